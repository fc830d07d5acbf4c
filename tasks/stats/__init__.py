"""Reference statistics and evaluation metrics (GPIC §3, Table 2, App. B).

Numerics (no I/O): ``moments`` (streaming, mergeable n / mean / scatter partials),
``subsample`` (order-independent bottom-k feature samples), ``fd`` (Fréchet distance,
FDµ + FDΣ), ``prdc`` (precision, recall, density, coverage; chunked, FAISS radii) and
``mmd`` (kernel MMD over random subsets). Protocol: ``config`` (defaults = GPIC's port; model
identity and deviations are ``tasks/shared/provenance.py``), ``files`` (paths), ``gpic_stats``
(gpic-eval's ``test_stats.npz``), ``caption_set`` (the caption set generated images came from).
Stages: ``stage`` and ``reference`` (statistics of a built corpus's splits, tiers and Test-50K,
per staging shard), ``compare`` (all metrics of one set against another) and ``evaluate``
(generated images against reference files); ``plan`` and ``evaluate_plan`` are their rerun
planning for ``corpusforge plan``. Tests: ``tests/test_stats_*.py``; benchmark: ``bench/stats.py``.
"""
