"""DLedgerMmapFileStore: DLedger's on-disk Raft log (data files, index files, checkpoint, currterm).

Theory of operation
-------------------
A store directory (DLedger's ``dledger-<selfId>``) holds::

    data/<20-digit offset>    entries laid end to end, ``data_file_size`` each (1 GiB)
    index/<20-digit offset>   one 32-byte unit per entry, entry i at offset i * 32 (160 MiB files)
    checkpoint                endIndex, committedIndex (+ hasvc's flushedIndex, beginIndex/Term/Pos)
    currterm                  currTerm, voteLeader (+ hasvc's committedIndex)

Both file lists are ``MappedFileQueue``s of ``MappedFile``s, as the commit log's. Appending an
entry (``append``): ``pre_append`` finds where it lands — the data file's write position, or the
start of the next data file after padding this one with a blank record when ``size + 8`` does not
fit (DLedger's ``MmapFileList.preAppend``) — then the entry is written there with its ``pos`` and
its index unit at ``index * 32``. ``pos`` is a function of the log's prefix and the file size, so
two stores holding the same entries hold the same bytes at the same offsets. An append first makes
the files it will need (``make_room``: the next data file, the next index file, as each queue's
spare), so a full disk fails it with DiskFullError before any byte is written, never half-way
between an entry and its index unit.

Nothing is durable until ``flush`` (data, then index; DLedger's FlushDataService every 10 ms),
which returns ``flushed_index``: entries at or below it survive a crash. ``truncate`` is durable
when it returns (later files deleted newest first and their names synced, then the cut zeroed and
synced: a crash part way leaves a prefix of the log).
``persist_checkpoint`` (DLedger: every 3 s) records ``endIndex`` and ``committedIndex`` as
DLedger does, plus ``flushedIndex``, the flushed index at that moment; ``truncate`` lowers it on
disk before cutting below it. ``save_hard_state`` replaces ``currterm`` durably before it returns.

Recovery (``open``), as ``DLedgerMmapFileStore#recover``: start at data file ``max(0, n - 3)``,
walking back to the first whose first entry is whole, lies at the file's start and matches its
index unit (none: file 0); scan forward entry by entry: a blank record moves to the next file,
zeros end the log; an entry must be whole (bodyCrc when not 0), lie at its own ``pos``, follow the
previous index by one and not lower the term. An index unit that does not match its entry is
rewritten from the data, with all that follow. Anything else ends the scan: that is where the
log ends, and what follows is cut (zeroed) — a torn tail. Refused instead, with a StoreError
naming the file and offset and nothing changed: a cut that would delete more than
``recovery_cut_segments_max`` later data files holding data (damage in the middle of the log,
DLedger's "processOffset is too small" rule), and a cut below the checkpoint's ``flushedIndex``
(entries known durable are gone) unless ``recovery_accept_lost_entries`` says to accept it, and
(unless it says so too) a whole entry that lowers the term (``DataScan.damaged``: the term is under
no CRC, so a damaged byte there would otherwise end the log early and keep the damaged entry).

Retention (``deletable_head_files``, ``delete_head_files``; DLedger's ``deleteExpiredFiles``)
deletes whole data files from the head: never one holding the committed or flushed entry or any
after them, nor the file being written; the index files wholly below the new first entry follow.
Before it deletes, it records the new first entry in the checkpoint (``beginIndex``, its ``pos``,
and ``beginTerm``, the term of the entry before it: a leader needs it to RESET a follower); a
crash part way through a deletion is finished by recovery (data files below ``beginPos`` go).

Reset (``reset``, a RESET from the Raft leader): every data and index file goes and the log
restarts empty at an index, its next entry at a given data offset (a data-file boundary: the
leader's first entry's pos, so the files end up byte-identical from there). Durable and atomic
for recovery: the checkpoint first records the new begin with ``resetting=1`` (fsynced, renamed),
then the files are deleted, then the flag is cleared; a crash after the first step is finished by
recovery (the files go), one before it leaves the old log. An empty log at index X reopens empty
at X (from the checkpoint's begin), with last term ``beginTerm``.

Not thread-safe: one caller at a time, with one exception: ``sync_files`` (the middle of
``flush``: ``flush_target``, ``sync_files``, ``flushed_to``) may run in a worker thread while the
owner appends, never while it truncates or closes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from commitlog.damage import DamagedRange
from commitlog.dledger import entry_codec as codec
from commitlog.dledger import state_files
from commitlog.dledger.entry_run import EntryRun, check_run, index_units
from commitlog.native import write_entries as _native_write_entries
from commitlog.dledger.scan import DataFile, DataScan, scan_data_files, unit_matches
from commitlog.mapped_file import OS_PAGE_SIZE, PREALLOCATE_STEP_SIZE, MappedFile, StoreError, fsync_directory
from commitlog.mapped_file_queue import MappedFileQueue

DATA_DIRECTORY = "data"
INDEX_DIRECTORY = "index"
# A member id as currterm can hold it: no whitespace or properties syntax, bounded.
_MEMBER_ID = re.compile(r"[^\s=:#!\\]{1,255}")


def _sync_file(path: str) -> None:
    """fdatasync ``path`` through a descriptor of its own (the same inode's pages)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    index: int  # >= 0, consecutive
    term: int  # >= 0, never decreasing along the log
    body: bytes  # opaque payload (in DLedgerCommitLog, one RocketMQ message record)


@dataclasses.dataclass(frozen=True, slots=True)
class HardState:
    term: int  # current term (DLedger: currTerm)
    voted_for: str | None  # member id voted for in `term` (DLedger: voteLeader)
    committed_index: int  # -1 when nothing committed (a hint; the core re-derives it)
    catch_up_term: int = -1  # the catch-up mark (state_files: catchUpTerm/catchUpIndex); -1: none
    catch_up_index: int = -1


@dataclasses.dataclass(frozen=True, slots=True)
class StoredEntry:
    """An entry as it lies on disk: ``pos`` is its data-file offset (DLedgerCommitLog's
    PHYSICALOFFSET of the message in it is ``pos + 48``), ``size`` header plus body."""

    index: int
    term: int
    pos: int
    size: int
    body: bytes


@dataclasses.dataclass(frozen=True)
class DLedgerStoreConfig:
    # mappedFileSizeForEntryData: 1 GiB (RocketMQ sets it to the commit log's segment size).
    data_file_size: int = 1024 * 1024 * 1024
    # mappedFileSizeForEntryIndex: 5 Mi units of 32 bytes = 160 MiB.
    index_file_size: int = codec.INDEX_UNIT_SIZE * 5 * 1024 * 1024
    # StoreConfig.preallocate_step_size: disk the data and index files reserve ahead of the writer.
    preallocate_step_size: int = PREALLOCATE_STEP_SIZE
    # flushFileInterval (10 ms) and checkPointInterval (3 s): for the driver that calls flush()
    # and persist_checkpoint(); the store itself reads no clock.
    flush_interval_seconds: float = 0.010
    checkpoint_interval_seconds: float = 3.0
    # As the commit log's StoreConfig: a torn tail spans at most the newest data file and its
    # predecessor; a cut deleting more later files holding data is damage, refused.
    recovery_cut_segments_max: int = 1
    # Recovery refuses to end below the checkpoint's flushedIndex (entries known durable are
    # gone) unless this is set — as DLedger, which recovers to whatever is left, always does.
    recovery_accept_lost_entries: bool = False
    # A member of a group with other members (the node sets it; a group of one has no other copy):
    # what recovery would refuse as damage -- an end below the checkpoint's flushedIndex, a term
    # going down, a cut deleting more than recovery_cut_segments_max files -- is cut instead, after
    # the catch-up mark (the end it had: currterm's catchUpTerm/catchUpIndex) is saved, and the
    # damage is listed in ``damaged``; the Raft leader then catches the member up. Off: refused.
    recovery_repair_from_peers: bool = False
    # The commit log's page_cache_keep_size (0: off): after each sync of the data files, their
    # flushed pages more than this many bytes behind the flushed end are dropped from the page
    # cache. On a guest that hands free memory back to its host (virtio-balloon free page
    # reporting), a page-cache page the guest never touched lately costs a host fault on its
    # first write; dropping pages behind lets new ones reuse memory freed moments before.
    page_cache_keep_size: int = 0
    # The commit log's small_write_pages, for the data files (a member with --flush sync).
    small_write_pages: bool = False

    def validate(self) -> None:
        if self.data_file_size < codec.BODY_OFFSET + codec.MIN_BLANK_SIZE:
            raise ValueError(f"data_file_size {self.data_file_size} cannot hold an entry and a blank record")
        if self.index_file_size <= 0 or self.index_file_size % codec.INDEX_UNIT_SIZE:
            raise ValueError(f"index_file_size {self.index_file_size} must be a positive multiple of 32")
        if self.recovery_cut_segments_max < 0:
            raise ValueError("recovery_cut_segments_max must be >= 0")
        if self.flush_interval_seconds <= 0 or self.checkpoint_interval_seconds <= 0:
            raise ValueError("flush and checkpoint intervals must be positive")
        if self.page_cache_keep_size < 0:
            raise ValueError(f"page_cache_keep_size must be >= 0, got {self.page_cache_keep_size}")


@dataclasses.dataclass(frozen=True)
class RecoveryReport:
    start_offset: int  # data offset the scan started at
    end_offset: int  # data offset the log ends at now
    first_index: int
    last_index: int
    entries_scanned: int
    reason: str  # why the scan stopped
    corrupt_offset: int | None  # where an invalid entry was cut (None: the log ended cleanly)
    deleted_data_files: tuple[str, ...]
    index_rebuilt_from: int | None  # first entry whose index unit was rewritten from the data
    lost_entries: int  # entries at or below the checkpoint's flushedIndex that were gone (accepted)


class DLedgerMmapFileStore:
    """The on-disk EntryLog (ENTRYLOG.md): DLedger's file layout, indexes from 0."""

    def __init__(self, directory: str, config: DLedgerStoreConfig, *, data_start_offset: int,
                 entry_class: Callable[[int, int, bytes], Any] = Entry,
                 hard_state_class: Callable[[int, str | None, int], Any] = HardState):  # fmt: skip
        config.validate()
        # What read() and load_hard_state() build: hasvc's own Entry and HardState (hasvc.state.raft.storage)
        # can be passed in, so that they compare equal to the core's (commitlog cannot import hasvc).
        self._entry_class = entry_class
        self._hard_state_class = hard_state_class
        if data_start_offset < 0 or data_start_offset % config.data_file_size:
            raise ValueError(f"data_start_offset {data_start_offset} is not a multiple of {config.data_file_size}")
        self.directory = directory
        self.config = config
        self._data_start_offset = data_start_offset
        self.data_file_list = MappedFileQueue(os.path.join(directory, DATA_DIRECTORY), file_size=config.data_file_size,
                                              small_pages=config.small_write_pages,
                                              preallocate_step_size=config.preallocate_step_size)  # fmt: skip
        self.index_file_list = MappedFileQueue(os.path.join(directory, INDEX_DIRECTORY), file_size=config.index_file_size,
                                               preallocate_step_size=config.preallocate_step_size)  # fmt: skip
        self._checkpoint_path = os.path.join(directory, state_files.CHECKPOINT_FILE)
        self._term_path = os.path.join(directory, state_files.TERM_FILE)
        self._first_index = 0
        self._last_index = -1
        self._last_term = -1
        self._flushed_index = -1
        self._committed_index = -1
        self._checkpoint_flushed_index = -1  # the flushedIndex the checkpoint file holds
        self._term_before_first = -1  # the term of entry first_index - 1 (-1: first is 0, or not known)
        self._begin: tuple[int, int, int] | None = None  # (beginIndex, beginTerm, beginPos) on record
        self._hard_state = HardState(0, None, -1)
        self.recovery: RecoveryReport | None = None
        # Damage recovery found and cut (recovery_repair_from_peers or recovery_accept_lost_entries).
        self.damaged: list[DamagedRange] = []

    @classmethod
    def open(cls, directory: str, config: DLedgerStoreConfig | None = None, *, data_start_offset: int = 0,
             entry_class: Callable[[int, int, bytes], Any] = Entry,
             hard_state_class: Callable[[int, str | None, int], Any] = HardState) -> DLedgerMmapFileStore:  # fmt: skip
        """Open (creating it if needed) and recover the store in ``directory``. An empty store's
        first data file starts at ``data_start_offset`` (smooth upgrade: dividedCommitlogOffset)."""
        store = cls(directory, config or DLedgerStoreConfig(), data_start_offset=data_start_offset,
                    entry_class=entry_class, hard_state_class=hard_state_class)  # fmt: skip
        os.makedirs(directory, exist_ok=True)
        store.data_file_list.load()
        try:
            store.index_file_list.load()
            store._recover()
        except BaseException:
            store.data_file_list.close()
            store.index_file_list.close()
            raise
        return store

    # -- EntryLog: reading ----------------------------------------------------------------

    def first_index(self) -> int:
        return self._first_index

    def last_index(self) -> int:
        return self._last_index

    def last_term(self) -> int:
        return self._last_term

    def ends(self) -> tuple[int, int, int]:
        """(first_index(), last_index(), last_term()) in one call: the Raft core reads them at every event."""
        return self._first_index, self._last_index, self._last_term

    def flushed_index(self) -> int:
        return self._flushed_index

    def term_before_first(self) -> int:
        """The term of entry ``first_index() - 1`` (deleted by retention or a reset), the empty
        log's last term; -1 when the first index is 0 or the store does not know it (its head
        was deleted by a version that did not record it)."""
        return self._term_before_first

    def first_offset(self) -> int:
        """Where entry ``first_index()`` lies (or will lie): the data offset a RESET hands on."""
        return self.data_start_offset

    def term_at(self, index: int) -> int:
        if index == self._last_index and index >= self._first_index:  # the commonest: no index unit read
            return self._last_term
        return self._unit(index)[4]

    def read(self, lo: int, hi: int, *, size_max: int) -> list[Any]:
        """Entries ``lo <= index < hi``, stopping before the bodies' total would pass ``size_max``
        (at least one when ``lo <= last_index()``). Each entry is checked against its index unit
        and its bodyCrc, as ``get`` does, without building the intermediate objects."""
        if lo > self._last_index:
            return []
        if lo < self._first_index:
            raise IndexError(f"index {lo} outside the log [{self._first_index}, {self._last_index}]")
        entries: list[Any] = []
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
            entries.append(self._entry_class(index, term, body))
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

    # -- the scrub and its repair (commitlog/scrub.py's EntryScrubber, the broker's fetch) --

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
            header = codec.decode_entry_header(data, 0)
            codec.check_body(header, data, 0)
        except codec.EntryFormatError as error:
            raise StoreError(f"{where}: the copy fetched: {error.reason}") from None
        if (header.index, header.pos, header.size) != (index, pos, len(data)) or header.channel or header.chain_crc:
            raise StoreError(f"{where}: the copy fetched is entry {header.index} at {header.pos} of {header.size} "
                             f"bytes ({len(data)} fetched)")  # fmt: skip
        mapped_file = self.data_file_list.find_mapped_file_by_offset(pos)
        position = pos - mapped_file.file_from_offset if mapped_file is not None else -1
        if mapped_file is None or position + header.size > mapped_file.wrote_position:
            raise StoreError(f"{where}: {header.size} bytes there pass this log's written data")
        ours: list[tuple[int, int]] = []  # (term, size) this log's header and unit say
        unit = self._index_unit_or_none(index)
        if unit is not None and unit.pos == pos:
            ours.append((unit.term, unit.size))
        local = codec.ENTRY_HEADER.unpack_from(mapped_file.view(), position)
        if local[0] == codec.MAGIC_1 and local[2] == index and local[4] == pos:
            ours.append((local[3], local[1]))
        if (header.term, header.size) not in ours:
            raise StoreError(f"{where}: the copy fetched (term {header.term}, {header.size} bytes) is not what this "
                             f"log's header or index unit say ({ours or 'nothing readable'})")  # fmt: skip
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

    # -- EntryLog: writing ----------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        """Append ``entries`` (``entries[0].index == last_index() + 1``, consecutive, terms not
        decreasing); not durable until ``flush``. Bad input: ValueError, nothing written. No
        room for a file they need: DiskFullError, nothing written (``make_room``).
        Entries are written a data file at a time, straight into the mapping."""
        size_total, size_max = self._check_appendable(entries)
        if entries:
            self.make_room(data_size=self._data_size(size_total, size_max), count=len(entries))
        if _native_write_entries is not None and entries:
            chunks: list[bytes] = []  # packed index units
            start = 0
            while start < len(entries):
                start = self._append_run_native(entries, start, chunks)
            self._append_index_bytes(entries[0].index, b"".join(chunks))
        else:
            sizes = [codec.entry_size(len(entry.body)) for entry in entries]
            units: list[tuple[int, int, int, int]] = []  # (index, pos, size, term)
            start = 0
            while start < len(entries):
                start = self._append_run(entries, sizes, start, units)
            self._append_index_units(units)
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
        view = mapped_file.writable_view()
        first_position = position = mapped_file.wrote_position
        limit = mapped_file.file_size - codec.MIN_BLANK_SIZE  # an entry leaves room for a blank record
        end = start
        while end < len(entries) and position + sizes[end] <= limit:
            entry = entries[end]
            entry_pos = mapped_file.file_from_offset + position
            codec.write_entry(view, position, index=entry.index, term=entry.term, pos=entry_pos, body=entry.body)
            units.append((entry.index, entry_pos, sizes[end], entry.term))
            position += sizes[end]
            end += 1
        assert end > start, (pos, sizes[start])  # pre_append made room for the first
        mapped_file.advance(position - first_position)
        return end

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
        file_size = self.config.data_file_size
        pos_limit = first_pos - first_pos % file_size + file_size - codec.MIN_BLANK_SIZE
        return check_run(run, prev_term=prev_term, first_pos=first_pos, pos_limit=pos_limit)

    def append_run(self, run: EntryRun) -> None:
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
        self.data_file_list.last.write_through(data)
        self._append_index_bytes(run.first_index, index_units(data, run.count))
        self._last_index, self._last_term = run.last_index, run.last_term
        self._check()

    def _append_index_bytes(self, first_index: int, units: bytes) -> None:
        """Write packed index units of consecutive entries from ``first_index``, an index file at a time."""
        offset, done = first_index * codec.INDEX_UNIT_SIZE, 0
        while done < len(units):
            mapped_file = self.index_file_list.get_last_mapped_file(offset)
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

    def _append_run_native(self, entries: Sequence[Entry], start: int, chunks: list[bytes]) -> int:
        """``_append_run`` in one native call (``write_entries``: header, CRC32, body and index unit
        per entry, from ``start`` while they fit the data file ``pre_append`` picks); the packed
        index units go to ``chunks``. Returns the index (in ``entries``) of the first one left."""
        pos = self.pre_append(codec.entry_size(len(entries[start].body)))
        mapped_file = self.data_file_list.last
        assert mapped_file is not None and mapped_file.offset_of(mapped_file.wrote_position) == pos, pos
        first_position = mapped_file.wrote_position
        limit = mapped_file.file_size - codec.MIN_BLANK_SIZE  # an entry leaves room for a blank record
        end, position, units = _native_write_entries(mapped_file.writable_view(), first_position, limit,
                                                     mapped_file.file_from_offset, entries, start)  # fmt: skip
        assert end > start, (pos, start)  # pre_append made room for the first
        mapped_file.advance(position - first_position)
        chunks.append(units)
        return end

    def make_room(self, *, data_size: int, count: int) -> None:
        """Make the files that appending ``count`` entries taking ``data_size`` bytes of data files
        from the log's end (blank padding included) will need, so that the append cannot meet a
        full disk half-way (``MappedFileQueue.make_room``: one new file of each kind). DiskFullError
        when one cannot be created; nothing else changes. A driver calls it before it lets the
        Raft core take entries (a proposal, a leader's push); ``append`` calls it again."""
        self.data_file_list.make_room(self.data_end() + data_size, start_offset=self._data_start_offset)
        index_start = (self._last_index + 1) * codec.INDEX_UNIT_SIZE
        self.index_file_list.make_room(index_start + count * codec.INDEX_UNIT_SIZE, start_offset=index_start)

    def _data_size(self, size_total: int, size_max: int) -> int:
        """The data-file bytes entries of ``size_total`` bytes (the largest ``size_max``) take from
        the log's end: themselves when they fit the last data file (leaving room for a blank
        record), else at most one entry's worth of blank padding more."""
        last = self.data_file_list.last
        if last is not None and last.wrote_position + size_total <= last.file_size - codec.MIN_BLANK_SIZE:
            return size_total
        return size_total + size_max + codec.MIN_BLANK_SIZE

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

    def _check_appendable(self, entries: Sequence[Entry]) -> tuple[int, int]:
        """ValueError unless ``entries`` may follow the log; their total and largest size."""
        index, term = self._last_index, max(self._last_term, 0)
        size_total = size_max = 0
        fit_max = min(self.config.data_file_size - codec.MIN_BLANK_SIZE, codec.ENTRY_SIZE_MAX)
        for entry in entries:  # no call per entry: a proposal of 32 entries checks 32
            if entry.index != index + 1:
                raise ValueError(f"entry index {entry.index} does not follow {index}")
            if entry.term < term:
                raise ValueError(f"entry {entry.index} has term {entry.term}, below the previous {term}")
            size = codec.BODY_OFFSET + len(entry.body)  # codec.entry_size
            if size > fit_max:
                raise ValueError(f"entry {entry.index} of {size} bytes is larger than ENTRY_SIZE_MAX="
                                 f"{codec.ENTRY_SIZE_MAX} or a data file of {self.config.data_file_size} less 8")  # fmt: skip
            index, term = entry.index, entry.term
            size_total += size
            if size > size_max:
                size_max = size
        return size_total, size_max

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

    @property
    def data_start_offset(self) -> int:
        """Where the log's first entry lies or will lie (0, or a smooth upgrade's divide)."""
        return self.data_file_list.min_offset if self.data_file_list.mapped_files else self._data_start_offset

    @property
    def data_file_size(self) -> int:
        """Bytes per data file: with the entries it decides every pos and blank record."""
        return self.config.data_file_size

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
        file_size = self.config.data_file_size
        last = self.data_file_list.last
        if start is not None:
            offset = start
        elif last is None:
            offset = self._data_start_offset
        elif last.full:
            offset = last.file_from_offset + file_size
        else:
            offset = last.offset_of(last.wrote_position)
        positions = []
        for size in sizes:
            remaining = file_size - offset % file_size
            if size + codec.MIN_BLANK_SIZE > remaining:
                offset += remaining  # a blank record fills the rest; the entry starts the next file
            positions.append(offset)
            offset += size
        return positions

    def next_pos(self, size: int) -> int:
        """Where an entry of ``size`` bytes appended now would land (no side effects)."""
        return self.plan_positions([size])[0]

    def warm_ahead(self, size: int) -> None:
        """Fault in ``size`` bytes of data file ahead of the writer (and the index units that go
        with them), creating the next file when the last is half full: the commit log's
        ``warm_ahead`` (RocketMQ's warm-up of mapped files). A first write to a page costs a page
        fault; warmed, 32-entry batches of 1 KiB appended ~1.5x faster here. For a driver's
        background thread or idle time; the files it creates are zeros that recovery ignores."""
        self.data_file_list.warm_ahead(size)
        self.index_file_list.warm_ahead(max(OS_PAGE_SIZE, size // codec.BODY_OFFSET * codec.INDEX_UNIT_SIZE))

    def _append_index_units(self, units: list[tuple[int, int, int, int]]) -> None:
        """Write the index units ``(index, pos, size, term)`` of consecutive entries at ``index * 32``
        (packed, then ``_append_index_bytes``: an index file at a time)."""
        if units:
            packed = b"".join(codec.INDEX_UNIT.pack(codec.MAGIC_1, pos, size, index, term)
                              for index, pos, size, term in units)  # fmt: skip
            self._append_index_bytes(units[0][0], packed)

    def truncate(self, *, after_index: int) -> None:
        """Drop every entry with index > ``after_index``; durable when it returns. Refuses
        (ValueError) to drop committed entries or to cut below the first entry."""
        if after_index >= self._last_index:
            return
        if after_index < self._first_index - 1:
            raise ValueError(f"cannot truncate after {after_index}: the log starts at {self._first_index}")
        if after_index < self._committed_index:
            raise ValueError(f"truncating after {after_index} would drop committed entries (committed {self._committed_index})")
        if after_index >= self._first_index:
            pos, size = self.entry_span(after_index)
            cut = pos + size
            term = self.term_at(after_index)
        else:
            cut, term = self.pos_at(self._first_index), self._term_before_first
        if self._checkpoint_flushed_index > after_index:
            self._flushed_index = min(self._flushed_index, after_index)
            self.persist_checkpoint()  # before the cut: the checkpoint never names entries that are gone
        self._cut(self.data_file_list, cut)
        self._cut(self.index_file_list, (after_index + 1) * codec.INDEX_UNIT_SIZE)
        self._last_index = after_index
        self._last_term = term
        self._flushed_index = min(self._flushed_index, after_index)
        self._check()

    # -- reset (a RESET from the leader) ------------------------------------------------------

    def reset(self, reset: Any) -> None:
        """Drop every entry and start the log empty at ``reset.first_index``, its next entry at
        data offset ``reset.first_offset`` (a data-file boundary), the empty log's last term
        ``reset.term_before_first``; committed and flushed index ``first_index - 1``. Durable when
        it returns, and atomic for recovery (see the module). ValueError, nothing changed, for an
        index below 1, a negative term, an offset off a file boundary, or committed entries at or
        above the index (they are never dropped)."""
        first, term, offset = reset.first_index, reset.term_before_first, reset.first_offset
        if first < 1 or term < 0:
            raise ValueError(f"reset to index {first} after term {term}: need index >= 1 and term >= 0")
        if offset < 0 or offset % self.config.data_file_size:
            raise ValueError(f"reset offset {offset} is not a multiple of the data file size {self.config.data_file_size}")
        if self._committed_index >= first:
            raise ValueError(f"a reset to {first} would drop committed entries (committed {self._committed_index})")
        self._begin = (first, term, offset)
        self._write_checkpoint(end=first - 1, committed=first - 1, flushed=first - 1, resetting=True)
        self._drop_all_files(first, offset)
        self._first_index, self._last_index, self._last_term = first, first - 1, term
        self._term_before_first = term
        self._flushed_index = self._committed_index = first - 1
        self._data_start_offset = offset
        self.persist_checkpoint()  # the reset is done: resetting goes
        self._check()

    def _drop_all_files(self, first: int, offset: int) -> None:
        """Delete every data and index file (names synced); the next entry lands at ``offset``."""
        for queue, start in ((self.data_file_list, offset), (self.index_file_list, first * codec.INDEX_UNIT_SIZE)):
            had_files = bool(queue.mapped_files)
            queue.reset_to(start)
            if had_files:
                fsync_directory(queue.directory)

    # -- retention (DLedgerMmapFileStore.CleanSpaceService / deleteExpiredFiles) ----------

    def deletable_head_files(self, *, keep_from_index: int, count_max: int) -> list[tuple[MappedFile, int]]:
        """The oldest data files (at most ``count_max``) whose every entry is below
        ``keep_from_index``, the committed index and the flushed index, each with the index of
        the first entry after it. The committed entry itself stays (a leader's COMPARE walks down
        to a follower's committed index at the lowest, which must still be there to compare), and
        so does the flushed one (a power loss must leave the log an entry to start from: the
        first entry of the first file kept is durable). A file qualifies only when the next
        file's first entry is whole at its start (so neither the file being written nor a warmed
        empty file goes)."""
        limit = min(keep_from_index, self._committed_index, self._flushed_index)
        files = self.data_file_list.mapped_files
        found: list[tuple[MappedFile, int]] = []
        for number in range(min(count_max, len(files) - 1)):
            following = files[number + 1]
            if following.wrote_position < codec.BODY_OFFSET:
                break
            try:
                next_first = codec.decode_entry_header(following.view(), 0).index
            except codec.EntryFormatError:
                break
            if next_first > limit or next_first > self._last_index:
                break
            found.append((files[number], next_first))
        return found

    def delete_head_files(self, *, count: int, keep_from_index: int) -> list[str]:
        """Delete the ``count`` oldest data files (``deletable_head_files`` with the same
        ``keep_from_index`` chose them; ValueError, nothing deleted, when it would not) and the
        index files whose every unit is below the new first entry; ``first_index()`` moves up.
        Durable when it returns: data files go oldest first, their directory synced, then index
        files. A crash part way leaves a log that starts later (recovery reads the first entry of
        the first data file; index files below it are left over and go on the next pass)."""
        chosen = self.deletable_head_files(keep_from_index=keep_from_index, count_max=count)
        if len(chosen) < count:
            raise ValueError(f"only {len(chosen)} of {count} head data files lie below entry {keep_from_index} "
                             f"and the committed and flushed index")  # fmt: skip
        if not chosen:
            return []
        new_first = chosen[-1][1]
        # Recorded first (durably): the term of the entry before the new first one is gone after.
        self._begin = (new_first, self.term_at(new_first - 1), self.pos_at(new_first))
        self.persist_checkpoint()
        deleted = self.data_file_list.delete_first_files(count)
        fsync_directory(self.data_file_list.directory)
        self._first_index = new_first
        self._term_before_first = self._begin[1]
        index_files = self.index_file_list.mapped_files
        unit_end = new_first * codec.INDEX_UNIT_SIZE
        below = sum(1 for f in index_files[:-1] if f.file_from_offset + f.file_size <= unit_end)
        deleted += self.index_file_list.delete_first_files(below)
        if below:
            fsync_directory(self.index_file_list.directory)
        self._check()
        return deleted

    def data_file_modified_ms(self, mapped_file: MappedFile) -> float:
        """When ``mapped_file`` was last written (its mtime, as DLedger's isTimeUp), in ms."""
        return os.path.getmtime(mapped_file.path) * 1000

    @staticmethod
    def _cut(queue: MappedFileQueue, offset: int) -> None:
        """Cut ``queue`` at ``offset`` durably. Later files go first, newest first, and their names
        are synced before the file holding ``offset`` is cut (zeroed, synced): a crash part way
        leaves a shorter log or the old one, never a cut file followed by files it dropped."""
        later = [f for f in queue.mapped_files if f.file_from_offset > offset]
        for mapped_file in reversed(later):
            mapped_file.destroy()
        if later:
            queue.mapped_files = [f for f in queue.mapped_files if f.file_from_offset <= offset]
            fsync_directory(queue.directory)
        queue.truncate_dirty_files(offset)

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

    # -- committed index, checkpoint, hard state ------------------------------------------

    @property
    def committed_index(self) -> int:
        return self._committed_index

    @property
    def committed_pos(self) -> int:
        """End offset of the committed entry (DLedger's committedPos); -1 when nothing is."""
        if self._committed_index < self._first_index:
            return -1
        pos, size = self.entry_span(self._committed_index)
        return pos + size

    def update_committed_index(self, index: int) -> int:
        """DLedger's updateCommittedIndex: ignore -1 and decreases, cap at the last index;
        return the committed index now. Persisted by ``persist_checkpoint``."""
        index = min(index, self._last_index)
        if index > self._committed_index and index >= self._first_index:
            self._committed_index = index
        return self._committed_index

    def persist_checkpoint(self) -> None:
        """Replace ``checkpoint`` durably: endIndex, committedIndex (DLedger's), flushedIndex and,
        once retention or a reset moved the log's start, beginIndex, beginTerm and beginPos."""
        self._write_checkpoint(end=self._last_index, committed=self._committed_index, flushed=self._flushed_index)

    def _write_checkpoint(self, *, end: int, committed: int, flushed: int, resetting: bool = False) -> None:
        values: dict[str, object] = {
            state_files.END_INDEX_KEY: end,
            state_files.COMMITTED_INDEX_KEY: committed,
            state_files.FLUSHED_INDEX_KEY: flushed,
        }
        if self._begin is not None:
            values.update({state_files.BEGIN_INDEX_KEY: self._begin[0], state_files.BEGIN_TERM_KEY: self._begin[1],
                           state_files.BEGIN_POS_KEY: self._begin[2]})  # fmt: skip
        if resetting:
            values[state_files.RESETTING_KEY] = 1
        state_files.write_properties(self._checkpoint_path, values)
        self._checkpoint_flushed_index = flushed

    def load_hard_state(self) -> Any:
        """The saved term and vote; the committed index known now (HardState(0, None, -1) fresh)."""
        saved = self._hard_state
        if saved.catch_up_index >= 0:
            return self._hard_state_class(saved.term, saved.voted_for, self._committed_index, saved.catch_up_term,
                                          saved.catch_up_index)  # fmt: skip
        return self._hard_state_class(saved.term, saved.voted_for, self._committed_index)

    def save_hard_state(self, state: HardState) -> None:
        """Replace ``currterm`` durably (fsynced before this returns). The term never decreases."""
        if state.term < self._hard_state.term:
            raise ValueError(f"term {state.term} below the saved term {self._hard_state.term}")
        if state.voted_for is not None and not _MEMBER_ID.fullmatch(state.voted_for):
            raise ValueError(f"member id {state.voted_for!r} cannot be stored (whitespace, = : # ! \\ or too long)")
        if state.committed_index < -1:
            raise ValueError(f"committed_index {state.committed_index} < -1")
        values: dict[str, object] = {
            state_files.TERM_KEY: state.term,
            state_files.VOTE_FOR_KEY: state.voted_for or "",
            state_files.COMMITTED_INDEX_KEY: state.committed_index,
        }
        mark = (getattr(state, "catch_up_term", -1), getattr(state, "catch_up_index", -1))
        if mark[1] >= 0:
            values[state_files.CATCH_UP_TERM_KEY], values[state_files.CATCH_UP_INDEX_KEY] = mark
        state_files.write_properties(self._term_path, values)
        self._hard_state = HardState(state.term, state.voted_for, state.committed_index, *mark)
        self.update_committed_index(state.committed_index)

    def _load_state_files(self) -> tuple[int, int, bool]:
        """Read currterm and checkpoint; return (committed index hint, checkpoint flushedIndex,
        whether a reset was under way); the recorded begin goes to ``_begin``."""
        hint = -1
        values = state_files.read_properties(self._term_path)
        if values is not None:
            term = state_files.int_property(values, state_files.TERM_KEY, path=self._term_path, default=0)
            vote = values.get(state_files.VOTE_FOR_KEY, "") or None
            hint = state_files.int_property(values, state_files.COMMITTED_INDEX_KEY, path=self._term_path, default=-1)
            mark = [state_files.int_property(values, key, path=self._term_path, default=-1)
                    for key in (state_files.CATCH_UP_TERM_KEY, state_files.CATCH_UP_INDEX_KEY)]  # fmt: skip
            self._hard_state = HardState(max(term, 0), vote, hint, *mark)
        flushed = -1
        values = state_files.read_properties(self._checkpoint_path)
        if values is not None:
            path = self._checkpoint_path
            committed = state_files.int_property(values, state_files.COMMITTED_INDEX_KEY, path=path, default=-1)
            hint = max(hint, committed)
            flushed = state_files.int_property(values, state_files.FLUSHED_INDEX_KEY, path=path, default=-1)
            begin = [state_files.int_property(values, key, path=path, default=-1) for key in
                     (state_files.BEGIN_INDEX_KEY, state_files.BEGIN_TERM_KEY, state_files.BEGIN_POS_KEY)]  # fmt: skip
            if begin[0] >= 1:
                if begin[1] < 0 or begin[2] < 0 or begin[2] % self.config.data_file_size:
                    raise StoreError(f"{path}: begin index {begin[0]}, term {begin[1]}, pos {begin[2]}: "
                                     "not a term and a data-file boundary")  # fmt: skip
                self._begin = (begin[0], begin[1], begin[2])
            resetting = state_files.int_property(values, state_files.RESETTING_KEY, path=path, default=0) == 1
            if resetting and self._begin is None:
                raise StoreError(f"{path}: resetting without a begin index")
            return hint, flushed, resetting
        return hint, flushed, False

    # -- recovery -------------------------------------------------------------------------

    def _recover(self) -> None:
        """Scan (reading only), refuse or accept the end found, then cut there and rebuild the
        index units that did not match."""
        committed_hint, checkpoint_flushed, resetting = self._load_state_files()
        if self._begin is not None:
            self._data_start_offset = self._begin[2]
            if resetting:  # a reset was begun: finish it (the checkpoint says so durably)
                self._drop_all_files(self._begin[0], self._begin[2])
            else:  # a retention pass that crashed part way: the files below the begin go
                self._delete_data_files_below(self._begin[2])
        files = self.data_file_list.mapped_files
        start_number = 0
        if not files:
            scan = DataScan(end_offset=self._data_start_offset, reason="no data files")
            start_offset = self._data_start_offset
        else:
            start_number = self._recovery_start(files)
            start_offset = files[start_number].file_from_offset
            scan = self._scan(files, start_number)
        if scan.last_index < 0 and self._begin is not None:  # empty at the recorded begin (a reset)
            scan.last_index, scan.last_term = self._begin[0] - 1, self._begin[1]
        accept, repair = self.config.recovery_accept_lost_entries, self.config.recovery_repair_from_peers
        damage = self._damage_found(scan, checkpoint_flushed)
        if damage is not None and not accept and not repair:
            raise StoreError(self._refusal(scan, damage[0], damage[1]))
        lost = max(0, checkpoint_flushed - scan.last_index)
        if damage is not None:
            if not accept:
                self._save_catch_up_mark(scan, committed_hint, checkpoint_flushed)
            if scan.damaged:  # the last entry kept has the damaged term: it goes too
                self._drop_last_scanned(scan)
            end = self.data_file_list.max_offset if self.data_file_list.mapped_files else scan.end_offset
            self.damaged.append(DamagedRange(scan.stop_path or self.data_file_list.directory, scan.end_offset,
                                             max(end, scan.end_offset), f"{scan.reason}: {damage[0]}",
                                             scan.last_index + 1))  # fmt: skip
        if accept and self._hard_state.catch_up_index >= 0:  # the operator accepts the loss: no mark
            saved = self._hard_state
            self.save_hard_state(HardState(saved.term, saved.voted_for, saved.committed_index))
        deleted = self._cut_data_after_scan(scan, cut_segments_max=None if damage is not None else
                                            self.config.recovery_cut_segments_max)  # fmt: skip
        self._cut_index_after_scan(scan)
        # What the scan read may have been only in the page cache (the process was killed, the
        # machine was not): sync it before calling it flushed.
        for mapped_file in [*self.data_file_list.mapped_files[start_number:], *self.index_file_list.mapped_files]:
            _sync_file(mapped_file.path)
        self._last_index, self._last_term = scan.last_index, scan.last_term
        self._first_index = self._read_first_index(scan)
        begin = self._begin
        self._term_before_first = begin[1] if begin is not None and begin[0] == self._first_index else -1
        self._flushed_index = scan.last_index
        self._checkpoint_flushed_index = checkpoint_flushed
        self.update_committed_index(committed_hint)
        # Entries below the first were deleted by retention or a reset, which take committed ones only.
        self._committed_index = max(self._committed_index, self._first_index - 1)
        if lost or resetting:
            self.persist_checkpoint()  # the loss was accepted once; the next open must not refuse again
        self.recovery = RecoveryReport(start_offset, scan.end_offset, self._first_index, scan.last_index,
                                       scan.count, scan.reason, None if scan.clean else scan.end_offset,
                                       deleted, scan.index_mismatch_from, lost)  # fmt: skip
        self._check()

    def _refusal(self, scan: DataScan, why: str, setting: str) -> str:
        where = scan.stop_path or self.data_file_list.directory
        value = "true" if setting == "recovery_accept_lost_entries" else "N"
        return (f"recovery refuses to end the log at offset {scan.end_offset} ({where}: {scan.reason}; the log "
                f"would end at entry {scan.last_index}): {why}. Inspect the files; set {setting}={value} (hasvc node "
                "--set) to accept the loss.")  # fmt: skip

    def _damage_found(self, scan: DataScan, checkpoint_flushed: int) -> tuple[str, str] | None:
        """Why ending the log where the scan stopped is damage, not a torn tail, and the setting
        that would accept it (None: a torn tail, or no cut at all)."""
        if scan.damaged:
            return ("a whole entry follows with a lower term: the log is damaged in the middle (an entry's term "
                    "is under no CRC), not torn at its tail; ending it here would drop what follows and keep a "
                    "damaged entry", "recovery_accept_lost_entries")  # fmt: skip
        lost = checkpoint_flushed - scan.last_index
        if lost > 0:
            return (f"the checkpoint says entries up to {checkpoint_flushed} were flushed; {lost} of them are gone",
                    "recovery_accept_lost_entries")  # fmt: skip
        later = [f for f in self.data_file_list.mapped_files if f.file_from_offset > scan.end_offset]
        holding_data = sum(1 for f in later if any(f.view()[: codec.MIN_BLANK_SIZE]))
        if holding_data > self.config.recovery_cut_segments_max:
            return (f"that would delete {holding_data} later data files holding data, more than "
                    f"recovery_cut_segments_max={self.config.recovery_cut_segments_max}", "recovery_cut_segments_max")
        return None

    def _save_catch_up_mark(self, scan: DataScan, committed_hint: int, checkpoint_flushed: int) -> None:
        """Before the cut: save the catch-up mark, the end the log had, as far as the index files,
        the checkpoint and the commit hint tell (its term from the index unit, else the saved
        term, an upper bound); an older mark stays if it is higher."""
        former_index, former_term = self._former_end(scan.last_index + 1)
        hard_term = self._hard_state.term
        candidates = [(former_term, former_index)]
        for index in (committed_hint, checkpoint_flushed, scan.last_index):
            if index > former_index:
                candidates.append((hard_term, index))
        mark_term, mark_index = max(candidates)
        saved = self._hard_state
        if (saved.catch_up_term, saved.catch_up_index) > (mark_term, mark_index):
            mark_term, mark_index = saved.catch_up_term, saved.catch_up_index
        if mark_index > scan.last_index or saved.catch_up_index >= 0:
            self.save_hard_state(HardState(saved.term, saved.voted_for, saved.committed_index, mark_term, mark_index))

    def _drop_last_scanned(self, scan: DataScan) -> None:
        """End the scan before its last entry (whose term field is damaged: a whole entry with a
        lower term follows it), where its index unit, written with it, says it lies."""
        last = scan.last_index
        unit = self._index_unit_or_none(last)
        if unit is None or scan.count == 0:
            raise StoreError(self._refusal(scan, f"entry {last} has a damaged term and no index unit to cut it by",
                                           "recovery_accept_lost_entries"))  # fmt: skip
        scan.end_offset, scan.last_index, scan.count = unit.pos, last - 1, scan.count - 1
        if scan.count == 0:
            scan.last_term = self._begin[1] if self._begin is not None and self._begin[0] == last else -1
            scan.first_index = -1
        else:
            previous = self._index_unit_or_none(last - 1)
            if previous is None:
                raise StoreError(self._refusal(scan, f"entry {last - 1} has no index unit", "recovery_accept_lost_entries"))
            scan.last_term = previous.term
        mapped_file = self.data_file_list.find_mapped_file_by_offset(unit.pos)
        scan.stop_path = mapped_file.path if mapped_file is not None else scan.stop_path
        scan.reason = f"entry {last}: term damaged ({scan.reason})"
        if scan.index_mismatch_from is not None and scan.index_mismatch_from > scan.last_index:
            scan.index_mismatch_from, scan.index_mismatch_offset = None, -1

    def _index_unit_or_none(self, index: int) -> codec.IndexUnit | None:
        offset = index * codec.INDEX_UNIT_SIZE
        mapped_file = self.index_file_list.find_mapped_file_by_offset(offset) if index >= 0 else None
        if mapped_file is None:
            return None
        try:
            unit = codec.decode_index_unit(mapped_file.view(), offset - mapped_file.file_from_offset)
        except codec.EntryFormatError:
            return None
        return unit if unit.index == index else None

    def _former_end(self, first_lost: int) -> tuple[int, int]:
        """(index, term) of the last index unit that follows on from ``first_lost`` (units
        index, index + 1, ... in order): where the log ended before the damage; (-1, -1): none."""
        queue = self.index_file_list
        found = (-1, -1)
        index = max(first_lost, 0)
        while True:
            offset = index * codec.INDEX_UNIT_SIZE
            mapped_file = queue.find_mapped_file_by_offset(offset)
            if mapped_file is None:
                return found
            try:
                unit = codec.decode_index_unit(mapped_file.view(), offset - mapped_file.file_from_offset)
            except codec.EntryFormatError:
                return found
            if unit.index != index or unit.term < found[1]:
                return found
            found = (index, unit.term)
            index += 1

    def _recovery_start(self, files: list[MappedFile]) -> int:
        """From file max(0, n - 3) back: the first whose first entry is whole, at the file's
        start and matching its index unit; none: 0."""
        for number in range(max(0, len(files) - 3), -1, -1):
            mapped_file = files[number]
            try:
                header, _ = codec.decode_entry(mapped_file.view())
            except codec.EntryFormatError:
                continue
            if header.pos == mapped_file.file_from_offset and self._unit_matches(header):
                return number
        return 0

    def _unit_matches(self, header: codec.EntryHeader) -> bool:
        offset = header.index * codec.INDEX_UNIT_SIZE
        mapped_file = self.index_file_list.find_mapped_file_by_offset(offset)
        if mapped_file is None or offset - mapped_file.file_from_offset >= mapped_file.wrote_position:
            return False
        try:
            unit = codec.decode_index_unit(mapped_file.view(), offset - mapped_file.file_from_offset)
        except codec.EntryFormatError:
            return False
        return unit_matches(unit, header)

    def _scan(self, files: list[MappedFile], start: int) -> DataScan:
        data_files = [DataFile(f.path, f.file_from_offset, f.view()) for f in files[start:]]
        first_index = None  # the log's first file: its first entry has the recorded begin's index, else 0
        if start == 0 and files[0].file_from_offset == self._data_start_offset:
            first_index = self._begin[0] if self._begin is not None else 0
        return scan_data_files(data_files, file_size=self.config.data_file_size, unit_matches=self._unit_matches,
                               first_index=first_index)  # fmt: skip

    def _cut_data_after_scan(self, scan: DataScan, *, cut_segments_max: int | None) -> tuple[str, ...]:
        """Cut the data files where the scan stopped (zeroing the rest of that file: bytes of a
        torn tail must not be read back after the next crash); refuse when that deletes more
        than ``cut_segments_max`` files holding data (None: damage being repaired, no limit)."""
        queue = self.data_file_list
        later = [f for f in queue.mapped_files if f.file_from_offset > scan.end_offset]
        holding_data = [f for f in later if any(f.view()[: codec.MIN_BLANK_SIZE])]
        if cut_segments_max is not None and len(holding_data) > cut_segments_max:
            raise StoreError(self._refusal(scan, f"that would delete {len(holding_data)} later data files holding data, "
                                                 f"more than recovery_cut_segments_max="
                                                 f"{self.config.recovery_cut_segments_max}",
                                           "recovery_cut_segments_max"))  # fmt: skip
        if queue.mapped_files:
            self._cut(queue, scan.end_offset)
        queue.flushed_where = queue.committed_where = scan.end_offset
        return tuple(f.path for f in later)

    def _cut_index_after_scan(self, scan: DataScan) -> None:
        """Cut the index after the last entry; rewrite the units from the first that did not
        match; make it all durable."""
        queue = self.index_file_list
        if scan.last_index < 0:
            had_files = bool(queue.mapped_files)
            queue.destroy()
            if had_files:
                fsync_directory(queue.directory)
            return
        if scan.index_mismatch_from is not None:
            self._rewind_index(scan.index_mismatch_from * codec.INDEX_UNIT_SIZE)
            self._rebuild_index(scan.index_mismatch_offset, scan.end_offset)
        self._rewind_index((scan.last_index + 1) * codec.INDEX_UNIT_SIZE)
        queue.flush()

    def _rewind_index(self, offset: int) -> None:
        """Cut the index files at ``offset``; when no kept file can hold it, drop them all (the
        next unit then starts a file of its own)."""
        queue = self.index_file_list
        last = queue.last
        if last is not None and queue.min_offset <= offset <= last.file_from_offset + queue.file_size:
            self._cut(queue, offset)
            return
        had_files = bool(queue.mapped_files)
        queue.reset_to(offset)
        if had_files:
            fsync_directory(queue.directory)

    def _rebuild_index(self, start_offset: int, end_offset: int) -> None:
        """Append the index unit of every entry in ``[start_offset, end_offset)`` of the data
        (already validated by the scan)."""
        offset = start_offset
        while offset < end_offset:
            mapped_file = self.data_file_list.find_mapped_file_by_offset(offset)
            assert mapped_file is not None, offset
            position = offset - mapped_file.file_from_offset
            if codec.peek_blank(mapped_file.view(), position) is not None:
                offset = mapped_file.file_from_offset + mapped_file.file_size
                continue
            header = codec.decode_entry_header(mapped_file.view(), position)
            self._append_index_units([(header.index, header.pos, header.size, header.term)])
            offset += header.size

    def _delete_data_files_below(self, offset: int) -> None:
        below = sum(1 for f in self.data_file_list.mapped_files if f.file_from_offset < offset)
        if below:
            self.data_file_list.delete_first_files(below)
            fsync_directory(self.data_file_list.directory)

    def _read_first_index(self, scan: DataScan) -> int:
        """The index of the first entry kept (DLedger's reviseLedgerBeginIndex); when empty, the
        recorded begin (a reset), else 0."""
        if scan.count == 0 and self._begin is not None:
            return self._begin[0]
        if scan.last_index < 0:
            return 0
        first = self.data_file_list.first
        assert first is not None
        try:
            return codec.decode_entry_header(first.view(), 0).index
        except codec.EntryFormatError as error:
            raise StoreError(f"{first.path}: the first entry of the log: {error}") from None

    # -- invariants and lifetime ----------------------------------------------------------

    def _check(self) -> None:
        assert -1 <= self._flushed_index <= self._last_index, (self._flushed_index, self._last_index)
        assert self._committed_index <= self._last_index, (self._committed_index, self._last_index)
        assert 0 <= self._first_index <= self._last_index + 1, (self._first_index, self._last_index)
        empty = self._last_index < self._first_index
        if empty:
            assert self._last_term == self._term_before_first, (self._first_index, self._last_term, self._term_before_first)
        else:
            assert self._last_term >= 0, (self._first_index, self._last_index, self._last_term)
        if not empty:
            end = (self._last_index + 1) * codec.INDEX_UNIT_SIZE
            assert self.index_file_list.max_wrote_offset == end, (self.index_file_list.max_wrote_offset, end)

    def close(self) -> None:
        """Flush, write the checkpoint, close the files (DLedgerMmapFileStore#shutdown)."""
        self.flush()
        self.persist_checkpoint()
        self.abandon()

    def abandon(self) -> None:
        """Close the files without flushing or writing anything: what a crash leaves behind,
        less what only the page cache held (tests remove that themselves)."""
        self.data_file_list.close()
        self.index_file_list.close()
