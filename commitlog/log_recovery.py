"""Recovery of a ``CommitLog`` (Kafka's ``LogLoader``, RocketMQ's ``CommitLog.recoverNormally`` /
``recoverAbnormally``): walk records from a safe segment (``commitlog.scan``) and cut the log at
the first invalid one when that is a torn tail (past the checkpoint's flushed offset); an invalid
record below it is damage (``commitlog.damage``), reported in the ``RecoveryReport`` and never cut
(``DamagedLogError``). Which segment is safe depends on how the last run ended; see ``recover``.

``LogRecovery`` is a part of ``CommitLog`` (its base class): the methods run on the log's own
fields, as when they were written in the one class.
"""

from __future__ import annotations

import dataclasses
import os
import time

from commitlog import record as rec
from commitlog.damage import DamagedRange
from commitlog.mapped_file import MappedFile, StoreError, nonzero_extent, segment_name
from commitlog.mapped_file_queue import MappedFileQueue
from commitlog.scan import ScanCode, find_next_record, scan_segment

# Damaged ranges one recovery reports (and a repair round fixes): enough for a few flipped bytes,
# bounded for a log that is garbage from some point on (then the first range is what matters).
DAMAGED_RANGES_MAX = 16


# The flushed offset to pass to ``recover`` when the checkpoint vouches for none (both of its
# copies damaged): every invalid record then counts as damage, and a clean end as the end.
FLUSHED_OFFSET_UNKNOWN = 1 << 62


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



class LogRecovery:
    """The recovery of ``CommitLog`` (see the module)."""

    mapped_file_queue: MappedFileQueue
    segment_size: int

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
