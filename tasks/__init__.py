"""Pipeline stages: plain functions over records and shards, with thin Prefect task wrappers."""
