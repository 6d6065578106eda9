"""The recovery scan of DLedger data files, shared by the store's recovery and the read-only
inspector: pure, it reads the buffers it is handed and writes nothing.

Theory of operation
-------------------
``scan_data_files`` walks data files in order from the first one it is given. In each: a blank
record (magic -1) whose size reaches exactly the end of the file moves to the next file; eight
zero bytes end the log (clean); anything else must be a whole entry (``entry_codec``: header
fields, body inside the file, bodyCrc when not 0) lying at its own ``pos``, with index = previous
+ 1 and a term not below the previous one. The first that is not ends the log there (not clean).
``unit_matches`` tells whether an entry's index unit agrees with it; the first entry whose unit
does not is remembered (recovery rewrites the index from there).

A blank record is fully determined by where it lies: ``[int32 -1][int32 remaining]`` and zeros to
the file's end (``blank_damage`` checks all of it, padding included). Where the bytes from the
scan's place to the file's end are not that -- a blank whose size, magic or padding is damaged --
and the next data file starts with the entry that follows the last one scanned (at its own pos,
its index unit agreeing), those bytes can only have been a blank record: the place is listed in
``blanks_damaged`` (recovery writes the blank again) and the scan goes on in the next file. No
torn write makes that (the writer pads a file before it starts the next one); a torn tail ends at
zeros, and zeros still end the log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from commitlog.dledger import entry_codec as codec


@dataclasses.dataclass
class DataScan:
    """Where the scan stopped and what it saw."""

    end_offset: int  # global data offset where the log ends
    first_index: int = -1
    last_index: int = -1
    last_term: int = -1
    count: int = 0
    reason: str = "end of written data"
    clean: bool = True  # ended at zeros or at the end of the last file, not at an invalid entry
    stop_path: str | None = None  # the data file the scan stopped in
    index_mismatch_from: int | None = None  # first entry whose index unit did not match
    index_mismatch_offset: int = -1  # its data offset
    # A whole entry at its own pos, following its predecessor's index, with a lower term: no torn
    # write makes that (a torn tail is zeros or a partial entry). The term is under no CRC in
    # DLedger's format, so a damaged byte there looks like this: damage in the middle of the log.
    damaged: bool = False
    first_index_expected: int | None = None  # the index the first entry scanned must have (None: any)
    last_pos: int = -1  # where the last entry scanned lies (its validated header's pos)
    previous_term: int = -1  # the term of the entry before it (-1: none scanned)
    # (data file path, data offset, why) of each blank record that was damaged (see the module)
    blanks_damaged: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class DataFile:
    path: str
    file_from_offset: int
    view: object  # a buffer of the whole file (mmap, memoryview, bytes)


def scan_data_files(files: Sequence[DataFile], *, file_size: int,
                    unit_matches: Callable[[codec.EntryHeader], bool],
                    first_index: int | None = None) -> DataScan:  # fmt: skip
    """Scan ``files`` (contiguous data files, non-empty) from the first one's start.
    ``first_index``: the index the first entry must have (the log's first file: its index is
    under no CRC, and nothing before it would tell a damaged one); None: any."""
    scan = DataScan(end_offset=files[0].file_from_offset)
    scan.first_index_expected = first_index
    for number, data_file in enumerate(files):
        scan.stop_path = data_file.path
        next_file = files[number + 1] if number + 1 < len(files) else None
        if not _scan_file(data_file, file_size, scan, unit_matches, next_file):
            return scan
    scan.end_offset = files[-1].file_from_offset + file_size
    scan.reason = "end of the last data file (blank record)"
    return scan


def blank_damage(view, position: int, file_size: int) -> str | None:
    """Why the bytes from ``position`` to the end of the data file in ``view`` are not the blank
    record a writer leaves there (None: they are)."""
    remaining = file_size - position
    if remaining < codec.MIN_BLANK_SIZE:
        return f"{remaining} bytes left, no room for a blank record"
    magic, size = codec.BLANK.unpack_from(view, position)
    if magic != codec.BLANK_MAGIC_CODE:
        return f"blank record magic {magic}"
    if size != remaining:
        return f"blank record of {size} bytes, {remaining} left"
    padding = bytes(view[position + codec.MIN_BLANK_SIZE : file_size])
    if padding.count(0) != len(padding):
        nonzero = len(padding) - len(padding.lstrip(b"\0"))
        return f"a nonzero byte in the blank record's padding at offset {position + codec.MIN_BLANK_SIZE + nonzero}"
    return None


def _blank_was_here(data_file: DataFile, position: int, file_size: int, scan: DataScan,
                    unit_matches: Callable[[codec.EntryHeader], bool], next_file: DataFile | None) -> bool:  # fmt: skip
    """Whether the bytes from ``position`` on were a blank record, now damaged (see the module):
    then it is listed and the scan moves to the next file."""
    reason = blank_damage(data_file.view, position, file_size)
    if reason is None:
        return True
    if codec.peek_blank(data_file.view, position) == file_size - position:  # its header is whole: the padding
        scan.blanks_damaged.append((data_file.path, data_file.file_from_offset + position, reason))
        return True
    if next_file is None or scan.last_index < 0 or position == 0:
        return False
    try:
        header = codec.decode_entry_header(next_file.view, 0)
        codec.check_body(header, next_file.view, 0)
    except codec.EntryFormatError:
        return False
    if (header.index, header.pos) != (scan.last_index + 1, next_file.file_from_offset) or not unit_matches(header):
        return False
    scan.blanks_damaged.append((data_file.path, data_file.file_from_offset + position, reason))
    return True


def _scan_file(data_file: DataFile, file_size: int, scan: DataScan,
               unit_matches: Callable[[codec.EntryHeader], bool], next_file: DataFile | None = None) -> bool:  # fmt: skip
    """Scan one data file into ``scan``; True when it ends with a blank record (or a damaged one,
    listed in ``blanks_damaged``)."""
    view = data_file.view
    position = 0
    while True:
        scan.end_offset = data_file.file_from_offset + position
        blank_here = lambda: _blank_was_here(data_file, position, file_size, scan, unit_matches, next_file)  # noqa: E731, B023
        if file_size - position < codec.MIN_BLANK_SIZE:
            return _stop(scan, f"{file_size - position} bytes left, no room for a record", clean=False)
        blank = codec.peek_blank(view, position)
        if blank is not None:
            if blank_here():
                return True
            return _stop(scan, f"blank record of {blank} bytes, {file_size - position} left", clean=False)
        if not any(view[position : position + codec.MIN_BLANK_SIZE]):
            return _stop(scan, "end of written data", clean=True)
        try:
            header = codec.decode_entry_header(view, position)
            codec.check_body(header, view, position)
        except codec.EntryFormatError as error:
            return True if blank_here() else _stop(scan, error.reason, clean=False)
        problem = _misplaced(header, scan, data_file.file_from_offset + position)
        if problem:
            scan.damaged = header.term < scan.last_term and header.pos == scan.end_offset and header.index == scan.last_index + 1
            return _stop(scan, problem, clean=False)
        if scan.index_mismatch_from is None and not unit_matches(header):
            scan.index_mismatch_from = header.index
            scan.index_mismatch_offset = header.pos
        if scan.first_index < 0:
            scan.first_index = header.index
        scan.previous_term = scan.last_term if scan.count else -1
        scan.last_index, scan.last_term, scan.last_pos = header.index, header.term, header.pos
        scan.count += 1
        position += header.size


def _stop(scan: DataScan, reason: str, *, clean: bool) -> bool:
    scan.reason, scan.clean = reason, clean
    return False


def _misplaced(header: codec.EntryHeader, scan: DataScan, offset: int) -> str | None:
    if header.pos != offset:
        return f"entry {header.index} says pos {header.pos}, lies at {offset}"
    if scan.last_index >= 0 and header.index != scan.last_index + 1:
        return f"entry index {header.index} does not follow {scan.last_index}"
    if scan.last_index < 0 and scan.first_index_expected not in (None, header.index):
        return f"entry index {header.index}, the log starts at {scan.first_index_expected}"
    if header.term < scan.last_term:
        return f"entry {header.index} has term {header.term}, below the previous {scan.last_term}"
    return None


def unit_matches(unit: codec.IndexUnit | None, header: codec.EntryHeader) -> bool:
    """Whether index unit ``unit`` (None: missing) agrees with the entry ``header``."""
    return unit is not None and (unit.magic, unit.pos, unit.size, unit.index, unit.term) == (
        header.magic, header.pos, header.size, header.index, header.term)  # fmt: skip
