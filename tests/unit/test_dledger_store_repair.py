"""A member's store that finds damage below what it knew durable, with recovery_repair_from_peers:
it is cut to the last good entry, the catch-up mark (the end it had) is saved in currterm before
the cut, and the damage is listed in ``store.damaged``; without the setting it is refused."""

import dataclasses

import pytest

from commitlog.damage import DamagedRange
from commitlog.dledger import DLedgerMmapFileStore, HardState
from commitlog.dledger import state_files
from commitlog.mapped_file import StoreError
from tests.unit.test_dledger_store import SMALL, crash_with_unflushed, damage, data_files, entries, open_store

REPAIR = dataclasses.replace(SMALL, recovery_repair_from_peers=True)


def closed_store(path, count, *, term=3):
    store = open_store(path)
    store.append(entries(0, count, term=term))
    store.save_hard_state(HardState(term + 1, "n0", count - 1))
    spans = {i: store.entry_span(i) for i in range(count)}
    store.close()
    return spans


def test_a_flipped_byte_after_a_clean_shutdown_is_cut_with_the_catch_up_mark_saved_first(tmp_path):
    spans = closed_store(tmp_path, 20)
    pos, size = spans[8]
    damage(tmp_path, pos + 60, b"\x55")  # one body byte of entry 8
    with pytest.raises(StoreError, match=r"bodyCrc mismatch \(entry index 8\).*would end at entry 7.*"
                                         r"recovery_accept_lost_entries=true"):
        open_store(tmp_path)
    store = open_store(tmp_path, REPAIR)
    assert store.last_index() == 7
    assert store.load_hard_state() == HardState(4, "n0", 7, 3, 19)  # the end it had: (term 3, index 19)
    (found,) = store.damaged
    assert isinstance(found, DamagedRange)
    assert (found.from_offset, found.index) == (pos, 8) and found.file.endswith("data/00000000000000000000")
    assert "bodyCrc mismatch" in found.reason
    assert state_files.read_properties(str(tmp_path / "currterm"))["catchUpIndex"] == "19"
    store.close()
    store = open_store(tmp_path)  # the cut is done, the checkpoint rewritten: nothing to refuse or repair
    assert store.last_index() == 7 and not store.damaged
    assert store.load_hard_state().catch_up_index == 19  # until the Raft core clears it
    store.save_hard_state(HardState(4, "n0", 7))
    store.close()
    assert "catchUpIndex" not in state_files.read_properties(str(tmp_path / "currterm"))


def test_entries_known_flushed_and_gone_after_a_crash_are_marked(tmp_path):
    spans = crash_with_unflushed(tmp_path, 20, 0)
    damage(tmp_path, spans[12][0], bytes(4096 - spans[12][0]))  # flushed, checkpointed, gone
    store = open_store(tmp_path, REPAIR)
    assert store.last_index() == 11
    assert store.load_hard_state().catch_up_index == 19  # the checkpoint's flushedIndex
    store.close()


def test_damage_in_an_early_file_is_cut_whole_when_repairing(tmp_path):
    store = open_store(tmp_path)
    store.append(entries(0, 100, term=2))
    store.flush()
    store.persist_checkpoint()
    spans = {i: store.entry_span(i) for i in range(100)}
    store.abandon()
    damage(tmp_path, spans[30][0] + 2, b"\x7f")
    store = open_store(tmp_path, REPAIR)
    assert store.last_index() == 29 and len(data_files(tmp_path)) == 2
    assert (store.load_hard_state().catch_up_term, store.load_hard_state().catch_up_index) == (2, 99)
    store.close()


def test_a_torn_tail_past_the_flushed_point_is_cut_without_a_mark(tmp_path):
    spans = crash_with_unflushed(tmp_path, 10, 5)
    damage(tmp_path, spans[12][0] + 4, b"\x00\x00\x00\x07")
    store = open_store(tmp_path, REPAIR)
    assert store.last_index() == 11 and not store.damaged
    assert store.load_hard_state().catch_up_index == -1
    store.close()


def test_accepting_the_loss_cuts_without_a_mark_and_drops_an_old_one(tmp_path):
    spans = closed_store(tmp_path, 20)
    damage(tmp_path, spans[8][0] + 60, b"\x55")
    open_store(tmp_path, REPAIR).close()
    store = open_store(tmp_path, dataclasses.replace(SMALL, recovery_accept_lost_entries=True))
    assert store.last_index() == 7 and store.load_hard_state().catch_up_index == -1
    store.close()


def test_the_mark_and_a_plain_hard_state_round_trip(tmp_path):
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    store.save_hard_state(HardState(5, None, -1, 4, 30))
    store.close()
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    assert store.load_hard_state() == HardState(5, None, -1, 4, 30)
    store.close()


def test_a_raised_term_goes_with_its_entry_when_repairing(tmp_path):
    spans = closed_store(tmp_path, 20)
    pos, _ = spans[8]
    damage(tmp_path, pos + 16, (200).to_bytes(8, "big"))  # entry 8's term (under no CRC) 3 -> 200
    store = open_store(tmp_path, REPAIR)
    assert (store.last_index(), store.last_term()) == (7, 3)  # entry 8 went too: its term cannot be trusted
    assert (store.load_hard_state().catch_up_term, store.load_hard_state().catch_up_index) == (3, 19)
    (found,) = store.damaged
    assert found.from_offset == pos and found.index == 8 and "term damaged" in found.reason
    store.close()


def test_a_damaged_index_in_the_logs_first_entry_is_damage_not_a_shorter_log(tmp_path):
    closed_store(tmp_path, 20)
    damage(tmp_path, 15, b"\x01")  # entry 0's index field (under no CRC) now says 1
    with pytest.raises(StoreError, match=r"entry index 1, the log starts at 0"):
        open_store(tmp_path)
    store = open_store(tmp_path, REPAIR)
    assert (store.first_index(), store.last_index()) == (0, -1)  # nothing kept: the leader sends it all again
    assert store.load_hard_state().catch_up_index == 19
    store.close()
