"""Read-only views of a DLedger store directory: ``verify`` and entry iteration for ``dump``.

Nothing here writes: files are opened ``O_RDONLY`` and mapped ``PROT_READ``, no recovery runs, so
it works on a live store (it sees what the page cache holds) and on a copy. File sizes come from
the files. ``verify`` scans from the first data file (recovery starts near the end) with the scan
recovery uses and says where the log ends, why, and what recovery would do about it.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from collections.abc import Iterator

from commitlog.dledger import entry_codec as codec
from commitlog.dledger import state_files
from commitlog.dledger.entry_store import DATA_DIRECTORY, INDEX_DIRECTORY
from commitlog.dledger.scan import DataFile, DataScan, scan_data_files, unit_matches
from commitlog.mapped_file import StoreError, nonzero_extent
from commitlog.mapped_file_queue import MappedFileQueue


class _ReadOnlyFiles:
    """The contiguous files of one directory, mapped read-only."""

    def __init__(self, directory: str):
        self.file_size = MappedFileQueue.infer_file_size(directory) or 0
        self.files: list[DataFile] = []
        self._mappings: list[mmap.mmap] = []
        expected = None
        for start, path in MappedFileQueue.segment_files(directory):
            if os.path.getsize(path) == 0:
                continue
            if expected is not None and start != expected:
                self.close()
                raise StoreError(f"{path}: expected the file starting at {expected} next (missing file)")
            with open(path, "rb") as file:
                mapping = mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ)
            self._mappings.append(mapping)
            self.files.append(DataFile(path, start, mapping))
            expected = start + self.file_size

    def find(self, offset: int) -> DataFile | None:
        if not self.files or not self.file_size:
            return None
        number = (offset - self.files[0].file_from_offset) // self.file_size
        return self.files[number] if 0 <= number < len(self.files) else None

    def close(self) -> None:
        self.files = []
        for mapping in self._mappings:
            try:
                mapping.close()
            except BufferError:
                pass  # a view is still alive (an exception's traceback); unmapped when it goes
        self._mappings = []


@dataclasses.dataclass
class DLedgerVerifyReport:
    path: str
    data_files: int
    data_file_size: int
    index_files: int
    index_file_size: int
    start_offset: int  # first data file's offset (the smooth-upgrade divide when it follows a classic log)
    end_offset: int  # end of the valid entries
    first_index: int
    last_index: int
    last_term: int
    entries: int
    reason: str
    corrupt_offset: int | None  # where an invalid entry or a torn tail starts; None: clean
    index_mismatch_from: int | None  # first entry whose index unit does not match (recovery rewrites)
    later_files_holding_data: int  # data files after the end holding data (recovery deletes them)
    checkpoint: dict[str, str] | None
    currterm: dict[str, str] | None

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


def verify(directory: str) -> DLedgerVerifyReport:
    """Scan every entry from the first data file; stop at the first invalid one."""
    if not os.path.isdir(directory):
        raise StoreError(f"{directory}: no such directory")
    data = _ReadOnlyFiles(os.path.join(directory, DATA_DIRECTORY))
    index = _ReadOnlyFiles(os.path.join(directory, INDEX_DIRECTORY))
    try:
        report = _verify(directory, data, index)
    finally:
        data.close()
        index.close()
    return report


def _verify(directory: str, data: _ReadOnlyFiles, index: _ReadOnlyFiles) -> DLedgerVerifyReport:
    def matches(header: codec.EntryHeader) -> bool:
        found = index.find(header.index * codec.INDEX_UNIT_SIZE)
        if found is None:
            return False
        try:
            unit = codec.decode_index_unit(found.view, header.index * codec.INDEX_UNIT_SIZE - found.file_from_offset)
        except codec.EntryFormatError:
            return False
        return unit_matches(unit, header)

    start = data.files[0].file_from_offset if data.files else 0
    if data.files:
        scan = scan_data_files(data.files, file_size=data.file_size, unit_matches=matches)
    else:
        scan = DataScan(end_offset=start, reason="no data files")
    end = scan.end_offset
    later = [f for f in data.files if f.file_from_offset > end and any(f.view[: codec.MIN_BLANK_SIZE])]
    corrupt, reason = (None if scan.clean else end), scan.reason
    if scan.clean and later:
        corrupt, reason = end, "data ends early but later data files hold entries"
    elif scan.clean and scan.blanks_damaged:
        path, offset, why = scan.blanks_damaged[0]
        corrupt, reason = offset, f"damaged blank record in {os.path.basename(path)}: {why} (recovery writes it again)"
    elif scan.clean and (stop := data.find(end)) is not None:
        with memoryview(stop.view) as view:
            if nonzero_extent(view, end - stop.file_from_offset, data.file_size):
                corrupt, reason = end, "nonzero bytes after the end of the data (torn tail)"
    return DLedgerVerifyReport(
        path=directory, data_files=len(data.files), data_file_size=data.file_size, index_files=len(index.files),
        index_file_size=index.file_size, start_offset=start, end_offset=end, first_index=scan.first_index,
        last_index=scan.last_index, last_term=scan.last_term, entries=scan.count, reason=reason,
        corrupt_offset=corrupt, index_mismatch_from=scan.index_mismatch_from, later_files_holding_data=len(later),
        checkpoint=state_files.read_properties(os.path.join(directory, state_files.CHECKPOINT_FILE)),
        currterm=state_files.read_properties(os.path.join(directory, state_files.TERM_FILE)),
    )  # fmt: skip


def iter_entries(directory: str, *, from_pos: int | None = None) -> Iterator[tuple[codec.EntryHeader, bytes]]:
    """(header, body) of every entry in data-file order from ``from_pos`` (an entry's pos; default
    the first); stops at the end of the data, raises EntryFormatError at an invalid entry."""
    data = _ReadOnlyFiles(os.path.join(directory, DATA_DIRECTORY))
    views: dict[int, memoryview] = {}  # one view a file: slicing the mmap itself would copy the whole file per entry
    try:
        if not data.files:
            return
        offset = data.files[0].file_from_offset if from_pos is None else from_pos
        while (found := data.find(offset)) is not None:
            position = offset - found.file_from_offset
            if codec.peek_blank(found.view, position) is not None:
                offset = found.file_from_offset + data.file_size
                continue
            if data.file_size - position < codec.MIN_BLANK_SIZE or not any(found.view[position : position + 8]):
                return
            view = views.get(found.file_from_offset)
            if view is None:
                view = views[found.file_from_offset] = memoryview(found.view)[: data.file_size]
            header, body = codec.decode_entry(view, position)  # the body is a copy: no view escapes
            if header.pos != offset:
                raise codec.EntryFormatError(f"entry {header.index} says pos {header.pos}, lies at {offset}")
            yield header, body
            offset += header.size
    finally:
        for view in views.values():
            view.release()
        data.close()
