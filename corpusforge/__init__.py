"""corpusforge's ground floor: storage, records, hashing, tar shards and the Dask cluster.

Every stage in ``tasks/`` builds on these; nothing here imports a stage.
"""

__version__ = "0.1.0"
