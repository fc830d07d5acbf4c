"""Prefect flows (one file per flow) and the ``corpusforge`` command line."""
