"""IVF inverted lists on disk: written per block, merged once, memory-mapped by every query.

Blocks of staging shards are added to copies of the trained index (tasks/graph/build.py), and one
merge concatenates every list block by block, in shard order, into FAISS's ``OnDiskInvertedLists``
file (what ``faiss.contrib.ondisk.merge_ondisk`` does, one range of lists at a time): each list holds
the same ids and codes in the same order as one index with every shard added in memory.

``graph/index/index.faiss`` names the lists file by its base name, so its bytes do not depend on
where it was built. A query task maps ``graph/index/index.ivfdata`` read-only, never reading the
lists whole into its own memory; mapping needs a local file, so from an object store it is copied
once per host into :func:`cache_dir` and checked against the index marker's SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from typing import IO

import faiss
import numpy as np

from corpusforge.storage import Store

CACHE_ENV = "CORPUSFORGE_INDEX_CACHE"  # where query hosts keep copies of a remote index's lists
CHUNK = 8 << 20
MERGE_RANGE_BYTES = 512 << 20  # lists one merge step maps at a time (and as much of the blocks)


def cache_dir() -> str:
    """Local folder for copies of remote lists files: ``$CORPUSFORGE_INDEX_CACHE``, else the
    system temp folder's ``corpusforge-index``. One copy per index fingerprint; nothing
    removes old ones (a host's disk is its own to clean)."""
    return os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "corpusforge-index")


def write_lists(index: faiss.Index, f: IO[bytes]) -> None:
    """The inverted lists of a CPU IVF index (FAISS's array format) through a Python file."""
    faiss.write_InvertedLists(faiss.extract_index_ivf(index).invlists, faiss.PyCallbackIOWriter(f.write))


def merge_lists(trained: faiss.Index, block_paths: list[str], lists_path: str, name: str) -> faiss.Index:
    """``trained`` (empty) with the lists of the block files, in order, concatenated list by
    list into ``lists_path``, a file the index names ``name`` (its final base name, not
    where it is written).

    One range of lists at a time (about MERGE_RANGE_BYTES of them, by the blocks' sizes):
    the blocks are mapped, the range merged into a part file
    (``OnDiskInvertedLists.merge_from_multiple``), everything unmapped, the part appended.
    The file equals one merge of every list at once (lists in order, each at the sum of the
    sizes before it), but no more than a range's pages are ever mapped at once."""
    ivf = faiss.extract_index_ivf(trained)
    if ivf.ntotal:
        raise ValueError("merge_lists needs an empty trained index")
    total = sum(os.path.getsize(p) for p in block_paths)
    ranges = np.array_split(np.arange(ivf.nlist), max(1, min(ivf.nlist, -(-total // MERGE_RANGE_BYTES))))
    sizes = np.zeros(ivf.nlist, np.uint64)
    part = f"{lists_path}.range.part"  # beside the lists file (a killed merge's is swept as a temp file)
    with open(lists_path, "wb") as out:
        for lists in ranges:
            first, stop = int(lists[0]), int(lists[-1]) + 1
            sizes[first:stop] = _merge_range(block_paths, first, stop, ivf.code_size, part)
            if sizes[first:stop].any():
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, CHUNK)
                os.unlink(part)
    merged = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, name)
    merged.set_all_lists_sizes(faiss.swig_ptr(sizes))
    merged.totsize = os.path.getsize(lists_path)
    ivf.replace_invlists(merged, True)
    merged.this.disown()  # the index owns the lists now
    trained.ntotal = ivf.ntotal = int(sizes.sum())
    return trained


def _merge_range(block_paths: list[str], first: int, stop: int, code_size: int, part: str) -> np.ndarray:
    """Lists ``first``..``stop`` of every block, in block order, into the file ``part`` (not
    written when they are all empty); their sizes. Unmaps the blocks and the part on return."""
    blocks = [faiss.read_InvertedLists(faiss.FileIOReader(p), faiss.IO_FLAG_MMAP) for p in block_paths]
    sizes = np.array([sum(b.list_size(j) for b in blocks) for j in range(first, stop)], np.uint64)
    if sizes.any():
        slices = [faiss.SliceInvertedLists(b, first, stop) for b in blocks]
        refs = faiss.InvertedListsPtrVector()
        for piece in slices:
            refs.push_back(piece)
        faiss.OnDiskInvertedLists(stop - first, code_size, part).merge_from_multiple(refs.data(), refs.size(),
                                                                                    False, False)
    return sizes


def open_mapped(f: IO[bytes], lists_path: str, nprobe: int) -> faiss.Index:
    """An index written with on-disk lists, read from ``f`` without them; its lists mapped
    read-only from the local file ``lists_path``."""
    index = faiss.read_index(faiss.PyCallbackIOReader(f.read), faiss.IO_FLAG_SKIP_IVF_DATA | faiss.IO_FLAG_READ_ONLY)
    ivf = faiss.extract_index_ivf(index)
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    if not isinstance(lists, faiss.OnDiskInvertedLists):
        raise ValueError(f"the index has {type(lists).__name__}, not on-disk inverted lists")
    lists.filename = lists_path
    lists.do_mmap()
    ivf.nprobe = nprobe
    return index


def local_file(store: Store, rel: str, sha256: str, folder: str) -> str:
    """A local path of ``rel`` to map: the store's own file when it is local, else a copy in
    ``folder`` made once (streamed to disk, SHA-256 checked, renamed into place): for a query
    host ``cache_dir()/{index fingerprint}``, for a merge its temporary folder."""
    if not store.remote:
        return store.path(rel)
    dest = os.path.join(folder, os.path.basename(rel))
    if not os.path.exists(dest):
        os.makedirs(folder, exist_ok=True)
        download(store, rel, dest, sha256)
    return dest


def download(store: Store, rel: str, dest: str, sha256: str | None = None) -> None:
    """Copy ``rel`` to the local file ``dest`` in chunks (a temp file renamed at the end, so
    a concurrent reader sees it whole or not at all); a mismatch with ``sha256`` is an error."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.", suffix=".part", dir=os.path.dirname(dest))
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, store.open(rel) as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                out.write(chunk)
        if sha256 is not None and h.hexdigest() != sha256:
            raise ValueError(f"{store.path(rel)}: SHA-256 {h.hexdigest()[:12]}… is not the recorded "
                             f"{sha256[:12]}… (changed after its unit wrote it)")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


