"""Contamination rates: how much of an evaluation set is already in a training corpus.

Modules: ``config`` (settings), ``eval_set`` (read and stage the evaluation set),
``eval_features`` (which feature settings embed it),
``selection`` (training/held-out keys from the manifest), ``similarity`` (exact top-k and
IVF search), ``image_scan`` (scan units), ``image_rates`` (image-only rate, seed 001),
``leakage`` (cross-split leakage), ``canary`` (seed 003's text rules), ``signatures``
(the same rules vectorised), ``lsh`` (banding), ``text_sources`` (corpus captions, text
tables, item texts), ``text_scan`` (text units: facts, join, verify, decide, recall),
``judge`` and ``image_text`` (image–text rate), ``editions`` (per-item decisions, new
benchmark edition), ``receipts`` (the receipt's sections), ``report``, ``stage`` (entry points and Prefect tasks).
"""
