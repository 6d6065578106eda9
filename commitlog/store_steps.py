"""The steps a driver runs on a ``MessageStore`` (``commitlog.services.StoreServices`` on threads,
the broker's trio tasks): warming the next segment, committing and flushing the log, dispatching
records into consume queues (``commitlog.dispatch``), flushing those, writing the checkpoint, and
retention. Each returns or raises without having changed what it had not finished; the driver
runs it again later (see ``commitlog.store``'s "A full disk and a failed sync").

``StoreSteps`` is a part of ``MessageStore`` (its base class): the methods run on the store's
own fields, as when they were written in the one class.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from commitlog.disk_watch import disk_used_ratio
from commitlog.dispatch import (
    _STOP_BLANK,
    _STOP_MALFORMED,
    _STOP_SLOW,
    DISPATCH_RECORDS_PER_CALL,
    _dispatch_units_python,
    _topic_name,
    dispatch_units,
)
from commitlog.mapped_file import DiskFullError, SyncFailedError

if TYPE_CHECKING:
    from commitlog.checkpoint import StoreCheckpoint
    from commitlog.commit_log import CommitLog
    from commitlog.config import StoreConfig
    from commitlog.consume_queue import ConsumeQueueStore
    from commitlog.store import TransientStorePool


class StoreSteps:
    """The driver steps of ``MessageStore`` (see the module)."""

    path: str
    config: StoreConfig
    sync_flush: bool
    pool: TransientStorePool | None
    commit_log: CommitLog
    consume_queues: ConsumeQueueStore
    checkpoint: StoreCheckpoint
    reput_from_offset: int
    write_failure: str | None
    dispatch_error: str | None
    dispatch_blocked: str | None
    dispatch_skipped: int

    def warm_commitlog(self, ahead: int | None = None) -> None:
        """Fault in ``ahead`` bytes (default ``warm_ahead_size``) ahead of the writer and make the
        next segment when it is due; ``ahead=0`` only makes the segment."""
        self.commit_log.warm_ahead(self.config.warm_ahead_size if ahead is None else ahead)

    def commit_commitlog(self, least_pages: int = 0) -> int:
        committed = self.commit_log.commit(least_pages)
        self._return_write_buffers()
        return committed

    def flush_commitlog(self, least_pages: int = 0) -> int:
        """Commit and flush the commit log; record what is durable in the checkpoint fields.
        A sync that fails (SyncFailedError, raised) fails the store's writes, and every later
        call raises it again without syncing: see the module."""
        if self.write_failure is not None:
            raise SyncFailedError(self.write_failure)
        store_timestamp = self.commit_log.mapped_file_queue.store_timestamp
        try:
            flushed = self.commit_log.flush(least_pages, keep_cached=self.config.page_cache_keep_size)
        except SyncFailedError as error:
            self.fail_writes(f"the log's sync failed, no more writes until a restart: {error}")
            raise
        self._return_write_buffers()
        if flushed >= self.commit_log.max_wrote_offset and store_timestamp:
            self.checkpoint.physic_msg_timestamp = store_timestamp
        self.checkpoint.master_flushed_offset = flushed
        return flushed

    def _return_write_buffers(self) -> None:
        if self.pool is None:
            return
        for mapped_file in self.commit_log.mapped_file_queue.mapped_files:
            buffer = mapped_file.release_write_buffer()
            if buffer is not None:
                self.pool.give_back(buffer)

    @property
    def dispatch_end_offset(self) -> int:
        """Consume queues index only what is durable under SYNC_FLUSH (RocketMQ HEAD's
        getConfirmOffset); everything readable under ASYNC_FLUSH."""
        queue = self.commit_log.mapped_file_queue
        return queue.flushed_where if self.sync_flush else queue.max_offset

    def dispatch(self, max_bytes: int | None = None) -> int:
        """Build consume queue units for records from ``reput_from_offset``; return how many
        records were read. A record that cannot be parsed stops dispatch and is reported in
        ``dispatch_error`` (recovery validated the master's log; a slave's bytes come from its
        master and are only parsed here)."""
        if self.dispatch_error is not None:
            return 0
        end = self.dispatch_end_offset
        budget = max_bytes or self.config.dispatch_batch_size_max
        count = 0
        queue = self.commit_log.mapped_file_queue
        while self.reput_from_offset < end and budget > 0:
            offset = max(self.reput_from_offset, queue.min_offset)
            mapped_file = queue.find_mapped_file_by_offset(offset)
            if mapped_file is None:
                break
            base = mapped_file.file_from_offset
            start = offset - base
            limit = min(mapped_file.read_position, end - base)
            view = mapped_file.view()
            position, stop, records, runs = dispatch_units(view, start, limit, base, DISPATCH_RECORDS_PER_CALL)
            try:
                if stop == _STOP_SLOW:  # one record the native parser leaves to Python
                    self._put_runs(runs)
                    count += records
                    position, stop, records, runs = _dispatch_units_python(view, position, limit, base, records_max=1)
                self._put_runs(runs)
            except DiskFullError as error:  # a consume queue's next file: again later from here (put_run skips what it has)
                self.dispatch_blocked = str(error)
                return count
            self.dispatch_blocked = None
            count += records
            if stop == _STOP_MALFORMED:
                self.dispatch_error = f"record at offset {base + position} cannot be dispatched (malformed)"
                self.reput_from_offset = base + position
                return count
            if stop == _STOP_BLANK:
                position = mapped_file.file_size
            if position == start:
                break  # nothing readable yet (a write buffer not committed this far)
            budget -= position - start
            self.reput_from_offset = base + position
        return count

    def _put_runs(self, runs: list) -> None:
        for topic, queue_id, first_queue_offset, count, units, _first, last_end, store_ts in runs:
            name = _topic_name(topic)
            if name is None:
                self.dispatch_skipped += count
                continue
            self.consume_queues.find_or_create(name, queue_id).put_run(first_queue_offset, units, last_end, store_ts)

    def flush_consume_queues(self, least_pages: int = 0) -> None:
        newest = self.consume_queues.flush(least_pages)
        if newest:
            self.checkpoint.logics_msg_timestamp = newest

    def write_checkpoint(self) -> None:
        self.checkpoint.flush()

    def clean_expired(self, *, now_ms_value: int) -> list[str]:
        """Retention: delete the oldest segments older than ``file_reserved_time_hours`` at
        ``now_ms_value`` (wall-clock ms, as the files' mtimes; the driver reads the clock) or,
        while the disk is above ``disk_clean_ratio``, regardless of age. Never the newest
        segment, nor one not yet dispatched. Consume queue files pointing only below the new
        minimum follow."""
        now = now_ms_value
        reserved_ms = self.config.file_reserved_time_hours * 3600 * 1000
        files = self.commit_log.mapped_file_queue.mapped_files[:-1]
        over_ratio = disk_used_ratio(self.path) > self.config.disk_clean_ratio
        count = 0
        for mapped_file in files[: self.config.delete_segments_per_pass_max]:
            if mapped_file.file_from_offset + mapped_file.file_size > self.reput_from_offset:
                break
            age_ms = now - os.path.getmtime(mapped_file.path) * 1000
            if age_ms < reserved_ms and not over_ratio:
                break
            count += 1
        deleted = self.commit_log.mapped_file_queue.delete_first_files(count)
        if deleted:
            self.consume_queues.delete_expired(self.commit_log.min_offset)
        return deleted
