"""Reading a ``MessageStore``: records by offset and by queue, checked against their CRCs as
``check_crc_on_read`` says (``commitlog.read_check``; damage found joins ``damaged``), raw byte
ranges, and the log's tail: the last whole record, record boundaries, and pattern matches that end
where a record ends.

``StoreReads`` is a part of ``MessageStore`` (its base class): the methods run on the store's
own fields, as when they were written in the one class.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from commitlog import read_check
from commitlog import record as rec
from commitlog.damage import DamagedRange
from commitlog.dispatch import RecordPlace, _record_places
from commitlog.scan import ScanCode, scan_segment

if TYPE_CHECKING:
    from commitlog.commit_log import CommitLog
    from commitlog.config import StoreConfig
    from commitlog.consume_queue import ConsumeQueueStore


class StoreReads:
    """The reads of ``MessageStore`` (see the module)."""

    config: StoreConfig
    crc_function: rec.CrcFunction
    commit_log: CommitLog
    consume_queues: ConsumeQueueStore
    damaged: list[DamagedRange]

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

    def find_bytes(self, sub: bytes, start_offset: int, end_offset: int) -> int:
        """The offset of the first ``sub`` lying whole in one segment's bytes within
        ``[start_offset, end_offset)`` (bounded by the log's end), or -1. A record never spans two
        segments, so neither does anything found in one."""
        log = self.commit_log
        offset, stop = max(start_offset, log.min_offset), min(end_offset, log.max_offset)
        while offset < stop:
            mapped_file = log.mapped_file_queue.find_mapped_file_by_offset(offset)
            base = mapped_file.file_from_offset
            position = mapped_file.find(sub, offset - base, stop - base)
            if position >= 0:
                return base + position
            offset = base + log.segment_size
        return -1

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
