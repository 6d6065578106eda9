"""Writing the entry store: appends (entries, or a leader's run of stored bytes), room on disk
ahead of them, and the flush.

Theory of operation
-------------------
``pre_append`` finds where an entry lands -- the data file's write position, or the start of the
next data file after padding this one with a blank record when ``size + 8`` does not fit
(``entry_placement``, DLedger's ``MmapFileList.preAppend``) -- then the entry is written there
with its ``pos`` and its index unit at ``index * 32``. An append first makes the files it will
need (``make_room``: the next data file, the next index file, as each queue's spare), so a full
disk fails it with DiskFullError before any byte is written, never half-way between an entry and
its index unit. Nothing is durable until ``flush`` (data, then index), which returns
``flushed_index``; its middle step, ``sync_files``, may run in a worker thread while the owner
appends.

``EntryWriter`` is a part of ``DLedgerMmapFileStore`` (its base class), not an object of its own:
``append`` and ``append_run`` are the put path, where a call through another object would cost.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from commitlog.dledger import entry_codec as codec
from commitlog.dledger import entry_placement as placement
from commitlog.dledger.entry_run import EntryRun, check_run, index_units
from commitlog.dledger.entry_types import Entry
from commitlog.mapped_file import OS_PAGE_SIZE, MappedFile, fsync_directory
from commitlog.mapped_file_queue import MappedFileQueue
from commitlog.native import write_entries as _native_write_entries

# A leader's large appends (a pass of puts from many writers: 64 x 1 KiB is ~70 KiB) are written
# into a buffer of the store's and stored with ``pwrite`` wherever their pages are not faulted in
# yet, and the warm-up stays behind while they come (``large_appends``), as a classic master's
# (``commitlog.commit_log``'s WRITE_THROUGH_MIN has why): a page the kernel allocates for a write
# that covers it whole is never zeroed, where the warm-up's fault zeroes it and the append then
# writes it again (64 x 1 KiB: the warm-up thread's memset was ~3 us of the leader's ~20 us a
# message). An append of WRITE_THROUGH_MIN or more starts that; WARM_AFTER_SMALL_APPENDS smaller
# ones in a row end it. A follower's runs always go by ``pwrite`` (``append_run``).
WRITE_THROUGH_MIN = 64 * 1024
WARM_AFTER_SMALL_APPENDS = 64
# The buffer's bound (memory held for it): a larger append goes through the mapping.
WRITE_THROUGH_MAX = 4 * 1024 * 1024


def append_index_bytes(queue: MappedFileQueue, first_index: int, units: bytes) -> None:
    """Write packed index units of consecutive entries from ``first_index``, an index file at a time."""
    offset, done = first_index * codec.INDEX_UNIT_SIZE, 0
    while done < len(units):
        mapped_file = queue.get_last_mapped_file(offset)
        assert mapped_file is not None
        if mapped_file.wrote_position == 0 and mapped_file.offset_of(0) < offset:
            # The first unit of a rebuilt or reset index need not start its file (entries
            # before the first kept entry have no units).
            mapped_file.set_positions(offset - mapped_file.file_from_offset)
        assert mapped_file.offset_of(mapped_file.wrote_position) == offset, (mapped_file, offset)
        size = min(len(units) - done, mapped_file.remaining)
        position = mapped_file.wrote_position
        mapped_file.writable_view()[position : position + size] = units[done : done + size]
        mapped_file.advance(size)
        done += size
        offset += size


def append_index_units(queue: MappedFileQueue, units: list[tuple[int, int, int, int]]) -> None:
    """Write the index units ``(index, pos, size, term)`` of consecutive entries at ``index * 32``
    (packed, then ``append_index_bytes``: an index file at a time)."""
    if units:
        packed = b"".join(codec.INDEX_UNIT.pack(codec.MAGIC_1, pos, size, index, term)
                          for index, pos, size, term in units)  # fmt: skip
        append_index_bytes(queue, units[0][0], packed)


class EntryWriter:
    """The write half of ``DLedgerMmapFileStore`` (see the module)."""

    config: object  # DLedgerStoreConfig
    data_file_list: MappedFileQueue
    index_file_list: MappedFileQueue
    _data_start_offset: int
    _first_index: int
    _last_index: int
    _last_term: int
    _flushed_index: int
    # Appends are large (WRITE_THROUGH_MIN): written with pwrite past the warmed pages, and the
    # warm-up makes only the next data file (``needs_warming``).
    large_appends = False
    _small_appends = 0  # in a row, while large_appends
    _through_buffer: bytearray | None = None  # what a pwrite'd append is written into first

    def append(self, entries: Sequence[Entry]) -> None:
        """Append ``entries`` (``entries[0].index == last_index() + 1``, consecutive, terms not
        decreasing); not durable until ``flush``. Bad input: ValueError, nothing written. No
        room for a file they need: DiskFullError, nothing written (``make_room``).
        Entries are written a data file at a time, straight into the mapping (large appends
        into a buffer stored with ``pwrite``: WRITE_THROUGH_MIN)."""
        size_total, size_max = placement.check_appendable(entries, last_index=self._last_index, last_term=self._last_term,
                                                             file_size=self.config.data_file_size)  # fmt: skip
        if entries:
            last = self.data_file_list.last
            data_size = placement.data_size(wrote_position=None if last is None else last.wrote_position,
                                            file_size=self.config.data_file_size, size_total=size_total, size_max=size_max)  # fmt: skip
            self.make_room(data_size=data_size, count=len(entries))
            self._note_append_size(size_total)
        if _native_write_entries is not None and entries:
            chunks: list[bytes] = []  # packed index units
            start = 0
            while start < len(entries):
                start = self._append_run_native(entries, start, chunks, size_total)
            append_index_bytes(self.index_file_list, entries[0].index, b"".join(chunks))
        else:
            sizes = [codec.entry_size(len(entry.body)) for entry in entries]
            units: list[tuple[int, int, int, int]] = []  # (index, pos, size, term)
            start = 0
            while start < len(entries):
                start = self._append_run(entries, sizes, start, units)
            append_index_units(self.index_file_list, units)
        if entries:
            self._last_index, self._last_term = entries[-1].index, entries[-1].term
        self._check()

    def _append_run(self, entries: Sequence[Entry], sizes: list[int], start: int,
                    units: list[tuple[int, int, int, int]]) -> int:  # fmt: skip
        """Write the entries from ``start`` that fit in the data file ``pre_append`` picks for the
        first; return the index (in ``entries``) of the first one left for the next file."""
        pos = self.pre_append(sizes[start])
        mapped_file = self.data_file_list.last
        assert mapped_file is not None and mapped_file.offset_of(mapped_file.wrote_position) == pos, pos
        limit = mapped_file.file_size - codec.MIN_BLANK_SIZE  # an entry leaves room for a blank record
        view, position, limit, base, through = self._write_target(mapped_file, limit, sum(sizes[start:]))
        first = position
        end = start
        while end < len(entries) and position + sizes[end] <= limit:
            entry = entries[end]
            entry_pos = base + position
            codec.write_entry(view, position, index=entry.index, term=entry.term, pos=entry_pos, body=entry.body)
            units.append((entry.index, entry_pos, sizes[end], entry.term))
            position += sizes[end]
            end += 1
        assert end > start, (pos, sizes[start])  # pre_append made room for the first
        self._written(mapped_file, view, first, position, through)
        return end

    def _append_run_native(self, entries: Sequence[Entry], start: int, chunks: list[bytes], size_total: int) -> int:
        """``_append_run`` in one native call (``write_entries``: header, CRC32, body and index unit
        per entry, from ``start`` while they fit the data file ``pre_append`` picks); the packed
        index units go to ``chunks``. Returns the index (in ``entries``) of the first one left."""
        pos = self.pre_append(codec.entry_size(len(entries[start].body)))
        mapped_file = self.data_file_list.last
        assert mapped_file is not None and mapped_file.offset_of(mapped_file.wrote_position) == pos, pos
        limit = mapped_file.file_size - codec.MIN_BLANK_SIZE  # an entry leaves room for a blank record
        size = size_total if start == 0 else self._size_from(entries, start)
        view, first, limit, base, through = self._write_target(mapped_file, limit, size)
        end, position, units = _native_write_entries(view, first, limit, base, entries, start)
        assert end > start, (pos, start)  # pre_append made room for the first
        self._written(mapped_file, view, first, position, through)
        chunks.append(units)
        return end

    @staticmethod
    def _size_from(entries: Sequence[Entry], start: int) -> int:
        """The bytes of ``entries[start:]`` with their headers (a run after a data file's end: rare)."""
        return sum(codec.BODY_OFFSET + len(entry.body) for entry in entries[start:])

    def _note_append_size(self, size: int) -> None:
        """Whether appends are large now (``large_appends``: see WRITE_THROUGH_MIN)."""
        if size >= WRITE_THROUGH_MIN:
            self.large_appends, self._small_appends = True, 0
        elif self.large_appends:
            self._small_appends += 1
            self.large_appends = self._small_appends < WARM_AFTER_SMALL_APPENDS

    def _write_target(self, mapped_file: MappedFile, limit: int, size: int) -> tuple:
        """Where entries of ``size`` bytes from the data file's write position are written:
        (view, position, limit, base, through), an entry at ``position`` of ``view`` lying at
        ``pos`` = ``base + position``. The mapping, or (``through``) while appends are large and
        their pages are not faulted in (see WRITE_THROUGH_MIN), the store's buffer from 0, which
        ``_written`` stores with ``pwrite``."""
        start = mapped_file.wrote_position
        size = min(size, limit - start)
        if (self.large_appends and size <= WRITE_THROUGH_MAX and mapped_file.write_buffer is None
                and mapped_file.populated_position < start + size):  # fmt: skip
            mapped_file.read_ahead_off_from(start)
            buffer = self._through_buffer
            if buffer is None or len(buffer) < size:
                buffer = self._through_buffer = bytearray(min(max(size, 2 * len(buffer or b"")), WRITE_THROUGH_MAX))
            return memoryview(buffer), 0, size, mapped_file.file_from_offset + start, True
        return mapped_file.writable_view(), start, limit, mapped_file.file_from_offset, False

    @staticmethod
    def _written(mapped_file: MappedFile, view: memoryview, first: int, position: int, through: bool) -> None:
        """Entries were written to ``view[first:position]`` (``_write_target``): stored with
        ``pwrite`` when that is the store's buffer (``through``), else the mapping advanced."""
        if through:
            with view, view[:position] as data:
                mapped_file.write_through(data)
        else:
            mapped_file.advance(position - first)

    def check_run(self, run: EntryRun, *, prev_term: int) -> str | None:
        """Why ``run`` cannot follow this log's last entry (of ``prev_term``), None when it can:
        ``entry_run.check_run`` with the first entry's ``pos`` where ``append_run`` would write it
        and the end of that data file (less a blank record) as the limit. Reads only."""
        if run.first_index != self._last_index + 1:
            return f"run starts at entry {run.first_index}, the log ends at {self._last_index}"
        data = run.data
        first_size = int.from_bytes(data[4:8], "big", signed=True) if data is not None and len(data) >= 8 else 0
        first_size = max(codec.BODY_OFFSET, min(first_size, self.config.data_file_size))
        first_pos = self.next_pos(first_size)
        pos_limit = placement.run_pos_limit(first_pos, file_size=self.config.data_file_size)
        return check_run(run, prev_term=prev_term, first_pos=first_pos, pos_limit=pos_limit)

    def append_run(self, run: EntryRun, *, read_ahead_off: bool = False) -> None:
        """Append a run that ``check_run`` accepted: one ``pwrite`` into the data file (after the
        blank record ``pre_append`` writes when it starts the next file; ``MappedFile.write_through``,
        as a classic slave stores frames: pages the write covers whole are never zeroed first, so a
        follower needs no warm-up ahead of it) and its index units built in one call. Not durable
        until ``flush``. ValueError, nothing written, when it does not start at the next index and
        the next ``pos`` (a run not checked against this log)."""
        data = run.data
        if run.first_index != self._last_index + 1 or data is None or len(data) < codec.BODY_OFFSET:
            raise ValueError(f"run of entries {run.first_index}..{run.last_index} does not follow {self._last_index}")
        _magic, first_size, _index, _term, first_pos, *_ = codec.ENTRY_HEADER.unpack_from(data, 0)
        expected = self.next_pos(max(first_size, codec.BODY_OFFSET))
        file_size = self.config.data_file_size
        if first_pos != expected or expected % file_size + len(data) > file_size - codec.MIN_BLANK_SIZE:
            raise ValueError(f"run of {len(data)} bytes at pos {first_pos}: the next entry goes at {expected} "
                             f"in data files of {file_size} bytes")  # fmt: skip
        self.make_room(data_size=first_pos + len(data) - self.data_end(), count=run.count)
        assert self.pre_append(first_size) == first_pos
        last = self.data_file_list.last
        if read_ahead_off:
            last.read_ahead_off_from(last.wrote_position)
        last.write_through(data)
        append_index_bytes(self.index_file_list, run.first_index, index_units(data, run.count))
        self._last_index, self._last_term = run.last_index, run.last_term
        self._check()

    def append_framed(self, run: EntryRun) -> None:
        """Append a leader's own entries that its planner framed as stored (``AppendPlan.run``,
        ``DLedgerMessageStore.take_run``): ``append_run``'s one ``pwrite`` and index units, with
        the size noted as ``append`` notes it (``large_appends``: the warm-up stays behind) and,
        as its ``pwrite``s do, no read-ahead through the mapping from where they go: the pushes
        read these bytes through it, and each fault read ahead (zeroed) the pages the next
        ``pwrite`` writes again (``MappedFile.read_ahead_off_from``; 18 % of the leader's CPU
        at 64 writers without it)."""
        self._note_append_size(len(run.data))
        self.append_run(run, read_ahead_off=True)

    def make_room(self, *, data_size: int, count: int) -> None:
        """Make the files that appending ``count`` entries taking ``data_size`` bytes of data files
        from the log's end (blank padding included) will need, so that the append cannot meet a
        full disk half-way (``MappedFileQueue.make_room``: one new file of each kind). DiskFullError
        when one cannot be created; nothing else changes. A driver calls it before it lets the
        Raft core take entries (a proposal, a leader's push); ``append`` calls it again."""
        self.data_file_list.make_room(self.data_end() + data_size, start_offset=self._data_start_offset)
        index_start = (self._last_index + 1) * codec.INDEX_UNIT_SIZE
        self.index_file_list.make_room(index_start + count * codec.INDEX_UNIT_SIZE, start_offset=index_start)

    def make_room_for_run(self, run: EntryRun) -> None:
        """``make_room`` for the part of a leader's run past our end (its first entry's ``pos``
        from its header; a run lies in one data file). A run too short to hold a header is
        left to ``check_run`` to refuse."""
        data = run.data
        if data is None or len(data) < codec.BODY_OFFSET or run.last_index <= self._last_index:
            return
        first_pos = codec.ENTRY_HEADER.unpack_from(data, 0)[4]
        self.make_room(data_size=max(0, first_pos + len(data) - self.data_end()), count=run.last_index - self._last_index)

    def data_end(self) -> int:
        """Where the data files' written bytes end (the next entry or blank record goes here)."""
        last = self.data_file_list.last
        return self._data_start_offset if last is None else last.file_from_offset + last.wrote_position

    def pre_append(self, size: int) -> int:
        """Make room for an entry of ``size`` bytes and return its ``pos`` (MmapFileList.preAppend):
        when ``size + 8`` does not fit in the last data file, fill its rest with a blank record
        (``[-1][remaining]`` and zeros) and start the next file."""
        queue = self.data_file_list
        mapped_file = queue.get_last_mapped_file(self._data_start_offset)
        assert mapped_file is not None
        if size + codec.MIN_BLANK_SIZE > mapped_file.remaining:
            remaining = mapped_file.remaining
            written = mapped_file.append(codec.encode_blank(remaining) + bytes(remaining - codec.MIN_BLANK_SIZE))
            assert written and mapped_file.full, mapped_file
            mapped_file = queue.get_last_mapped_file()
            assert mapped_file is not None and mapped_file.wrote_position == 0
        return mapped_file.offset_of(mapped_file.wrote_position)

    def start_at(self, offset: int) -> None:
        """Make an empty log's first entry land at data offset ``offset`` (a data-file boundary):
        a follower joining a group whose log starts at a smooth upgrade's divide learns it from
        the leader's first entry's pos. Empty data files are removed; refused on a non-empty log."""
        if self._last_index >= 0 or self._first_index != 0:
            raise ValueError(f"the log holds entries [{self._first_index}, {self._last_index}]; its start is fixed")
        if offset < 0 or offset % self.config.data_file_size:
            raise ValueError(f"start offset {offset} is not a multiple of the data file size {self.config.data_file_size}")
        if self.data_file_list.mapped_files or self.data_file_list.min_offset != offset:
            self.data_file_list.reset_to(offset)
            if os.path.isdir(self.data_file_list.directory):
                fsync_directory(self.data_file_list.directory)
        self._data_start_offset = offset

    def plan_positions(self, sizes: Sequence[int], *, start: int | None = None) -> list[int]:
        """Where entries of these sizes (header included), appended now in this order, would land;
        no side effects. A follower checks the leader's ``pos`` with it before appending
        (DLedger's appendAsFollower requires the data to land at the entry's pos). ``start``:
        where the entries before them end (a leader's planned but not yet appended entries),
        instead of where the data files end."""
        offset = self.plan_offset() if start is None else start
        return placement.plan_positions(sizes, offset=offset, file_size=self.config.data_file_size)

    def plan_offset(self) -> int:
        """Where ``plan_positions`` starts placing entries appended now (before any blank record
        the first one needs): the data files' end, or the next file's start when the last is full."""
        last = self.data_file_list.last
        if last is None:
            return self._data_start_offset
        if last.full:
            return last.file_from_offset + self.config.data_file_size
        return last.offset_of(last.wrote_position)

    def next_pos(self, size: int) -> int:
        """Where an entry of ``size`` bytes appended now would land (no side effects)."""
        return self.plan_positions([size])[0]

    def warm_ahead(self, size: int) -> None:
        """Fault in ``size`` bytes of data file ahead of the writer (and the index units that go
        with them), creating the next file when the last is half full: the commit log's
        ``warm_ahead`` (RocketMQ's warm-up of mapped files). A first write to a page costs a page
        fault; warmed, 32-entry batches of 1 KiB appended ~1.5x faster here. For a driver's
        background thread or idle time; the files it creates are zeros that recovery ignores.
        While appends are large (``large_appends``) only the next data file is made."""
        self.data_file_list.warm_ahead(0 if self.large_appends else size)
        self.index_file_list.warm_ahead(self._index_ahead(size))

    def needs_warming(self, size: int) -> bool:
        """Whether ``warm_ahead(size)`` has work (``MappedFileQueue.needs_warming``): the data
        files' (only the next one to make while appends are large: they go by ``pwrite``, see
        WRITE_THROUGH_MIN) or the index files' (their units always go through the mapping)."""
        return (self.data_file_list.needs_warming(0 if self.large_appends else size)
                or self.index_file_list.needs_warming(self._index_ahead(size)))  # fmt: skip

    @staticmethod
    def _index_ahead(size: int) -> int:
        """The index files' bytes warmed with ``size`` of data files (the units of ~48-byte entries)."""
        return max(OS_PAGE_SIZE, size // codec.BODY_OFFSET * codec.INDEX_UNIT_SIZE)

    # -- flush ----------------------------------------------------------------------------

    def flush(self) -> int:
        """Make every appended entry durable (data, then index); return ``flushed_index()``.
        The three steps a driver may split to run the middle one in a worker thread."""
        target = self.flush_target()
        self.sync_files()
        return self.flushed_to(target)

    def flush_target(self) -> int:
        """The last index now: what a ``sync_files`` started after this call makes durable."""
        return self._last_index

    def sync_files(self) -> None:
        """Sync the data files, then the index files, up to what each holds when it gets there
        (at least every entry up to a ``flush_target`` read before). Safe in a worker thread
        while the owner appends: it reads each file's write position once and changes only the
        flushed positions and the files' ``flushed_where``; never while the owner truncates or
        closes (the owner's lock). Runs no ``_check``: an append may be half done meanwhile."""
        self.sync_data_files()
        self.sync_index_files()

    def sync_data_files(self) -> None:
        """The data half of ``sync_files`` (same rules); then, with ``page_cache_keep_size``, the
        flushed pages that far behind are dropped from the page cache (``MappedFile.drop_cached``:
        what is flushed is on disk, a read there faults it back in)."""
        self.data_file_list.flush(keep_cached=self.config.page_cache_keep_size)

    def sync_index_files(self) -> None:
        """The index half of ``sync_files`` (same rules). The two halves may run in any order or
        at once, in two threads (they touch different files): recovery trusts only the data
        files and rebuilds or cuts index units that do not match them, so neither half needs
        the other first, and what is flushed (``flushed_to``) is decided by the data half alone."""
        self.index_file_list.flush()

    def index_unsynced(self) -> bool:
        """Whether index units were written since the index files' last sync."""
        queue = self.index_file_list
        return queue.flushed_where < queue.max_offset

    def flushed_to(self, target: int) -> int:
        """Record entries up to ``target`` (a ``flush_target`` read before ``sync_files`` began)
        as durable; return ``flushed_index()``. Group commit: entries appended during the sync
        wait for the next one."""
        assert target <= self._last_index, ("truncated during a flush", target, self._last_index)
        self._flushed_index = max(self._flushed_index, target)
        self._check()
        return self._flushed_index
