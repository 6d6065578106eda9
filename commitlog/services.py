"""StoreServices: the store's background work on threads, for scripts, tools and benchmarks.

RocketMQ runs FlushRealTimeService or GroupCommitService, CommitRealTimeService and
ReputMessageService as threads; these are the same loops over ``MessageStore``'s step methods:

* flush: ASYNC_FLUSH flushes every ``flush_interval_commitlog_ms`` when at least
  ``flush_commitlog_least_pages`` pages are dirty (everything every thorough interval);
  SYNC_FLUSH is group commit: a producer registers the offset it needs, the flush thread runs one
  ``fdatasync`` for everything appended so far and releases every waiter it covered. Waiters not
  covered within ``sync_flush_timeout_ms`` get FLUSH_DISK_TIMEOUT (FlushDiskWatcher).
* commit (transient store pool only): copies write buffers into the files.
* dispatch: builds consume queue units, woken by appends and flushes.
* warm: keeps ``warm_ahead_size`` bytes ahead of the writer faulted in, and the next segment ready.
* housekeeping: consume queue flushes, the checkpoint, retention.

A full disk stops no thread: a step that meets it (``is_disk_full``) is tried again after
DISK_FULL_RETRY_SECONDS, the last such error kept in ``disk_full_error``; the puts meanwhile answer
DISK_FULL. A failed sync of the log fails the store's writes (``MessageStore.write_failure``) and
every waiting SYNC_FLUSH put (FLUSH_DISK_TIMEOUT); the loop goes on failing later waiters.

The broker does not use this module: it drives the same steps from trio tasks.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

from commitlog import record as rec
from commitlog.commit_log import AppendResult
from commitlog.mapped_file import StoreError, SyncFailedError, is_disk_full
from commitlog.store import MessageStore
from commitlog.waiters import OffsetWaiters, WaitersFull

HOUSEKEEPING_INTERVAL_SECONDS = 1.0
CLEAN_INTERVAL_SECONDS = 10.0
# Dispatch runs at most once per interval (ReputMessageService: every 1 ms) and sleeps at most
# the idle time when nothing wakes it.
DISPATCH_INTERVAL_SECONDS = 0.001
DISPATCH_IDLE_SECONDS = 0.1
# A step that met a full disk runs again after this long (the warm-up would otherwise create and
# remove a whole segment every warm_interval_ms).
DISK_FULL_RETRY_SECONDS = 1.0


class _Waiter:
    __slots__ = ("event", "ok")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.ok = False


class StoreServices:
    def __init__(self, store: MessageStore):
        self.store = store
        config = store.config
        self._stopping = threading.Event()
        self._flush_wakeup = threading.Condition()
        self._dispatch_wakeup = threading.Event()
        self._waiters: OffsetWaiters[_Waiter] = OffsetWaiters(waiters_max=config.group_commit_waiters_max)
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.disk_full_error: BaseException | None = None  # the last step that met a full disk

    def start(self) -> StoreServices:
        targets = [self._flush_loop, self._dispatch_loop, self._housekeeping_loop, self._warm_loop]
        if self.store.pool is not None:
            targets.append(self._commit_loop)
        for target in targets:
            thread = threading.Thread(target=self._guard(target), name=target.__name__.strip("_"), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._flush_wakeup:
            self._flush_wakeup.notify_all()
        self._dispatch_wakeup.set()
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        for waiter in self._waiters.drain():
            waiter.event.set()
        if self.errors:
            raise self.errors[0]

    def __enter__(self) -> StoreServices:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _guard(self, target):
        def run() -> None:
            try:
                target()
            except BaseException as error:  # surfaced by stop(); the store stays consistent
                self.errors.append(error)
                self._stopping.set()

        return run

    # -- producers ------------------------------------------------------------------------

    def put(self, messages: Sequence[rec.Message]) -> AppendResult:
        """Append and, under SYNC_FLUSH, wait until the records are on disk."""
        return self._after_append(self.store.append(messages))

    def put_batch(self, batch: rec.MessageBatch) -> AppendResult:
        """``put`` for a batch sharing topic and queue (the fast path)."""
        return self._after_append(self.store.append_batch(batch))

    def _after_append(self, result: AppendResult) -> AppendResult:
        if result.status is not rec.PutMessageStatus.PUT_OK:
            return result
        self._dispatch_wakeup.set()
        if self.store.sync_flush and not self.wait_flushed(result.next_offset):
            return _with_status(result, rec.PutMessageStatus.FLUSH_DISK_TIMEOUT)
        return result

    def wait_flushed(self, offset: int) -> bool:
        if self.store.commit_log.flushed_offset >= offset:
            return True
        timeout = self.store.config.sync_flush_timeout_seconds
        waiter = _Waiter()
        with self._flush_wakeup:
            try:
                self._waiters.add(offset, time.monotonic() + timeout, waiter)
            except WaitersFull:
                return False
            self._flush_wakeup.notify()
        waiter.event.wait()
        return waiter.ok

    # -- loops ----------------------------------------------------------------------------

    def _step(self, function, *args, **kwargs) -> bool:
        """``function(*args, **kwargs)``; False, after DISK_FULL_RETRY_SECONDS, when it met a full disk."""
        try:
            function(*args, **kwargs)
        except (StoreError, OSError) as error:
            if not is_disk_full(error):
                raise
            self.disk_full_error = error
            self._stopping.wait(DISK_FULL_RETRY_SECONDS)
            return False
        return True

    def _flush_loop(self) -> None:
        if self.store.sync_flush:
            self._group_commit_loop()
        else:
            self._async_flush_loop()

    def _group_commit_loop(self) -> None:
        while not self._stopping.is_set():
            with self._flush_wakeup:
                if not len(self._waiters):
                    self._flush_wakeup.wait(0.01)
            try:
                flushed = self.store.flush_commitlog(0)
            except SyncFailedError:  # never flushed again (write_failure): every waiter fails
                flushed = -1
                with self._flush_wakeup:
                    for waiter in self._waiters.drain():
                        waiter.event.set()
            self._dispatch_wakeup.set()
            with self._flush_wakeup:
                for waiter in self._waiters.release(flushed):
                    waiter.ok = True
                    waiter.event.set()
                for waiter in self._waiters.expire(time.monotonic()):
                    waiter.event.set()

    def _async_flush_loop(self) -> None:
        config = self.store.config
        interval = config.flush_interval_commitlog_seconds
        thorough = config.flush_commitlog_thorough_interval_seconds
        last_thorough = time.monotonic()
        while not self._stopping.wait(interval):
            now = time.monotonic()
            least_pages = config.flush_commitlog_least_pages
            if now - last_thorough >= thorough:
                least_pages, last_thorough = 0, now
            self._flush(least_pages)
        self._flush(0)

    def _flush(self, least_pages: int) -> None:
        """ASYNC_FLUSH's flush; a failed sync stops nothing here (the store refuses writes from
        then on, ``write_failure``, and every later flush raises at once without syncing)."""
        try:
            self.store.flush_commitlog(least_pages)
        except SyncFailedError:
            pass

    def _commit_loop(self) -> None:
        config = self.store.config
        interval = config.commit_interval_commitlog_seconds
        while not self._stopping.wait(interval):
            self.store.commit_commitlog(config.commit_commitlog_least_pages)
            self._dispatch_wakeup.set()

    def _dispatch_loop(self) -> None:
        while not self._stopping.is_set():
            self._dispatch_wakeup.wait(DISPATCH_IDLE_SECONDS)
            self._dispatch_wakeup.clear()
            while self.store.dispatch():
                pass
            # Coalesce: at most one pass per interval however many puts woke us (every wakeup
            # is a GIL hand-over the producers pay for).
            self._stopping.wait(DISPATCH_INTERVAL_SECONDS)

    def _warm_loop(self) -> None:
        interval = self.store.config.warm_interval_seconds
        while not self._stopping.wait(interval):
            self._step(self.store.warm_commitlog)

    def _housekeeping_loop(self) -> None:
        config = self.store.config
        thorough = config.flush_consume_queue_thorough_interval_seconds
        last_thorough = last_clean = time.monotonic()
        while not self._stopping.wait(HOUSEKEEPING_INTERVAL_SECONDS):
            now = time.monotonic()
            least_pages = config.flush_consume_queue_least_pages
            if now - last_thorough >= thorough:
                least_pages, last_thorough = 0, now
            self._step(self.store.flush_consume_queues, least_pages)
            self._step(self.store.write_checkpoint)
            if now - last_clean >= CLEAN_INTERVAL_SECONDS:
                last_clean = now
                self._step(self.store.clean_expired, now_ms_value=time.time_ns() // 1_000_000)


def _with_status(result: AppendResult, status: rec.PutMessageStatus) -> AppendResult:
    return dataclasses.replace(result, status=status)
