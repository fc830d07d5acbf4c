"""Near-duplicate removal as GPIC did it: FAISS similarity graph, two-tier rule, reports.

Modules: ``config`` (NearDedupConfig), ``nodes`` (global node ids), ``index`` (FAISS),
``edges`` (index build, per-shard queries, symmetrised edge files, recall),
``components`` (union-find), ``two_tier`` (the rule), ``chaining`` (component report),
``decisions`` (per-shard decision files), ``collision`` (Fig. 6), ``calibration`` (Fig. 5),
``stage`` (entry point and Prefect tasks), ``derived`` (the stage on a built corpus: source
checks, lineage).
"""
