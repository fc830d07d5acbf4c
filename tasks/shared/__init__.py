"""What several stages share, and which imports no stage: the feature models and their
extraction (``features``), image decoding, the pair rule (``pair_score``), the IVF index size
(``ivf``), seeded smallest-k sampling (``sampling``), receipts' output hashes
(``output_hashes``), the sample JSON (``samples``), the model-identity labels (``provenance``)
and the caption summary."""
