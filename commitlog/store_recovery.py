"""The log's ends in a ``MessageStore``: recovery at open (the steps of ``commitlog.store``'s theory
of operation, after the commit log's own ``CommitLog.recover``), and the cuts and resumptions of a
role change (``truncate``, ``resume_queue_offsets``, ``open_epoch``).

``StoreRecovery`` is a part of ``MessageStore`` (its base class): the methods run on the store's
own fields, as when they were written in the one class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from commitlog.log_recovery import DamagedLogError
from commitlog.dispatch import _runs_between, _topic_name
from commitlog.epoch import truncate_suffix_by_offset
from commitlog.mapped_file import StoreError

if TYPE_CHECKING:
    from commitlog.checkpoint import StoreCheckpoint
    from commitlog.commit_log import CommitLog
    from commitlog.config import StoreConfig
    from commitlog.consume_queue import ConsumeQueueStore
    from commitlog.epoch import EpochFile
    from commitlog.log_recovery import RecoveryReport
    from commitlog.record_crc import CrcFunction


class StoreRecovery:
    """Recovery and the log's cuts of ``MessageStore`` (see the module)."""

    path: str
    config: StoreConfig
    crc_function: CrcFunction
    commit_log: CommitLog
    consume_queues: ConsumeQueueStore
    checkpoint: StoreCheckpoint
    epochs: EpochFile
    recovery: RecoveryReport | None
    last_exit_ok: bool
    reput_from_offset: int
    queues_rebuilt: tuple[tuple[str, int], ...]
    dispatch_error: str | None

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
