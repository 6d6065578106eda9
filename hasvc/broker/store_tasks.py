"""The store's background work as trio tasks (RocketMQ's FlushCommitLogService, GroupCommitService,
ReputMessageService, CleanCommitLogService and AllocateMappedFileService, on one loop).

Theory of operation
-------------------
The store is synchronous; what blocks on the disk (``fdatasync``, consume-queue flushes, segment
creation, page warm-up, retention) runs in worker threads (``trio.to_thread``), which release the
GIL while the kernel works. ``maintenance`` is held around that work and around a truncation (a
rejoining slave) so the two never overlap; the warm-up has its own lock, ``warming``, so that it
runs beside flushes but never beside a truncation (which holds both).

* group commit (SYNC_FLUSH): one ``fdatasync`` for everything appended when a put asks
  (``FlushWaits``), releasing every put it covers;
* async flush (ASYNC_FLUSH): every ``flush_interval_commitlog``, at least
  ``flush_commitlog_least_pages`` pages, everything every ``flush_commitlog_thorough_interval``;
* dispatch: consume-queue units for what the put path's own pass (``after_appends``) left;
* warm-up: the write area kept faulted in ahead of the writer;
* housekeeping: consume-queue flush and checkpoint every second, retention every ten;
* scrub: the whole log and its consume queues re-checked at ``scrub_bytes_per_second``
  (``commitlog.scrub``), under ``maintenance`` (never beside retention or a truncation); a
  consume queue unit that no longer matches its record is rewritten from it; damage in the log
  is logged at ERROR with its place and listed in STATUS (``damaged``), never cut.

No step ends the process on the disk's account (``_run_step``): a full disk (ENOSPC, a segment
or consume-queue file that cannot be created) is logged at most once per
DISK_FULL_LOG_INTERVAL_SECONDS a step, and the step runs again later (the warm-up after
DISK_FULL_RETRY_SECONDS); the puts meanwhile answer DISK_FULL (``MessageStore.disk_full``). A
sync that fails, or any other I/O error of a step, fails the store's writes
(``MessageStore.fail_writes``: puts answer SERVICE_NOT_AVAILABLE, the group commit's waiters
FLUSH_DISK_TIMEOUT, nothing is flushed again), logged once with the reason STATUS shows.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Protocol

import trio

from commitlog.scrub import Scrubber
from commitlog.mapped_file import StoreError, SyncFailedError, is_disk_full
from commitlog.store import MessageStore
from hasvc import transport
from hasvc.config import BrokerRole
from hasvc.state.role import RoleState

LOGGER = logging.getLogger(__name__)

# Background task periods (RocketMQ: reput every 1 ms, checkpoint and CQ flush every 1 s,
# retention every 10 s; warm-up is ours).
DISPATCH_INTERVAL_SECONDS = 0.001
HOUSEKEEPING_INTERVAL_SECONDS = 1.0
CLEAN_INTERVAL_SECONDS = 10.0
WARM_INTERVAL_SECONDS = 0.002
WARM_IDLE_SECONDS = 1.0
# A scrub pass that reached the end of the log waits this long before the next one begins (a small
# store would otherwise be re-read many times a second, however slow the rate).
SCRUB_PASS_PAUSE_SECONDS = 10.0
SCRUB_STEP_PAUSE_MIN_SECONDS = 0.001  # between two steps at least (a step that found nothing to walk)
# A full disk lasts: each step says so at most once per this long (one line, not one per try).
DISK_FULL_LOG_INTERVAL_SECONDS = 30.0
# The warm-up, having met a full disk, tries its spare segment again after this long rather than
# at its own pace (every WARM_INTERVAL_SECONDS while writes go on): each try creates, fails to
# preallocate and removes a whole segment file.
DISK_FULL_RETRY_SECONDS = 1.0
FAILED = object()  # what ``_run_step`` returns for a step that failed on the disk's account


class FlushWaits(Protocol):
    """What the group commit needs of the puts waiting for a flush (``PutService``)."""

    async def wait_flush_requested(self) -> None: ...

    def flushed(self, offset: int) -> None: ...

    def fail_flush_waits(self) -> None: ...


class StoreTasks:
    def __init__(self, *, store: MessageStore, role: RoleState, warm_ahead_size: int) -> None:
        self.store = store
        self.role = role
        self._warm_ahead_size = warm_ahead_size
        self.new_data = transport.Notifier()
        self._warm_wanted = trio.Event()  # set by after_appends when the write area needs warming
        # Held around background work that touches the store from worker threads, and around
        # truncation (a rejoining slave) so the two never overlap.
        self.maintenance = trio.Lock()
        # The warm-up's own lock: it runs beside flushes and housekeeping, only never beside a
        # truncation (which holds both). Behind ``maintenance`` it waited out every flush's
        # msync, and a writer at 200 MB/s ran past its 16 MiB of warmed pages and faulted them
        # in itself: the kernel's page zeroing was 9 % of a busy master's main thread.
        self.warming = trio.Lock()
        self.scrubber = Scrubber(store, crc_function=store.crc_function)
        self.on_damage: Callable[[], None] = lambda: None  # new damage found: the broker's online repair looks
        self._disk_full_logged_at: dict[str, float] = {}  # step -> when it last said the disk is full
        self._write_failure_logged = False

    def start(self, nursery: trio.Nursery, flushes: FlushWaits) -> None:
        for task in (self.dispatch_task, self.warm_task, self.housekeeping_task, self.scrub_task):
            nursery.start_soon(task)
        if self.store.sync_flush:
            nursery.start_soon(self.group_commit_task, flushes)
        else:
            nursery.start_soon(self.async_flush_task)

    @property
    def warm_ahead(self) -> int:
        """Bytes kept faulted in ahead of the writer: ``warm_ahead_size`` on a master, none on a
        slave, which writes frames with ``pwrite`` (``ha_slave``): a page the kernel allocates for
        a write is not zeroed first where it is written whole, and warming it ahead would be a
        second pass over every page (zero, then write). 64 producers x 32 messages: +15-30 %
        (docs/design/put-path.md). The next segment is still made ahead on both. None either while
        a master's appends are large (``CommitLog.large_appends``): it writes them with ``pwrite``
        past the warmed pages, for the same reason."""
        return 0 if self.role.is_slave or getattr(self.store.commit_log, "large_appends", False) else self._warm_ahead_size

    def after_appends(self) -> None:
        """What follows a pass of appends (a master's puts, a frame on a slave), done here
        rather than by waking a task per append (for a lone producer each wake-up was a
        scheduler pass on the put's path): the consume queue units, and a wake-up for the
        dispatch task only if a pass leaves more, for the warm-up task only when the write
        area needs it."""
        store = self.store
        store.dispatch()
        if store.reput_from_offset < store.dispatch_end_offset and store.dispatch_error is None:
            self.new_data.notify()
        commit_log = store.commit_log
        # warm_ahead, written out (a classic broker's: a DLedger member warms from its sync loop, raft/sync.py)
        ahead = 0 if self.role.role is BrokerRole.SLAVE or getattr(commit_log, "large_appends", False) else self._warm_ahead_size
        if commit_log.mapped_file_queue.needs_warming(ahead):
            self._warm_wanted.set()

    async def _run_step(self, name: str, function, *args):
        """``function(*args)`` in a worker thread; FAILED when it failed on the disk's account (see
        the module): a full disk logged (rate-limited), another I/O error failing the store's writes."""
        try:
            return await trio.to_thread.run_sync(function, *args)
        except (StoreError, OSError) as error:
            if is_disk_full(error):
                now = trio.current_time()
                if now >= self._disk_full_logged_at.get(name, -DISK_FULL_LOG_INTERVAL_SECONDS) + DISK_FULL_LOG_INTERVAL_SECONDS:
                    self._disk_full_logged_at[name] = now
                    LOGGER.warning("%s: the disk is full, tried again later (said at most every %.0f s): %s", name,
                                   DISK_FULL_LOG_INTERVAL_SECONDS, error)  # fmt: skip
                return FAILED
            if not isinstance(error, (SyncFailedError, OSError)):
                raise
            self.store.fail_writes(f"{name} failed, no more writes until a restart: {error}")  # unless failed already
            if not self._write_failure_logged:
                self._write_failure_logged = True
                LOGGER.error("%s", self.store.write_failure)
            return FAILED

    async def group_commit_task(self, flushes: FlushWaits) -> None:
        """SYNC_FLUSH: one fdatasync for everything appended so far, then release its waiters;
        a failed sync fails them (and every later wait: the store never syncs again)."""
        while True:
            await flushes.wait_flush_requested()
            async with self.maintenance:
                flushed = await self._run_step("flush", self.store.flush_commitlog, 0)
            if flushed is FAILED:
                flushes.fail_flush_waits()
                continue
            flushes.flushed(flushed)
            self.new_data.notify()  # under SYNC_FLUSH dispatch follows the flushed offset
        raise AssertionError("unreachable")

    async def async_flush_task(self) -> None:
        store_config = self.store.config
        thorough_at = trio.current_time() + store_config.flush_commitlog_thorough_interval_seconds
        while True:
            await trio.sleep(store_config.flush_interval_commitlog_seconds)
            least_pages = store_config.flush_commitlog_least_pages
            if trio.current_time() >= thorough_at:
                least_pages = 0
                thorough_at = trio.current_time() + store_config.flush_commitlog_thorough_interval_seconds
            async with self.maintenance:
                await self._run_step("flush", self.store.flush_commitlog, least_pages)
        raise AssertionError("unreachable")

    async def dispatch_task(self) -> None:
        while True:
            await self.new_data.wait(0.1)
            while self.store.dispatch():
                await trio.sleep(0)
            await trio.sleep(DISPATCH_INTERVAL_SECONDS)
        raise AssertionError("unreachable")

    async def warm_task(self) -> None:
        """Keep the write area faulted in: looks after appends (not on a timer: an idle broker
        should cost nothing), at most once per WARM_INTERVAL_SECONDS."""
        while True:
            with trio.move_on_after(WARM_IDLE_SECONDS):
                await self._warm_wanted.wait()
            self._warm_wanted = trio.Event()
            await trio.sleep(WARM_INTERVAL_SECONDS)
            ahead = self.warm_ahead
            if self.store.commit_log.mapped_file_queue.needs_warming(ahead):
                async with self.warming:
                    done = await self._run_step("warm-up", self.store.warm_commitlog, ahead)
                if done is FAILED:
                    await trio.sleep(DISK_FULL_RETRY_SECONDS)
        raise AssertionError("unreachable")

    async def housekeeping_task(self) -> None:
        store_config = self.store.config
        clean_at = trio.current_time() + CLEAN_INTERVAL_SECONDS
        while True:
            await trio.sleep(HOUSEKEEPING_INTERVAL_SECONDS)
            async with self.maintenance:
                await self._run_step("consume-queue flush", self.store.flush_consume_queues, store_config.flush_consume_queue_least_pages)
                await self._run_step("checkpoint", self.store.write_checkpoint)
            if trio.current_time() >= clean_at:
                clean_at = trio.current_time() + CLEAN_INTERVAL_SECONDS
                async with self.maintenance:
                    clean = functools.partial(self.store.clean_expired, now_ms_value=time.time_ns() // 1_000_000)  # mtimes are wall-clock
                    deleted = await self._run_step("retention", clean)
                if deleted and deleted is not FAILED:
                    LOGGER.info("retention deleted %d segment(s): %s", len(deleted), ", ".join(os.path.basename(p) for p in deleted))
        raise AssertionError("unreachable")

    async def scrub_task(self) -> None:
        rate = self.store.config.scrub_bytes_per_second
        if rate <= 0:
            return
        step_bytes = self.store.config.scrub_step_bytes
        while True:
            async with self.maintenance:
                step = await self._run_step("scrub", self.scrubber.step, step_bytes)
            if step is FAILED:
                await trio.sleep(SCRUB_PASS_PAUSE_SECONDS)
                continue
            for found in step.damaged:
                if self.store.record_damage(found):
                    LOGGER.error("scrub: damage in the log at %s; reads of it are refused until it is repaired "
                                 "from a peer", found.describe())  # fmt: skip
                    self.on_damage()
            for topic, queue_id, queue_offset in step.units_repaired:
                LOGGER.warning("scrub: consume queue %s/%d unit %d did not match its record: rewritten from it",
                               topic, queue_id, queue_offset)  # fmt: skip
            checked = step.checked_to - step.checked_from
            if step.pass_completed:
                await trio.sleep(SCRUB_PASS_PAUSE_SECONDS)
            else:
                await trio.sleep(max(checked / rate, SCRUB_STEP_PAUSE_MIN_SECONDS))
        raise AssertionError("unreachable")
