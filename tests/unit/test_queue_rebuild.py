"""A consume queue always equals what a full dispatch of the commit log builds: after a crash with
the dispatcher behind, after the scrub, and as ``check_consume_queues`` (``hasvc store verify``,
the drills) reports it: the first differing unit with both values."""

import dataclasses
import json
import os
import types

from click.testing import CliRunner

from commitlog import record as rec
from commitlog.consume_queue import CQ_UNIT, CQ_UNIT_SIZE
from commitlog.inspect import check_consume_queues
from commitlog.scrub import Scrubber
from commitlog.store import MessageStore
from hasvc.cli import main


def _send(store: MessageStore, count: int, *, first: int = 0, queues: int = 2) -> list:
    results = []
    for number in range(first, first + count):
        result = store.append([rec.Message("T", b"%05d" % number + b"b" * 300, queue_id=number % queues)])
        assert result.status is rec.PutMessageStatus.PUT_OK, result
        results.append(result)
    return results


def _dispatch_all(store: MessageStore) -> None:
    while store.dispatch():
        pass


def _scrub_pass(store: MessageStore) -> list:
    scrubber = Scrubber(store, crc_function=store.crc_function)
    repaired = []
    while not (step := scrubber.step(4096)).pass_completed:
        repaired += step.units_repaired
    return repaired


def test_a_crash_with_the_dispatcher_behind_resumes_queue_offsets_after_the_last_record(tmp_path, small_config):
    # The log holds more records than one dispatch step's budget past where recovery starts
    # dispatching again (the oldest segment here: the checkpoint was never written). Opening the
    # store took one step, then resumed the queue offsets from the half-built queues: the next
    # puts reused queue offsets that records of the log already held.
    config = dataclasses.replace(small_config, dispatch_batch_size_max=8 * 1024)
    store = MessageStore.open(str(tmp_path), config)
    _send(store, 400)
    assert store.commit_log.max_offset > 4 * config.dispatch_batch_size_max
    store.dispatch(4096)  # the dispatcher was behind when the process was killed
    store.close(clean=False)
    with MessageStore.open(str(tmp_path), config) as store:
        assert not store.last_exit_ok
        after = store.append([rec.Message("T", b"after the crash", queue_id=1)])
        assert after.queue_offsets == (200,)  # queue 1 held 200 records of the log
        _dispatch_all(store)
        check = check_consume_queues(str(tmp_path))
        assert check.ok, check.describe()
        assert check.units == 401 and check.behind == 0
        assert store.pull("T", 1, 200, 1)[0].body.tobytes() == b"after the crash"


def test_the_scrub_keeps_the_unit_a_full_dispatch_builds_when_the_log_repeats_a_queue_offset(tmp_path, small_config):
    # A log written before the fix above can hold two records with one queue offset. Dispatch
    # indexes the first; the scrub rewrote the unit to the second (what the later record says),
    # so a restarted master's queue differed from its slave's, and from any rebuild.
    with MessageStore.open(str(tmp_path), small_config) as store:
        _send(store, 40)
        store.commit_log.topic_queue_table[("T", 1)] -= 1  # the next put to queue 1 repeats offset 19
        repeated = _send(store, 4, first=41)[0]
        assert repeated.queue_offsets == (19,)
        _dispatch_all(store)
        before = check_consume_queues(str(tmp_path))
        assert before.duplicates == 1 and not before.differences
        duplicate = before.duplicates_listed[0]
        assert (duplicate.topic, duplicate.queue_id, duplicate.queue_offset) == ("T", 1, 19)
        assert duplicate.duplicate_offset == repeated.wrote_offset
        assert store.consume_queues.find("T", 1).get(19)[0] == duplicate.first_offset
        assert _scrub_pass(store) == []
        after = check_consume_queues(str(tmp_path))
        assert not after.differences, after.describe()
        assert store.consume_queues.find("T", 1).get(19)[0] == duplicate.first_offset


def test_the_scrub_still_rewrites_a_damaged_unit_from_its_record(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        _send(store, 40)
        _dispatch_all(store)
        queue = store.consume_queues.find("T", 0)
        good = queue.get(7)
        queue.rewrite_unit(7, CQ_UNIT.pack(good[0], good[1], good[2] ^ 1))  # a flipped bit in the tags code
        assert _scrub_pass(store) == [("T", 0, 7)]
        assert queue.get(7) == good


def test_check_consume_queues_names_the_first_differing_unit_with_both_values(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        results = _send(store, 60, queues=3)
        _dispatch_all(store)
    assert check_consume_queues(str(tmp_path)).ok
    path = os.path.join(tmp_path, "consumequeue", "T", "2", f"{0:020d}")
    with open(path, "r+b") as file:  # unit 5 of queue 2 names record 20's offset instead of record 17's
        file.seek(5 * CQ_UNIT_SIZE)
        file.write(results[20].wrote_offset.to_bytes(8, "big"))
    check = check_consume_queues(str(tmp_path))
    assert not check.ok
    [difference] = check.differences
    assert (difference.topic, difference.queue_id, difference.index) == ("T", 2, 5)
    assert difference.stored[0] == results[20].wrote_offset
    assert difference.rebuilt == (results[17].wrote_offset, results[17].wrote_bytes, 0)
    assert difference.describe().startswith(f"T/2 unit 5: stored (offset {results[20].wrote_offset}, ")


def test_check_consume_queues_counts_units_not_dispatched_yet(tmp_path, small_config):
    store = MessageStore.open(str(tmp_path), small_config)
    _send(store, 300)
    assert len(store.commit_log.mapped_file_queue.mapped_files) > 1
    store.dispatch(1)  # the first segment's records dispatched, then killed
    store.close(clean=False)
    check = check_consume_queues(str(tmp_path))
    assert check.ok and check.behind > 0
    assert check.units + check.behind == 300


def test_check_consume_queues_reports_a_unit_past_the_last_record_of_its_queue(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        _send(store, 30)
        _dispatch_all(store)
        end = store.commit_log.max_offset
    with open(os.path.join(tmp_path, "consumequeue", "T", "0", f"{0:020d}"), "r+b") as file:
        file.seek(15 * CQ_UNIT_SIZE)  # queue 0 holds units 0..14
        file.write(CQ_UNIT.pack(end, 100, 0))
    [difference] = check_consume_queues(str(tmp_path)).differences
    assert (difference.index, difference.stored, difference.rebuilt) == (15, (end, 100, 0), None)


def test_store_verify_reports_the_first_differing_unit_and_exits_1(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        results = _send(store, 60, queues=3)
        _dispatch_all(store)
    clean = CliRunner().invoke(main, ["store", "verify", str(tmp_path)])
    assert clean.exit_code == 0, clean.output
    assert "queues       3 queue(s), 60 unit(s) match a rebuild from the log\n" in clean.output
    with open(os.path.join(tmp_path, "consumequeue", "T", "2", f"{0:020d}"), "r+b") as file:
        file.seek(5 * CQ_UNIT_SIZE)
        file.write(results[20].wrote_offset.to_bytes(8, "big"))
    text = CliRunner().invoke(main, ["store", "verify", str(tmp_path)])
    assert text.exit_code == 1
    assert f"T/2 unit 5: stored (offset {results[20].wrote_offset}, size {results[17].wrote_bytes}, tags 0), " \
           f"rebuilt (offset {results[17].wrote_offset}, size {results[17].wrote_bytes}, tags 0)" in text.output
    assert "status       CORRUPT: the consume queues differ from the log" in text.output
    done = CliRunner().invoke(main, ["store", "verify", str(tmp_path), "--json"])
    assert done.exit_code == 1
    [difference] = json.loads(done.output)["consume_queues"]["differences"]
    assert difference == {"topic": "T", "queue_id": 2, "index": 5, "stored": [results[20].wrote_offset, results[17].wrote_bytes, 0],
                          "rebuilt": [results[17].wrote_offset, results[17].wrote_bytes, 0]}  # fmt: skip


def test_the_drills_name_the_side_whose_queues_differ_from_its_log(tmp_path, small_config):
    from hasvc.tools.drill import queues_against_logs  # noqa: PLC0415 (the drill module starts no process on import)

    sides = {}
    for name in ("a", "b"):
        with MessageStore.open(str(tmp_path / name), small_config) as store:
            results = _send(store, 20)
            _dispatch_all(store)
        sides[name] = types.SimpleNamespace(store=str(tmp_path / name))
    assert queues_against_logs(sides["a"], sides["b"]) == ""
    with open(os.path.join(tmp_path, "b", "consumequeue", "T", "1", f"{0:020d}"), "r+b") as file:
        file.seek(3 * CQ_UNIT_SIZE)
        file.write(results[9].wrote_offset.to_bytes(8, "big"))
    assert queues_against_logs(sides["a"], sides["b"]).startswith(
        f"slave b: T/1 unit 3: stored (offset {results[9].wrote_offset}, size {results[7].wrote_bytes}, tags 0), rebuilt (offset "
        f"{results[7].wrote_offset},")  # fmt: skip


def test_queue_offsets_at_the_log_end_count_the_records_dispatch_has_not_reached(tmp_path, small_config):
    # What the next puts continue from when dispatch stops short (no room for a queue file).
    with MessageStore.open(str(tmp_path), small_config) as store:
        _send(store, 300, queues=3)
        store.dispatch(1)  # the first segment's records
        assert store.reput_from_offset < store.commit_log.max_offset
        assert store.consume_queues.queue_offset_table()[("T", 0)] < 100
        assert store._queue_offsets_at_log_end() == {("T", 0): 100, ("T", 1): 100, ("T", 2): 100}


def test_a_unit_moved_to_another_record_of_its_queue_is_dropped_and_rebuilt_at_open(tmp_path, small_config):
    # A flipped bit in a unit's commit-log offset can name another record of the same queue and
    # size (a DLedger corrupt drill's round: 0x1d -> 0x9d, 8 MiB on). Recovery cut the queue after
    # that unit (the next one breaks the order) and kept it: its record's size, topic and queue
    # matched. Dispatch then resumed after the record it named and met a queue offset past the
    # queue's end: the store refused to open ("unit for queue offset 19 but the queue holds 16").
    with MessageStore.open(str(tmp_path), small_config) as store:
        _send(store, 60)
        _dispatch_all(store)
        queue = store.consume_queues.find("T", 0)
        good, later = queue.get(15), queue.get(18)
        queue.rewrite_unit(15, CQ_UNIT.pack(later[0], later[1], later[2]))
    with MessageStore.open(str(tmp_path), small_config) as store:
        _dispatch_all(store)
        assert ("T", 0) in store.queues_rebuilt
        assert store.consume_queues.find("T", 0).get(15) == good
        check = check_consume_queues(str(tmp_path))
        assert check.ok, check.describe()
