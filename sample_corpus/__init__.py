"""A deterministic sample corpus with planted duplicates and bad records (``corpusforge sample``).

Writes input format (a): ``images/`` plus ``metadata.parquet`` whose rows point at the
files, and ``ground_truth.json`` saying what a correct pipeline must find. See
``design.py`` for how the corpus is decided and ``corpus.py`` for how it is written.
"""

from sample_corpus.corpus import render_group, write_sample_corpus
from sample_corpus.design import SampleDesign, design_sample_corpus

__all__ = ["SampleDesign", "design_sample_corpus", "render_group", "write_sample_corpus"]
