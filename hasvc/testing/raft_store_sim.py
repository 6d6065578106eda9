"""The Raft simulator over real DLedger entry stores: every member's log is a
``DLedgerMmapFileStore`` in a directory of its own, with small data and index files.

    python -m hasvc.testing.sim raft-store --seeds 20 [--nodes 3|5] [--first-seed N]
    python -m hasvc.testing.sim raft-store --seed 5                  # replay one seed

The schedules are ``hasvc.testing.raft_sim``'s, seed for seed; what changes is the log under each
core. A crash abandons the store as a killed process does and then, page by page past each
file's flushed point, loses each 4 KiB page of unflushed data with probability 1/2 (a power loss
that wrote some pages and not others: torn entries, torn index units), and reopens it: the
store's recovery must find the end the core may rely on. Retention deletes whole head data files
below the core's retention floor (or, forced, regardless of it: a stranded member is then RESET).
Storage faults: a member's data damaged on disk (a flipped byte in an entry's header), cut by its
recovery with the catch-up mark saved, then caught up by the leader. The checker (one leader a
term, log matching, committed entries never change or vanish, acknowledged proposals committed
once, no vote for a log missing an entry the voter acknowledged) runs after every step, as over
the in-memory SimLog.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile

from commitlog.dledger import DLedgerMmapFileStore, DLedgerStoreConfig
from hasvc.testing import raft_sim

PAGE_SIZE = 4096
# Small files, so that a seed's few hundred entries fill several and retention has whole files to delete.
# A member of a group: damage (the simulator's storage faults) is cut with the catch-up mark saved.
STORE_CONFIG = DLedgerStoreConfig(data_file_size=1024, index_file_size=32 * 64, recovery_repair_from_peers=True)


class StoreLog:
    """A DLedger entry store with what the simulator asks of a SimLog besides the store's own
    ``EntryLog`` methods: ``entries``, ``entry_at``, ``compact`` and ``crash``."""

    def __init__(self, path: str, seed: int | str):
        self.path = path
        self.rng = random.Random(f"raft-store-pages-{seed}")
        self.store = self._open()

    def _open(self) -> DLedgerMmapFileStore:
        return DLedgerMmapFileStore.open(self.path, STORE_CONFIG)

    def __getattr__(self, name):  # the EntryLog methods the cores call are the store's own
        return getattr(self.store, name)

    def entry_at(self, index: int):
        return self.store.read(index, index + 1, size_max=0)[0]

    @property
    def entries(self) -> list:
        return self.store.read(self.store.first_index(), self.store.last_index() + 1, size_max=1 << 40)

    def compact(self, *, keep_from_index: int, committed_index: int) -> int:
        """SimLog.compact on the real store: its retention (whole head data files; the driver
        sets the committed index first, as DLedgerMessageStore.set_committed does)."""
        self.store.update_committed_index(committed_index)
        count = len(self.store.deletable_head_files(keep_from_index=keep_from_index, count_max=10))
        self.store.delete_head_files(count=count, keep_from_index=keep_from_index)
        return self.store.first_index()

    def crash(self, *, lose_unflushed: bool = True) -> int:
        before = self.store.last_index()
        queues = (self.store.data_file_list, self.store.index_file_list)
        states = [(q.flushed_where, [(f.path, f.file_from_offset, f.offset_of(f.wrote_position)) for f in q.mapped_files])
                  for q in queues]  # fmt: skip
        self.store.abandon()
        if lose_unflushed:
            for flushed, files in states:
                for path, start, end in files:
                    self._lose_pages(path, start, max(flushed, start), end)
        self.store = self._open()
        return before - self.store.last_index()

    def lose_from(self, index: int) -> None:
        """SimLog.lose_from on the real store: everything is flushed and checkpointed, then one
        byte of entry ``index``'s header (its magic code) is flipped on disk; reopening cuts
        there and saves the catch-up mark itself (recovery_repair_from_peers). Recovery re-checks
        only the last 3 data files: an entry before them is not damaged, the first one they
        hold is (fewer entries lost than asked: the simulator's healthy-copy check covers it)."""
        self.store.flush()
        self.store.persist_checkpoint()
        pos, _ = self.store.entry_span(index)
        files = self.store.data_file_list.mapped_files
        scanned_from = files[max(0, len(files) - 3)].file_from_offset
        if pos < scanned_from:  # recovery re-checks the last 3 data files only: damage the first entry it checks
            pos = scanned_from
            index = self.store.get_by_pos(pos).index
        self.store.abandon()
        size = STORE_CONFIG.data_file_size
        name = os.path.join(self.path, "data", f"{pos - pos % size:020d}")
        with open(name, "r+b") as file:
            file.seek(pos % size + 3)  # the low byte of the entry's magic code
            byte = file.read(1)
            file.seek(pos % size + 3)
            file.write(bytes([byte[0] ^ 0x01]))
        self.store = self._open()
        assert self.store.last_index() == index - 1 and self.store.damaged, (index, self.store.last_index())
        assert self.store.load_hard_state().catch_up_index >= index

    def _lose_pages(self, path: str, start: int, low: int, end: int) -> None:
        with open(path, "r+b") as file:
            for page in range(low - low % PAGE_SIZE, end, PAGE_SIZE):
                lo, hi = max(page, low), min(page + PAGE_SIZE, end)
                if lo < hi and self.rng.random() < 0.5:
                    file.seek(lo - start)
                    file.write(bytes(hi - lo))

    def close(self) -> None:
        self.store.abandon()


def run_seed(seed: int, nodes: int = 3, *, directory: str | None = None,
             digest=None) -> tuple[raft_sim.SeedReport, list[StoreLog]]:  # fmt: skip
    """One seed of ``raft_sim`` with a store per member under ``directory`` (a temporary one,
    removed afterwards, when None). Returns the report and the members' logs (closed).
    ``digest``: as ``raft_sim.run_seed``'s."""
    root = directory or tempfile.mkdtemp(prefix="hasvc-raft-store-sim-")
    created: list[StoreLog] = []

    def store_log(member: str) -> StoreLog:
        created.append(StoreLog(os.path.join(root, f"seed{seed}-{member}-{len(created)}"), f"{nodes}-{seed}-{len(created)}"))
        return created[-1]

    try:
        report = raft_sim.run_seed(seed, nodes, log_factory=store_log, digest=digest)
    finally:
        for log in created:
            log.close()
        if directory is None:
            shutil.rmtree(root, ignore_errors=True)
    return report, created


def replay_command(seed: int, nodes: int) -> str:
    return f"python -m hasvc.testing.sim raft-store --nodes {nodes} --seed {seed}"
