"""Make a big file durable while it is still being written, so that the fsync at its
end has little left to wait for.

Left alone, the kernel writes a staging shard back only after ~30 s or under memory pressure,
so its final fsync writes the whole shard while the writer waits, idle. :class:`SyncAhead` asks
for an ``fdatasync`` every few MB from a helper thread instead (RocksDB's ``bytes_per_sync``;
``sync_file_range`` alone starts the writes but not a virtual disk's cache flush, which was most
of the wait here). They change no byte; the caller's own fsync still makes the file durable.
"""

from __future__ import annotations

import os
import stat
from concurrent.futures import Future, ThreadPoolExecutor


class SyncAhead:
    """``fdatasync`` of ``fd`` in a helper thread after each ``EVERY`` bytes written (reported
    with :meth:`written`); a sync still running when the next is due is not queued behind:
    the next one covers both. Only for regular files (a pipe cannot be synced)."""

    EVERY = 8 << 20  # a sync's fixed cost (a journal commit, a cache flush) stays small beside the data's

    def __init__(self, fd: int):
        self.fd, self.unsynced = fd, 0
        self.running: Future[None] | None = None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="sync-ahead")

    @staticmethod
    def applies_to(fd: int) -> bool:
        return stat.S_ISREG(os.fstat(fd).st_mode)

    def written(self, size: int) -> None:
        self.unsynced += size
        if self.unsynced >= self.EVERY and (self.running is None or self.running.done()):
            if self.running is not None:
                self.running.result()  # a failed sync (EIO) fails the write: the final fsync might not see it again
            self.running, self.unsynced = self.pool.submit(os.fdatasync, self.fd), 0

    def close(self) -> None:
        """Wait for the sync in flight and raise its error, if any."""
        try:
            if self.running is not None:
                self.running.result()
        finally:
            self.pool.shutdown()

    def abort(self) -> None:
        """Wait for the sync in flight (the file is closed next; its descriptor must not be
        synced after it was reused), ignoring its error: the write failed anyway."""
        self.pool.shutdown()
