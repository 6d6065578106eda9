"""Reading the entry store: entries by index, by ``pos`` and as stored runs, index-unit lookup.

Theory of operation
-------------------
Entry ``i``'s index unit lies at offset ``i * 32`` of the index files and names its ``pos`` and
``size`` in the data files. Every read is a pair check (STYLE.md): the entry header at ``pos`` must
say what the unit says (magic, size, index, term, pos), and the body its bodyCrc (when not 0);
anything else is damage after recovery, a StoreError naming the file and offset (``get`` says
what is wrong; the fast paths -- ``read``, ``_unit`` -- check the same fields without building
objects and ask ``get``/``_index_unit`` for the reason when a check fails). Outside
``[first_index(), last_index()]``: IndexError.

``EntryReader`` is a part of ``DLedgerMmapFileStore`` (its base class), not an object of its own:
the Raft core reads ``term_at``, ``ends`` and units at every event, and a call through another
object would cost on that path. It reads the store's files and its ``_first_index`` and
``_last_index`` and changes nothing.
"""

from __future__ import annotations

from typing import NoReturn

from commitlog.dledger import entry_codec as codec
from commitlog.dledger.entry_run import EntryRun
from commitlog.dledger.entry_types import Entry, StoredEntry
from commitlog.mapped_file import StoreError
from commitlog.mapped_file_queue import MappedFileQueue


def index_unit_or_none(queue: MappedFileQueue, index: int) -> codec.IndexUnit | None:
    """The index unit of entry ``index`` in ``queue`` when it is there, decodes and names that
    entry; None otherwise (recovery and repair ask without knowing the log's bounds)."""
    offset = index * codec.INDEX_UNIT_SIZE
    mapped_file = queue.find_mapped_file_by_offset(offset) if index >= 0 else None
    if mapped_file is None:
        return None
    try:
        unit = codec.decode_index_unit(mapped_file.view(), offset - mapped_file.file_from_offset)
    except codec.EntryFormatError:
        return None
    return unit if unit.index == index else None


class EntryReader:
    """The read half of ``DLedgerMmapFileStore`` (see the module)."""

    data_file_list: MappedFileQueue
    index_file_list: MappedFileQueue
    _first_index: int
    _last_index: int
    _last_term: int
    _committed_index: int

    def term_at(self, index: int) -> int:
        if index == self._last_index and index >= self._first_index:  # the commonest: no index unit read
            return self._last_term
        return self._unit(index)[4]

    def read(self, lo: int, hi: int, *, size_max: int) -> list[Entry]:
        """Entries ``lo <= index < hi``, stopping before the bodies' total would pass ``size_max``
        (at least one when ``lo <= last_index()``). Each entry is checked against its index unit
        and its bodyCrc, as ``get`` does, without building the intermediate objects."""
        if lo > self._last_index:
            return []
        if lo < self._first_index:
            raise IndexError(f"index {lo} outside the log [{self._first_index}, {self._last_index}]")
        entries: list[Entry] = []
        total = 0
        index_file = None
        for index in range(lo, min(hi, self._last_index + 1)):
            offset = index * codec.INDEX_UNIT_SIZE
            if index_file is None or offset - index_file.file_from_offset >= index_file.file_size:
                index_file = self.index_file_list.find_mapped_file_by_offset(offset)
                if index_file is None:
                    self._raise_damage(index)
            magic, pos, size, unit_index, term = codec.INDEX_UNIT.unpack_from(index_file.view(),
                                                                              offset - index_file.file_from_offset)  # fmt: skip
            body = self._checked_body(index, magic, pos, size, unit_index, term)
            if entries and total + len(body) > size_max:
                break
            entries.append(Entry(index, term, body))
            total += len(body)
        return entries

    def _checked_body(self, index: int, magic: int, pos: int, size: int, unit_index: int, term: int) -> bytes:
        """The body of entry ``index`` whose index unit holds these values, after the pair check."""
        data_file = self.data_file_list.find_mapped_file_by_offset(pos)
        position = pos - data_file.file_from_offset if data_file is not None else -1
        if data_file is None or not codec.BODY_OFFSET <= size <= data_file.wrote_position - position:
            self._raise_damage(index)
        view = data_file.view()
        header = codec.ENTRY_HEADER.unpack_from(view, position)
        if header[:5] != (magic, size, index, term, pos) or unit_index != index or header[8] + codec.BODY_OFFSET != size:
            self._raise_damage(index)
        body = bytes(view[position + codec.BODY_OFFSET : position + size])
        if header[7] and codec.body_crc(body) != header[7]:
            self._raise_damage(index)
        return body

    def _raise_damage(self, index: int) -> NoReturn:
        """``get`` names what is wrong with entry ``index``; the caller's fast check found it."""
        self.get(index)
        raise AssertionError(f"entry {index} failed a check that get() passes")

    def get(self, index: int) -> StoredEntry:
        """Entry ``index`` with its ``pos``; IndexError outside [first, last]; StoreError when the
        data does not match its index unit (damage after recovery)."""
        unit = self._index_unit(index)
        view = self._data_view(unit.pos, unit.size)
        try:
            header, body = codec.decode_entry(view)
        except codec.EntryFormatError as error:
            raise StoreError(f"{self.data_file_list.directory}: entry {index} at offset {unit.pos}: {error}") from None
        if (header.index, header.term, header.pos, header.size) != (unit.index, unit.term, unit.pos, unit.size):
            raise StoreError(f"{self.data_file_list.directory}: entry at offset {unit.pos} is {header}, "
                             f"its index unit says {unit}")  # fmt: skip
        return StoredEntry(header.index, header.term, header.pos, header.size, body)

    def get_by_pos(self, pos: int) -> StoredEntry:
        """The entry that starts at data offset ``pos`` (DLedgerCommitLog reads messages by
        offset: pos = PHYSICALOFFSET - 48); ValueError when no entry of the log starts there."""
        mapped_file = self.data_file_list.find_mapped_file_by_offset(pos)
        if mapped_file is None or pos - mapped_file.file_from_offset >= mapped_file.wrote_position:
            raise ValueError(f"offset {pos} is outside the written data files")
        try:
            header = codec.decode_entry_header(mapped_file.view(), pos - mapped_file.file_from_offset)
        except codec.EntryFormatError as error:
            raise ValueError(f"no entry starts at offset {pos}: {error.reason}") from None
        if not self._first_index <= header.index <= self._last_index:
            raise ValueError(f"no entry starts at offset {pos}: entry {header.index} is not in the log")
        stored = self.get(header.index)
        if stored.pos != pos:
            raise ValueError(f"no entry starts at offset {pos}: entry {header.index} lies at {stored.pos}")
        return stored

    def pos_at(self, index: int) -> int:
        """Data-file offset of entry ``index`` (DLedgerEntry.pos)."""
        return self._unit(index)[1]

    def entry_span(self, index: int) -> tuple[int, int]:
        """``(pos, size)`` of entry ``index``: its bytes are ``[pos, pos + size)`` of the data files."""
        unit = self._unit(index)
        return unit[1], unit[2]

    def _unit(self, index: int) -> tuple[int, int, int, int, int]:
        """``_index_unit``'s fields (magic, pos, size, index, term) without building an
        ``IndexUnit``: the same checks, the reason from ``_index_unit`` when one fails (the
        leader reads units per push and per proposal: the dataclass cost ~3 % of its loop)."""
        if not self._first_index <= index <= self._last_index:
            raise IndexError(f"index {index} outside the log [{self._first_index}, {self._last_index}]")
        offset = index * codec.INDEX_UNIT_SIZE
        # find_mapped_file_by_offset written out (the leader reads a few units an event)
        files = self.index_file_list.mapped_files
        number = (offset - files[0].file_from_offset) // self.index_file_list.file_size if files else -1
        mapped_file = files[number] if 0 <= number < len(files) else None
        if mapped_file is not None:
            assert mapped_file.file_from_offset <= offset < mapped_file.file_from_offset + mapped_file.file_size
            unit = codec.INDEX_UNIT.unpack_from(mapped_file.view(), offset - mapped_file.file_from_offset)
            if (unit[0] == codec.MAGIC_1 and unit[3] == index and codec.BODY_OFFSET <= unit[2] <= codec.ENTRY_SIZE_MAX
                    and unit[1] >= 0 and unit[4] >= 0):  # fmt: skip
                return unit
        found = self._index_unit(index)  # raises, naming what is wrong
        raise AssertionError(f"index unit {found} failed a check that _index_unit passes")

    def entry_spans(self, first: int, last: int) -> list[tuple[int, int]]:
        """``entry_span`` of every entry in ``[first, last]``, read from the index files a run of
        units at a time (the dispatcher's path: one lookup per index file, not per entry)."""
        if not self._first_index <= first <= last <= self._last_index:
            raise IndexError(f"entries [{first}, {last}] outside the log [{self._first_index}, {self._last_index}]")
        spans: list[tuple[int, int]] = []
        index = first
        while index <= last:
            offset = index * codec.INDEX_UNIT_SIZE
            mapped_file = self.index_file_list.find_mapped_file_by_offset(offset)
            if mapped_file is None:
                raise StoreError(f"{self.index_file_list.directory}: no index file holds offset {offset} (entry {index})")
            position = offset - mapped_file.file_from_offset
            count = min(last - index + 1, (mapped_file.file_size - position) // codec.INDEX_UNIT_SIZE)
            view = mapped_file.view()[position : position + count * codec.INDEX_UNIT_SIZE]
            for expected, (magic, pos, size, unit_index, _term) in enumerate(codec.INDEX_UNIT.iter_unpack(view), start=index):
                if magic != codec.MAGIC_1 or unit_index != expected or not codec.BODY_OFFSET <= size <= codec.ENTRY_SIZE_MAX:
                    self._index_unit(expected)  # raises with the reason
                spans.append((pos, size))
            index += count
        return spans

    def _index_unit(self, index: int) -> codec.IndexUnit:
        if not self._first_index <= index <= self._last_index:
            raise IndexError(f"index {index} outside the log [{self._first_index}, {self._last_index}]")
        offset = index * codec.INDEX_UNIT_SIZE
        mapped_file = self.index_file_list.find_mapped_file_by_offset(offset)
        if mapped_file is None:
            raise StoreError(f"{self.index_file_list.directory}: no index file holds offset {offset} (entry {index})")
        position = offset - mapped_file.file_from_offset
        try:
            unit = codec.decode_index_unit(mapped_file.view(), position)
        except codec.EntryFormatError as error:
            raise StoreError(f"{mapped_file.path}: index unit of entry {index}: {error}") from None
        if unit.index != index:
            raise StoreError(f"{mapped_file.path}: index unit at position {position} names entry {unit.index}, not {index}")
        return unit

    def _data_view(self, pos: int, size: int) -> memoryview:
        mapped_file = self.data_file_list.find_mapped_file_by_offset(pos)
        if mapped_file is None:
            raise StoreError(f"{self.data_file_list.directory}: no data file holds offset {pos}")
        position = pos - mapped_file.file_from_offset
        if position + size > mapped_file.wrote_position:
            raise StoreError(f"{mapped_file.path}: entry [{position}, {position + size}) beyond the written "
                             f"{mapped_file.wrote_position} bytes")  # fmt: skip
        return mapped_file.view()[position : position + size]

    # -- runs of stored entries (a push as the leader's bytes: entry_run.py) ---------------

    def run_length(self, lo: int, hi: int, *, size_max: int) -> tuple[int, int]:
        """(count, body bytes) of the entries from ``lo`` (below ``hi``) whose bodies fit in
        ``size_max`` (at least one entry when ``lo <= last_index()``): what one push carries. A
        binary search over the index units (the bytes between two entries' positions, less a
        header per entry; a blank record at a file's end counts as body), no entry read."""
        count, body_size, _, _ = self.run_extent(lo, hi, size_max=size_max)
        return count, body_size

    def run_extent(self, lo: int, hi: int, *, size_max: int) -> tuple[int, int, int, int]:
        """``run_length`` and where those entries lie: (count, body bytes, pos of the first, end of
        the last); (0, 0, -1, -1) when none."""
        hi = min(hi, self._last_index + 1)
        if lo >= hi:
            return 0, 0, -1, -1
        start = self.pos_at(lo)
        pos, size = self.entry_span(hi - 1)
        body_size = pos + size - start - (hi - lo) * codec.BODY_OFFSET
        if body_size <= size_max or hi - lo == 1:  # all of them (the commonest: a push of what a proposal added)
            return hi - lo, body_size, start, pos + size
        low, high = lo, hi - 2  # the answer's last entry lies in [low, high]
        # First where the range's average entry says, and the entry after it: entries of one size
        # (a producer's) need no more. Then a binary search of what is left.
        body_average = body_size / (hi - lo)
        guess = min(max(lo + int(size_max / body_average) - 1, low), high) if body_average > 0 else low
        pos, size = self.entry_span(guess)
        if pos + size - start - (guess - lo + 1) * codec.BODY_OFFSET <= size_max:
            low, found = guess, (pos, size)
            if guess < high:
                pos, size = self.entry_span(guess + 1)
                if pos + size - start - (guess - lo + 2) * codec.BODY_OFFSET > size_max:
                    high = guess
                else:
                    low, found = guess + 1, (pos, size)
        else:
            high = guess - 1
            found = None
        while low < high:
            middle = (low + high + 1) // 2
            pos, size = self.entry_span(middle)
            if pos + size - start - (middle - lo + 1) * codec.BODY_OFFSET <= size_max:
                low, found = middle, (pos, size)
            else:
                high = middle - 1
        pos, size = found if found is not None else self.entry_span(low)  # found: low's, when read
        return low - lo + 1, pos + size - start - (low - lo + 1) * codec.BODY_OFFSET, start, pos + size

    def read_runs(self, first: int, count: int, last_term: int) -> list[EntryRun] | None:
        """Entries ``first .. first + count - 1`` as stored, one ``EntryRun`` per data file they
        lie in, each a read-only view of the mapping (release it before the log changes: a
        truncate zeroes it, retention unmaps it); None unless the log holds them all and the
        last has ``last_term`` (then, by log matching, they are the entries that were meant)."""
        last = first + count - 1
        if count < 1 or first < self._first_index or last > self._last_index or self.term_at(last) != last_term:
            return None
        runs: list[EntryRun] = []
        while first <= last:
            pos = self.pos_at(first)
            mapped_file = self.data_file_list.find_mapped_file_by_offset(pos)
            file_end = mapped_file.file_from_offset + mapped_file.file_size
            end_pos, end_size = self.entry_span(last)
            if end_pos < file_end:
                stop = last
            else:  # the last entry starting in this file: binary search (the run stops at the file's end)
                low, high = first, last
                while low < high:
                    middle = (low + high + 1) // 2
                    if self.pos_at(middle) < file_end:
                        low = middle
                    else:
                        high = middle - 1
                stop = low
                end_pos, end_size = self.entry_span(stop)
            position = pos - mapped_file.file_from_offset
            view = mapped_file.view()[position : position + end_pos + end_size - pos].toreadonly()
            runs.append(EntryRun(first, stop - first + 1, last_term if stop == last else self.term_at(stop), view))
            first = stop + 1
        return runs

    @property
    def committed_pos(self) -> int:
        """End offset of the committed entry (DLedger's committedPos); -1 when nothing is."""
        if self._committed_index < self._first_index:
            return -1
        pos, size = self.entry_span(self._committed_index)
        return pos + size
