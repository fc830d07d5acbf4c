"""Staging shards (:mod:`tasks.staging.stage`: the stage; :mod:`tasks.staging.plan`: its rerun plan)."""
