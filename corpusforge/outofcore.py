"""DuckDB for whole-corpus steps: one connection that sorts and joins out of core.

A global step (a comparison of manifests, a folder's listing) runs in one task over rows
of the whole corpus; DuckDB keeps them under ``memory_limit`` and spills the rest to a
local temporary folder, so the task's memory does not grow with the corpus.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import Any

from corpusforge.storage import Store


@contextlib.contextmanager
def spilling_duckdb(memory_limit: str, *stores: Store) -> Iterator[Any]:
    """A DuckDB connection that spills to a temporary folder past ``memory_limit`` and reads
    the stores' files through their fsspec filesystems when they are remote."""
    import duckdb

    with tempfile.TemporaryDirectory(prefix="corpusforge-duckdb-") as spill:
        con = duckdb.connect(config={"memory_limit": memory_limit, "temp_directory": spill,
                                     "preserve_insertion_order": True})
        try:
            registered: set[str] = set()
            for store in stores:
                protocol = store.root.split("://", 1)[0]
                if store.remote and protocol not in registered:
                    con.register_filesystem(store.fs)
                    registered.add(protocol)
            yield con
        finally:
            con.close()
