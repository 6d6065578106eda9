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
import os
import time
from collections.abc import Sequence

from commitlog import identity as store_identity
from commitlog import read_check
from commitlog import record as rec
from commitlog.checkpoint import StoreCheckpoint, StoreLock, create_abort_file, remove_abort_file
from commitlog.commit_log import AppendResult, CommitLog
from commitlog.config import FlushDiskType, StoreConfig
from commitlog.consume_queue import ConsumeQueueStore
from commitlog.damage import DamagedRange
from commitlog.disk_watch import DiskWatch, disk_used_ratio
from commitlog.epoch import EpochFile
from commitlog.log_recovery import RecoveryReport
from commitlog.mapped_file import FilesCreated, StoreError
from commitlog.mapped_file_queue import MappedFileQueue
from commitlog.store_reads import StoreReads
from commitlog.store_recovery import StoreRecovery
from commitlog.store_steps import StoreSteps


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


class MessageStore(StoreRecovery, StoreSteps, StoreReads):
    """A store directory, opened (see the module). Its parts by concern: opening, closing and
    appending here; recovery and the log's cuts in ``StoreRecovery`` (``commitlog.store_recovery``),
    the driver's steps in ``StoreSteps`` (``commitlog.store_steps``), reads in ``StoreReads``
    (``commitlog.store_reads``)."""

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

    # -- statistics -----------------------------------------------------------------------

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


def _batchable(message: rec.Message) -> bool:
    """A message the batch path encodes identically (it writes RECONSUMETIMES and
    PREPARED_TX_OFFSET as 0)."""
    return message.reconsume_times == 0 and message.prepared_transaction_offset == 0

