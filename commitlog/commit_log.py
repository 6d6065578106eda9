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
on how the last run ended; see ``recover``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Sequence

from commitlog import native
from commitlog import record as rec
from commitlog.mapped_file import PREALLOCATE_STEP_SIZE, DiskFullError, MappedFile, StoreError, nonzero_extent, segment_name
from commitlog.damage import DamagedRange
from commitlog.mapped_file_queue import MappedFileQueue, WriteBufferSource
from commitlog.scan import ScanCode, find_next_record, scan_segment

# Damaged ranges one recovery reports (and a repair round fixes): enough for a few flipped bytes,
# bounded for a log that is garbage from some point on (then the first range is what matters).
DAMAGED_RANGES_MAX = 16


# The flushed offset to pass to ``recover`` when the checkpoint vouches for none (both of its
# copies damaged): every invalid record then counts as damage, and a clean end as the end.
FLUSHED_OFFSET_UNKNOWN = 1 << 62


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


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryReport:
    abnormal: bool
    start_offset: int  # where the scan began
    end_offset: int  # the recovered end of the log
    records: int
    scanned_bytes: int
    seconds: float
    corrupt_offset: int | None  # first invalid record, None when the log ended cleanly
    reason: str
    deleted_segments: tuple[str, ...]
    dropped_bytes: int  # nonzero bytes cut from the segment that held the cut
    # Damage found (then nothing was cut or changed: the store refuses to open), at most
    # DAMAGED_RANGES_MAX ranges, and the valid records that follow the first damaged range.
    damaged: tuple[DamagedRange, ...] = ()
    records_past_damage: int = 0

    def describe(self) -> str:
        kind = "abnormal (abort file present)" if self.abnormal else "normal"
        text = (
            f"{kind} recovery scanned {self.records} records ({self.scanned_bytes} bytes) from offset "
            f"{self.start_offset} in {self.seconds:.3f}s; log ends at {self.end_offset}"
        )
        if self.corrupt_offset is not None:
            text += f"; cut at {self.corrupt_offset}: {self.reason}"
        if self.dropped_bytes:
            text += f"; {self.dropped_bytes} bytes after the cut zeroed"
        if self.deleted_segments:
            text += f"; deleted segments {', '.join(os.path.basename(p) for p in self.deleted_segments)}"
        if self.damaged:
            text += f"; DAMAGED, nothing cut: {'; '.join(damage.describe() for damage in self.damaged)}"
        return text


class DamagedLogError(StoreError):
    """A store that recovery found damaged and did not cut: one line naming the first damaged
    range (file, offsets, reason) and the two commands that resolve it."""

    def __init__(self, directory: str, report: RecoveryReport):
        assert report.damaged
        self.directory = directory
        self.damaged = report.damaged
        first = report.damaged[0]
        more = f" (and {len(report.damaged) - 1} more damaged ranges)" if len(report.damaged) > 1 else ""
        super().__init__(
            f"{directory}: damaged commit log in {first.file} at offsets [{first.from_offset}, {first.to_offset}): "
            f"{first.reason}{more}; nothing was cut. Repair it from a broker that holds these bytes: "
            f"hasvc store repair {directory} --from HOST:PORT; or cut the log there, losing what follows: "
            f"hasvc store repair {directory} --accept-loss"
        )


def record_offsets_python(sizes, start: int) -> tuple[int, ...]:
    """Where each record of a batch of ``sizes`` starts, the first at ``start``. The native twin
    (commitlog/_scan.c ``record_offsets``) builds the tuple with no list between."""
    return tuple(itertools.accumulate(sizes[:-1], initial=start)) if sizes else ()


record_offsets = native.record_offsets or record_offsets_python


def _transactional(sysflag: int) -> bool:
    return sysflag & rec.SYSFLAG_TRANSACTION_MASK in (rec.SYSFLAG_TRANSACTION_PREPARED, rec.SYSFLAG_TRANSACTION_ROLLBACK)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class CommitLog:
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

    # -- recovery -------------------------------------------------------------------------

    def recover(
        self,
        *,
        abnormal: bool,
        dispatch_from: int,
        checkpoint_min_timestamp: int,
        crc_function: rec.CrcFunction | None,
        cut_segments_max: int = 1,
        flushed_offset: int | None = None,
        accept_loss: bool = False,
    ) -> RecoveryReport:
        """Find the end of the valid log and cut it there — unless what stops the scan is damage.

        Start segment: walking back from the newest segment, the first whose first record is
        valid, starts at or below ``dispatch_from`` (the consume queues' high mark, so every record
        they lack is scanned again) and — after a crash — was stored before the checkpoint's
        timestamp minus 3 s (so it was flushed). None qualifies: the oldest segment.

        Torn tail or damage (``flushed_offset``: the checkpoint's, what was known on disk): an
        invalid record that does not lie wholly at or below ``flushed_offset`` (its end by its size
        word, or its first 8 bytes when that word is out of bounds) may be a write the last run
        never finished: it is cut, with what follows. One that does lie below it was on disk
        whole and is damage; so is a cut that would delete more than ``cut_segments_max`` later
        segments holding data (a torn tail spans at most the newest segment and its predecessor).
        Damage is never cut: the report's ``damaged`` names the ranges (up to DAMAGED_RANGES_MAX,
        each from the invalid record to the next valid one) and nothing is changed. A clean
        shutdown flushed everything, so there only a record cut by the log's end (a slave's
        partial last record) is a tail. ``accept_loss`` cuts at the first invalid record
        whatever it is (``hasvc store repair --accept-loss``). ``flushed_offset=None`` is the old
        rule (the classic part of a DLedger store): the segment count alone, refused with
        StoreError.
        """
        started = time.perf_counter()
        files = self.mapped_file_queue.mapped_files
        if not files:
            return RecoveryReport(abnormal, 0, 0, 0, 0, 0.0, None, "empty log", (), 0)
        start_index = self._recovery_start_index(
            abnormal=abnormal, dispatch_from=dispatch_from, checkpoint_min_timestamp=checkpoint_min_timestamp
        )
        records = 0
        scanned = 0
        corrupt_offset = None
        reason = "end of written data"
        end_offset = files[-1].file_from_offset + self.segment_size
        cut_file = None
        cut_index = -1
        for index in range(start_index, len(files)):
            mapped_file = files[index]
            result = scan_segment(
                mapped_file.view(),
                start=0,
                end=self.segment_size,
                file_from_offset=mapped_file.file_from_offset,
                crc_function=crc_function,
            )
            records += result.count
            scanned += result.position
            if result.code is ScanCode.END_OF_SEGMENT:
                scanned += self.segment_size - result.position
                continue
            end_offset = mapped_file.offset_of(result.position)
            cut_file, cut_index = mapped_file, index
            if not result.code.clean:
                corrupt_offset = end_offset
                reason = result.reason
            break
        else:
            reason = "end of segment (blank record)"
        if cut_file is None and flushed_offset is not None and not accept_loss \
                and end_offset < flushed_offset < FLUSHED_OFFSET_UNKNOWN:  # fmt: skip
            # Every segment ends in a blank, yet flushed bytes lie beyond: a segment is missing.
            reason = (f"the log ends at {end_offset}, below the checkpoint's flushed offset {flushed_offset}: "
                      f"the segment that starts there is missing (lost writes)")  # fmt: skip
            path = os.path.join(self.mapped_file_queue.directory, segment_name(end_offset))
            damaged = (DamagedRange(path, end_offset, min(flushed_offset, end_offset + self.segment_size), reason),)
            return RecoveryReport(abnormal, files[start_index].file_from_offset, end_offset, records, scanned,
                                  time.perf_counter() - started, None, reason, (), 0, damaged, 0)  # fmt: skip
        deleted = tuple(f.path for f in files if f.file_from_offset > end_offset)
        holding_data = [f for f in files if f.file_from_offset > end_offset and any(f.view()[:8])]
        too_many = len(holding_data) > cut_segments_max and not accept_loss
        if flushed_offset is not None and cut_file is not None and not accept_loss:
            position = end_offset - cut_file.file_from_offset
            torn = corrupt_offset is None or self._extent_end(cut_file, position) > flushed_offset
            # Zeros where the checkpoint says flushed bytes were: lost writes (a write the disk
            # acknowledged and never made, a segment cut short), not a tail that never was.
            lost = corrupt_offset is None and end_offset < flushed_offset < FLUSHED_OFFSET_UNKNOWN
            if lost and not too_many:
                reason = (f"the log ends at {end_offset}, below the checkpoint's flushed offset {flushed_offset}: "
                          "flushed bytes are missing (lost writes)")  # fmt: skip
                to = min(flushed_offset, cut_file.file_from_offset + self.segment_size)
                damaged = (DamagedRange(cut_file.path, end_offset, to, reason),)
                return RecoveryReport(
                    abnormal, files[start_index].file_from_offset, end_offset, records, scanned,
                    time.perf_counter() - started, corrupt_offset, reason, (), 0, damaged, 0,
                )  # fmt: skip
            if too_many or not torn:
                if corrupt_offset is None:
                    reason = f"zero bytes where the log goes on: {len(holding_data)} later segments hold data"
                elif too_many:
                    reason += f" ({len(holding_data)} later segments hold data)"
                else:
                    reason += f" (below the checkpoint's flushed offset {flushed_offset})"
                damaged, past = self._damaged_ranges(cut_index, position, reason, crc_function, flushed_offset)
                return RecoveryReport(
                    abnormal, files[start_index].file_from_offset, end_offset, records, scanned,
                    time.perf_counter() - started, corrupt_offset, reason, (), 0, damaged, past,
                )  # fmt: skip
        elif too_many:
            where = os.path.basename(cut_file.path) if cut_file else "?"
            raise StoreError(
                f"recovery refuses to cut the log at offset {end_offset} (segment {where}: {reason}): that would "
                f"delete {len(holding_data)} later segments holding data, more than recovery_cut_segments_max="
                f"{cut_segments_max}. Inspect with 'hasvc store verify'; raise the limit to accept the loss."
            )
        dropped = 0
        if cut_file is not None and (abnormal or corrupt_offset is not None):
            position = end_offset - cut_file.file_from_offset
            if corrupt_offset is not None:
                dropped = nonzero_extent(cut_file.view(), position, self.segment_size)
            self.mapped_file_queue.truncate_dirty_files(end_offset)
        else:
            for mapped_file in [f for f in files if f.file_from_offset > end_offset]:
                mapped_file.destroy()
            kept = [f for f in files if f.file_from_offset <= end_offset]
            self.mapped_file_queue.mapped_files = kept
            if cut_file is not None:
                position = end_offset - cut_file.file_from_offset
                cut_file.set_positions(position)
        queue = self.mapped_file_queue
        queue.flushed_where = queue.committed_where = end_offset
        return RecoveryReport(
            abnormal=abnormal,
            start_offset=files[start_index].file_from_offset,
            end_offset=end_offset,
            records=records,
            scanned_bytes=scanned,
            seconds=time.perf_counter() - started,
            corrupt_offset=corrupt_offset,
            reason=reason,
            deleted_segments=deleted,
            dropped_bytes=dropped,
        )

    def _extent_end(self, mapped_file: MappedFile, position: int) -> int:
        """Where the (invalid) record at ``position`` ends by its size word; when that word is
        out of bounds, only its first 8 bytes (size and magic) are taken as the record."""
        left = self.segment_size - position
        size = int.from_bytes(mapped_file.view()[position : position + 4], "big", signed=True) if left >= 4 else 0
        return mapped_file.offset_of(position + (size if 8 <= size <= left else min(8, left)))

    def _damaged_ranges(
        self, index: int, position: int, reason: str, crc_function, flushed_offset: int
    ) -> tuple[tuple[DamagedRange, ...], int]:
        """The damaged ranges from the invalid record at ``position`` of segment ``index`` on,
        each to the next valid record (``scan.find_next_record``), and the valid records counted
        after the first. The walk goes on after each range to the end of the log; it stops at a
        torn tail (an invalid record past ``flushed_offset`` with nothing after it) or after
        DAMAGED_RANGES_MAX ranges. Reads only."""
        files = self.mapped_file_queue.mapped_files
        size = self.segment_size
        ranges: list[DamagedRange] = []
        past = 0
        while len(ranges) < DAMAGED_RANGES_MAX:
            mapped_file = files[index]
            base = mapped_file.file_from_offset
            to = find_next_record(
                mapped_file.view(), start=position, end=size, file_from_offset=base, crc_function=crc_function
            )
            ranges.append(DamagedRange(mapped_file.path, base + position, base + to, reason))
            position = to
            while True:  # on from the range's end to the next invalid record or the log's end
                if position >= size:
                    index, position = index + 1, 0
                    if index == len(files):
                        return tuple(ranges), past
                mapped_file = files[index]
                result = scan_segment(mapped_file.view(), start=position, end=size,
                                      file_from_offset=mapped_file.file_from_offset, crc_function=crc_function)  # fmt: skip
                past += result.count
                if result.code is ScanCode.END_OF_SEGMENT:
                    position = size
                    continue
                position = result.position
                if result.code is ScanCode.END_OF_DATA:
                    return tuple(ranges), past
                later_data = any(any(f.view()[:8]) for f in files[index + 1 :])
                if not later_data and self._extent_end(mapped_file, position) > flushed_offset:
                    return tuple(ranges), past  # a torn tail: cut when the store opens after the repair
                reason = result.reason
                break
        return tuple(ranges), past

    def _recovery_start_index(self, *, abnormal: bool, dispatch_from: int, checkpoint_min_timestamp: int) -> int:
        files = self.mapped_file_queue.mapped_files
        for index in range(len(files) - 1, -1, -1):
            mapped_file = files[index]
            try:
                first = rec.decode_record(mapped_file.view(), 0, crc_function=None)
            except rec.RecordError:
                continue
            if first.physical_offset != mapped_file.file_from_offset or first.store_timestamp == 0:
                continue
            if first.physical_offset > dispatch_from:
                continue
            if abnormal and first.store_timestamp > checkpoint_min_timestamp:
                continue
            return index
        return 0

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
