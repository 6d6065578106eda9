"""DLedgerMessageStore (RocketMQ's DLedgerCommitLog): one record per DLedger entry, PHYSICALOFFSET =
pos + 48, consume queues over committed entries only, recovery, smooth upgrade from a classic store."""

import dataclasses
import os
import random
import shutil
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import native
from commitlog import record as rec
from commitlog.commit_log import ReadError
from commitlog.config import StoreConfig
from commitlog.dledger import DLedgerStoreConfig, Entry
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.message_inspect import iter_messages, verify_member
from commitlog.dledger import message_planning
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.dledger.upgrade import dledger_directory
from commitlog.mapped_file import StoreError
from commitlog.store import MessageStore

SEGMENT_SIZE = 4096
CONFIG = StoreConfig(commitlog_segment_size=SEGMENT_SIZE, consume_queue_units_per_file=64,
                     disk_max_used_space_ratio=1.0, disk_clean_ratio=1.0)  # fmt: skip
DLEDGER = DLedgerStoreConfig(data_file_size=SEGMENT_SIZE, index_file_size=32 * 64)


def open_store(path, self_id="n0", *, upgrade_classic=False):
    return DLedgerMessageStore.open(str(path), CONFIG, self_id=self_id, dledger=DLEDGER, upgrade_classic=upgrade_classic)


def message(i, queue_id=0, size=100, topic="T"):
    return rec.Message(topic, bytes([i % 256]) * size, queue_id=queue_id, properties={"KEYS": f"k{i}"})


def append_plan(store, plan, term=1):
    store.entries.append([Entry(plan.first_index + i, term, body) for i, body in enumerate(plan.bodies)])


def lead(store, messages, *, term=1, commit=True):
    """The leader's path: plan, the core accepts, the driver appends, commits, dispatches."""
    plan = store.plan_append(messages)
    store.accept_plan(plan)
    append_plan(store, plan, term)
    if commit:
        store.set_committed(store.entries.last_index())
        while store.dispatch():
            pass
    return plan


def noop(store, term):
    store.entries.append([Entry(store.entries.last_index() + 1, term, b"")])


def pulled(store, queue_id=0, topic="T"):
    return [(r.queue_offset, bytes(r.body)) for r in store.pull(topic, queue_id, 0, 1000)]


def test_plan_accept_append_commit_dispatch_pull(tmp_path):
    store = open_store(tmp_path)
    noop(store, 1)
    messages = [message(1, 0), message(2, 1), message(3, 0)]
    plan = store.plan_append(messages)
    assert plan.first_index == 1 and store.entries.last_index() == 0  # planning wrote nothing
    assert [q for _, _, q in plan.placements] == [0, 0, 1]
    store.accept_plan(plan)
    append_plan(store, plan)
    assert [store.offset_of_index(i) for i in (1, 2, 3)] == list(plan.offsets)
    assert pulled(store) == []  # appended, not committed
    store.set_committed(3)
    assert store.dispatch() == 4  # the no-op and three messages
    assert pulled(store, 0) == [(0, messages[0].body), (1, messages[2].body)]
    assert pulled(store, 1) == [(0, messages[1].body)]
    record = store.get_record(plan.offsets[1], check_crc=True)
    assert (record.topic, record.queue_id, record.properties["KEYS"]) == ("T", 1, "k2")
    assert record.store_timestamp == plan.store_timestamp
    assert store.caught_up() and store.reput_from_offset == store.dispatch_end_offset == store.committed_end_offset()
    assert bytes(store.read(plan.offsets[0], record.size)) == plan.bodies[0]
    store.close()


def test_nothing_above_the_committed_index_is_readable(tmp_path):
    store = open_store(tmp_path)
    plan = lead(store, [message(i) for i in range(3)], commit=False)
    store.set_committed(0)
    store.dispatch()
    first, second, _ = plan.offsets
    assert store.committed_end_offset() == second - codec.BODY_OFFSET == store.dispatch_end_offset
    assert pulled(store) == [(0, message(0).body)]
    with pytest.raises(ReadError, match="not committed"):
        store.get_record(second)
    with pytest.raises(ReadError, match="outside the committed"):
        store.read(second, 100)
    assert len(store.read(first, 1 << 20)) == second - codec.BODY_OFFSET - first  # stops at the committed end
    with pytest.raises(ReadError):
        store.get_record(first + 1)  # no record starts there
    assert not store.caught_up()
    store.set_committed(2)
    store.set_committed(1)  # never goes back
    assert store.entries.committed_index == 2
    store.dispatch()
    assert len(pulled(store)) == 3 and store.caught_up()
    store.close()


def test_no_op_entries_get_no_consume_queue_unit(tmp_path):
    store = open_store(tmp_path)
    noop(store, 1)
    lead(store, [message(0)], term=1)
    noop(store, 2)
    noop(store, 3)
    lead(store, [message(1)], term=3)
    assert store.dispatched_index == store.entries.last_index() == 4
    assert pulled(store) == [(0, message(0).body), (1, message(1).body)]
    assert store.consume_queues.find("T", 0).max_offset_in_queue == 2
    store.close()


def test_physical_offset_is_pos_plus_48_for_every_record_across_data_files(tmp_path):
    rng = random.Random(7)
    store = open_store(tmp_path)
    plans = []
    for round_ in range(12):
        if round_ % 3:
            plans.append(
                store.plan_append([message(i, i % 2, rng.randrange(1, 900)) for i in range(rng.randrange(1, 5))])
            )
        else:
            plans.append(store.plan_batch(rec.MessageBatch("T", [b"b" * rng.randrange(1, 900)] * 3, queue_id=1)))
        store.accept_plan(plans[-1])  # several proposals in flight before any is appended
    for plan in plans:
        append_plan(store, plan)
    store.set_committed(store.entries.last_index())
    while store.dispatch():
        pass
    assert len(store.entries.data_file_list.mapped_files) >= 3
    offsets = [offset for plan in plans for offset in plan.offsets]
    for index, offset in enumerate(offsets):
        pos, size = store.entries.entry_span(index)
        assert offset == pos + codec.BODY_OFFSET == store.offset_of_index(index)
        assert store.get_record(offset, check_crc=True).physical_offset == offset
    for mapped_file in store.entries.data_file_list.mapped_files[:-1]:  # each ends with DLedger's blank record
        last_pos, last_size = max(store.entries.entry_span(i) for i in range(len(offsets))
                                  if mapped_file.file_from_offset <= store.entries.pos_at(i) < mapped_file.file_from_offset + SEGMENT_SIZE)  # fmt: skip
        end = last_pos + last_size - mapped_file.file_from_offset
        if end < SEGMENT_SIZE:
            assert codec.peek_blank(mapped_file.view(), end) == SEGMENT_SIZE - end
    queue_offsets = {0: [], 1: []}
    for plan in plans:
        for _, queue_id, queue_offset in plan.placements:
            queue_offsets[queue_id].append(queue_offset)
    assert all(offsets_ == list(range(len(offsets_))) for offsets_ in queue_offsets.values())
    assert [r.physical_offset for q in (0, 1) for r in store.pull("T", q, 0, 1000)] == [
        offset for q in (0, 1) for plan in plans for offset, queue_id, _ in plan.placements if queue_id == q
    ]
    store.close()


@pytest.mark.parametrize("shared_properties", [True, False])
def test_a_batch_is_planned_as_the_same_records_as_its_messages_one_by_one(tmp_path, shared_properties):
    """plan_batch (one entry per message, one reused single-message batch) writes, message for
    message, the record plan_append writes: body, properties, queue offset, physical offset."""
    bodies = [bytes([i]) * size for i, size in enumerate((10, 700, 1, 333))]
    properties = {"KEYS": "shared"} if shared_properties else [{"KEYS": f"k{i}"} for i in range(len(bodies))]
    batch_store, one_store = open_store(tmp_path / "batch"), open_store(tmp_path / "one")
    lead(one_store, [message(99)])  # both logs start with one message, so offsets are not all 0
    lead(batch_store, [message(99)])
    plan = batch_store.plan_batch(rec.MessageBatch("T", bodies, queue_id=0, properties=properties,
                                                   born_timestamp=5))  # fmt: skip
    batch_store.accept_plan(plan)
    append_plan(batch_store, plan)
    batch_store.set_committed(batch_store.entries.last_index())
    while batch_store.dispatch():
        pass
    singles = [rec.Message("T", body, queue_id=0, born_timestamp=5,
                           properties=properties if shared_properties else properties[i])
               for i, body in enumerate(bodies)]  # fmt: skip
    lead(one_store, singles)

    def records(store):
        return [(r.queue_offset, r.physical_offset, bytes(r.body), dict(r.properties))
                for r in store.pull("T", 0, 0, 1000)]  # fmt: skip

    got = records(batch_store)
    assert got == records(one_store)
    assert [body for _, _, body, _ in got[1:]] == bodies
    assert [props["KEYS"] for _, _, _, props in got[1:]] == (["shared"] * 4 if shared_properties else ["k0", "k1", "k2", "k3"])
    batch_store.close()
    one_store.close()


def test_a_plan_after_accepted_plans_plans_only_its_own_entries(tmp_path, monkeypatch):
    """A pass of puts accepts a plan per request before any is appended: each plan starts where
    the newest accepted entry ends instead of planning every pending entry again (quadratic in a
    pass), and lands where the entries are then appended, across data files."""
    store = open_store(tmp_path)
    planned = []
    plan_positions = store.entries.plan_positions
    monkeypatch.setattr(store.entries, "plan_positions",
                        lambda sizes, **kwargs: planned.append(len(sizes)) or plan_positions(sizes, **kwargs))  # fmt: skip
    plans = []
    for round_ in range(20):
        plans.append(store.plan_batch(rec.MessageBatch("T", [b"b" * (300 + 37 * round_)] * 3, queue_id=0)))
        store.accept_plan(plans[-1])
    assert planned == [3] * 20
    for plan in plans:
        append_plan(store, plan)
    assert len(store.entries.data_file_list.mapped_files) >= 4
    offsets = [offset for plan in plans for offset in plan.offsets]
    assert offsets == [store.entries.pos_at(i) + codec.BODY_OFFSET for i in range(len(offsets))]
    store.close()


def test_bad_and_oversize_messages_are_refused_and_plan_nothing(tmp_path):
    store = open_store(tmp_path)
    with pytest.raises(rec.MessageRejected, match="does not fit a DLedger data file"):
        store.plan_append([message(0, size=SEGMENT_SIZE)])
    with pytest.raises(rec.MessageRejected, match="topic"):
        store.plan_append([rec.Message("bad topic", b"x")])
    with pytest.raises(rec.MessageRejected, match="empty batch"):
        store.plan_append([])
    plan = store.plan_append([message(0)])
    assert plan.first_index == 0 and plan.queue_offsets == (0,)
    other = store.plan_append([message(1)])
    store.accept_plan(plan)
    with pytest.raises(ValueError, match="out of order"):
        store.accept_plan(other)  # planned against the same end as `plan`
    store.close()


def test_reopen_after_a_clean_close_keeps_everything_and_continues_the_queues(tmp_path):
    store = open_store(tmp_path)
    noop(store, 1)
    plans = [lead(store, [message(i, i % 2, 700)]) for i in range(10)]
    store.close()
    assert not os.path.exists(tmp_path / "abort")
    store = open_store(tmp_path)
    assert store.last_exit_ok and store.entries.committed_index == 10 and store.caught_up()
    assert [r.physical_offset for r in store.pull("T", 0, 0, 100)] == [p.offsets[0] for p in plans[::2]]
    store.resume_queue_offsets()
    assert lead(store, [message(10, 0), message(11, 1)]).queue_offsets == (5, 5)
    store.close()


def test_a_crash_keeps_committed_flushed_entries_and_cuts_units_of_lost_ones(tmp_path):
    store = open_store(tmp_path)
    flushed = [lead(store, [message(i, 0, 500)]) for i in range(10)]
    store.entries.flush()
    store.write_checkpoint()
    lost = [lead(store, [message(i, 0, 500)]) for i in range(10, 14)]  # committed by a quorum, not flushed here
    store.flush_consume_queues()  # ... while their consume-queue units were
    assert len(pulled(store)) == 14
    lost_pos = lost[0].offsets[0] - codec.BODY_OFFSET
    store.close(clean=False)
    data = os.path.join(dledger_directory(str(tmp_path), "n0"), "data")
    for name in sorted(os.listdir(data)):  # the page cache is lost: zero everything unflushed
        start = int(name)
        if start + SEGMENT_SIZE > lost_pos:
            with open(os.path.join(data, name), "r+b") as file:
                file.seek(max(0, lost_pos - start))
                file.write(bytes(SEGMENT_SIZE - max(0, lost_pos - start)))
    store = open_store(tmp_path)
    assert not store.last_exit_ok and store.entries.last_index() == 9
    assert pulled(store) == [(i, message(i, 0, 500).body) for i in range(10)]
    assert store.consume_queues.find("T", 0).max_physic_offset == store.committed_end_offset()
    assert [store.get_record(p.offsets[0]).queue_offset for p in flushed] == list(range(10))
    assert store.caught_up()
    store.resume_queue_offsets()
    assert lead(store, [message(20)]).queue_offsets == (10,)  # the lost offsets are reused, not skipped
    store.close()


def test_after_a_crash_lost_consume_queues_are_rebuilt_from_the_committed_hint(tmp_path):
    store = open_store(tmp_path)
    noop(store, 1)
    for i in range(8):
        lead(store, [message(i, i % 3, 600)])
    store.entries.flush()
    store.write_checkpoint()  # committedIndex 8 on disk
    store.close(clean=False)
    shutil.rmtree(tmp_path / "consumequeue")
    store = open_store(tmp_path)
    assert store.entries.committed_index == 8 and store.caught_up()
    assert [len(pulled(store, q)) for q in range(3)] == [3, 3, 2]
    store.close()
    store = open_store(tmp_path)
    assert [len(pulled(store, q)) for q in range(3)] == [3, 3, 2]
    store.close()


def test_the_dispatched_consume_queues_raise_a_stale_committed_hint(tmp_path):
    store = open_store(tmp_path)
    lead(store, [message(0)])
    store.entries.flush()
    store.write_checkpoint()  # committedIndex 0
    lead(store, [message(1)])
    store.entries.flush()
    store.flush_consume_queues()
    store.close(clean=False)  # the checkpoint still says 0; the queues hold entry 1, committed when dispatched
    store = open_store(tmp_path)
    assert store.entries.committed_index == 1 and len(pulled(store)) == 2
    store.close()


def test_an_uncommitted_tail_is_truncated_and_the_log_continues(tmp_path):
    store = open_store(tmp_path)
    lead(store, [message(0)])
    tail = lead(store, [message(1), message(2)], commit=False)
    with pytest.raises(ValueError, match="committed"):
        store.entries.truncate(after_index=-1)
    store.entries.truncate(after_index=0)  # a new leader's log wins
    store.discard_plans()
    with pytest.raises(ReadError):
        store.get_record(tail.offsets[0])
    replacement = lead(store, [message(7), message(8, 1)], term=2)
    assert replacement.first_index == 1 and replacement.offsets[0] == tail.offsets[0]
    assert replacement.queue_offsets == (1, 0)
    assert pulled(store) == [(0, message(0).body), (1, message(7).body)]
    store.close()
    store = open_store(tmp_path)
    assert pulled(store) == [(0, message(0).body), (1, message(7).body)] and pulled(store, 1) == [(0, message(8).body)]
    store.close()


def test_an_accepted_plan_that_was_not_appended_is_reported(tmp_path):
    store = open_store(tmp_path)
    plan = store.plan_append([message(0)])
    store.accept_plan(plan)
    noop(store, 1)  # something else took its index
    with pytest.raises(StoreError, match="discard_plans"):
        store.plan_append([message(1)])
    store.discard_plans()
    assert store.plan_append([message(1)]).queue_offsets == (0,)
    store.close()


def test_a_follower_promoted_resumes_queue_offsets_from_its_consume_queues(tmp_path):
    leader, follower = open_store(tmp_path / "a", "n0"), open_store(tmp_path / "b", "n1")
    for i in range(6):
        lead(leader, [message(i, i % 2, 300)])
    copied = leader.entries.read(0, 100, size_max=1 << 20)
    follower.entries.append([Entry(e.index, e.term, e.body) for e in copied])
    follower.set_committed(3)
    follower.dispatch()
    with pytest.raises(StoreError, match="cannot take writes"):
        follower.resume_queue_offsets()  # entries 4 and 5 are not committed yet
    follower.set_committed(5)
    noop(follower, 2)
    follower.set_committed(6)
    follower.resume_queue_offsets()
    assert bytes(follower.get_record(leader.offset_of_index(2)).body) == message(2, 0, 300).body  # same offsets
    assert lead(follower, [message(6, 0), message(7, 1)], term=2).queue_offsets == (3, 3)
    assert [q for q, _ in pulled(follower, 0)] == [0, 1, 2, 3]
    leader.close()
    follower.close()


def classic_store_with(path, count, size=700):
    store = MessageStore.open(str(path), CONFIG)
    offsets = []
    for i in range(count):
        result = store.append([message(i, i % 2, size)])
        assert result.status is rec.PutMessageStatus.PUT_OK
        offsets.extend(result.offsets)
    store.close()
    return offsets


@pytest.mark.parametrize("crashed", [False, True])
def test_smooth_upgrade_serves_old_offsets_and_continues_each_queue(tmp_path, crashed):
    old = classic_store_with(tmp_path, 9)
    if crashed:  # the classic broker was killed with units not dispatched: the upgrade recovers them
        classic = MessageStore.open(str(tmp_path), CONFIG)
        old.extend(classic.append([message(9, 1, 700)]).offsets)
        classic.close(clean=False)
    store = open_store(tmp_path, upgrade_classic=True)  # the explicit step: the store becomes n0's
    boundary = (old[-1] // SEGMENT_SIZE + 1) * SEGMENT_SIZE
    assert store.divided_offset == boundary and store.statistics().min_offset == 0
    assert [store.get_record(offset).physical_offset for offset in old] == old
    assert [q for q, _ in pulled(store, 0)] == list(range(5))
    store.resume_queue_offsets()
    plan = lead(store, [message(20, 0), message(21, 1)])
    assert plan.offsets[0] == boundary + codec.BODY_OFFSET
    assert plan.queue_offsets == (5, len(old) - 5)
    assert [r.physical_offset for r in store.pull("T", 0, 0, 100)] == old[::2] + [plan.offsets[0]]
    store.close()
    store = open_store(tmp_path)  # the divide now comes from the DLedger files
    assert store.divided_offset == boundary and len(pulled(store, 0)) == 6 and len(pulled(store, 1)) == len(old) - 4
    record = store.get_record(old[1], check_crc=True)
    assert len(store.read(old[1], 1 << 20)) >= record.size and bytes(record.body) == message(1, 1, 700).body
    store.close()


def test_after_a_crash_dispatch_goes_back_to_the_recovery_scan_start(tmp_path):
    store = open_store(tmp_path)
    for i in range(6):
        lead(store, [message(i, i % 2, 600)])
    store.entries.flush()
    store.write_checkpoint()
    store.close(clean=False)
    shutil.rmtree(tmp_path / "consumequeue" / "T" / "1")  # queue 1's units never reached the disk; queue 0's did
    store = open_store(tmp_path)
    assert [len(pulled(store, q)) for q in range(2)] == [3, 3]
    store.close()


def test_verify_and_iterate_a_member_store_with_both_parts(tmp_path):
    old = classic_store_with(tmp_path, 7)
    store = open_store(tmp_path, upgrade_classic=True)
    noop(store, 1)
    new = lead(store, [message(10, 0), message(11, 1)])
    store.close()
    report = verify_member(str(tmp_path), "n0")
    assert report.ok and report.divided_offset == store.divided_offset
    assert (report.dledger_messages, report.dledger_noops, report.classic.records) == (2, 1, 7)
    assert [part["part"] for part in report.as_json()["parts"]] == ["classic", "dledger"]
    listed = [(m.part.value, m.offset, m.index) for m in iter_messages(str(tmp_path), "n0")]
    assert listed == [("classic", o, None) for o in old] + [("dledger", o, i) for i, o in enumerate(new.offsets, 1)]
    assert [m.offset for m in iter_messages(str(tmp_path), "n0", from_offset=new.offsets[1])] == [new.offsets[1]]
    assert [m.offset for m in iter_messages(str(tmp_path), "n0", from_offset=old[-1])] == [old[-1], *new.offsets]
    # a body whose PHYSICALOFFSET is not pos + 48 (a store written wrongly) is found
    pos = new.offsets[1] - codec.BODY_OFFSET
    data = os.path.join(dledger_directory(str(tmp_path), "n0"), "data", f"{pos - pos % SEGMENT_SIZE:020d}")
    body = bytearray(new.bodies[1])
    body[28:36] = (new.offsets[1] + 1).to_bytes(8, "big")
    with open(data, "r+b") as file:  # a whole entry, its bodyCrc right: only the message is wrong
        file.seek(pos % SEGMENT_SIZE)
        file.write(codec.encode_entry(index=2, term=1, pos=pos, body=bytes(body)))
    report = verify_member(str(tmp_path), "n0")
    assert not report.ok and report.bad_message_offset == new.offsets[1] and "pos + 48" in report.bad_message_reason
    with pytest.raises(rec.RecordError, match="pos \\+ 48"):
        list(iter_messages(str(tmp_path), "n0"))
    store = open_store(tmp_path)  # the store's own dispatch refuses it too, and serves the rest
    assert "not one record" in store.dispatch_error and not store.caught_up()
    assert store.dispatched_index == 1  # the entries before the bad one are dispatched, their units written
    with pytest.raises(ReadError, match="names offset"):
        store.get_record(new.offsets[1])
    assert pulled(store, 1) == [(q, message(i, 1, 700).body) for q, i in enumerate((1, 3, 5))]  # classic only
    store.close()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1500), min_size=1, max_size=4), min_size=1, max_size=12))
def test_every_planned_offset_is_where_the_entry_lands_plus_48(batches):
    with tempfile.TemporaryDirectory() as path:
        store = open_store(path)
        plans = []
        for sizes in batches:
            plans.append(store.plan_append([message(i, i % 3, size) for i, size in enumerate(sizes)]))
            store.accept_plan(plans[-1])
            if len(plans) % 2 == 0:  # sometimes two proposals in flight
                for plan in plans[-2:]:
                    append_plan(store, plan)
        if len(plans) % 2:
            append_plan(store, plans[-1])
        store.set_committed(store.entries.last_index())
        while store.dispatch():
            pass
        offsets = [offset for plan in plans for offset in plan.offsets]
        assert offsets == [store.entries.pos_at(i) + codec.BODY_OFFSET for i in range(len(offsets))]
        assert all(store.get_record(offset, check_crc=True).physical_offset == offset for offset in offsets)
        assert sum(len(pulled(store, q)) for q in range(3)) == len(offsets) and store.caught_up()
        store.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["T", "U"]), st.integers(0, 2), st.lists(st.integers(0, 1500), min_size=1, max_size=5),
                          st.sampled_from([0, rec.SYSFLAG_TRANSACTION_PREPARED]), st.booleans()),
                min_size=1, max_size=8),
       st.integers(0, 3))  # fmt: skip
def test_batches_planned_together_are_the_batches_planned_one_after_the_other(monkeypatch, batches, lead_in):
    """plan_batches (a leader's pass over several queues: one proposal) plans, byte for byte, the
    entries that planning each batch's messages one by one, accepted in turn, would plan: bodies,
    offsets (across data files), queues, queue offsets (none for a prepared transaction), and the
    queue table after."""
    monkeypatch.setattr(message_planning, "now_ms", lambda: 1_700_000_000_000)
    made = [rec.MessageBatch(topic, [bytes([len(sizes) + i]) * size for i, size in enumerate(sizes)], queue_id=queue,
                             properties={"KEYS": topic} if shared else [{"KEYS": f"k{i}"} for i in range(len(sizes))],
                             flag=3, born_timestamp=7, sysflag=sysflag)
            for topic, queue, sizes, sysflag, shared in batches]  # fmt: skip
    with tempfile.TemporaryDirectory() as together_path, tempfile.TemporaryDirectory() as apart_path:
        together, apart = open_store(together_path), open_store(apart_path)
        for store in (together, apart):
            for i in range(lead_in):  # the logs start elsewhere than at 0, and the queues too
                lead(store, [message(i, i % 3, 900)])
        plan = together.plan_batches(made)
        together.accept_plan(plan)
        plans = []
        for batch in made:  # each batch's messages one by one (plan_append: a code path of its own)
            props = batch.properties if isinstance(batch.properties, list) else [batch.properties] * len(batch.bodies)
            plans.append(apart.plan_append([rec.Message(batch.topic, body, queue_id=batch.queue_id, properties=p, flag=3,
                                                        born_timestamp=7, sysflag=batch.sysflag)
                                            for body, p in zip(batch.bodies, props)]))  # fmt: skip
            apart.accept_plan(plans[-1])
        assert plan.first_index == plans[0].first_index
        for field in ("bodies", "offsets", "queue_ids", "queue_offsets", "positions", "entry_sizes"):
            assert list(getattr(plan, field)) == [x for each in plans for x in getattr(each, field)], field
        assert together._queue_table == apart._queue_table
        together.close()
        apart.close()


def test_batches_planned_together_are_refused_as_a_whole(tmp_path):
    store = open_store(tmp_path)
    good = rec.MessageBatch("T", [b"fine"], queue_id=0)
    with pytest.raises(rec.MessageRejected, match="does not fit a DLedger data file"):
        store.plan_batches([good, rec.MessageBatch("T", [b"x" * SEGMENT_SIZE], queue_id=1)])
    with pytest.raises(rec.MessageRejected, match="topic"):
        store.plan_batches([good, rec.MessageBatch("bad topic", [b"x"], queue_id=1)])
    plan = store.plan_batches([good])  # nothing was planned or taken meanwhile
    assert plan.first_index == 0 and plan.queue_offsets == (0,)
    store.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 300), st.sampled_from(["T", "U"]),
                          st.sampled_from([None, "new", "caf\u00e9"]), st.booleans()), min_size=1, max_size=30),
       st.integers(0, 2**32))  # fmt: skip
def test_dispatch_walks_entries_natively_as_its_twin_does(tmp_path_factory, items, seed):
    """Dispatch of committed entries is one native walk per data file (dispatch_units with an
    entry header); the Python twin gives the same stops and units, and the consume queues hold
    every message at its queue offset (no-ops, several queues and data-file ends between)."""
    from commitlog import native
    from commitlog.dispatch import _dispatch_entries_python

    rng = random.Random(seed)
    store = open_store(tmp_path_factory.mktemp("walk"))
    try:
        expected = {}
        for i, (queue_id, size, topic, tags, noop_before) in enumerate(items):
            if noop_before:
                noop(store, 1)
            properties = {"KEYS": f"k{i}"} | ({"TAGS": tags} if tags else {})
            lead(store, [rec.Message(topic, bytes([i % 256]) * size, queue_id=queue_id, properties=properties)],
                 commit=rng.random() < 0.3)  # fmt: skip
            expected.setdefault((topic, queue_id), []).append(bytes([i % 256]) * size)
        store.set_committed(store.entries.last_index())
        while store.dispatch():
            pass
        assert store.dispatch_error is None and store.dispatched_index == store.entries.last_index()
        for (topic, queue_id), bodies in expected.items():
            assert [body for _, body in pulled(store, queue_id, topic)] == bodies
        if native.dispatch_units is not None:
            for mapped_file in store.entries.data_file_list.mapped_files:
                view, base = mapped_file.view(), mapped_file.file_from_offset
                for start_entry in range(0, mapped_file.wrote_position, max(1, mapped_file.wrote_position // 3)):
                    try:  # from an entry's start
                        header = codec.decode_entry_header(view, start_entry)
                    except codec.EntryFormatError:
                        continue
                    limit = mapped_file.wrote_position
                    fast = native.dispatch_units(view, start_entry, limit, base, 1000, 48)
                    slow = _dispatch_entries_python(view, start_entry, limit, base, 1000, 48)
                    assert fast == slow, (header, fast[:3], slow[:3])
    finally:
        store.close()


def test_a_malformed_entry_body_stops_dispatch_and_names_the_entry(tmp_path):
    store = open_store(tmp_path)
    lead(store, [message(1), message(2)], commit=False)
    store.entries.append([Entry(2, 1, b"not a record at all")])
    lead(store, [message(3)], commit=False)
    store.set_committed(store.entries.last_index())
    while store.dispatch():
        pass
    assert store.dispatched_index == 1 and store.dispatch_error.startswith("entry 2: its body at offset")
    assert [q for q, _ in pulled(store)] == [0, 1]
    store.close(clean=False)


def test_dispatch_keeps_to_its_byte_budget(tmp_path):
    """A commit dispatches inline up to a byte budget (the driver's DISPATCH_INLINE_BYTES_MAX):
    the native walk stops at the entry that reaches it, and the next call goes on from there."""
    store = open_store(tmp_path)
    for i in range(20):
        lead(store, [message(i, size=100)], commit=False)
    store.set_committed(store.entries.last_index())
    record_size = store.entries.entry_span(0)[1] - codec.BODY_OFFSET
    assert store.dispatch(max_bytes=3 * record_size) == 3 and store.dispatched_index == 2
    assert store.dispatch(max_bytes=1) == 1  # at least one entry
    while store.dispatch():
        pass
    assert store.dispatched_index == 19 and [q for q, _ in pulled(store)] == list(range(20))
    store.close()


def plan_batch_one_by_one(store, batch):
    """The bodies ``plan_batch`` must make: one ``write_batch`` of a single-message batch per
    message, at that message's own offset (what plan_batch did before it wrote the batch once)."""
    store_ip, store_port, store_v6 = rec.encode_host(store.config.store_host)
    prepared = rec.prepare_batch(batch, body_size_max=store.config.max_message_size, store_v6=store_v6)
    first_index, positions, _ = store._plan_positions(prepared.sizes)
    store_timestamp = max(rec_now_ms(), store._last_store_timestamp)
    first = store._take_queue_offset({}, batch.topic, batch.queue_id, prepared.sysflag, prepared.count)
    shared = isinstance(prepared.properties, bytes)
    bodies = []
    for i, (body, size, pos) in enumerate(zip(batch.bodies, prepared.sizes, positions)):
        one = rec.PreparedBatch(dataclasses.replace(batch, bodies=[body]), prepared.topic,
                                prepared.properties if shared else [prepared.properties[i]], prepared.sysflag,
                                prepared.born_ip, prepared.born_port, [size], size)  # fmt: skip
        buffer = bytearray(size)
        rec.write_batch(buffer, 0, one, queue_offset_first=first + i, physical_base=pos + codec.BODY_OFFSET,
                        store_timestamp=store_timestamp, store_ip=store_ip, store_port=store_port,
                        crc_function=store.crc_function)  # fmt: skip
        bodies.append(bytes(buffer))
    return first_index, tuple(bodies), tuple(pos + codec.BODY_OFFSET for pos in positions)


def rec_now_ms():
    return 1_700_000_000_000


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 900), min_size=1, max_size=12), shared=st.booleans(),
       transactional=st.booleans(), lead_size=st.integers(0, 3000))  # fmt: skip
def test_plan_batch_writes_the_bytes_of_one_write_per_message(tmp_path_factory, monkeypatch, sizes, shared,
                                                              transactional, lead_size):  # fmt: skip
    """plan_batch writes the batch once and sets each record's PHYSICALOFFSET: byte for byte what
    a write_batch per message at its own offset writes, across a data file's end too."""
    monkeypatch.setattr("commitlog.dledger.message_planning.now_ms", rec_now_ms)
    store = open_store(tmp_path_factory.mktemp("plan"))
    try:
        if lead_size:
            lead(store, [rec.Message("T", b"x" * lead_size, queue_id=1)])
        bodies = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
        properties = {"KEYS": "shared"} if shared else [{"KEYS": f"k{i}"} for i in range(len(bodies))]
        sysflag = rec.SYSFLAG_TRANSACTION_PREPARED if transactional else 0
        batch = rec.MessageBatch("T", bodies, queue_id=1, properties=properties, born_timestamp=5, sysflag=sysflag)
        plan = store.plan_batch(batch)
        assert (plan.first_index, plan.bodies, plan.offsets) == plan_batch_one_by_one(store, batch)
    finally:
        store.close()


@pytest.mark.skipif(native.cut_records is None, reason="the native module is not built")
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(rec.PHYSICAL_OFFSET_POSITION + 8, 400), st.integers(0, (1 << 62))),
                min_size=0, max_size=40), st.integers(0, 30))  # fmt: skip
def test_the_records_of_a_batch_are_cut_natively_as_their_twin_cuts_them(records, spare):
    """``plan_batch``'s cut of one ``write_batch`` into a body per entry, the PHYSICALOFFSET of each
    set first: the native ``cut_records`` (no Python call per record) and its Python twin give the
    same bodies and leave the same buffer; a size that cannot hold the field, a record past the
    buffer's end and a count mismatch are refused by both."""
    sizes = [size for size, _ in records]
    offsets = [offset for _, offset in records]
    data = bytes(random.Random(len(records)).randrange(256) for _ in range(sum(sizes) + spare))
    native_buffer, twin_buffer = bytearray(data), bytearray(data)
    field = rec.PHYSICAL_OFFSET_POSITION
    bodies = native.cut_records(native_buffer, sizes, offsets, field)
    assert bodies == message_planning._cut_records_python(twin_buffer, sizes, offsets, field)
    assert native_buffer == twin_buffer and b"".join(bodies) == bytes(native_buffer[: sum(sizes)])
    assert all(int.from_bytes(body[field : field + 8], "big") == offset for body, offset in zip(bodies, offsets))
    for bad_sizes, bad_offsets in (([field + 7], [0]), ([len(data) + 1], [0]), (sizes + [field + 8], offsets)):
        if bad_sizes == sizes + [field + 8] and spare >= field + 8:
            continue  # it fits in the spare bytes
        for cut in (native.cut_records, message_planning._cut_records_python):
            with pytest.raises(ValueError):
                cut(bytearray(data), bad_sizes, bad_offsets, field)
    with pytest.raises(ValueError):
        native.cut_records(bytearray(data), sizes, offsets + [1], field)


def test_a_members_entry_files_take_the_stores_page_cache_keep_size(tmp_path):
    config = dataclasses.replace(CONFIG, page_cache_keep_size=1 << 20)
    store = DLedgerMessageStore.open(str(tmp_path), config, self_id="n0", dledger=None)
    try:
        assert store.entries.config.page_cache_keep_size == 1 << 20
        assert store.entries.config.data_file_size == config.commitlog_segment_size
    finally:
        store.close()


def test_a_consume_queue_cut_in_the_middle_by_damage_is_rebuilt_at_open(tmp_path):
    """A flipped bit in a unit's commit log offset breaks the queue's order: recovery cuts it there
    and, since units follow the cut, dispatches that queue's entries again from its new end."""
    store = open_store(tmp_path)
    noop(store, 1)
    for i in range(30):
        lead(store, [message(i, i % 2, 100)])
    before = pulled(store, 1)
    unit_file = store.consume_queues.find("T", 1).mapped_file_queue.mapped_files[0].path
    store.close()
    with open(unit_file, "r+b") as file:
        file.seek(7 * 20 + 4)
        byte = file.read(1)[0]
        file.seek(7 * 20 + 4)
        file.write(bytes([byte ^ 0x40]))
    store = open_store(tmp_path)
    try:
        assert store.queues_rebuilt == (("T", 1),)
        assert pulled(store, 1) == before
        assert pulled(store, 0) == [(i, bytes([2 * i]) * 100) for i in range(15)]
    finally:
        store.close()


def test_the_consume_queue_scrub_rewrites_a_unit_recovery_cannot_see(tmp_path):
    """A flipped bit in a unit's tags code keeps the queue's order: recovery keeps it; the scrub
    (EntryScrubber) finds the unit that no longer matches its record and rewrites it."""
    from commitlog.scrub import EntryScrubber

    store = open_store(tmp_path)
    noop(store, 1)
    for i in range(40):
        lead(store, [message(i, i % 2, 100)])
    queue_file = store.consume_queues.find("T", 0).mapped_file_queue.mapped_files[0].path
    before = store.consume_queues.find("T", 0).units_at(0, 20)
    store.close()
    with open(queue_file, "r+b") as file:
        file.seek(11 * 20 + 12)  # unit 11's tags code, first byte
        file.write(b"\x10")
    store = open_store(tmp_path)
    try:
        queue = store.consume_queues.find("T", 0)
        assert store.queues_rebuilt == () and queue.units_at(0, 20) != before
        scrubber = EntryScrubber(store)
        repaired = []
        while not (step := scrubber.step(700)).pass_completed:
            repaired += step.units_repaired
        assert repaired == [("T", 0, 11)]
        assert queue.units_at(0, 20) == before
        assert scrubber.statistics.passes == 1 and scrubber.statistics.units_repaired == 1
    finally:
        store.close()
