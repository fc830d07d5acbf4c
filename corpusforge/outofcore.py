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
        except duckdb.Error:
            _reraise_storage_fault(stores)
            raise
        finally:
            con.close()


def _reraise_storage_fault(stores: tuple[Store, ...]) -> None:
    """Raise the storage's own error when a remote store is what failed a query.

    DuckDB hands a failure of a registered fsspec filesystem back as ``duckdb.Error`` carrying
    the Python traceback as text, so the cause (an unreachable endpoint) is lost to the
    callers that classify faults and the traceback reaches the user's terminal. Asking each
    remote store for its root again raises the real exception when the store is down."""
    for store in stores:
        if store.remote:
            store.fs.invalidate_cache()
            with contextlib.suppress(FileNotFoundError):  # it answered: the query's error stands
                store.fs.info(store.root)
