"""DLedgerMmapFileStore against an in-memory model: random appends, truncates, flushes, commits,
hard-state saves, clean reopens and crashes. A crash loses any 4 KiB page of data or index
written after the last flush (page by page, as writeback leaves it); entries up to the flushed
index must come back, later ones may vanish but never change, and a saved hard state is never lost."""

import os
import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from commitlog.dledger import DLedgerMmapFileStore, DLedgerStoreConfig, Entry, HardState

PAGE_SIZE = 4096
# Data files of 4 pages and index files of 64 units: entries roll files often. At most 11
# unflushed entries of at most 1 048 bytes: a torn tail never spans more than the newest data
# file and its predecessor (what recovery_cut_segments_max=1 allows).
CONFIG = DLedgerStoreConfig(data_file_size=4 * PAGE_SIZE, index_file_size=32 * 64)
UNFLUSHED_MAX = 8


def lose_unflushed_pages(queue_state, keep_page) -> None:
    """Zero every page (or part of one) above the flushed offset that ``keep_page`` says was not
    written back. ``queue_state`` = (flushed offset, [(path, file start, written end)])."""
    flushed, files = queue_state
    for path, start, end in files:
        low = max(flushed, start)
        if end <= low:
            continue
        with open(path, "r+b") as file:
            page = low - low % PAGE_SIZE
            while page < end:
                lo, hi = max(page, low), min(page + PAGE_SIZE, end)
                if lo < hi and not keep_page(page):
                    file.seek(lo - start)
                    file.write(bytes(hi - lo))
                page += PAGE_SIZE


def queue_state(queue):
    files = [(f.path, f.file_from_offset, f.offset_of(f.wrote_position)) for f in queue.mapped_files]
    return queue.flushed_where, files


class EntryStoreMachine(RuleBasedStateMachine):
    @initialize()
    def open_store(self):
        self.path = tempfile.mkdtemp(prefix="hasvc-dledger-sm-")
        self.store = DLedgerMmapFileStore.open(self.path, CONFIG)
        self.model: list[Entry] = []
        self.term = 0
        self.committed = -1
        self.hard_state = HardState(0, None, -1)

    def teardown(self):
        if hasattr(self, "store"):
            self.store.abandon()
            shutil.rmtree(self.path, ignore_errors=True)

    @precondition(lambda self: self.store.last_index() - self.store.flushed_index() < UNFLUSHED_MAX)
    @rule(sizes=st.lists(st.integers(0, 1000), min_size=1, max_size=4), new_term=st.booleans())
    def append(self, sizes, new_term):
        if new_term:
            self.term += 1
        start = len(self.model)
        batch = [Entry(start + i, self.term, os.urandom(size)) for i, size in enumerate(sizes)]
        self.store.append(batch)
        self.model.extend(batch)

    @rule()
    def flush(self):
        assert self.store.flush() == len(self.model) - 1

    @rule()
    def warm_ahead(self):
        self.store.warm_ahead(CONFIG.data_file_size)

    @rule()
    def persist_checkpoint(self):
        self.store.persist_checkpoint()

    @precondition(lambda self: self.store.flushed_index() > self.committed)
    @rule(data=st.data())
    def commit(self, data):
        # only flushed entries: a committed entry must never vanish in this model
        self.committed = data.draw(st.integers(self.committed + 1, self.store.flushed_index()))
        assert self.store.update_committed_index(self.committed) == self.committed

    @precondition(lambda self: len(self.model) - 1 > self.committed)
    @rule(data=st.data())
    def truncate(self, data):
        after = data.draw(st.integers(self.committed, len(self.model) - 2))
        self.store.truncate(after_index=after)
        del self.model[after + 1 :]

    @rule(vote=st.sampled_from([None, "n0", "n1", "n2"]), bump=st.integers(0, 2))
    def save_hard_state(self, vote, bump):
        self.term += bump
        self.hard_state = HardState(self.term, vote, self.committed)
        self.store.save_hard_state(self.hard_state)

    @rule()
    def reopen_cleanly(self):
        self.store.close()
        self.store = DLedgerMmapFileStore.open(self.path, CONFIG)
        assert self.store.recovery.corrupt_offset is None
        assert self.store.last_index() == len(self.model) - 1

    @rule(mask=st.one_of(st.just(0), st.just(2**64 - 1), st.integers(0, 2**64 - 1)))
    def crash_and_recover(self, mask):
        flushed = self.store.flushed_index()
        states = [queue_state(self.store.data_file_list), queue_state(self.store.index_file_list)]
        self.store.abandon()
        for number, state in enumerate(states):
            lose_unflushed_pages(state, lambda page, n=number: mask >> ((page // PAGE_SIZE + 13 * n) % 64) & 1)
        self.store = DLedgerMmapFileStore.open(self.path, CONFIG)
        last = self.store.last_index()
        assert flushed <= last <= len(self.model) - 1, (flushed, last, len(self.model))
        del self.model[last + 1 :]
        hard = self.store.load_hard_state()
        assert (hard.term, hard.voted_for) == (self.hard_state.term, self.hard_state.voted_for)
        assert self.store.committed_index <= last
        self.committed = self.store.committed_index

    @invariant()
    def log_matches_model(self):
        if not hasattr(self, "store"):
            return
        store = self.store
        assert store.last_index() == len(self.model) - 1
        assert store.last_term() == (self.model[-1].term if self.model else -1)
        assert -1 <= store.flushed_index() <= store.last_index()
        assert store.read(0, len(self.model), size_max=1 << 30) == self.model
        for entry in self.model[-3:]:
            assert store.term_at(entry.index) == entry.term


EntryStoreMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestEntryStoreMachine = EntryStoreMachine.TestCase
