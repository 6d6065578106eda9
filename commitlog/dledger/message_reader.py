"""Offsets and reads of a DLedger member's message store: the commit-log offset space over the
classic part and the entries (PHYSICALOFFSET = an entry's pos + 48), and the committed records
read by offset, by consume queue, and searched at their ends.

``MessageReader`` is a part of ``DLedgerMessageStore`` (its base class) over its ``entries``,
``classic`` part and ``divided_log``; only committed entries are readable.
"""

from __future__ import annotations

import bisect
import re
import struct
from collections.abc import Iterator, Sequence
from typing import Any

from commitlog import read_check
from commitlog import record as rec
from commitlog.commit_log import ReadError
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.upgrade import LogPart
from commitlog.mapped_file import StoreError
from commitlog.dispatch import RecordPlace

BODY_OFFSET = codec.BODY_OFFSET  # PHYSICALOFFSET = entry pos + 48 (DLedgerCommitLog's BODY_OFFSET)
_SIZE_WORD = struct.Struct(">i")  # a record's TOTALSIZE


def transactional(sysflag: int) -> bool:
    """A transaction prepare or rollback record: it takes no consume-queue offset."""
    return sysflag & rec.SYSFLAG_TRANSACTION_MASK in (
        rec.SYSFLAG_TRANSACTION_PREPARED,
        rec.SYSFLAG_TRANSACTION_ROLLBACK,
    )


class MessageReader:
    """Offsets and reads of ``DLedgerMessageStore`` (see the module)."""

    entries: Any  # DLedgerMmapFileStore
    classic: Any  # CommitLog | None
    divided_log: Any  # DividedLog
    divided_offset: int
    consume_queues: Any  # ConsumeQueueStore
    config: Any  # StoreConfig
    crc_function: Any
    read_damaged: list

    # -- offsets ----------------------------------------------------------------------------

    def _dledger_start(self) -> int:
        """Commit-log offset where the DLedger part starts."""
        entries = self.entries
        if entries.last_index() >= entries.first_index():
            return entries.pos_at(entries.first_index())
        if entries.data_file_list.mapped_files:
            return entries.data_file_list.min_offset
        if entries.first_index() > 0:  # empty after a reset: where its next entry will lie
            return entries.data_start_offset
        return max(self.divided_offset, 0)

    def _end_offset_of(self, index: int) -> int:
        """End of entry ``index`` in the commit-log offset space (the DLedger start below the first)."""
        if index < self.entries.first_index():
            return self._dledger_start()
        pos, size = self.entries.entry_span(index)
        return pos + size

    def _entries_end(self) -> int:
        return self._end_offset_of(self.entries.last_index())

    def _first_index_at_or_after(self, pos: int) -> int:
        entries = self.entries
        indexes = range(entries.first_index(), entries.last_index() + 1)
        return entries.first_index() + bisect.bisect_left(indexes, pos, key=entries.pos_at)

    def committed_end_offset(self) -> int:
        """Commit-log offset just past the last committed entry: the readable end."""
        return self._end_offset_of(self.entries.committed_index)

    def offset_of_index(self, index: int) -> int:
        """PHYSICALOFFSET of the message in entry ``index`` (its pos + 48)."""
        return self.entries.pos_at(index) + BODY_OFFSET

    @property
    def min_offset(self) -> int:
        """The oldest readable offset: the classic part's, until retention deletes the DLedger
        part's head (the newest sealed classic segment stays on disk, no longer reachable)."""
        if self.classic is not None and self.entries.first_index() == 0:
            return self.classic.min_offset
        return self._dledger_start()

    # -- reading ----------------------------------------------------------------------------

    def _record_at(self, offset: int, *, committed_only: bool = True, crc_function=None) -> rec.Record:
        if self.divided_log.part_of(offset) is LogPart.CLASSIC:
            return self.classic.get_record(offset, crc_function=crc_function)
        try:
            stored = self.entries.get_by_pos(offset - BODY_OFFSET)
        except (ValueError, IndexError, StoreError) as error:
            raise ReadError(f"no message at offset {offset}: {error}") from None
        if committed_only and stored.index > self.entries.committed_index:
            raise ReadError(f"entry {stored.index} at offset {offset} is not committed")
        try:
            record = rec.decode_record(stored.body, 0, crc_function=crc_function, limit=len(stored.body))
        except rec.RecordError as error:
            raise ReadError(f"entry {stored.index} at offset {offset}: {error.reason}") from None
        if record.physical_offset != offset:
            raise ReadError(f"entry {stored.index}: its record names offset {record.physical_offset}, not {offset}")
        return record

    def get_record(self, offset: int, *, check_crc: bool = False) -> rec.Record:
        """The committed message whose commit-log offset is ``offset``; ReadError otherwise (with
        ``check_crc``, ``DamagedRecordError`` for a body that fails its CRC, added to ``damaged``)."""
        if check_crc:  # the record's own checks first (the entry's CRC, below, names no record)
            head = self.read(offset, _SIZE_WORD.size)
            size = _SIZE_WORD.unpack(head)[0] if len(head) == _SIZE_WORD.size else 0
            checked = read_check.noted(read_check.read_records(self._segment_of, [(offset, max(size, 8))],
                                                               crc_function=self.crc_function), self.read_damaged)  # fmt: skip
            if checked.damage is not None:
                raise read_check.DamagedRecordError(checked.damage)
        return self._record_at(offset)

    def read_records(self, spans: Sequence[tuple], *, copy: bool = False) -> read_check.CheckedRead:
        """MessageStore.read_records: one walk per record here (entry headers lie between them)."""
        checked = read_check.read_records(self._segment_of, spans, crc_function=self.crc_function, check=self.config.check_crc_on_read,
                                          copy=copy)  # fmt: skip
        return read_check.noted(checked, self.read_damaged)

    def read_checked(self, offset: int, size_max: int) -> read_check.CheckedRead:
        """MessageStore.read_checked: in the DLedger part each entry's record is walked alone."""
        if not self.config.check_crc_on_read:
            return read_check.CheckedRead([self.read(offset, size_max)])
        if self.divided_log.part_of(offset) is LogPart.CLASSIC:
            mapped_file = self.classic.transfer_span(offset, 0)[0]
            segment_end, header = mapped_file.file_from_offset + mapped_file.file_size, 0
        else:
            self.read(offset, 0)  # ReadError outside the committed log, as read
            mapped_file = self.entries.data_file_list.find_mapped_file_by_offset(offset)
            segment_end = min(mapped_file.file_from_offset + mapped_file.file_size, self.committed_end_offset())
            header = BODY_OFFSET
        checked = read_check.read_range(self.read, self._file_path, offset, size_max, crc_function=self.crc_function,
                                        segment_end=segment_end, entry_header_size=header)  # fmt: skip
        return read_check.noted(checked, self.read_damaged)

    def _segment_of(self, offset: int) -> read_check.Segment:
        """The readable bytes of the file holding ``offset``: a classic segment's, or a data file's
        up to the committed end."""
        if self.divided_log.part_of(offset) is LogPart.CLASSIC:
            mapped_file = self.classic.transfer_span(offset, 0)[0]
            return mapped_file.view()[: mapped_file.read_position], mapped_file.file_from_offset, mapped_file.path
        start, end = self._dledger_start(), self.committed_end_offset()
        if not start <= offset < end:
            raise ReadError(f"offset {offset} outside the committed DLedger log [{start}, {end})")
        mapped_file = self.entries.data_file_list.find_mapped_file_by_offset(offset)
        limit = min(mapped_file.wrote_position, end - mapped_file.file_from_offset)
        return mapped_file.view()[:limit], mapped_file.file_from_offset, mapped_file.path

    def _file_path(self, offset: int) -> str:
        if self.divided_log.part_of(offset) is LogPart.CLASSIC:
            return self.classic.mapped_file_queue.find_mapped_file_by_offset(offset).path
        return self.entries.data_file_list.find_mapped_file_by_offset(offset).path

    def read(self, offset: int, size_max: int) -> memoryview:
        """Zero-copy bytes from ``offset``: up to ``size_max``, never past a file's end nor, in the
        DLedger part, past the committed end (DLedgerCommitLog.getData)."""
        if self.divided_log.part_of(offset) is LogPart.CLASSIC:
            return self.classic.read(offset, size_max)
        start, end = self._dledger_start(), self.committed_end_offset()
        if not start <= offset < end:
            raise ReadError(f"offset {offset} outside the committed DLedger log [{start}, {end})")
        mapped_file = self.entries.data_file_list.find_mapped_file_by_offset(offset)
        position = offset - mapped_file.file_from_offset
        size = min(size_max, mapped_file.wrote_position - position, end - offset)
        return mapped_file.slice(position, size)

    def pull(self, topic: str, queue_id: int, queue_offset: int, count_max: int) -> list[rec.Record]:
        queue = self.consume_queues.find(topic, queue_id)
        if queue is None:
            return []
        units = queue.read(queue_offset, count_max)
        if not self.config.check_crc_on_read:
            return [self.get_record(offset) for offset, _size, _tags in units]
        checked = self.read_records(units)
        if checked.damage is not None and not checked.views:
            raise read_check.DamagedRecordError(checked.damage)
        return [rec.decode_record(view, crc_function=None) for view in checked.views]

    def find_at_record_ends(self, span_bytes: int, pattern: re.Pattern) -> Iterator[tuple[re.Match, RecordPlace]]:
        """Matches of ``pattern`` ending exactly where a record ends (its properties), in the
        committed entries of the last ``span_bytes`` of the DLedger part (the classic part is not
        searched), with where that record is (MessageStore.find_at_record_ends)."""
        entries = self.entries
        end = self.committed_end_offset()
        index = self._first_index_at_or_after(end - span_bytes)
        while index <= entries.committed_index:
            pos, size = entries.entry_span(index)
            index += 1
            if size <= BODY_OFFSET:
                continue
            mapped_file = entries.data_file_list.find_mapped_file_by_offset(pos)
            base = mapped_file.file_from_offset
            view = mapped_file.view()
            start, limit = pos + BODY_OFFSET - base, pos + size - base
            for match in pattern.finditer(view, start, limit):
                if match.end() != limit:
                    continue
                _, _, _, queue_id, queue_offset, sysflag, _, _ = rec.decode_dispatch(view, start, limit)
                if not transactional(sysflag):
                    yield match, RecordPlace(pos + BODY_OFFSET, size - BODY_OFFSET, queue_id, queue_offset)
