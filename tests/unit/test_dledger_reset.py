"""A RESET on the DLedger store (a follower stranded below the leader's first index): every data,
index and consume-queue file goes and the log restarts empty at the leader's first index and
offset; afterwards the follower's files are byte-identical to the leader's from there. Durable and
atomic: a reopen, and a power loss at each step of the reset, recover to the old log or the new
one, never a mix. Retention records the term before the new first entry (what a leader's RESET
carries), and a crash part way through a deletion is finished on reopen."""

import dataclasses
import os

import pytest

from commitlog.dledger import DLedgerMmapFileStore, Entry
from commitlog.dledger import state_files
from commitlog.dledger.message_inspect import verify_member
from tests.unit.test_dledger_message_store import lead, message, open_store
from tests.unit.test_dledger_retention import PER_FILE, SMALL, data_files, entries, filled_message_store, readable


@dataclasses.dataclass(frozen=True)
class Reset:  # what the Raft core hands the driver (hasvc.state.raft.storage.LogReset)
    first_index: int
    term_before_first: int
    first_offset: int


def stranded_store(path, *, count=PER_FILE * 2 + 3, committed=5):
    """A follower's store: entries 0..count-1 of term 1 (flushed), only 0..committed committed."""
    store = DLedgerMmapFileStore.open(str(path), SMALL)
    store.append(entries(0, count))
    store.flush()
    store.update_committed_index(committed)
    store.persist_checkpoint()
    return store


def leader_store(path, *, files=6, delete=3, term=2):
    """A leader's store whose retention deleted its first ``delete`` data files."""
    store = DLedgerMmapFileStore.open(str(path), SMALL)
    store.append(entries(0, PER_FILE * files + 4, term=term))
    store.flush()
    store.update_committed_index(store.last_index())
    store.delete_head_files(count=delete, keep_from_index=1 << 60)
    return store


def file_bytes(directory, names):
    return {name: open(os.path.join(directory, name), "rb").read() for name in names}


def test_retention_records_the_term_before_the_first_entry_and_a_reopen_keeps_it(tmp_path):
    store = leader_store(tmp_path)
    assert store.first_index() == 3 * PER_FILE and store.term_before_first() == 2
    assert store.first_offset() == 3 * SMALL.data_file_size == store.pos_at(store.first_index())
    store.close()
    values = state_files.read_properties(os.path.join(tmp_path, state_files.CHECKPOINT_FILE))
    assert (values["beginIndex"], values["beginTerm"], values["beginPos"]) == (str(3 * PER_FILE), "2", str(3 * 4096))
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    assert (store.first_index(), store.term_before_first(), store.first_offset()) == (3 * PER_FILE, 2, 3 * 4096)
    store.close()


def test_a_crash_part_way_through_a_recorded_deletion_is_finished_on_reopen(tmp_path):
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    store.append(entries(0, PER_FILE * 5 + 4))
    store.flush()
    store.update_committed_index(store.last_index())
    calls = []

    def crash_after_one(count):
        calls.append(count)
        os.unlink(store.data_file_list.mapped_files[0].path)  # one of the three, then the power goes
        raise OSError("power loss")

    store.data_file_list.delete_first_files = crash_after_one
    with pytest.raises(OSError):
        store.delete_head_files(count=3, keep_from_index=1 << 60)
    assert calls == [3]
    store.abandon()
    assert len(data_files(tmp_path)) == 5  # two of the files to delete are still there
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    assert len(data_files(tmp_path)) == 3
    assert (store.first_index(), store.term_before_first()) == (3 * PER_FILE, 1)
    assert store.read(3 * PER_FILE, 1 << 20, size_max=1 << 30) == entries(3 * PER_FILE, 2 * PER_FILE + 4)
    store.close()


def test_a_reset_drops_every_file_and_the_log_restarts_empty_at_the_index(tmp_path):
    store = stranded_store(tmp_path)
    store.reset(Reset(100, 3, 8 * 4096))
    assert data_files(tmp_path) == [] and os.listdir(os.path.join(tmp_path, "index")) == []
    assert (store.first_index(), store.last_index(), store.last_term(), store.term_before_first()) == (100, 99, 3, 3)
    assert (store.committed_index, store.flushed_index(), store.first_offset()) == (99, 99, 8 * 4096)
    store.close()
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)  # empty at 100 after a reopen too
    assert (store.first_index(), store.last_index(), store.last_term(), store.committed_index) == (100, 99, 3, 99)
    assert store.first_offset() == 8 * 4096
    store.append(entries(100, 5, term=3))
    assert store.pos_at(100) == 8 * 4096 and data_files(tmp_path) == [f"{8 * 4096:020d}"]
    store.flush()
    store.abandon()  # a crash: entries from 100 on are found again
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    assert (store.first_index(), store.last_index(), store.term_before_first()) == (100, 104, 3)
    assert store.read(100, 105, size_max=1 << 20) == entries(100, 5, term=3)
    store.close()


def test_a_reset_is_refused_for_committed_entries_and_impossible_places(tmp_path):
    store = stranded_store(tmp_path, committed=40)
    for reset, why in [(Reset(40, 1, 4096), "committed"), (Reset(0, 1, 0), "index"), (Reset(50, -1, 4096), "term"),
                       (Reset(50, 1, 100), "multiple")]:  # fmt: skip
        with pytest.raises(ValueError, match=why):
            store.reset(reset)
    assert (store.first_index(), store.last_index(), len(data_files(tmp_path))) == (0, PER_FILE * 2 + 2, 3)
    store.close()


def test_after_a_reset_and_the_leaders_entries_the_files_are_byte_identical_from_its_first_entry(tmp_path):
    leader = leader_store(tmp_path / "leader")
    follower = stranded_store(tmp_path / "follower")
    follower.reset(Reset(leader.first_index(), leader.term_before_first(), leader.first_offset()))
    follower.append(leader.read(leader.first_index(), leader.last_index() + 1, size_max=1 << 40))
    follower.close()
    leader.close()
    names = sorted(os.listdir(tmp_path / "leader" / "data"))
    assert sorted(os.listdir(tmp_path / "follower" / "data")) == names
    assert file_bytes(tmp_path / "follower" / "data", names) == file_bytes(tmp_path / "leader" / "data", names)
    # the index files hold the same units from the first entry's on (the leader's first index file
    # still holds units of deleted entries before it; the follower's has zeros there)
    names = sorted(os.listdir(tmp_path / "leader" / "index"))
    assert sorted(os.listdir(tmp_path / "follower" / "index")) == names
    units = {side: b"".join(file_bytes(tmp_path / side / "index", names).values()) for side in ("leader", "follower")}
    skip = leader.first_index() * 32 - int(names[0])
    assert units["follower"][skip:] == units["leader"][skip:] and any(units["leader"][skip:])


def _begin_the_reset(store, reset):
    """The first step of ``reset`` alone: the checkpoint says a reset to ``reset`` is under way."""
    store.state_files.begin = (reset.first_index, reset.term_before_first, reset.first_offset)
    store.state_files.write_checkpoint(end=reset.first_index - 1, committed=reset.first_index - 1,
                                       flushed=reset.first_index - 1, resetting=True)  # fmt: skip


@pytest.mark.parametrize("crash_after", ["nothing", "checkpoint", "data_files", "index_files"])
def test_a_power_loss_during_a_reset_recovers_to_the_old_log_or_the_new_one(tmp_path, crash_after):
    store = stranded_store(tmp_path)
    old = store.read(0, 1 << 20, size_max=1 << 40)
    reset = Reset(100, 3, 8 * 4096)
    if crash_after != "nothing":
        _begin_the_reset(store, reset)
    if crash_after in ("data_files", "index_files"):
        for name in data_files(tmp_path):
            os.unlink(os.path.join(tmp_path, "data", name))
    if crash_after == "index_files":
        for name in os.listdir(os.path.join(tmp_path, "index")):
            os.unlink(os.path.join(tmp_path, "index", name))
    store.abandon()
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    if crash_after == "nothing":
        assert store.read(0, 1 << 20, size_max=1 << 40) == old
    else:  # the checkpoint said so: the reset is finished
        assert (store.first_index(), store.last_index(), store.last_term(), store.committed_index) == (100, 99, 3, 99)
        assert data_files(tmp_path) == [] and os.listdir(os.path.join(tmp_path, "index")) == []
        values = state_files.read_properties(os.path.join(tmp_path, state_files.CHECKPOINT_FILE))
        assert "resetting" not in values
    store.append([Entry(store.last_index() + 1, 3, b"next")])
    store.close()
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    assert store.read(store.last_index(), store.last_index() + 1, size_max=1 << 20)[0].body == b"next"
    store.close()


# -- the message store: consume queues --------------------------------------------------------


def test_a_message_store_reset_restarts_the_consume_queues_at_the_leaders_offsets(tmp_path):
    leader = filled_message_store(tmp_path / "leader")
    leader.clean_expired(keep_from_index=1 << 60, over_ratio=True)
    leader.clean_expired(keep_from_index=1 << 60, over_ratio=True)
    first = leader.entries.first_index()
    assert first > 0
    follower = open_store(tmp_path / "follower")
    for i in range(3):  # its own committed, dispatched messages, far below the leader's first entry
        lead(follower, [message(i, queue_id=0, size=300)])
    assert follower.consume_queues.find("T", 0) is not None
    follower.reset_log(Reset(first, leader.entries.term_before_first(), leader.entries.first_offset()))
    assert follower.consume_queues.queues == {} and not os.path.exists(str(tmp_path / "follower" / "consumequeue"))
    assert follower.min_offset == leader.min_offset and follower.dispatched_index == first - 1
    follower.entries.append(leader.entries.read(first, leader.entries.last_index() + 1, size_max=1 << 40))
    follower.set_committed(leader.entries.last_index())
    while follower.dispatch():
        pass
    assert readable(follower) == readable(leader) and readable(leader)
    follower.close(clean=False)  # a crash after the reset: reopened as it was
    follower = open_store(tmp_path / "follower")
    assert readable(follower) == readable(leader)
    assert (follower.entries.first_index(), follower.min_offset) == (first, leader.min_offset)
    follower.close()
    leader.close()
    assert verify_member(str(tmp_path / "follower"), "n0").ok


def test_a_crash_between_dropping_the_queues_and_the_entries_rebuilds_the_old_queues(tmp_path):
    store = open_store(tmp_path)
    for i in range(3):
        lead(store, [message(i, queue_id=0, size=300)])
    before = readable(store)
    entries_reset = store.entries.reset

    def power_loss(reset):
        raise OSError("power loss")

    store.entries.reset = power_loss
    with pytest.raises(OSError):
        store.reset_log(Reset(100, 1, 8 * 4096))
    store.entries.reset = entries_reset
    store.close(clean=False)
    store = open_store(tmp_path)
    assert readable(store) == before and store.entries.first_index() == 0
    store.close()


def test_store_verify_of_a_member_left_empty_by_a_reset_says_where_its_log_starts(tmp_path):
    from click.testing import CliRunner

    from commitlog.dledger.upgrade import dledger_directory
    from hasvc.cli import main as cli_main

    directory = dledger_directory(str(tmp_path), "n0")
    os.makedirs(directory)
    store = stranded_store(directory)
    store.reset(Reset(100, 3, 8 * 4096))
    store.close()
    done = CliRunner().invoke(cli_main, ["store", "verify", str(tmp_path), "--member", "n0"])
    assert "the log is empty and starts at entry 100 (offset 32768, the term before it 3)" in done.output, done.output
