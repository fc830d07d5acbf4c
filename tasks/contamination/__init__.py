"""Contamination rates: how much of an evaluation set is already in a training corpus
(docs/contamination.md). ``stage`` holds the entry points the flow calls, ``files`` the paths
and schemas other stages and flows may import; each other module is one measurement or step.
"""
