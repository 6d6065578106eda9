"""CommitLog: the message log. Append, append replicated bytes, read, flush, commit, recover.

Theory of operation
-------------------
Appends hold the put lock, take the last segment (rolling to a new one when the batch plus an
8-byte blank does not fit, after writing the blank), assign each record its physical offset,
queue offset and store timestamp, encode the records straight into the segment (or its write
buffer) and move ``wrote_position`` once for the whole batch. Validation and most of the encoding
(``record.prepare_message``) happen before the lock is taken, so a refused message writes nothing.

A slave never encodes: ``append_replicated`` copies the master's bytes verbatim (blank records
included) and insists that they start exactly at its own end — byte-identical logs are the point.

Flushing and committing are steps the caller drives (a thread, or a trio task): ``flush`` moves
``flushed_where`` with one ``fdatasync`` per segment touched, however many appends came before it
— that is group commit.

Recovery walks records from a safe segment (``commitlog.scan``) and cuts the log at the first
invalid one when that is a torn tail (past the checkpoint's flushed offset); an invalid record
below it is damage (``commitlog.damage``), reported and never cut. Which segment is safe depends
on how the last run ended; see ``recover`` (``LogRecovery`` in ``commitlog.log_recovery``, a base
class of ``CommitLog``).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Sequence

from commitlog import native
from commitlog import record as rec
from commitlog.log_recovery import DamagedLogError, LogRecovery, RecoveryReport
from commitlog.mapped_file import PREALLOCATE_STEP_SIZE, DiskFullError, MappedFile, StoreError
from commitlog.mapped_file_queue import MappedFileQueue, WriteBufferSource


class ReadError(ValueError):
    """A read at an offset that is not a record, or outside the log."""


class ReplicationOffsetError(ValueError):
    """Replicated bytes that do not start at the local end of the log."""


@dataclasses.dataclass(slots=True)  # not frozen: built for every put, and frozen __init__ costs 4x
class AppendResult:
    status: rec.PutMessageStatus
    wrote_offset: int = -1  # physical offset of the first record
    wrote_bytes: int = 0
    store_timestamp: int = 0
    offsets: tuple[int, ...] = ()  # physical offset of every record
    queue_offsets: tuple[int, ...] = ()
    reason: str = ""

    @property
    def next_offset(self) -> int:
        """The log offset just past the last record: what flush and replication must reach."""
        return self.wrote_offset + self.wrote_bytes


def record_offsets_python(sizes, start: int) -> tuple[int, ...]:
    """Where each record of a batch of ``sizes`` starts, the first at ``start``. The native twin
    (commitlog/_scan.c ``record_offsets``) builds the tuple with no list between."""
    return tuple(itertools.accumulate(sizes[:-1], initial=start)) if sizes else ()


record_offsets = native.record_offsets or record_offsets_python


# Large appends (a pass of 32-message batches from several writers: ~200 KiB) are encoded into a
# buffer of the log's and written with ``pwrite`` wherever their pages are not faulted in yet,
# and the warm-up stays behind while they come (``large_appends``): a page the kernel allocates
# for a write that covers it whole is never zeroed, where the warm-up's fault zeroes it and the
# encoder then writes it again, cold (16 x 32 at 1 KiB: the kernel's memset was ~20 % of the
# master's CPU). An append of WRITE_THROUGH_MIN or more starts that; WARM_AFTER_SMALL_APPENDS
# smaller ones in a row end it (a pass of one request between large ones keeps it: the warm-up
# woken by every such pass ran ahead again). Otherwise appends stay on warmed pages of the
# mapping: a ``pwrite`` a put cost a lone writer ~40 us of p50.
WRITE_THROUGH_MIN = 64 * 1024
WARM_AFTER_SMALL_APPENDS = 64
# The buffer's bound (memory held for it): a larger append goes through the mapping.
WRITE_THROUGH_MAX = 4 * 1024 * 1024


def _transactional(sysflag: int) -> bool:
    return sysflag & rec.SYSFLAG_TRANSACTION_MASK in (rec.SYSFLAG_TRANSACTION_PREPARED, rec.SYSFLAG_TRANSACTION_ROLLBACK)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class CommitLog(LogRecovery):
    def __init__(
        self,
        directory: str,
        *,
        segment_size: int,
        store_host: rec.Host = ("127.0.0.1", 10911),
        write_buffer_source: WriteBufferSource | None = None,
        small_pages: bool = False,
        preallocate_step_size: int = PREALLOCATE_STEP_SIZE,
    ):
        self.mapped_file_queue = MappedFileQueue(
            directory, file_size=segment_size, write_buffer_source=write_buffer_source, small_pages=small_pages,
            preallocate_step_size=preallocate_step_size,
        )
        self.segment_size = segment_size
        self.store_ip, self.store_port, self.store_v6 = rec.encode_host(store_host)
        # (topic, queue id) -> next queue offset; recovered from the consume queues.
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.put_lock = threading.Lock()
        self.last_store_timestamp = 0
        # Appends are large (see WRITE_THROUGH_MIN): they go by pwrite past the warmed pages and
        # the warm-up waits (the broker's after_appends reads it).
        self.large_appends = False
        self._small_appends = 0  # in a row, while large_appends
        self._through_buffer = bytearray()  # the appends written with pwrite are encoded here

    def load(self) -> None:
        self.mapped_file_queue.load()

    # -- offsets --------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return self.mapped_file_queue.min_offset

    @property
    def max_offset(self) -> int:
        """End of what readers see (with a write buffer: what is committed)."""
        return self.mapped_file_queue.max_offset

    @property
    def max_wrote_offset(self) -> int:
        return self.mapped_file_queue.max_wrote_offset

    @property
    def flushed_offset(self) -> int:
        return self.mapped_file_queue.flushed_where

    @property
    def committed_offset(self) -> int:
        return self.mapped_file_queue.committed_where

    # -- append ---------------------------------------------------------------------------

    def append(self, prepared: Sequence[rec.PreparedMessage]) -> AppendResult:
        """Append records in one go; all land in the same segment, in order, or none do."""
        if not prepared:
            return AppendResult(rec.PutMessageStatus.MESSAGE_ILLEGAL, reason="empty batch")
        total = 0
        for message in prepared:
            total += rec.with_store_host(message, store_v6=self.store_v6)
        store_ip, store_port = self.store_ip, self.store_port

        def write(buffer, position: int, base: int, store_timestamp: int) -> tuple[list[int], list[int]]:
            offsets, queue_offsets = [], []
            for message in prepared:
                queue_offset = self._next_queue_offset(message.message.topic, message.message.queue_id, message.sysflag, 1)
                offsets.append(base + position)
                queue_offsets.append(queue_offset)
                position += rec.write_record(
                    buffer, position, message, queue_offset=queue_offset, physical_offset=base + position,
                    store_timestamp=store_timestamp, store_ip=store_ip, store_port=store_port,
                )  # fmt: skip
            return offsets, queue_offsets

        return self._append_locked(total, write)

    def append_batch(self, prepared: rec.PreparedBatch, *, crc_function: rec.CrcFunction = rec.CRC_FUNCTIONS["crc32c"]) -> AppendResult:
        """Append a batch sharing topic and queue: one native call encodes every record (the fast
        path for batched sends). ``prepared`` must come from ``prepare_batch`` with this log's
        store host family."""
        batch = prepared.batch
        assert bool(prepared.sysflag & rec.SYSFLAG_STOREHOST_V6) == self.store_v6

        def write(buffer, position: int, base: int, store_timestamp: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
            # _next_queue_offset written out (a put's one pass through here: two calls fewer).
            count = len(prepared.sizes)
            transactional = _transactional(prepared.sysflag)
            if transactional:
                first = 0
            else:
                key = (batch.topic, batch.queue_id)
                first = self.topic_queue_table.get(key, 0)
                self.topic_queue_table[key] = first + count
            written = rec.write_batch(
                buffer, position, prepared, queue_offset_first=first, physical_base=base,
                store_timestamp=store_timestamp, store_ip=self.store_ip, store_port=self.store_port,
                crc_function=crc_function,
            )  # fmt: skip
            assert written == prepared.total, (written, prepared.total)
            offsets = record_offsets(prepared.sizes, base + position)
            queue_offsets = (0,) * count if transactional else tuple(range(first, first + count))
            return offsets, queue_offsets

        return self._append_locked(prepared.total, write)

    def _next_queue_offset(self, topic: str, queue_id: int, sysflag: int, count: int) -> int:
        """Reserve ``count`` queue offsets; transaction prepare/rollback records get 0 and none."""
        if _transactional(sysflag):
            return 0
        key = (topic, queue_id)
        first = self.topic_queue_table.get(key, 0)
        self.topic_queue_table[key] = first + count
        return first

    def _append_locked(self, total: int, write) -> AppendResult:
        if total + rec.BLANK_SIZE > self.segment_size:
            return AppendResult(
                rec.PutMessageStatus.MESSAGE_ILLEGAL,
                reason=f"batch of {total} bytes does not fit a segment of {self.segment_size}",
            )
        with self.put_lock:
            try:
                mapped_file = self._segment_for(total)
                if mapped_file.wrote_position + total > mapped_file.allocated_position:
                    mapped_file.ensure_allocated(mapped_file.wrote_position + total)
            except DiskFullError as error:  # no next segment or no room in this one: nothing written but a blank end
                return AppendResult(rec.PutMessageStatus.DISK_FULL, reason=str(error))
            store_timestamp = max(now_ms(), self.last_store_timestamp)
            self.last_store_timestamp = store_timestamp
            start = mapped_file.wrote_position
            base = mapped_file.file_from_offset
            if total >= WRITE_THROUGH_MIN:
                self.large_appends, self._small_appends = True, 0
            elif self.large_appends:
                self._small_appends += 1
                self.large_appends = self._small_appends < WARM_AFTER_SMALL_APPENDS
            if (self.large_appends and total <= WRITE_THROUGH_MAX and mapped_file.write_buffer is None
                    and mapped_file.populated_position < start + total):  # fmt: skip
                mapped_file.read_ahead_off_from(start)
                if len(self._through_buffer) < total:
                    self._through_buffer = bytearray(min(max(total, 2 * len(self._through_buffer)), WRITE_THROUGH_MAX))
                with memoryview(self._through_buffer) as buffer:  # the records' offsets as in place
                    offsets, queue_offsets = write(buffer, 0, base + start, store_timestamp)
                    with buffer[:total] as data:
                        mapped_file.write_through(data)  # pwrite, then advance
            else:
                offsets, queue_offsets = write(mapped_file.writable_view(), start, base, store_timestamp)
                mapped_file.advance(total)
            mapped_file.store_timestamp = store_timestamp
        return AppendResult(
            rec.PutMessageStatus.PUT_OK,
            wrote_offset=base + start,
            wrote_bytes=total,
            store_timestamp=store_timestamp,
            offsets=tuple(offsets),  # no copy when already a tuple
            queue_offsets=tuple(queue_offsets),
        )

    def _segment_for(self, size: int) -> MappedFile:
        """The segment the next ``size`` bytes go to; ends the current one with a blank record
        when ``size`` plus the blank does not fit (RocketMQ's END_OF_FILE)."""
        queue = self.mapped_file_queue
        mapped_file = queue.get_last_mapped_file(0)
        if size + rec.BLANK_SIZE > mapped_file.file_size - mapped_file.wrote_position:  # remaining
            remaining = mapped_file.remaining
            mapped_file.ensure_allocated(mapped_file.wrote_position + rec.BLANK_SIZE)
            rec.write_blank(mapped_file.writable_view(), mapped_file.wrote_position, remaining)
            mapped_file.advance(remaining)
            mapped_file = queue.get_last_mapped_file(0)
        return mapped_file

    def warm_ahead(self, size: int) -> None:
        self.mapped_file_queue.warm_ahead(size)

    def append_replicated(self, offset: int, data) -> None:
        """Append bytes a master sent, verbatim, with ``pwrite`` (``MappedFile.write_through``).
        ``offset`` must be the local end of the log (or, for an empty log, the start of a
        segment). Raises ReplicationOffsetError otherwise."""
        view = memoryview(data)
        size = len(view)
        with self.put_lock:  # a frame that continues the last segment and fits it: written at once
            files = self.mapped_file_queue.mapped_files
            if files:
                last = files[-1]
                end, room = last.file_from_offset + last.wrote_position, last.file_size - last.wrote_position
                if offset == end and 0 < size <= room:
                    last.write_through(view)
                    return
        self._append_replicated(offset, size, lambda mapped_file, done, count: mapped_file.write_through(view[done : done + count]))

    def append_replicated_from_pipe(self, offset: int, pipe_fd: int, size: int) -> None:
        """``append_replicated`` for ``size`` bytes waiting in a pipe (``MappedFile.write_from_pipe``):
        a slave splices a frame from its socket into the pipe, then from the pipe into the log."""
        self._append_replicated(offset, size, lambda mapped_file, _, count: mapped_file.write_from_pipe(pipe_fd, count))

    def _append_replicated(self, offset: int, size: int, write) -> None:
        """``write(mapped_file, done, count)`` the ``size`` bytes from ``offset``, the part of
        them each segment holds (``done`` bytes already written before it)."""
        with self.put_lock:
            queue = self._replication_queue(offset)
            done = 0
            while done < size:
                mapped_file = queue.get_last_mapped_file(offset + done)
                count = min(size - done, mapped_file.remaining)
                write(mapped_file, done, count)
                done += count

    def _replication_queue(self, offset: int) -> MappedFileQueue:
        """Check that replicated bytes for ``offset`` continue the local log (call with the put lock)."""
        queue = self.mapped_file_queue
        if queue.last is None:
            if offset % self.segment_size:
                raise ReplicationOffsetError(f"an empty log can only start at a segment boundary, master sent {offset}")
            queue.reset_to(offset)
        elif offset != self.max_wrote_offset:
            raise ReplicationOffsetError(
                f"master sent bytes for offset {offset} but the local log ends at {self.max_wrote_offset}"
            )
        return queue

    def prepare_replication(self, offset: int) -> int:
        """Check that replicated bytes for ``offset`` continue the local log, make the segment
        they go to (a new one: fallocate and a directory fsync), and return the room left in it."""
        with self.put_lock:
            return self._replication_queue(offset).get_last_mapped_file(offset).remaining

    # -- reads ----------------------------------------------------------------------------

    def read(self, offset: int, size_max: int) -> memoryview:
        """Zero-copy bytes from ``offset``: up to ``size_max`` and never past a segment's end or
        the readable end of the log."""
        mapped_file, position, size = self.transfer_span(offset, size_max)
        return mapped_file.slice(position, size)

    def transfer_span(self, offset: int, size_max: int) -> tuple[MappedFile, int, int]:
        """Where the bytes ``read(offset, size_max)`` would return lie on disk: (segment,
        position in it, size), for sending them with ``os.sendfile``. Bytes below the readable
        end are in the file even with a write buffer (readable = committed)."""
        queue = self.mapped_file_queue  # its ends read directly: a frame to a slave per put comes here
        if offset < queue.min_offset or offset >= queue.max_offset:
            raise ReadError(f"offset {offset} outside the log [{self.min_offset}, {self.max_offset})")
        mapped_file = queue.find_mapped_file_by_offset(offset)
        assert mapped_file is not None
        position = offset - mapped_file.file_from_offset
        return mapped_file, position, min(size_max, mapped_file.read_position - position)

    def get_record(self, offset: int, *, crc_function: rec.CrcFunction | None = None) -> rec.Record:
        """The record that starts at ``offset``; ReadError when no record starts there."""
        if offset < self.min_offset or offset >= self.max_offset:
            raise ReadError(f"offset {offset} outside the log [{self.min_offset}, {self.max_offset})")
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        position = offset - mapped_file.file_from_offset
        try:
            record = rec.decode_record(
                mapped_file.view(), position, crc_function=crc_function, limit=mapped_file.read_position
            )
        except rec.RecordError as error:
            raise ReadError(f"no record starts at offset {offset}: {error.reason}") from None
        if record.physical_offset != offset:
            raise ReadError(f"no record starts at offset {offset}: the bytes there name offset {record.physical_offset}")
        return record

    def next_record_offset(self, offset: int) -> int:
        """Where the record after the one at ``offset`` starts (blank records skipped)."""
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset)
        if mapped_file is None:
            raise ReadError(f"offset {offset} outside the log")
        position = offset - mapped_file.file_from_offset
        blank = rec.peek_blank(mapped_file.view(), position)
        if blank is not None:
            return mapped_file.file_from_offset + self.segment_size
        (size,) = rec.TOTAL_SIZE.unpack_from(mapped_file.view(), position)
        return offset + size

    # -- commit and flush -----------------------------------------------------------------

    def commit(self, least_pages: int = 0) -> int:
        return self.mapped_file_queue.commit(least_pages)

    def flush(self, least_pages: int = 0, *, keep_cached: int = 0) -> int:
        """Commit (if a write buffer is in use) and fsync; return the flushed offset. Flushed
        pages more than ``keep_cached`` bytes back are then dropped from the page cache (0: none)."""
        self.mapped_file_queue.commit(0 if least_pages == 0 else least_pages)
        return self.mapped_file_queue.flush(least_pages, keep_cached=keep_cached)

    # -- truncation -----------------------------------------------------------------------

    def truncate(self, offset: int) -> None:
        """Cut the log at ``offset`` (a record boundary), zeroing what follows."""
        with self.put_lock:
            if offset < self.min_offset or offset > self.max_wrote_offset:
                raise ReadError(f"cannot truncate at {offset}: log is [{self.min_offset}, {self.max_wrote_offset}]")
            if offset < self.max_wrote_offset:
                mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(offset)
                position = offset - mapped_file.file_from_offset
                if position and rec.peek_blank(mapped_file.view(), position) is None:
                    self.get_record(offset)  # raises unless a record starts there
            self.mapped_file_queue.truncate_dirty_files(offset)

    def close(self) -> None:
        self.mapped_file_queue.close()


__all__ = [
    "AppendResult",
    "CommitLog",
    "DamagedLogError",
    "ReadError",
    "RecoveryReport",
    "ReplicationOffsetError",
    "StoreError",
]
