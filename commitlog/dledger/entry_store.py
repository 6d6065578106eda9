"""DLedgerMmapFileStore: DLedger's on-disk Raft log (data files, index files, checkpoint, currterm).

Theory of operation
-------------------
A store directory (DLedger's ``dledger-<selfId>``) holds::

    data/<20-digit offset>    entries laid end to end, ``data_file_size`` each (1 GiB)
    index/<20-digit offset>   one 32-byte unit per entry, entry i at offset i * 32 (160 MiB files)
    checkpoint                endIndex, committedIndex (+ hasvc's flushedIndex, beginIndex/Term/Pos)
    currterm                  currTerm, voteLeader (+ hasvc's committedIndex)

Both file lists are ``MappedFileQueue``s of ``MappedFile``s, as the commit log's. The store is a
facade over one module per concern, each with its own theory of operation:

    entry_placement    where entries land: pos, blank records (pure; the message store plans by it)
    entry_reader       reads by index, by pos and as stored runs, index-unit lookup (pair-checked)
    entry_writer       append (entries, a leader's run), room on disk ahead, flush
    entry_retention    truncate, reset (a RESET from the leader), retention of head files
    entry_repair       the scrub's unit reads and the repair of an entry from a healthy copy
    entry_recovery     open: recovery as a plan (read only), then its application (``EntryLogLoader``)
    state_files        the checkpoint and currterm files (``EntryStateFiles``)

The reader, writer, retention and repair parts are base classes of ``DLedgerMmapFileStore`` over
the one set of positions below (the Raft core reads ``ends``/``term_at`` at every event and the put
path appends: no call through another object on those paths); recovery and the state files are
objects of their own, with their inputs and outputs named. The store keeps the log's positions:
``first_index <= last_index + 1``, ``flushed_index <= last_index``, ``committed_index <=
last_index``, and the index files end at ``(last_index + 1) * 32`` (``_check``, after each change).

Nothing is durable until ``flush`` (DLedger's FlushDataService every 10 ms), which returns
``flushed_index``: entries at or below it survive a crash. ``truncate`` and ``reset`` are durable
when they return. ``persist_checkpoint`` (DLedger: every 3 s) records ``endIndex`` and
``committedIndex`` as DLedger does, plus ``flushedIndex``, the flushed index at that moment;
``truncate`` lowers it on disk before cutting below it. ``save_hard_state`` replaces ``currterm``
durably before it returns. An empty log at index X reopens empty at X (from the checkpoint's
begin), with last term ``beginTerm``.

Not thread-safe: one caller at a time, with one exception: ``sync_files`` (the middle of
``flush``: ``flush_target``, ``sync_files``, ``flushed_to``) may run in a worker thread while the
owner appends, never while it truncates or closes.
"""

from __future__ import annotations

import dataclasses
import os

from commitlog.damage import DamagedRange
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.entry_reader import EntryReader
from commitlog.dledger.entry_recovery import EntryLogLoader, RecoveryReport
from commitlog.dledger.entry_repair import EntryRepair
from commitlog.dledger.entry_retention import EntryRetention
from commitlog.dledger.entry_types import Entry, HardState, StoredEntry
from commitlog.dledger.entry_writer import EntryWriter
from commitlog.dledger.state_files import EntryStateFiles
from commitlog.mapped_file import PREALLOCATE_STEP_SIZE
from commitlog.mapped_file_queue import MappedFileQueue

__all__ = ["DLedgerMmapFileStore", "DLedgerStoreConfig", "Entry", "HardState", "RecoveryReport", "StoredEntry"]

DATA_DIRECTORY = "data"
INDEX_DIRECTORY = "index"


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



class DLedgerMmapFileStore(EntryReader, EntryWriter, EntryRetention, EntryRepair):
    """The on-disk EntryLog (``hasvc.state.raft.storage``): DLedger's file layout, indexes from 0."""

    def __init__(self, directory: str, config: DLedgerStoreConfig, *, data_start_offset: int):
        config.validate()
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
        self.state_files = EntryStateFiles(directory, data_file_size=config.data_file_size)
        self._first_index = 0
        self._last_index = -1
        self._last_term = -1
        self._flushed_index = -1
        self._committed_index = -1
        self._term_before_first = -1  # the term of entry first_index - 1 (-1: first is 0, or not known)
        self.recovery: RecoveryReport | None = None
        # Damage recovery found and cut (recovery_repair_from_peers or recovery_accept_lost_entries).
        self.damaged: list[DamagedRange] = []

    @classmethod
    def open(cls, directory: str, config: DLedgerStoreConfig | None = None, *,
             data_start_offset: int = 0) -> DLedgerMmapFileStore:  # fmt: skip
        """Open (creating it if needed) and recover the store in ``directory``. An empty store's
        first data file starts at ``data_start_offset`` (smooth upgrade: dividedCommitlogOffset)."""
        store = cls(directory, config or DLedgerStoreConfig(), data_start_offset=data_start_offset)
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

    def _recover(self) -> None:
        """Recovery (``entry_recovery``: finish, plan, apply), then start from what it found."""
        loader = EntryLogLoader(self.data_file_list, self.index_file_list, self.config, self.state_files,
                                data_start_offset=self._data_start_offset)  # fmt: skip
        loaded = loader.load()
        self.damaged.extend(loaded.damaged)
        self._data_start_offset = loaded.data_start_offset
        self._first_index, self._last_index, self._last_term = loaded.first_index, loaded.last_index, loaded.last_term
        self._term_before_first = loaded.term_before_first
        self._flushed_index = loaded.last_index
        self.update_committed_index(loaded.committed_hint)
        # Entries below the first were deleted by retention or a reset, which take committed ones only.
        self._committed_index = max(self._committed_index, self._first_index - 1)
        if loaded.checkpoint_rewrite:
            self.persist_checkpoint()  # the loss was accepted once; the next open must not refuse again
        self.recovery = loaded.report
        self._check()

    # -- where the log begins and ends ------------------------------------------------------

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

    @property
    def data_start_offset(self) -> int:
        """Where the log's first entry lies or will lie (0, or a smooth upgrade's divide)."""
        return self.data_file_list.min_offset if self.data_file_list.mapped_files else self._data_start_offset

    @property
    def data_file_size(self) -> int:
        """Bytes per data file: with the entries it decides every pos and blank record."""
        return self.config.data_file_size

    # -- committed index, checkpoint, hard state ------------------------------------------

    @property
    def committed_index(self) -> int:
        return self._committed_index

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
        self.state_files.write_checkpoint(end=self._last_index, committed=self._committed_index, flushed=self._flushed_index)

    def load_hard_state(self) -> HardState:
        """The saved term and vote; the committed index known now (HardState(0, None, -1) fresh)."""
        saved = self.state_files.hard_state
        if saved.catch_up_index >= 0:
            return HardState(saved.term, saved.voted_for, self._committed_index, saved.catch_up_term, saved.catch_up_index)
        return HardState(saved.term, saved.voted_for, self._committed_index)

    def save_hard_state(self, state: HardState) -> None:
        """Replace ``currterm`` durably (fsynced before this returns). The term never decreases."""
        self.state_files.save_hard_state(state)
        self.update_committed_index(state.committed_index)

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
