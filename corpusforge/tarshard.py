"""Deterministic WebDataset tar shards: writing, indexing and safe reading.

A sample is a key plus ``{extension: bytes}``; members are named ``{key}.{ext}``.
Headers are fixed (mtime 0, uid/gid 0, empty owner names, mode 0444, USTAR), so the
same samples in the same order always give byte-identical tars. The writer records
where every member's data starts, so later stages can fetch one sample with a ranged
read instead of scanning the shard.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import re
import tarfile
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

import pyarrow as pa

from corpusforge.writeback import SyncAhead

# writev takes at most this many buffers per call (EINVAL beyond; 1024 on Linux)
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
# WebDataset splits a member name at its first dot, so keys may not contain one.
SAFE_KEY = re.compile(r"^[A-Za-z0-9_\-]{1,96}$")
SAFE_EXT = re.compile(r"^[a-z0-9]{1,8}(\.[a-z0-9]{1,8})*$")

INDEX_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("ext", pa.string()),
    ("offset", pa.int64()),
    ("size", pa.int64()),
    ("sha256", pa.string()),  # of the member's bytes: what a copy of it depends on
])


def is_safe_key(key: str) -> bool:
    return bool(SAFE_KEY.match(key))


def folded_key(key: str) -> str:
    """A key as a case-insensitive filesystem (macOS, Windows) sees it: two keys with one
    folded form overwrite each other's files when a release tar is unpacked there."""
    return key.lower()  # safe keys are ASCII


@dataclass
class Sample:
    key: str
    # ext -> bytes (or a read-only view that stays unchanged until the tar's digest is read),
    # written in this order
    members: dict[str, bytes | memoryview] = field(default_factory=dict)
    # ext -> SHA-256 (hex) of members whose digest the caller already knows and has checked
    # the bytes against (staging: ingest's hash, checked by the spill checksum); the index
    # takes it instead of hashing those bytes a second time
    digests: dict[str, str] = field(default_factory=dict)


@dataclass
class ShardWriteResult:
    bytes: int
    count: int
    index: pa.Table  # one row per member: key, ext, offset, size, sha256
    digest: Future[str]  # the tar's SHA-256, finished by a helper thread (see ShardSink)

    @property
    def sha256(self) -> str:
        """The tar's SHA-256: ask for it after the file is fsynced, so hashing overlaps that wait."""
        return self.digest.result()


class HashingWriter(io.RawIOBase):
    """Counts and hashes everything written through it, on its way to the real file."""

    def __init__(self, target: IO[bytes]):
        self.target, self.h, self.n = target, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        b = bytes(b)
        self.h.update(b)
        self.n += len(b)
        self.target.write(b)
        return len(b)

    @property
    def sha256(self) -> str:
        return self.h.hexdigest()


def _sha256_of_batches(batches: queue.Queue) -> str:
    h = hashlib.sha256()
    while (batch := batches.get()) is not None:
        for piece in batch:
            h.update(piece)
    return h.hexdigest()


class ShardSink:
    """Writes a tar's pieces in large batches (one ``writev`` each instead of a system call and a
    copy per piece) and hashes them in a helper thread, where SHA-256 (about as costly as the copy)
    overlaps the copy and the final fsync. At most ``MAX_QUEUED`` batches are held. ``sync_ahead``:
    the written part is synced as the tar grows, so the caller's fsync waits only for the tail."""

    BATCH_BYTES, BATCH_PIECES, MAX_QUEUED = 4 << 20, 1024, 8

    def __init__(self, target: IO[bytes], sync_ahead: bool = False):
        self.target, self.n = target, 0
        self.pieces: list[bytes | memoryview] = []
        self.pending = 0
        try:
            target.flush()
            self.fd: int | None = target.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            self.fd = None  # an in-memory or remote file object: joined writes
        self.sync_ahead = SyncAhead(self.fd) if sync_ahead and self.fd is not None and SyncAhead.applies_to(self.fd) \
            else None
        self.batches: queue.Queue = queue.Queue(self.MAX_QUEUED)
        self.hasher = ThreadPoolExecutor(1, thread_name_prefix="tar-sha256")
        self.digest = self.hasher.submit(_sha256_of_batches, self.batches)

    def add(self, pieces: Iterable[bytes | memoryview], size: int) -> None:
        """Append ``pieces``, ``size`` bytes in all; they must not change before the digest is
        read (the helper thread hashes them later)."""
        self.pieces += pieces
        self.n += size
        self.pending += size
        if self.pending >= self.BATCH_BYTES or len(self.pieces) >= self.BATCH_PIECES:
            self.flush()

    def flush(self) -> None:
        if not self.pieces:
            return
        pieces, size, self.pieces, self.pending = self.pieces, self.pending, [], 0
        self.batches.put(pieces)
        if self.fd is None:
            self.target.write(b"".join(pieces))
            return
        views: list[bytes | memoryview] = pieces
        while views:  # a regular file may take fewer bytes than asked: go on where it stopped
            done, first = os.writev(self.fd, views[:IOV_MAX]), 0
            while first < len(views) and done >= len(views[first]):
                done -= len(views[first])
                first += 1
            views = views[first:]
            if done:
                views[0] = memoryview(views[0])[done:]
        if self.sync_ahead is not None:
            self.sync_ahead.written(size)

    def close(self) -> Future[str]:
        """Write what is left and end the hash stream; return the digest's future."""
        self.flush()
        if self.sync_ahead is not None:
            self.sync_ahead.close()
        self.batches.put(None)
        self.hasher.shutdown(wait=False)
        return self.digest

    def abort(self) -> None:
        """End the hash stream (the helper thread exits); nothing more is written."""
        if self.sync_ahead is not None:
            self.sync_ahead.abort()
        self.batches.put(None)
        self.hasher.shutdown(wait=False)


# The fixed fields of every header this module writes (mode 0444, uid/gid 0, mtime 0, a
# regular file, empty owner names), laid out as tarfile's USTAR encoder lays them out.
_MODE_IDS = b"0000444\x00" + b"0000000\x00" * 2
_MTIME = b"00000000000\x00"
_AFTER_MTIME = b"0" + b"\x00" * 100 + b"ustar\x0000" + b"\x00" * (64 + 16 + 155)  # type … prefix
_FIXED_SUM = 256 + sum(_MODE_IDS) + sum(_MTIME) + sum(_AFTER_MTIME)  # 8 checksum bytes count as spaces
_PADS = tuple(bytes(n) for n in range(tarfile.BLOCKSIZE))  # zeros after a member, by length
SMALL_MEMBER = 4096  # members below this size are joined with their headers into one written piece
SMALL_RUN = 1 << 20  # a run of small members is written once it holds this much: a shard of small
                     # members (thumbnails, captions) is not held whole until its end


def ustar_header(name: str, size: int) -> bytes:
    """The 512-byte USTAR header :mod:`tarfile` writes for a regular file ``name`` of ``size``
    bytes with this module's fixed fields (names over 100 bytes go through tarfile itself)."""
    raw = name.encode("ascii", "surrogateescape") if name.isascii() else b""
    if not raw or len(raw) > 100 or size >= 8 ** 11:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o444, 0, 0, "", ""
        return info.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")
    size_field = b"%011o\x00" % size
    chksum = _FIXED_SUM + sum(raw) + sum(size_field)
    return b"".join((raw.ljust(100, b"\x00"), _MODE_IDS, size_field, _MTIME, b"%06o\x00 " % chksum,
                     _AFTER_MTIME)).ljust(tarfile.BLOCKSIZE, b"\x00")


def write_tar(target: IO[bytes], samples: Iterable[Sample], sync_ahead: bool = False) -> ShardWriteResult:
    """Stream ``samples`` into ``target`` as a deterministic tar; return its hash and index.

    The bytes are exactly what :mod:`tarfile` writes in ``"w|"`` mode with these headers, written
    directly (tarfile's per-member overhead made staging several times slower than a raw copy).
    The bytes bypass ``target``'s buffer: write nothing else through it. ``sync_ahead``: the
    caller fsyncs the finished file; sync its written part while it is being written."""
    sink = ShardSink(target, sync_ahead)
    keys, exts, offsets, sizes, shas = [], [], [], [], []
    count = position = 0
    checked_exts: set[str] = set()
    # Headers, paddings and small members (captions, sample JSON) between two big members
    # are joined into one piece: a sample is then two pieces for writev and the hash
    # thread instead of nine (a Python call and a system-call buffer each).
    small: list[bytes | memoryview] = []
    small_bytes = 0
    try:
        for sample in samples:
            key = sample.key
            if not is_safe_key(key):
                raise ValueError(f"unsafe sample key {key!r}")
            for ext, data in sample.members.items():
                if ext not in checked_exts:
                    if not SAFE_EXT.match(ext):
                        raise ValueError(f"unsafe extension {ext!r} for key {key!r}")
                    checked_exts.add(ext)
                size = len(data)
                pad = _PADS[-size % tarfile.BLOCKSIZE]
                small.append(ustar_header(f"{key}.{ext}", size))
                position += tarfile.BLOCKSIZE
                offsets.append(position)
                if size < SMALL_MEMBER:
                    small += (data, pad)
                    small_bytes += tarfile.BLOCKSIZE + size + len(pad)
                    if small_bytes >= SMALL_RUN:
                        joined = b"".join(small)
                        sink.add((joined,), len(joined))
                        small, small_bytes = [], 0
                else:
                    joined = b"".join(small)
                    sink.add((joined, data), len(joined) + size)
                    small, small_bytes = [pad], len(pad)
                position += size + len(pad)
                keys.append(key)
                exts.append(ext)
                sizes.append(size)
                shas.append(sample.digests.get(ext) or hashlib.sha256(data).hexdigest())
            count += 1
        end = 2 * tarfile.BLOCKSIZE
        end += -(position + end) % tarfile.RECORDSIZE
        small.append(bytes(end))
        joined = b"".join(small)
        sink.add((joined,), len(joined))
        digest = sink.close()
    except BaseException:
        sink.abort()
        raise
    index = pa.table({"key": keys, "ext": exts, "offset": offsets, "size": sizes, "sha256": shas},
                     schema=INDEX_SCHEMA)
    return ShardWriteResult(bytes=sink.n, count=count, index=index, digest=digest)


@dataclass
class TarMemberError:
    """A member that could not be used, with the reason; never silently skipped."""
    name: str
    reason: str


def split_member_name(name: str) -> tuple[str, str] | None:
    """``dir/key.ext`` -> (``dir/key``, ``ext``) as WebDataset groups them; None if unsafe
    (absolute paths, ``..`` components, backslashes, NUL, empty key or extension)."""
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return None
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    base = parts[-1]
    if "." not in base or base.startswith("."):
        return None
    stem, ext = base.split(".", 1)
    prefix = "/".join(parts[:-1] + [stem])
    return prefix, ext.lower()


@dataclass
class TarSample:
    """One sample read from a tar: members by extension, where each member's data starts,
    or an error (then ``members`` is empty) for unusable members and truncated streams."""
    key: str
    members: dict[str, bytes] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    error: TarMemberError | None = None


class _TailReader(io.RawIOBase):
    """A read-only stream that remembers its last bytes read, so the end of a tar can be checked
    after :mod:`tarfile` has stopped reading."""

    KEEP = 1 << 16

    def __init__(self, source: IO[bytes]):
        self.source, self.tail, self.tail_start = source, b"", 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.tail += data
        if len(self.tail) > 2 * self.KEEP:
            cut = len(self.tail) - self.KEEP
            self.tail, self.tail_start = self.tail[cut:], self.tail_start + cut
        return data

    def block_at(self, offset: int) -> bytes | None:
        """The 512 bytes at ``offset`` if they were read and are still remembered."""
        start = offset - self.tail_start
        if start < 0:
            return None
        return self.tail[start:start + tarfile.BLOCKSIZE]


def _member_kind(info: tarfile.TarInfo) -> str:
    """What a non-regular member is, for its error (a link names its target)."""
    if info.issym():
        return f"symbolic link to {info.linkname!r}"
    if info.islnk():
        return f"hard link to {info.linkname!r}"
    kinds = {tarfile.CHRTYPE: "character device", tarfile.BLKTYPE: "block device", tarfile.FIFOTYPE: "FIFO",
             tarfile.CONTTYPE: "contiguous file"}
    return kinds.get(info.type, f"member type {info.type!r}")


def iter_tar_samples(fileobj: IO[bytes]) -> Iterator[TarSample]:
    """Yield consecutive members sharing a key as one :class:`TarSample`, reading the tar as a stream.

    A non-file member (link, device, FIFO) makes its whole sample an error: one sample, one
    record. A member with an unsafe name comes back alone as an error. A member repeating an
    extension starts a new sample with the same key (flagged as a duplicate later), so two samples
    are never merged. A truncated or corrupt tar ends with one error sample naming how many samples
    were read before it (the sample in progress is reported inside it). Python's ``tarfile`` takes
    a header cut short, or a stream ending right after a member, as the end of the archive; here an
    uncompressed tar counts as whole only if an end-of-archive block follows its last member."""
    current = TarSample(key="")
    exts: set[str] = set()  # the extensions of the sample in progress, unusable members included
    reader = _TailReader(fileobj)
    done = 0

    def cut(why: str) -> TarSample:
        name = current.key or "<tar>"
        return TarSample(name, error=TarMemberError(
            name, f"corrupt or truncated tar after {done} complete samples: {why}"))

    def finished(sample: TarSample) -> TarSample:
        if sample.error is not None:  # an error sample carries no member
            sample.members.clear()
            sample.offsets.clear()
        return sample

    try:
        with tarfile.open(fileobj=reader, mode="r|*") as tar:
            for info in tar:
                if info.isdir():
                    continue
                parsed = split_member_name(info.name)
                if parsed is None:
                    if exts:  # keep input order: finish the sample in progress first
                        yield finished(current)
                        done += 1
                        current, exts = TarSample(key=""), set()
                    yield TarSample(info.name, error=TarMemberError(info.name, "unsafe member name"))
                    done += 1
                    continue
                key, ext = parsed
                # a new key, or a member repeating one the sample already has (a duplicate
                # key): the sample in progress ends, so nothing is merged or overwritten
                if exts and (key != current.key or ext in exts):
                    yield finished(current)
                    done += 1
                    current, exts = TarSample(key=key), set()
                current.key = key
                exts.add(ext)
                if not info.isreg():
                    if current.error is None:
                        current.error = TarMemberError(info.name, f"not a regular file: {_member_kind(info)}")
                    continue
                f = tar.extractfile(info)
                current.members[ext] = f.read() if f is not None else b""
                current.offsets[ext] = info.offset_data
            end = reader.block_at(tar.offset) if tar.fileobj.comptype == "tar" else b"\0" * tarfile.BLOCKSIZE
    except (tarfile.TarError, EOFError, OSError) as exc:
        yield cut(str(exc))
        return
    if end is None or len(end) < tarfile.BLOCKSIZE or end.count(0) != tarfile.BLOCKSIZE:
        yield cut("no end-of-archive block after the last member (header cut short or stream ended)")
        return
    if exts:
        yield finished(current)
