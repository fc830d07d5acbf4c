"""Feature extraction: one module per model family, one file layout every later stage reads."""
