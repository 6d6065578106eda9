"""A blank record left after the log's last entry by a lost entry is cut by recovery: the next
entry lands where the log's prefix says (``entry_placement``), so a follower holding the same
entries accepts the leader's run at that pos. (Kept, the blank put a leader's next entry at the
next data file's start while its followers expected it after their last entry: they refused
every push and the group could commit nothing -- the raft-store simulator's seed 100624.)"""

import os

import pytest

from commitlog.dledger import DLedgerMmapFileStore, DLedgerStoreConfig, Entry
from hasvc.state.raft.storage import EntryRun

CONFIG = DLedgerStoreConfig(data_file_size=1024, index_file_size=32 * 64)
# 48 + 18 * 51 = 966 bytes: 58 left in data file 0, room for a 48-byte entry (and its blank
# record's 8) but not for a 51-byte one, which goes to data file 1 after a blank at 966.
PREFIX = [Entry(0, 1, b"")] + [Entry(i, 1, b"p%02d" % i) for i in range(1, 19)]


def _store(directory) -> DLedgerMmapFileStore:
    store = DLedgerMmapFileStore.open(str(directory), CONFIG)
    store.append(PREFIX)
    store.flush()
    return store


@pytest.mark.parametrize("loss", ["page zeroed", "file gone"])
def test_recovery_cuts_the_blank_a_lost_entry_left_and_a_follower_accepts_the_next_run(tmp_path, loss):
    leader = _store(tmp_path / "leader")
    assert leader.data_end() == 966
    leader.append([Entry(19, 1, b"p19")])  # 51 bytes: a blank at 966, the entry at 1024
    leader.flush()
    assert leader.entry_span(19) == (1024, 51)
    leader.abandon()
    second = os.path.join(tmp_path / "leader", "data", f"{1024:020d}")
    if loss == "page zeroed":  # a power loss took data file 1's page: entry 19 is gone, the blank is not
        with open(second, "r+b") as file:
            file.write(bytes(1024))
    else:  # or data file 1's creation was never synced
        os.unlink(second)
    leader = DLedgerMmapFileStore.open(str(tmp_path / "leader"), CONFIG)
    follower = _store(tmp_path / "follower")
    try:
        assert leader.last_index() == 18
        assert leader.data_end() == follower.data_end() == 966
        assert leader.next_pos(48) == follower.next_pos(48) == 966
        leader.append([Entry(19, 2, b"")])  # a new leader's no-op: 48 bytes fit after entry 18
        assert leader.entry_span(19) == (966, 48)
        (run,) = leader.read_runs(19, 1, 2)
        stored = EntryRun(run.first_index, run.count, run.last_term, bytes(run.data))
        del run
        assert follower.check_run(stored, prev_term=1) is None
        follower.append_run(stored)
        assert follower.entry_span(19) == (966, 48)
    finally:
        leader.abandon()
        follower.abandon()
    reopened = DLedgerMmapFileStore.open(str(tmp_path / "leader"), CONFIG)
    try:
        assert reopened.last_index() == 19 and reopened.entry_span(19) == (966, 48)
    finally:
        reopened.abandon()
