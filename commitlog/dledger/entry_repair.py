"""Scrub support and entry repair: the stored index units as they are, and an entry rewritten
from a healthy member's copy (commitlog/scrub.py's EntryScrubber, the broker's fetch).

``EntryRepair`` is a part of ``DLedgerMmapFileStore`` (its base class).
"""

from __future__ import annotations

from commitlog.dledger import entry_codec as codec
from commitlog.dledger.entry_reader import index_unit_or_none
from commitlog.mapped_file import MappedFile, StoreError
from commitlog.mapped_file_queue import MappedFileQueue


class EntryRepair:
    """The scrub's reads and the repair's writes of ``DLedgerMmapFileStore`` (see the module)."""

    data_file_list: MappedFileQueue
    index_file_list: MappedFileQueue
    _first_index: int
    _last_index: int
    _last_term: int
    _committed_index: int

    def index_unit_bytes(self, first: int, count_max: int) -> bytes:
        """The stored index units of entries ``first``.. as they are (at most ``count_max``, none
        past the last entry, all from one index file): the scrub compares them with its entries."""
        count = min(count_max, self._last_index - first + 1)
        offset = first * codec.INDEX_UNIT_SIZE
        mapped_file = self.index_file_list.find_mapped_file_by_offset(offset) if count > 0 and first >= self._first_index else None
        if mapped_file is None:
            return b""
        position = offset - mapped_file.file_from_offset
        count = min(count, (mapped_file.wrote_position - position) // codec.INDEX_UNIT_SIZE)
        return bytes(mapped_file.view()[position : position + max(count, 0) * codec.INDEX_UNIT_SIZE])

    def rewrite_blank(self, pos: int) -> str:
        """Write the blank record from data offset ``pos`` to the end of its data file again
        (``[int32 -1][int32 remaining]`` and zeros: all determined by where it lies), over a
        damaged one, in a data file the writer has moved past; durable when this returns.
        Returns the file's path. The caller knows a blank lies there (the scrub: the next entry
        starts the next data file)."""
        mapped_file = self.data_file_list.find_mapped_file_by_offset(pos)
        assert mapped_file is not None and mapped_file.wrote_position == mapped_file.file_size, pos
        position = pos - mapped_file.file_from_offset
        remaining = mapped_file.file_size - position
        mapped_file.rewrite(position, codec.encode_blank(remaining) + bytes(remaining - codec.MIN_BLANK_SIZE))
        return mapped_file.path

    def rewrite_entry(self, index: int, pos: int, data) -> tuple[str, ...]:
        """Write ``data`` -- entry ``index`` at ``pos`` as a healthy member's log holds it (the data
        files of the members are byte-identical) -- over this log's damaged copy, and its index
        unit from it; durable when this returns. Only a committed entry (one that every member
        holding it holds the same) and only a copy that checks: a whole entry (magic, sizes,
        bodyCrc, reserved fields 0) with this index and pos, whose term and size this log's
        header or index unit still agree with (a single damage changes one of them, not both).
        StoreError naming why otherwise, nothing written. Returns what was rewritten."""
        where = f"{self.data_file_list.directory}: entry {index} at offset {pos}"
        if not self._first_index <= index <= self._committed_index:
            raise StoreError(f"{where}: not a committed entry of this log [{self._first_index}, {self._committed_index}]")
        try:
            header, mapped_file, position = check_entry_copy(self.data_file_list, self.index_file_list, index, pos, data,
                                                             within="written")  # fmt: skip
        except EntryCopyRefused as error:
            raise StoreError(f"{where}: {error.reason}") from None
        rewritten: list[str] = []
        if bytes(mapped_file.view()[position : position + header.size]) != bytes(data):
            mapped_file.rewrite(position, data)
            rewritten.append(f"{header.size} entry bytes in {mapped_file.path}")
        expected = codec.INDEX_UNIT.pack(header.magic, pos, header.size, index, header.term)
        offset = index * codec.INDEX_UNIT_SIZE
        index_file = self.index_file_list.find_mapped_file_by_offset(offset)
        if index_file is not None:
            unit_position = offset - index_file.file_from_offset
            if bytes(index_file.view()[unit_position : unit_position + codec.INDEX_UNIT_SIZE]) != expected:
                index_file.rewrite(unit_position, expected)
                rewritten.append(f"the index unit in {index_file.path}")
        if index == self._last_index:
            self._last_term = header.term
        return tuple(rewritten)


class EntryCopyRefused(StoreError):
    """A member's copy of an entry that must not be written over this log's (``reason`` says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def check_entry_copy(data_file_list: MappedFileQueue, index_file_list: MappedFileQueue, index: int, pos: int, data, *,
                     within: str, holder: str = "this log") -> tuple[codec.EntryHeader, MappedFile, int]:  # fmt: skip
    """(its header, the data file, the position in it) when ``data`` is entry ``index`` at ``pos``,
    whole (magic, sizes, bodyCrc, reserved fields 0), lying ``within`` this log's data ("written":
    before the data file's wrote position, a log open; "file": leaving a blank record's room in the
    data file, a log not loaded), whose term and size this log's header or index unit there still
    say (a single damage changes one of them, not both); EntryCopyRefused otherwise, its reason
    naming the log as ``holder``. Shared by the live repair (``EntryRepair.rewrite_entry``) and the
    offline one (``member_repair.check_copy``)."""
    try:
        header = codec.decode_entry_header(data, 0)
        codec.check_body(header, data, 0)
    except codec.EntryFormatError as error:
        raise EntryCopyRefused(f"the copy fetched: {error.reason}") from None
    if (header.index, header.pos, header.size) != (index, pos, len(data)) or header.channel or header.chain_crc:
        raise EntryCopyRefused(f"the copy fetched is entry {header.index} at {header.pos} of {header.size} bytes "
                               f"({len(data)} fetched)")  # fmt: skip
    mapped_file = data_file_list.find_mapped_file_by_offset(pos)
    position = pos - mapped_file.file_from_offset if mapped_file is not None else -1
    if within == "written":
        if mapped_file is None or position + header.size > mapped_file.wrote_position:
            raise EntryCopyRefused(f"{header.size} bytes there pass {holder}'s written data")
    elif mapped_file is None or position + header.size > mapped_file.file_size - codec.MIN_BLANK_SIZE:
        raise EntryCopyRefused(f"{holder} has no data file that holds [{pos}, {pos + header.size})")
    ours: list[tuple[int, int]] = []  # (term, size) this log's index unit and header say
    unit = index_unit_or_none(index_file_list, index)
    if unit is not None and unit.pos == pos:
        ours.append((unit.term, unit.size))
    local = codec.ENTRY_HEADER.unpack_from(mapped_file.view(), position)
    if local[0] == codec.MAGIC_1 and local[2] == index and local[4] == pos:
        ours.append((local[3], local[1]))
    if (header.term, header.size) not in ours:
        raise EntryCopyRefused(f"the copy fetched (term {header.term}, {header.size} bytes) is not what {holder}'s header "
                               f"or index unit say ({ours or 'nothing readable'})")  # fmt: skip
    return header, mapped_file, position
