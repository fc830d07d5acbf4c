"""Prompt qualification for image-generation benchmarks (seed 000).

Three heuristics flag prompts whose scores are likely inflated by training-data overlap —
risk indicators, not proofs: category density against a corpus built here
(:mod:`.density`), tightly clustered outputs (:mod:`.variance`) and old-versus-new cohort
divergence per model (:mod:`.cohorts`). Flagged prompts go to a quarantine ledger and a
rotation choice proposes a new edition that never touches the anchor set (:mod:`.rotation`).
The flow plans and summarises signals 1 and 2 with :mod:`.signals` and writes every file
with :mod:`.outputs`.
"""
