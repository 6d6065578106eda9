"""MessageStore: a store directory — commit log, consume queues, checkpoint, abort and lock files.

Theory of operation
-------------------
Opening a store takes the ``lock`` (a second process is refused), notes whether ``abort`` is
present (the last run crashed), loads the segments, recovers, and creates ``abort`` until ``close``.

Recovery (RocketMQ's ``DefaultMessageStore.recover``):

1. consume queues: each is read back to its last valid unit;
2. commit log: ``CommitLog.recover`` walks records from a safe segment and cuts at the first invalid
   one when it is a torn tail past the checkpoint's flushed offset (zeroing what follows and
   deleting later segments); damage below it is never cut: the store refuses to open
   (``DamagedLogError``, one line naming the range and ``hasvc store repair``);
3. consume queues are cut to the recovered log, and the last unit of each is checked against the
   record it names (a torn unit is dropped);
4. dispatch resumes: after a normal shutdown from the queues' high mark; after a crash from the
   start of the recovery scan, every record again (``put`` skips what is already there).

Nothing here runs by itself: flushing, committing, dispatching and cleaning are step methods that a
driver calls — ``commitlog.services.StoreServices`` (threads) or the broker (trio tasks).

A full disk and a failed sync
-----------------------------
Appends answer DISK_FULL while the disk is above ``disk_max_used_space_ratio`` (``DiskWatch``:
measured again after every file this process creates, and at least every
``disk_check_interval_ms``) and while no next segment can be created (``DiskWatch.no_room``:
until the next measurement is due). A step that meets a full disk (dispatch growing a consume
queue, the warm-up's spare segment, retention, the checkpoint) raises or returns without having
changed what it had not finished, and the driver runs it again later: none of them is fatal.
A failed sync of the log (``SyncFailedError``) is: the store keeps the reason in
``write_failure``, refuses every append from then on (SERVICE_NOT_AVAILABLE) and never flushes
the log again, so that nothing is counted durable that a failed sync may have lost (PostgreSQL's
fsyncgate). Reopening the store (a restart) recovers from what is on disk.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import struct
import time
from collections.abc import Iterator, Sequence

from commitlog import identity as store_identity
from commitlog import record as rec
from commitlog.checkpoint import StoreCheckpoint, StoreLock, create_abort_file, remove_abort_file
from commitlog.commit_log import AppendResult, CommitLog, DamagedLogError, RecoveryReport
from commitlog.config import FlushDiskType, StoreConfig
from commitlog.consume_queue import CQ_UNIT, ConsumeQueueStore
from commitlog.damage import DamagedRange
from commitlog.epoch import EpochFile, truncate_suffix_by_offset
from commitlog.scan import ScanCode, scan_segment
from commitlog.mapped_file import DiskFullError, FilesCreated, StoreError, SyncFailedError
from commitlog.mapped_file_queue import MappedFileQueue

from commitlog import native as _native
from commitlog import read_check


class TransientStorePool:
    """Write buffers for segments (transientStorePoolEnable): appends land in memory and the
    commit step copies them into the file. Bounded: with every buffer in use a new segment is
    written directly through its mapping, as if the pool were off."""

    def __init__(self, *, buffers_max: int, buffer_size: int):
        self.buffers_max = buffers_max
        self.buffer_size = buffer_size
        self._free: list[bytearray] = []
        self._created = 0

    def borrow(self) -> bytearray | None:
        if self._free:
            return self._free.pop()
        if self._created < self.buffers_max:
            self._created += 1
            return bytearray(self.buffer_size)
        return None

    def give_back(self, buffer: bytearray) -> None:
        assert len(buffer) == self.buffer_size
        self._free.append(buffer)

    @property
    def available(self) -> int:
        return len(self._free) + self.buffers_max - self._created


class DiskWatch:
    """Whether appends must answer DISK_FULL. The disk's use is measured (``statvfs``) at most
    once per ``interval_seconds`` of the time given, and again as soon as this process has
    created a file since (``FilesCreated``): segments and consume-queue files are preallocated
    whole, so the disk's use jumps when one is made and hardly moves between (a master filling a
    64 MiB disk at full speed filled it between two measurements a second apart and never
    answered DISK_FULL). Others' writes are seen within the interval. ``no_room``: a segment
    could not be created: full until the next measurement is due (the append just before had
    the disk measured, or trusted a measurement, less than an interval ago)."""

    __slots__ = ("path", "ratio_max", "interval_seconds", "due_at", "files_created", "used_ratio", "full", "reason")

    def __init__(self, path: str, *, ratio_max: float, interval_seconds: float) -> None:
        self.path = path
        self.ratio_max = ratio_max
        self.interval_seconds = interval_seconds
        self.due_at = float("-inf")  # the next measurement, in the caller's (monotonic) seconds
        self.files_created = -1  # FilesCreated.count at the last measurement
        self.used_ratio = 0.0
        self.full = False
        self.reason = ""

    def full_at(self, now: float) -> bool:
        if now < self.due_at and self.files_created == FilesCreated.count:
            return self.full
        self.due_at = now + self.interval_seconds
        self.files_created = FilesCreated.count
        self.used_ratio = disk_used_ratio(self.path)
        self.full = self.used_ratio > self.ratio_max
        self.reason = (f"{self.path}: disk {self.used_ratio:.0%} used, above disk_max_used_space_ratio "
                       f"{self.ratio_max:.0%}" if self.full else "")  # fmt: skip
        return self.full

    def no_room(self, reason: str) -> None:
        self.full = True
        self.reason = reason
        self.files_created = FilesCreated.count


@dataclasses.dataclass(frozen=True, slots=True)
class StoreStatistics:
    min_offset: int
    max_offset: int
    flushed_offset: int
    committed_offset: int
    dispatched_offset: int
    segments: int
    consume_queues: int
    disk_used_ratio: float


class MessageStore:
    def __init__(self, path: str, config: StoreConfig | None = None, *, check_identity: bool = True):
        self.path = path
        self.check_identity = check_identity  # False: a DLedger store's smooth upgrade, which checked it already
        self.identity: store_identity.StoreIdentity | None = None  # STORE/identity, once open
        self.config = (config or StoreConfig()).validate()
        self.crc_function = self.config.crc_function
        # SYNC_FLUSH (group commit) or not: the config is frozen, and dispatch asks twice a put.
        self.sync_flush = self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self.pool = (
            TransientStorePool(
                buffers_max=self.config.transient_store_pool_size, buffer_size=self.config.commitlog_segment_size
            )
            if self.config.transient_store_pool_enable
            else None
        )
        self.commit_log = CommitLog(
            os.path.join(path, "commitlog"),
            segment_size=self.config.commitlog_segment_size,
            store_host=self.config.store_host,
            write_buffer_source=self.pool.borrow if self.pool else None,
            small_pages=self.config.small_write_pages,
            preallocate_step_size=self.config.preallocate_step_size,
        )
        self.consume_queues = ConsumeQueueStore(
            os.path.join(path, "consumequeue"), units_per_file=self.config.consume_queue_units_per_file
        )
        self.checkpoint: StoreCheckpoint | None = None
        self.epochs: EpochFile | None = None
        self.recovery: RecoveryReport | None = None
        self.last_exit_ok = True
        self.reput_from_offset = 0
        self.epoch_damage = ""  # what was wrong with the epoch file or its copy at open (both rewritten)
        self.queues_rebuilt: tuple[tuple[str, int], ...] = ()  # (topic, queue id) recovery found cut by damage
        self.dispatch_error: str | None = None
        self.dispatch_skipped = 0  # records whose topic cannot name a consume queue
        self.damaged: list[DamagedRange] = []  # damage found (by recovery, reads, the scrub): STATUS ``damaged``
        self._lock: StoreLock | None = None
        self.disk = DiskWatch(path, ratio_max=self.config.disk_max_used_space_ratio,
                              interval_seconds=self.config.disk_check_interval_seconds)  # fmt: skip
        # Why the store takes no more writes (a failed sync of the log), or None: see the module.
        self.write_failure: str | None = None
        # Why dispatch stopped short (no room for a consume-queue file), or None; it runs again later.
        self.dispatch_blocked: str | None = None
        self._opened = False

    # -- lifetime -------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str, config: StoreConfig | None = None, *, check_identity: bool = True) -> MessageStore:
        store = cls(path, config, check_identity=check_identity)
        store._open()
        return store

    def _open(self) -> None:
        if self.check_identity:  # before anything is created or written: a refusal leaves the store as it was
            store_identity.check(self.path, store_identity.CLASSIC)
        os.makedirs(self.path, exist_ok=True)
        existing = MappedFileQueue.infer_file_size(os.path.join(self.path, "commitlog"))
        if existing is not None and existing != self.config.commitlog_segment_size:
            raise StoreError(
                f"{self.path}/commitlog: segments are {existing} bytes but commitlog_segment_size is "
                f"{self.config.commitlog_segment_size}"
            )
        self._lock = StoreLock(os.path.join(self.path, "lock"))
        try:
            if self.check_identity:
                self.identity = store_identity.claim(self.path, store_identity.CLASSIC)
            abort_path = os.path.join(self.path, "abort")
            self.last_exit_ok = not os.path.exists(abort_path)
            self.checkpoint = StoreCheckpoint.open(os.path.join(self.path, "checkpoint"))
            self.epochs = EpochFile.open(self.path)
            self.epoch_damage = self.epochs.heal()  # one copy damaged: both written anew from the other
            self.commit_log.load()
            self.consume_queues.load()
            self._recover()
            create_abort_file(abort_path)
        except BaseException:
            self.commit_log.close()
            self.consume_queues.close()
            self._lock.release()
            raise
        self._opened = True

    def _recover(self) -> None:
        queues = self.consume_queues
        queues.recover()
        dispatch_from = queues.max_physic_offset
        self.recovery = self.commit_log.recover(
            abnormal=not self.last_exit_ok,
            dispatch_from=dispatch_from,
            checkpoint_min_timestamp=self.checkpoint.min_timestamp,
            crc_function=self.crc_function if self.config.check_crc_on_recover else None,
            cut_segments_max=self.config.recovery_cut_segments_max,
            flushed_offset=self.checkpoint.recovery_flushed_offset,
        )
        if self.recovery.damaged:
            raise DamagedLogError(self.path, self.recovery)
        end = self.recovery.end_offset
        self._lower_flushed_offset(end)
        if not self.commit_log.mapped_file_queue.mapped_files:
            queues.destroy()
        queues.truncate_dirty(end)
        queues.drop_torn_units(self.commit_log.get_record, min_offset=0, last_exit_ok=self.last_exit_ok)
        if self.last_exit_ok:
            self.reput_from_offset = max(queues.max_physic_offset, self.commit_log.min_offset)
        else:
            self.reput_from_offset = max(self.recovery.start_offset, self.commit_log.min_offset)
        # Queues cut by damage (not at their tail) are rebuilt from the log: dispatch from the
        # oldest such queue's end (a record end: its last unit was checked against its record).
        rebuilt = [queue for queue in queues.queues.values() if queue.cut_in_recovery]
        if rebuilt:
            self.reput_from_offset = max(min(self.reput_from_offset, *(q.max_physic_offset for q in rebuilt)),
                                         self.commit_log.min_offset)  # fmt: skip
        self.queues_rebuilt = tuple(sorted((q.topic, q.queue_id) for q in rebuilt))
        self._dispatch_to_the_end()
        self.commit_log.topic_queue_table = self._queue_offsets_at_log_end()

    def _dispatch_to_the_end(self) -> None:
        """Dispatch until nothing more moves (the log's end, or a step that cannot go on: no room
        for a queue file, a record that cannot be parsed). One step is not enough: after a crash
        dispatch starts again at the recovery scan's first segment, and one step's budget
        (``dispatch_batch_size_max``) may end before the records the last run never indexed."""
        while True:
            before = self.reput_from_offset
            self.dispatch()
            if self.reput_from_offset == before:
                return

    def _queue_offsets_at_log_end(self) -> dict[tuple[str, int], int]:
        """The next queue offset of every queue after the log's last record: the consume queues'
        ends, raised by the queue offsets of records dispatch has not reached (a step stopped
        short). Taken from the queues alone, the next puts would reuse queue offsets that records
        of the log already hold, and a consumer would never see them (found by the corrupt drill:
        a master killed with its dispatcher 4 MiB behind)."""
        table = self.consume_queues.queue_offset_table()
        queue = self.commit_log.mapped_file_queue
        offset, end = max(self.reput_from_offset, queue.min_offset), self.commit_log.max_offset
        while offset < end:
            mapped_file = queue.find_mapped_file_by_offset(offset)
            if mapped_file is None:
                break
            base = mapped_file.file_from_offset
            position = offset - base
            limit = min(mapped_file.read_position, end - base)
            for topic, queue_id, first, count, *_ in _runs_between(mapped_file.view(), position, limit, base):
                name = _topic_name(topic)
                if name is not None:
                    table[(name, queue_id)] = max(table.get((name, queue_id), 0), first + count)
            offset = base + mapped_file.file_size
        return table

    def _lower_flushed_offset(self, end: int) -> None:
        """Before the log is cut at ``end`` (or after recovery cut it there), the checkpoint's
        flushed offset comes down to it, on disk: bytes written there later are not yet flushed,
        and a torn write of them must not read as damage after a crash."""
        if end < self.checkpoint.master_flushed_offset:
            self.checkpoint.master_flushed_offset = end
            self.checkpoint.flush()

    def record_damage(self, found: DamagedRange) -> bool:
        """Remember damage found in the log (once per spot: a range overlapping one known is not
        added); True when it is new."""
        return read_check.add_damage(self.damaged, found)

    def clear_damage(self, *, from_offset: int, to_offset: int) -> None:
        """Forget the damage lying within ``[from_offset, to_offset)``: those bytes were rewritten
        and check clean."""
        self.damaged[:] = [found for found in self.damaged
                           if not (from_offset <= found.from_offset and found.to_offset <= to_offset)]  # fmt: skip

    def close(self, *, clean: bool = True) -> None:
        """Flush everything, write the checkpoint, remove ``abort`` (only if all is dispatched).

        ``clean=False`` lets go of the files as a killed process would: nothing flushed, ``abort``
        left in place (what was written stays in the page cache, as after SIGKILL). A store whose
        writes failed (``write_failure``) closes so too: nothing it holds is known durable past
        its last good sync, and the next open recovers as after a crash."""
        if not self._opened:
            return
        self._opened = False
        if not clean or self.write_failure is not None:
            self.commit_log.close()
            self.consume_queues.close()
            self._lock.release()
            return
        try:
            self.flush_commitlog(0)
            self.dispatch()
            self.flush_consume_queues(0)
            self.write_checkpoint()
            if self.dispatch_error is None and self.reput_from_offset >= self.commit_log.max_offset:
                remove_abort_file(os.path.join(self.path, "abort"))
        finally:
            self.commit_log.close()
            self.consume_queues.close()
            self._lock.release()

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------

    def prepare(self, messages: Sequence[rec.Message]) -> list[rec.PreparedMessage]:
        """Validate and pre-encode (outside any lock). Raises MessageRejected."""
        body_size_max = self.config.max_message_size
        prepared = [
            rec.prepare_message(
                message, crc_function=self.crc_function, body_size_max=body_size_max, record_crc=self.config.append_record_crc
            )
            for message in messages
        ]
        if len(prepared) > 1:
            total_body = sum(len(message.message.body) for message in prepared)
            if total_body > body_size_max:
                raise rec.MessageRejected(
                    rec.PutMessageStatus.MESSAGE_ILLEGAL,
                    f"batch bodies total {total_body} bytes, more than max_message_size {body_size_max}",
                )
        return prepared

    def append(self, messages: Sequence[rec.Message]) -> AppendResult:
        """Validate and append; no waiting for flush (the driver does that for SYNC_FLUSH)."""
        if len(messages) == 1 and _batchable(messages[0]):
            message = messages[0]
            return self.append_batch(
                rec.MessageBatch(
                    message.topic, [message.body], queue_id=message.queue_id, properties=message.properties,
                    flag=message.flag, born_timestamp=message.born_timestamp, born_host=message.born_host,
                    sysflag=message.sysflag,
                )  # fmt: skip
            )
        try:
            prepared = self.prepare(messages)
        except rec.MessageRejected as error:
            return AppendResult(error.status, reason=error.reason)
        return self.append_prepared(prepared)

    def append_prepared(self, prepared: Sequence[rec.PreparedMessage]) -> AppendResult:
        if self.write_failure is not None or self.disk_full():
            return self._refusal()
        return self._noted(self.commit_log.append(prepared))

    def _refusal(self) -> AppendResult:
        if self.write_failure is not None:
            return AppendResult(rec.PutMessageStatus.SERVICE_NOT_AVAILABLE, reason=self.write_failure)
        return AppendResult(rec.PutMessageStatus.DISK_FULL, reason=self.disk.reason)

    def _noted(self, result: AppendResult) -> AppendResult:
        """A DISK_FULL from the log (no next segment) holds until the next measurement."""
        if result.status is rec.PutMessageStatus.DISK_FULL:
            self.disk.no_room(result.reason)
        return result

    def fail_writes(self, reason: str) -> None:
        """Take no more writes (a sync failed, here or in a driver's step): see the module."""
        if self.write_failure is None:
            self.write_failure = reason

    def append_batch(self, batch: rec.MessageBatch) -> AppendResult:
        """Validate and append a batch sharing topic and queue (the fast path)."""
        try:
            prepared = rec.prepare_batch(
                batch, body_size_max=self.config.max_message_size, store_v6=self.commit_log.store_v6,
                record_crc=self.config.append_record_crc,
            )  # fmt: skip
        except rec.MessageRejected as error:
            return AppendResult(error.status, reason=error.reason)
        if self.write_failure is not None or self.disk_full():
            return self._refusal()
        result = self.commit_log.append_batch(prepared, crc_function=self.crc_function)
        if result.status is rec.PutMessageStatus.DISK_FULL:  # _noted, written out (a put's one pass)
            self.disk.no_room(result.reason)
        return result

    def append_replicated(self, offset: int, data) -> None:
        if self.write_failure is not None:
            raise StoreError(self.write_failure)
        self.commit_log.append_replicated(offset, data)

    def disk_full(self) -> bool:
        """``disk_full_at`` now: the append path's one clock read (an argument per append would
        cost every caller a clock read of its own). ``DiskWatch.full_at``'s test written out."""
        now = time.monotonic()
        disk = self.disk
        if now < disk.due_at and disk.files_created == FilesCreated.count:
            return disk.full
        return disk.full_at(now)

    def disk_full_at(self, now: float) -> bool:
        """Whether appends answer DISK_FULL at ``now`` (monotonic seconds): see ``DiskWatch``."""
        return self.disk.full_at(now)

    # -- driver steps ---------------------------------------------------------------------

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

    # -- reading --------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """The oldest offset still in the log (retention moves it up)."""
        return self.commit_log.min_offset

    def get_record(self, offset: int, *, check_crc: bool = False) -> rec.Record:
        """The record at ``offset``; with ``check_crc`` a record that fails its body CRC, or its
        record CRC when it has the tail, raises ``DamagedRecordError`` (and is added to ``damaged``)."""
        record = self.commit_log.get_record(offset)
        if check_crc and not rec.crcs_ok(self.commit_log.read(offset, record.size), 0, record, self.crc_function):
            body_ok = self.crc_function(record.body) & rec.CRC_MASK == record.body_crc
            reason = "record CRC mismatch" if body_ok else "body CRC mismatch"
            damage = DamagedRange(self._segment_path(offset), offset, offset + record.size, reason)
            read_check.add_damage(self.damaged, damage)
            raise read_check.DamagedRecordError(damage)
        return record

    def read(self, offset: int, size_max: int) -> memoryview:
        return self.commit_log.read(offset, size_max)

    def read_records(self, spans: Sequence[tuple], *, copy: bool = False) -> read_check.CheckedRead:
        """The records at ``spans`` ((offset, size, ...): a consume queue's units), checked unless
        ``check_crc_on_read`` is off (commitlog/read_check.py); damage found joins ``damaged``.
        ``copy``: bytes copies rather than views of the mapping."""
        checked = read_check.read_records(self._segment_of, spans, crc_function=self.crc_function, check=self.config.check_crc_on_read,
                                          copy=copy)  # fmt: skip
        return read_check.noted(checked, self.damaged)

    def read_checked(self, offset: int, size_max: int) -> read_check.CheckedRead:
        """``read`` for a reader that gets raw bytes (READ), checked as ``read_check.read_range`` says."""
        if not self.config.check_crc_on_read:
            return read_check.CheckedRead([self.read(offset, size_max)])
        mapped_file = self.commit_log.transfer_span(offset, 0)[0]  # ReadError outside the log, as read
        checked = read_check.read_range(self.read, self._segment_path, offset, size_max, crc_function=self.crc_function,
                                        segment_end=mapped_file.file_from_offset + mapped_file.file_size)  # fmt: skip
        return read_check.noted(checked, self.damaged)

    def _segment_path(self, offset: int) -> str:
        return self.commit_log.mapped_file_queue.find_mapped_file_by_offset(offset).path

    def _segment_of(self, offset: int) -> read_check.Segment:
        mapped_file = self.commit_log.transfer_span(offset, 0)[0]  # ReadError outside the log
        return mapped_file.view()[: mapped_file.read_position], mapped_file.file_from_offset, mapped_file.path

    def pull(self, topic: str, queue_id: int, queue_offset: int, count_max: int) -> list[rec.Record]:
        """Up to ``count_max`` records from the queue, checked (``read_records``): the records
        before a damaged one; ``DamagedRecordError`` when the first one is damaged."""
        queue = self.consume_queues.find(topic, queue_id)
        if queue is None:
            return []
        units = queue.read(queue_offset, count_max)
        if not self.config.check_crc_on_read:
            return [self.commit_log.get_record(offset) for offset, _size, _tags in units]
        checked = self.read_records(units)
        if checked.damage is not None and not checked.views:
            raise read_check.DamagedRecordError(checked.damage)
        return [rec.decode_record(view, crc_function=None) for view in checked.views]

    def truncate(self, offset: int) -> None:
        """Cut the log, the consume queues and the epoch history at ``offset`` (a record boundary;
        a broker rejoining as a slave after failover)."""
        self._lower_flushed_offset(offset)
        self.commit_log.truncate(offset)
        self.consume_queues.truncate_dirty(offset)
        self.reput_from_offset = min(self.reput_from_offset, offset)
        self.dispatch_error = None
        self.commit_log.topic_queue_table = self.consume_queues.queue_offset_table()
        self.epochs.replace(truncate_suffix_by_offset(self.epochs.entries, offset))

    def resume_queue_offsets(self) -> None:
        """Before a promoted slave takes writes: flush and dispatch every replicated record, then
        continue each queue's offsets from its consume queue. Replication writes records, not the
        append path's ``topic_queue_table``; without this a new master's first writes would reuse
        queue offsets that replicated records already hold (RocketMQ: recoverTopicQueueTable on
        the role change)."""
        self.commit_log.flush()
        self._dispatch_to_the_end()
        if self.dispatch_error is not None:
            raise StoreError(f"cannot take writes: {self.dispatch_error}")
        self.commit_log.topic_queue_table = self._queue_offsets_at_log_end()  # dispatch may stop short (no room for a queue file)

    def open_epoch(self, epoch: int) -> None:
        """A new master's epoch, starting at the log's end. Entries a slave adopted from its
        master that start past its own end (it had not caught up to them: that master's bytes
        from there on are not in this log) are cut first; without that the history could not
        grow and the promotion failed (found by the classic cluster simulation)."""
        end = self.commit_log.max_offset
        kept = [entry for entry in self.epochs.entries if entry.start_offset <= end]
        if len(kept) < len(self.epochs.entries):
            self.epochs.replace(kept)
        self.epochs.append(epoch, end)

    def last_record_end(self) -> int:
        """The end of the last complete, valid record: a slave's log may end in the middle of a
        record (frames are cut by size), and a new master must start after whole records."""
        last = self.commit_log.mapped_file_queue.last
        if last is None:
            return self.commit_log.min_offset
        result = scan_segment(last.view(), start=0, end=last.wrote_position if last.wrote_position < last.file_size else last.file_size,
                              file_from_offset=last.file_from_offset, crc_function=self.crc_function)  # fmt: skip
        return last.offset_of(last.file_size if result.code is ScanCode.END_OF_SEGMENT else result.position)

    def tail_start(self, span_bytes: int) -> int:
        """The first record boundary at or before ``max_offset - span_bytes`` (found by walking
        size words from the start of that segment; may be a blank record's start)."""
        log = self.commit_log
        target = max(log.min_offset, log.max_offset - span_bytes)
        if target >= log.max_offset:
            return log.max_offset
        mapped_file = log.mapped_file_queue.find_mapped_file_by_offset(target)
        position = target - mapped_file.file_from_offset
        if position:
            walk = scan_segment(mapped_file.view(), start=0, end=position, file_from_offset=mapped_file.file_from_offset, crc_function=None)
            position = walk.position
        return mapped_file.file_from_offset + position

    def find_at_record_ends(self, span_bytes: int, pattern: re.Pattern, *, start_offset: int | None = None,
                            end_offset: int | None = None) -> Iterator[tuple[re.Match, RecordPlace]]:  # fmt: skip
        """Matches of ``pattern`` that end exactly where a record ends, or where its CRC tail
        starts (so they lie in its properties, the record's last field, never in its body), in the last ``span_bytes`` of
        the log, with where that record is. Fast: the regex engine finds candidates and the
        dispatch parser (native when built) locates records; no record is decoded in Python.
        ``start_offset``/``end_offset``: record boundaries to search between instead (a slave
        following its log's growth)."""
        log = self.commit_log
        offset = self.tail_start(span_bytes) if start_offset is None else start_offset
        stop = log.max_offset if end_offset is None else min(end_offset, log.max_offset)
        while offset < stop:
            mapped_file = log.mapped_file_queue.find_mapped_file_by_offset(offset)
            base = mapped_file.file_from_offset
            start = offset - base
            limit = min(mapped_file.read_position, stop - base)
            view = mapped_file.view()
            matches = list(pattern.finditer(view, start, limit))
            if matches:
                places = {offset + size - base: (offset, size, queue_id, queue_offset)
                          for offset, size, queue_id, queue_offset in _record_places(view, start, limit, base)}  # fmt: skip
                for match in matches:
                    place = places.get(match.end())
                    if place is None and view[match.end() : match.end() + len(rec.RECORD_CRC_TAIL_PREFIX)] == rec.RECORD_CRC_TAIL_PREFIX:
                        # The record CRC tail follows the last property (it never follows a body).
                        place = places.get(match.end() + rec.RECORD_CRC_TAIL_SIZE)
                    if place is not None:
                        yield match, RecordPlace(*place)
            offset = base + log.segment_size

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            min_offset=self.commit_log.min_offset,
            max_offset=self.commit_log.max_offset,
            flushed_offset=self.commit_log.flushed_offset,
            committed_offset=self.commit_log.committed_offset,
            dispatched_offset=self.reput_from_offset,
            segments=len(self.commit_log.mapped_file_queue.mapped_files),
            consume_queues=len(self.consume_queues.queues),
            disk_used_ratio=disk_used_ratio(self.path),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class RecordPlace:
    offset: int
    size: int
    queue_id: int
    queue_offset: int


def _record_places(view: memoryview, start: int, limit: int, base: int) -> list[tuple[int, int, int, int]]:
    """(offset, size, queue id, queue offset) of each queued record in ``view[start:limit]`` is, from the dispatch parser (records
    that get no consume queue unit, prepared and rolled-back transactions, are left out)."""
    return list(_places_of(_runs_between(view, start, limit, base)))


def _runs_between(view: memoryview, start: int, limit: int, base: int) -> list[tuple]:
    """The dispatch parser's runs of the records in ``view[start:limit]`` (to a blank, a record
    that cannot be parsed, or ``limit``), without writing any unit."""
    found = []
    position = start
    while position < limit:
        before = position
        position, stop, _records, runs = dispatch_units(view, position, limit, base, DISPATCH_RECORDS_PER_CALL)
        found += runs
        if stop == _STOP_SLOW:
            position, stop, _records, runs = _dispatch_units_python(view, position, limit, base, records_max=1)
            found += runs
        if stop in (_STOP_BLANK, _STOP_MALFORMED) or position == before:
            break
    return found


def _places_of(runs) -> Iterator[tuple[int, int, int, int]]:
    for _topic, queue_id, first_queue_offset, _count, units, *_ in runs:
        for index, (offset, size, _tags) in enumerate(CQ_UNIT.iter_unpack(units), first_queue_offset):
            yield offset, size, queue_id, index


def _batchable(message: rec.Message) -> bool:
    """A message the batch path encodes identically (it writes RECONSUMETIMES and
    PREPARED_TX_OFFSET as 0)."""
    return message.reconsume_times == 0 and message.prepared_transaction_offset == 0


_STOP_LIMIT, _STOP_BLANK, _STOP_MALFORMED, _STOP_SLOW = 0, 1, 2, 3
# Records parsed per call: bounds the runs built in one go.
DISPATCH_RECORDS_PER_CALL = 4096


def _dispatch_units_python(view: memoryview, start: int, limit: int, base: int, records_max: int = DISPATCH_RECORDS_PER_CALL):
    """Python twin of the native ``dispatch_units``: parse records from ``start`` and group them
    into runs per queue with consecutive queue offsets, units packed. Returns ``(stop position,
    stop kind, records read, [(topic bytes, queue id, first queue offset, count, units, first
    offset, last end, max store timestamp)])``."""
    runs: list[list] = []
    newest: dict[tuple[bytes, int], list] = {}
    position = start
    records = 0
    stop = _STOP_LIMIT
    pack = CQ_UNIT.pack
    while position < limit and records < records_max:
        if limit - position < 8:
            break  # the rest of this record has not arrived (a slave between two frames)
        if rec.peek_blank(view, position) is not None:
            stop = _STOP_BLANK
            break
        size, magic = rec.BLANK.unpack_from(view, position)
        if magic in (rec.MAGIC_V1, rec.MAGIC_V2) and size >= 91 and size > limit - position:
            break  # incomplete: wait for more bytes, as ReputMessageService does
        try:
            size, physical, topic, queue_id, queue_offset, sysflag, store_ts, tags = rec.decode_dispatch(
                view, position, limit
            )
        except rec.RecordError:
            stop = _STOP_MALFORMED
            break
        if physical != base + position:
            stop = _STOP_MALFORMED
            break
        records += 1
        offset = base + position
        position += size
        transaction = sysflag & rec.SYSFLAG_TRANSACTION_MASK
        if transaction in (rec.SYSFLAG_TRANSACTION_PREPARED, rec.SYSFLAG_TRANSACTION_ROLLBACK):
            continue
        key = (topic.encode(), queue_id)
        run = newest.get(key)
        if run is None or run[2] + run[3] != queue_offset:
            run = [key[0], queue_id, queue_offset, 0, bytearray(), offset, 0, store_ts]
            runs.append(run)
            newest[key] = run
        run[3] += 1
        run[4] += pack(offset, size, tags)
        run[6] = offset + size
        run[7] = max(run[7], store_ts)
    return position, stop, records, [(t, q, f, c, bytes(u), o, e, s) for t, q, f, c, u, o, e, s in runs]


dispatch_units = _native.dispatch_units or _dispatch_units_python


def _dispatch_entries_python(view: memoryview, start: int, limit: int, base: int, records_max: int,
                             entry_header: int) -> tuple[int, int, int, list[tuple]]:  # fmt: skip
    """Python twin of the native ``dispatch_units(..., entry_header)``: walk DLedger entries from
    ``start`` (each ``[magic 1][size]...``, a header of ``entry_header`` bytes and one record or,
    a no-op, none) and group their records' units into runs as ``dispatch_units`` does. Returns
    ``(position, stop kind, entries read, runs)``; a stop names the entry it stopped at: 1 a blank
    (magic -1), 2 an entry not whole or whose body is not exactly one record."""
    runs: list[list] = []
    newest: dict[tuple[bytes, int], list] = {}
    position, entries, stop = start, 0, _STOP_LIMIT
    while position < limit and entries < records_max:
        if limit - position < 8:
            stop = _STOP_MALFORMED
            break
        magic, size = _ENTRY_MAGIC_SIZE.unpack_from(view, position)
        if magic == -1:
            stop = _STOP_BLANK
            break
        if magic != 1 or not entry_header <= size <= limit - position:
            stop = _STOP_MALFORMED
            break
        if size > entry_header:
            end, kind, records, found = _dispatch_units_python(view, position + entry_header, position + size, base, 1)
            if kind != _STOP_LIMIT or records != 1 or end != position + size:
                stop = _STOP_MALFORMED
                break
            for topic, queue_id, first, count, units, first_offset, last_end, store_ts in found:
                run = newest.get((topic, queue_id))
                if run is None or run[2] + run[3] != first:
                    run = newest[(topic, queue_id)] = [topic, queue_id, first, 0, bytearray(), first_offset, 0, store_ts]
                    runs.append(run)
                run[3] += count
                run[4] += units
                run[6] = last_end
                run[7] = max(run[7], store_ts)
        position += size
        entries += 1
    return position, stop, entries, [(t, q, f, c, bytes(u), o, e, s) for t, q, f, c, u, o, e, s in runs]


_ENTRY_MAGIC_SIZE = struct.Struct(">ii")  # a DLedger entry header's first two fields (commitlog.dledger.entry_codec)


def dispatch_entries(view, start: int, limit: int, base: int, records_max: int, entry_header: int):
    """``dispatch_units`` over DLedger entries: one native walk (``_STOP_SLOW`` at an entry whose
    TAGS are not UTF-8: the caller takes that one through the twin), else the twin."""
    if _native.dispatch_units is not None:
        return _native.dispatch_units(view, start, limit, base, records_max, entry_header)
    return _dispatch_entries_python(view, start, limit, base, records_max, entry_header)


@functools.lru_cache(maxsize=4096)
@functools.lru_cache(maxsize=1024)
def _topic_name(topic: bytes) -> str | None:
    """The topic as a directory name, or None when it cannot be one (skipped, counted). Cached:
    the same few topics come back in every dispatch."""
    try:
        text = topic.decode()
    except UnicodeDecodeError:
        return None
    return text if rec.TOPIC_PATTERN.fullmatch(text) else None


def disk_used_ratio(path: str) -> float:
    """The disk's fill as ``df`` shows it: used / (used + available to us). Blocks reserved for
    root, or held back by the volume, count as neither: ``1 - available / total`` called a disk
    that ``df`` shows 37 % full 74 % full, and retention began deleting segments regardless of age."""
    stat = os.statvfs(path)
    used = stat.f_blocks - stat.f_bfree
    capacity = used + stat.f_bavail
    if capacity <= 0:
        return 0.0
    return used / capacity
