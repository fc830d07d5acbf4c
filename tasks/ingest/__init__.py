"""Ingest and exact deduplication: list and read the source (``sources``), validate images
(``validate``), resolve licences (``licenses``), write one ingest partition (``partition``),
then find exact duplicates through a bucketed exchange of hashes (``exact_dedup``)."""
