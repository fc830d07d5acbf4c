"""What several stages share, and which imports no stage: the feature models and their
extraction (``features``), image decoding, the pair rule (``pair_score``), the sample JSON
(``samples``), the model-identity labels (``provenance``) and the caption summary."""
