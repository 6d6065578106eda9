"""The entry files' syncs of a Raft member (see ``hasvc.broker.raft``: "Flushing does not block
the loop"): at most one sync at a time, in a worker thread started from the loop (by an append
with ``--flush sync``, by the end of the previous sync, and every FLUSH_INTERVAL_SECONDS), its end
handled by a callback in the loop; a small flush with ``--flush sync`` in the loop itself. None
starts while a task holds the files quiet (``files_quiet``: a truncate, retention, a reset) or
once the driver closes. Between syncs, a leader's warm-up of the write area takes the sync's place."""

from __future__ import annotations

import contextlib
import functools
import math
from typing import TYPE_CHECKING

import trio

from commitlog.mapped_file import StoreError, is_disk_full
from hasvc.state.raft.ready import Role

if TYPE_CHECKING:
    from hasvc.broker.raft.driver import RaftDriver

# DLedger flushStoreIntervalMs (10 ms).
FLUSH_INTERVAL_SECONDS = 0.010
# The index files are synced at most this often (DLedger syncs them with the data files every
# 10 ms). Recovery trusts only the data files and rebuilds the index units that do not match them,
# so an index unit not yet synced costs a longer recovery scan after a power loss (at most this
# long's writes), never an entry; at 10 ms the index sync's worker thread started behind one put in
# ten at one writer and the loop then waited on the GIL for the thread (``strace``: ~0.3 ms).
INDEX_FLUSH_INTERVAL_SECONDS = 1.0
# With --flush sync, a flush of at most this many unflushed entries runs in the loop rather than in
# the worker thread: the thread's hand-off (start, wake-up byte, a loop pass) cost more than the
# msync (~130 us here) and sat on the path of every put at one writer; more entries than this mean
# puts keep arriving, and the thread lets the loop take them during the msync (group commit).
SYNC_INLINE_ENTRIES_MAX = 2
# A full disk lasts: the warm-up (and a blocked dispatch, ``RaftBroker._dispatcher``) tries again
# after this long (each warm-up try creates and removes a whole file).
DISK_FULL_RETRY_SECONDS = 1.0


class EntrySync:
    """The syncs of one driver's entry files (see the module). ``syncing``: a sync (or the
    warm-up) runs in a worker thread; ``quiet_holds``: tasks in ``files_quiet``."""

    def __init__(self, driver: RaftDriver) -> None:
        self._driver = driver  # its node (replaced after a failed append), drain and disk-full log
        self._store = driver.store
        self._group = driver.group
        self._token = trio.lowlevel.current_trio_token()
        self.syncing = False  # a sync of the entry files runs in a worker thread
        self._idle = trio.Event()  # set whenever no sync runs
        self._idle.set()
        self.quiet_holds = 0  # tasks in ``files_quiet``: no sync starts meanwhile
        self._closing = False
        self._index_synced_at = -math.inf
        self._failed = trio.Event()
        self._failure: BaseException | None = None
        self._warm_failure: BaseException | None = None  # the warm-up's thread met a full disk
        self._warm_retry_at = -math.inf
        self.tick_seconds = FLUSH_INTERVAL_SECONDS  # the ticker's period (a controller's is longer: its own owner's choice)

    def after_append(self, *, inline_only: bool = False) -> bool:
        """With flush_sync, after a drain appended entries and sent its messages (the pushes
        leave before this member's own msync, so the followers' flushes overlap it): flush at
        once, in the loop when at most SYNC_INLINE_ENTRIES_MAX entries wait (then ``persisted``
        and another drain carry the acknowledgement out), else in the worker thread. With
        ``inline_only``, a flush for the worker thread is left to a later call: False then,
        else True (done, or none may start now)."""
        if self.syncing or self.quiet_holds or self._closing:
            return True
        entries = self._store.entries
        target = entries.flush_target()
        if target - entries.flushed_index() > SYNC_INLINE_ENTRIES_MAX:
            if inline_only:
                return False
            self.start()
            return True
        try:
            entries.sync_data_files()
        except Exception as error:  # noqa: BLE001 -- as a worker thread's failure: the ticker task raises it
            self._failure = error
            self._failed.set()
            return True
        self._data_synced(target)
        return True

    def start(self, *, data: bool = True) -> None:
        """Start a sync of the entry files in a worker thread unless one runs, a task holds the
        files quiet or the driver closes (``close``): the data files when entries wait to be flushed (and
        ``data``), else the index files once INDEX_FLUSH_INTERVAL_SECONDS after their last sync. The
        thread's end is handled in the loop by ``_synced`` (through the run_sync_soon task, with
        no task of its own: a flusher task cost three or four task steps a flush), which starts
        the next: with flush_sync the data files' at once (group commit), else only the index
        files' (the data files wait for the next tick: syncing back to back would cost a thread
        hand-off and an msync per few entries at high rates)."""
        if self.syncing or self.quiet_holds or self._closing:
            return
        entries = self._store.entries
        if data and entries.flushed_index() < entries.last_index():
            job, done = entries.sync_data_files, functools.partial(self._data_synced, entries.flush_target())
        elif entries.index_unsynced() and trio.current_time() >= self._index_synced_at + INDEX_FLUSH_INTERVAL_SECONDS:
            job, done = entries.sync_index_files, self._index_synced
        elif (self._driver.node.role is Role.LEADER and trio.current_time() >= self._warm_retry_at
              and self._store.entries.needs_warming(self._store.config.warm_ahead_size)):  # fmt: skip
            # The write area faulted in ahead of the appends, as a classic broker's warm-up task
            # does (StoreTasks.warm_task): without it every fourth 1 KiB entry's first write to a
            # page was a page fault on the loop (a sixth of a leader's main thread at 64
            # producers, py-spy). In the sync's place, between syncs, so truncations and
            # retention (files_quiet) exclude it as they exclude a sync. A leader's only: a
            # follower stores pushes with pwrite (DLedgerMmapFileStore.append_run), for which
            # pages faulted in ahead were zeroed for nothing (its worker threads 1.0-2.3 ->
            # 0.7-1.1 us a message at 64 x 1, docs/design/put-path.md). While a leader's appends
            # are large it writes them with pwrite too (``EntryWriter.large_appends``): only the
            # next data file is made ahead then, and the index files warmed.
            job, done = self._warm, self._warmed
        else:
            return
        self.syncing = True
        self._idle = trio.Event()
        token = self._token
        trio.lowlevel.start_thread_soon(job, lambda result: token.run_sync_soon(self._synced, done, result),
                                        name=f"hasvc {self._group.self_id} {job.__name__}")  # fmt: skip

    def _synced(self, done, result) -> None:
        self.syncing = False
        self._idle.set()
        try:
            result.unwrap()
            done()
        except BaseException as error:  # noqa: BLE001 -- a run_sync_soon callback must not raise:
            self._failure = error  # the ticker task raises it
            self._failed.set()
            return
        self.start(data=self._group.raft.flush_sync)

    def _data_synced(self, target: int) -> None:
        """Group commit: entries up to ``target`` (the last index when the sync began) are
        flushed; those appended meanwhile wait for the next sync."""
        flushed = self._store.entries.flushed_to(target)
        self._driver.node.persisted(flushed, trio.current_time())
        self._driver.drain()

    def _warm(self) -> None:
        """The warm-up, in the worker thread: a full disk (the next file cannot be made) is
        kept for ``_warmed`` to log, not raised (it would stop the member)."""
        try:
            self._store.warm_commitlog()
        except (StoreError, OSError) as error:
            if not is_disk_full(error):
                raise
            self._warm_failure = error

    def _warmed(self) -> None:
        if self._warm_failure is not None:
            self._driver.log_disk_full("warm-up", self._warm_failure)
            self._warm_failure = None
            self._warm_retry_at = trio.current_time() + DISK_FULL_RETRY_SECONDS

    def _index_synced(self) -> None:
        self._index_synced_at = trio.current_time()

    async def ticker(self) -> None:
        """Every FLUSH_INTERVAL_SECONDS start a sync if one is due (DLedger's FlushDataService;
        with flush_sync, appends start theirs at once and this catches up the index files);
        raise what a sync raised."""
        while True:
            with trio.move_on_after(self.tick_seconds):
                await self._failed.wait()
            if self._failure is not None:
                raise self._failure
            self.start()

    @contextlib.asynccontextmanager
    async def files_quiet(self):
        """Hold off the entry files' syncs (waiting for one that runs): for what cuts or deletes
        the files a sync's thread reads (a truncate, retention). Synchronous code inside only."""
        self.quiet_holds += 1
        try:
            while self.syncing:
                await self._idle.wait()
            yield
        finally:
            self.quiet_holds -= 1
            if not self.quiet_holds:
                self.start()

    async def close(self) -> None:
        """Start no more syncs and wait for the one that runs (its thread reads the mappings
        that closing the store unmaps)."""
        self._closing = True
        while self.syncing:
            await self._idle.wait()

