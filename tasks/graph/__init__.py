"""Near-duplicate removal as GPIC did it: FAISS similarity graph, two-tier rule, reports.

Entry point ``stage``; paths and schemas other stages may import: ``files``; the steps in order:
``stage``'s docstring and docs/near-duplicates.md.
"""
