"""Reference statistics and evaluation metrics (GPIC §3, App. B).

``moments`` (streaming mean/covariance partials and their merge), ``subsample``
(order-independent feature samples), ``fd``, ``prdc`` and ``mmd`` (the metrics),
``provenance`` (what a statistics file was computed with), ``reference`` (statistics
of a built corpus's splits) and ``evaluate`` (metrics of generated images).
"""
