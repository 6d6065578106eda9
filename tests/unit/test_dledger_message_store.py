"""DLedgerMessageStore: records in DLedger entries, PHYSICALOFFSET = pos + 48, readable and
dispatched only once committed, queue offsets resumed by a new leader, recovery after a crash."""

from __future__ import annotations

import pytest

from commitlog import record as rec
from commitlog.commit_log import ReadError
from commitlog.config import StoreConfig
from commitlog.dledger.entry_store import Entry
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.mapped_file import StoreError

SEGMENT = 64 * 1024


def _open(path) -> DLedgerMessageStore:
    return DLedgerMessageStore.open(str(path), StoreConfig(commitlog_segment_size=SEGMENT), self_id="n0")


def _propose(store: DLedgerMessageStore, bodies: list[bytes], *, term: int = 1, topic: str = "T", queue_id: int = 0):
    plan = store.plan_append([rec.Message(topic, body, queue_id=queue_id) for body in bodies], now_ms=1_700_000_000_000)
    store.accept_plan(plan)
    store.entries.append([Entry(plan.first_index + i, term, body) for i, body in enumerate(plan.bodies)])
    return plan


def test_records_land_at_their_planned_offsets_across_data_files(tmp_path) -> None:
    store = _open(tmp_path)
    plans = [_propose(store, [bytes([i % 251]) * 3000]) for i in range(60)]  # > 2 data files: blanks between
    store.set_committed(store.entries.last_index())
    assert store.dispatch() == 60
    for i, plan in enumerate(plans):
        record = store.get_record(plan.offsets[0], check_crc=True)
        assert record.physical_offset == plan.offsets[0] == store.offset_of_index(i)
        assert record.queue_offset == i and bytes(record.body) == bytes([i % 251]) * 3000
    assert [r.queue_offset for r in store.pull("T", 0, 10, 5)] == [10, 11, 12, 13, 14]
    assert store.entries.pos_at(59) >= 2 * SEGMENT
    store.close()


def test_nothing_above_the_committed_index_is_readable_or_dispatched(tmp_path) -> None:
    store = _open(tmp_path)
    first = _propose(store, [b"a", b"b"])
    store.entries.append([Entry(2, 1, b"")])  # a leader's no-op
    third = _propose(store, [b"c"])
    store.set_committed(0)
    assert store.dispatch() == 1
    assert bytes(store.get_record(first.offsets[0]).body) == b"a"
    with pytest.raises(ReadError, match="not committed"):
        store.get_record(first.offsets[1])
    assert len(store.pull("T", 0, 0, 10)) == 1
    store.set_committed(3)
    assert store.dispatch() == 3  # b, the no-op (no unit), c
    assert [bytes(r.body) for r in store.pull("T", 0, 0, 10)] == [b"a", b"b", b"c"]
    assert store.pull("T", 0, 0, 10)[2].queue_offset == 2 and third.queue_offsets == (2,)
    with pytest.raises(ReadError, match="no-op"):
        store.read(store.offset_of_index(2), 100)
    assert store.caught_up()
    store.close()


def test_a_new_leader_continues_each_queue_after_entries_an_old_one_numbered(tmp_path) -> None:
    leader = _open(tmp_path / "a")
    plan = _propose(leader, [b"x", b"y"], queue_id=1)
    follower = _open(tmp_path / "b")
    follower.entries.append([Entry(i, 1, body) for i, body in enumerate(plan.bodies)])  # replicated as they are
    follower.entries.append([Entry(2, 2, b"")])
    follower.set_committed(2)
    assert not follower.caught_up()
    follower.dispatch()
    assert follower.caught_up()
    follower.resume_queue_offsets()
    nxt = _propose(follower, [b"z"], term=2, queue_id=1)
    assert nxt.queue_offsets == (2,) and nxt.first_index == 3
    leader.close()
    follower.close()


def test_reopen_after_a_power_loss_keeps_flushed_entries_and_cuts_queue_units_past_the_data(tmp_path) -> None:
    store = _open(tmp_path)
    plans = [_propose(store, [b"m%d" % i]) for i in range(5)]
    store.set_committed(4)
    store.entries.flush()
    store.write_checkpoint()
    plans += [_propose(store, [b"m%d" % i]) for i in range(5, 10)]
    store.set_committed(9)
    store.dispatch()
    store.flush_consume_queues()  # units for 0..9 on disk, entries 5..9 never flushed
    lost_from, _ = store.entries.entry_span(5)
    store.consume_queues.close()
    store.entries.abandon()
    data = sorted((tmp_path / "dledger-n0" / "data").iterdir())[0]
    with open(data, "r+b") as file:  # the power loss: pages never written back read as zeros
        file.seek(lost_from)
        file.write(b"\0" * (SEGMENT - lost_from))
    again = _open(tmp_path)
    assert not again.last_exit_ok
    assert again.entries.last_index() == 4 and again.dispatched_index == 4
    assert [bytes(r.body) for r in again.pull("T", 0, 0, 20)] == [b"m%d" % i for i in range(5)]
    assert again.caught_up()
    again.resume_queue_offsets()
    assert _propose(again, [b"n"]).queue_offsets == (5,)
    assert plans[5].offsets[0] == again.offset_of_index(5)  # the same place as the lost entry
    again.close()


def test_a_classic_commit_log_is_refused_until_smooth_upgrade_is_built_in(tmp_path) -> None:
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / "00000000000000000000").write_bytes(b"\0" * SEGMENT)
    with pytest.raises(StoreError, match="classic commit log"):
        _open(tmp_path)


def test_an_oversize_message_is_refused_before_anything_changes(tmp_path) -> None:
    store = _open(tmp_path)
    with pytest.raises(rec.MessageRejected):
        store.plan_append([rec.Message("T", b"x" * (SEGMENT + 1))], now_ms=0)
    assert store.entries.last_index() == -1 and store.queue_table == {}
    store.close()
