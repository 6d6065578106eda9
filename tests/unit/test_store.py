import dataclasses
import os
import re
import struct
import types

import pytest

from commitlog import record as rec
from commitlog.config import FlushDiskType, StoreConfig
from commitlog.consume_queue import CQ_UNIT
from commitlog.epoch import EpochEntry
from commitlog.mapped_file import StoreError, segment_name
from commitlog.services import StoreServices
from commitlog.store import MessageStore, disk_used_ratio
from tests.sizes import SEGMENT_SIZE


def fill(store: MessageStore, count: int, *, queues: int = 2, body_size: int = 300, topic: str = "T") -> list:
    results = []
    for i in range(count):
        result = store.append([rec.Message(topic, bytes([i % 251]) * body_size, queue_id=i % queues, properties={"TAGS": f"t{i % 3}"})])
        assert result.status is rec.PutMessageStatus.PUT_OK, result
        results.append(result)
    return results


def segment_path(root, offset=0) -> str:
    return os.path.join(root, "commitlog", segment_name(offset))


def test_clean_reopen_keeps_everything_and_rebuilds_nothing(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        results = fill(store, 500)
        store.dispatch()
        table = store.consume_queues.queue_offset_table()
    assert table == {("T", 0): 250, ("T", 1): 250}
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert store.last_exit_ok and not store.recovery.abnormal
        assert store.commit_log.max_offset == results[-1].next_offset
        assert store.consume_queues.queue_offset_table() == table
        pulled = store.pull("T", 1, 10, 3)
        assert [r.queue_offset for r in pulled] == [10, 11, 12]
        assert [r.tags_code for r in pulled] == [rec.java_string_hash(f"t{i % 3}") for i in (21, 23, 25)]
        # queue offsets continue where they were
        assert store.append([rec.Message("T", b"x", queue_id=1)]).queue_offsets == (250,)


def _crashed_store(tmp_path, config, count=60):
    store = MessageStore.open(str(tmp_path), config)
    results = fill(store, count)
    store.dispatch()
    store.flush_commitlog(0)
    store.close(clean=False)
    assert os.path.exists(tmp_path / "abort")
    return results


@pytest.mark.parametrize(
    "damage",
    ["half_record", "bit_flip_in_body", "zeroed_tail", "garbage_after_end", "topic_length_corrupted"],
)
def test_crash_recovery_cuts_only_the_invalid_tail(tmp_path, small_config, damage):
    results = _crashed_store(tmp_path, small_config)
    last = results[-1]
    position = last.wrote_offset % SEGMENT_SIZE
    path = segment_path(tmp_path, last.wrote_offset - position)
    with open(path, "r+b") as file:
        if damage == "half_record":
            file.seek(position + last.wrote_bytes // 2)
            file.write(bytes(last.wrote_bytes))
        elif damage == "bit_flip_in_body":
            file.seek(position + 100)
            byte = file.read(1)[0]
            file.seek(position + 100)
            file.write(bytes([byte ^ 0x10]))
        elif damage == "zeroed_tail":
            file.seek(position)
            file.write(bytes(last.wrote_bytes))
        elif damage == "garbage_after_end":
            file.seek(position + last.wrote_bytes)
            file.write(os.urandom(500))
        elif damage == "topic_length_corrupted":  # DefaultMessageStoreTest#testRecover's damage
            file.seek(position + 84 + 4 + 300)
            file.write(b"\x7f")
    with MessageStore.open(str(tmp_path), small_config) as store:
        report = store.recovery
        assert report.abnormal
        if damage == "garbage_after_end":
            assert store.commit_log.max_offset == last.next_offset
            assert report.corrupt_offset == last.next_offset
        elif damage == "zeroed_tail":
            assert store.commit_log.max_offset == last.wrote_offset
            assert report.corrupt_offset is None  # a zero word is the clean end of data
        else:
            assert store.commit_log.max_offset == last.wrote_offset
            assert report.corrupt_offset == last.wrote_offset
        table = store.consume_queues.queue_offset_table()
        assert sum(table.values()) == len([r for r in results if r.next_offset <= store.commit_log.max_offset])
        for queue in store.consume_queues.queues.values():
            for offset, size, _ in queue.all_units():
                assert store.get_record(offset, check_crc=True).size == size
        # the cut tail is zero on disk: nothing old can come back after another crash
        end = store.commit_log.max_offset % SEGMENT_SIZE
    with open(path, "rb") as file:
        data = file.read()
    assert data[end:] == bytes(SEGMENT_SIZE - end)


def test_consume_queue_ahead_of_the_log_is_truncated(tmp_path, small_config):
    results = _crashed_store(tmp_path, small_config)
    cut = results[40].wrote_offset
    with open(segment_path(tmp_path), "r+b") as file:
        file.seek(cut)
        file.write(bytes(SEGMENT_SIZE - cut))
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert store.commit_log.max_offset == cut
        assert sum(store.consume_queues.queue_offset_table().values()) == 40
        assert store.append([rec.Message("T", b"n", queue_id=0)]).queue_offsets == (20,)


def test_lost_consume_queue_units_are_rebuilt_after_a_crash(tmp_path, small_config):
    _crashed_store(tmp_path, small_config)
    queue_dir = tmp_path / "consumequeue" / "T" / "1"
    for name in os.listdir(queue_dir):
        os.unlink(queue_dir / name)
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert store.consume_queues.queue_offset_table()[("T", 1)] == 30


def test_a_torn_consume_queue_unit_is_dropped(tmp_path, small_config):
    _crashed_store(tmp_path, small_config)
    path = tmp_path / "consumequeue" / "T" / "0" / segment_name(0)
    with open(path, "r+b") as file:
        file.seek(29 * 20)
        file.write(CQ_UNIT.pack(5, 300, 0))  # the last unit now names a record that is not there
    with MessageStore.open(str(tmp_path), small_config) as store:
        table = store.consume_queues.queue_offset_table()
        assert table[("T", 0)] == 30  # dropped, then rebuilt from the log
        offset, size, _ = store.consume_queues.find("T", 0).get(29)
        assert store.get_record(offset).queue_offset == 29


def test_a_second_process_is_refused(tmp_path, small_config):
    import subprocess
    import sys

    with MessageStore.open(str(tmp_path), small_config):
        code = (
            "import sys; from commitlog.store import MessageStore; from commitlog.config import StoreConfig\n"
            f"MessageStore.open({str(tmp_path)!r}, StoreConfig(commitlog_segment_size={SEGMENT_SIZE}))"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "already open in another process" in done.stderr


def test_inconsistent_segments_refuse_to_load_naming_the_file(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        fill(store, 400)
    os.truncate(segment_path(tmp_path, SEGMENT_SIZE), SEGMENT_SIZE // 2)
    with pytest.raises(StoreError, match="different sizes"):
        MessageStore.open(str(tmp_path), small_config)
    os.truncate(segment_path(tmp_path, SEGMENT_SIZE), SEGMENT_SIZE)
    with pytest.raises(StoreError, match="segments are 65536 bytes but commitlog_segment_size is 131072"):
        MessageStore.open(str(tmp_path), dataclasses.replace(small_config, commitlog_segment_size=2 * SEGMENT_SIZE))


def test_disk_over_the_ratio_refuses_appends_and_keeps_data(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        fill(store, 10)
    full = dataclasses.replace(small_config, disk_max_used_space_ratio=0.0001)
    with MessageStore.open(str(tmp_path), full) as store:
        result = store.append([rec.Message("T", b"x")])
        assert result.status is rec.PutMessageStatus.DISK_FULL
        assert "disk_max_used_space_ratio" in result.reason
        assert store.append_batch(rec.MessageBatch("T", [b"x"])).status is rec.PutMessageStatus.DISK_FULL
        assert len(store.pull("T", 0, 0, 100)) == 5


def test_rejected_messages_write_nothing(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert store.append([rec.Message("T", b"x" * (4 * 1024 * 1024 + 1))]).status is rec.PutMessageStatus.MESSAGE_ILLEGAL
        assert store.append([rec.Message("T", b"ok"), rec.Message("bad/topic", b"x")]).status is rec.PutMessageStatus.MESSAGE_ILLEGAL
        assert store.append([rec.Message("T", b"x", properties={"P": "v" * 40000})]).status is rec.PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
        assert store.append_batch(rec.MessageBatch("T", [b"x" * 3_000_000, b"y" * 2_000_000])).status is rec.PutMessageStatus.MESSAGE_ILLEGAL
        assert store.commit_log.max_offset == 0


def test_retention_deletes_old_segments_and_their_queue_files(tmp_path):
    # disk_clean_ratio=1: only age counts here, however full the machine's disk is.
    config = StoreConfig(commitlog_segment_size=SEGMENT_SIZE, consume_queue_units_per_file=20, file_reserved_time_hours=1,
                         disk_clean_ratio=1.0)  # fmt: skip
    with MessageStore.open(str(tmp_path), config) as store:
        fill(store, 600, queues=1)
        store.dispatch()
        old = [f.path for f in store.commit_log.mapped_file_queue.mapped_files[:2]]
        now_ms = int(os.path.getmtime(store.commit_log.mapped_file_queue.mapped_files[2].path) * 1000)
        for path in old:
            os.utime(path, (0, now_ms / 1000 - 3600 - 1))  # just past the hour kept
        assert store.clean_expired(now_ms_value=now_ms - 2000) == []  # 3599 s old: kept
        assert store.clean_expired(now_ms_value=now_ms) == old
        assert store.commit_log.min_offset == 2 * SEGMENT_SIZE
        queue = store.consume_queues.find("T", 0)
        assert queue.min_offset_in_queue > 0
        first = queue.get(queue.min_offset_in_queue)
        assert first[0] >= store.commit_log.min_offset - first[1] * 20
    with MessageStore.open(str(tmp_path), config) as store:
        assert store.commit_log.min_offset == 2 * SEGMENT_SIZE
        assert store.pull("T", 0, 599, 1)[0].queue_offset == 599


def test_a_disk_above_the_clean_ratio_deletes_old_segments_regardless_of_age(tmp_path):
    config = StoreConfig(commitlog_segment_size=SEGMENT_SIZE, consume_queue_units_per_file=20, disk_clean_ratio=1.0)
    with MessageStore.open(str(tmp_path), config) as store:
        fill(store, 600, queues=1)
        store.dispatch()
        files = [f.path for f in store.commit_log.mapped_file_queue.mapped_files]
        assert store.clean_expired(now_ms_value=int(os.path.getmtime(files[-1]) * 1000)) == []  # young segments, disk below the ratio
    with MessageStore.open(str(tmp_path), dataclasses.replace(config, disk_clean_ratio=1e-9)) as store:
        store.dispatch()
        assert store.clean_expired(now_ms_value=int(os.path.getmtime(files[-1]) * 1000)) == files[:-1]  # all but the newest, however young
        assert store.commit_log.min_offset == files_offset(files[-1])
        assert store.pull("T", 0, 599, 1)[0].queue_offset == 599


def files_offset(path: str) -> int:
    return int(os.path.basename(path))


def test_transient_store_pool_reads_only_committed_bytes(tmp_path, small_config):
    config = dataclasses.replace(small_config, transient_store_pool_enable=True, transient_store_pool_size=2)
    with MessageStore.open(str(tmp_path), config) as store:
        result = store.append([rec.Message("T", b"pooled")])
        assert store.commit_log.max_offset == 0  # written to the buffer, not yet committed
        store.commit_commitlog(0)
        assert store.commit_log.max_offset == result.next_offset
        fill(store, 600)
        store.flush_commitlog(0)
        assert store.pool.available >= 1  # full segments gave their buffers back
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert bytes(store.get_record(0).body) == b"pooled"
        assert store.commit_log.max_offset > 3 * SEGMENT_SIZE


def test_sync_flush_put_returns_after_the_records_are_flushed(tmp_path, small_config):
    config = dataclasses.replace(small_config, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    with MessageStore.open(str(tmp_path), config) as store, StoreServices(store) as services:
        for i in range(20):
            result = services.put([rec.Message("T", b"s" * i)])
            assert result.status is rec.PutMessageStatus.PUT_OK
            assert store.commit_log.flushed_offset >= result.next_offset


def test_checkpoint_records_flushed_offset_and_timestamps(tmp_path, small_config):
    from commitlog.checkpoint import StoreCheckpoint

    with MessageStore.open(str(tmp_path), small_config) as store:
        results = fill(store, 5)
    checkpoint = StoreCheckpoint.open(str(tmp_path / "checkpoint"))
    assert checkpoint.master_flushed_offset == results[-1].next_offset
    assert checkpoint.physic_msg_timestamp == results[-1].store_timestamp
    assert checkpoint.logics_msg_timestamp == results[-1].store_timestamp
    assert os.path.getsize(tmp_path / "checkpoint") == 4096
    raw = (tmp_path / "checkpoint").read_bytes()
    assert struct.unpack_from(">q", raw, 24)[0] == results[-1].next_offset


def test_slave_builds_consume_queues_from_replicated_bytes(tmp_path, small_config):
    with MessageStore.open(str(tmp_path / "master"), small_config) as master:
        fill(master, 300, queues=3)
        master.dispatch()
        with MessageStore.open(str(tmp_path / "slave"), small_config) as slave:
            offset = 0
            while offset < master.commit_log.max_offset:
                chunk = master.read(offset, 32 * 1024)
                slave.append_replicated(offset, chunk)
                offset += len(chunk)
            slave.dispatch()
            assert slave.consume_queues.queue_offset_table() == master.consume_queues.queue_offset_table()
            for key, queue in master.consume_queues.queues.items():
                assert slave.consume_queues.queues[key].all_units() == queue.all_units()


def test_damage_in_the_middle_of_the_log_is_refused_not_cut(tmp_path, small_config):
    store = MessageStore.open(str(tmp_path), small_config)
    results = fill(store, 900)
    store.close(clean=False)  # a crash: recovery scans from the oldest segment
    victim = next(r for r in results if r.wrote_offset > SEGMENT_SIZE + 1000)
    path = segment_path(tmp_path, SEGMENT_SIZE)
    with open(path, "r+b") as file:
        file.seek(victim.wrote_offset - SEGMENT_SIZE + 150)
        file.write(b"\xff\xff")
    before = {name: os.path.getsize(tmp_path / "commitlog" / name) for name in os.listdir(tmp_path / "commitlog")}
    with pytest.raises(StoreError, match=f"{segment_name(SEGMENT_SIZE)} at offsets \\[{victim.wrote_offset}, "
                                         f"{victim.next_offset}\\): body CRC mismatch \\(4 later segments hold data\\)"):
        MessageStore.open(str(tmp_path), small_config)
    assert {name: os.path.getsize(tmp_path / "commitlog" / name) for name in os.listdir(tmp_path / "commitlog")} == before
    accepting = dataclasses.replace(small_config, recovery_cut_segments_max=100)
    with MessageStore.open(str(tmp_path), accepting) as store:
        assert store.commit_log.max_offset == victim.wrote_offset


def test_a_slave_log_ending_mid_record_dispatches_up_to_it_and_then_the_rest(tmp_path, small_config):
    from commitlog.dispatch import _dispatch_units_python

    with MessageStore.open(str(tmp_path / "master"), small_config) as master:
        results = fill(master, 20)
        data = bytes(master.read(0, 10**9))
    cut = results[10].wrote_offset + 50  # frames end wherever the batch size says, not at records
    with MessageStore.open(str(tmp_path / "slave"), small_config) as slave:
        slave.append_replicated(0, data[:cut])
        assert slave.dispatch() == 10
        assert slave.dispatch_error is None and slave.reput_from_offset == results[10].wrote_offset
        view = slave.commit_log.mapped_file_queue.last.view()
        assert _dispatch_units_python(view, results[10].wrote_offset, cut, 0)[:3] == (results[10].wrote_offset, 0, 0)
        slave.append_replicated(cut, data[cut:])
        assert slave.dispatch() == 10
        assert sum(slave.consume_queues.queue_offset_table().values()) == 20


@pytest.mark.parametrize("span", [0, 1, 299, 5000, 70_000, 200_000, 10**9])
def test_the_tail_starts_at_the_last_boundary_before_the_span(tmp_path, small_config, span):
    with MessageStore.open(str(tmp_path), small_config) as store:
        offsets = [o for result in fill(store, 600, body_size=200) for o in result.offsets]  # spans several segments
        start, end = store.tail_start(span), store.commit_log.max_offset
    target = max(0, end - span)
    assert start <= target
    if span == 0:
        assert start == end
    else:  # the last record start at or before the target, within the target's segment
        assert start == max(o for o in offsets if o <= target and o // SEGMENT_SIZE == target // SEGMENT_SIZE)


def test_matches_count_only_at_a_record_end_never_in_a_body(tmp_path, small_config):
    pattern = re.compile(rb"MARK\x01(\d+)\x02")
    with MessageStore.open(str(tmp_path), small_config) as store:
        placed = {}
        for i in range(400):  # several segments; every third record is marked in its properties
            properties = {"TAGS": "t", "MARK": str(i)} if i % 3 == 0 else {"TAGS": "t"}
            body = b"MARK\x01999\x02" * 20 if i % 3 == 1 else bytes(200)  # forged marks in bodies
            result = store.append([rec.Message("T", body, queue_id=i % 2, properties=properties)])
            if i % 3 == 0:
                placed[i] = (result.offsets[0], result.queue_offsets[0], i % 2)
        found = {int(m.group(1)): (p.offset, p.queue_offset, p.queue_id) for m, p in store.find_at_record_ends(10**9, pattern)}
        assert found == placed
        recent = {int(m.group(1)) for m, _ in store.find_at_record_ends(5000, pattern)}
        assert recent and recent == {i for i in placed if placed[i][0] >= store.tail_start(5000)}


def test_disk_used_ratio_is_what_df_shows(monkeypatch):
    # a volume with 252 units, 37 used, 65 available to us (the rest reserved): df says 37 / 102
    monkeypatch.setattr(os, "statvfs", lambda path: types.SimpleNamespace(f_blocks=252, f_bfree=215, f_bavail=65))
    assert disk_used_ratio("/anywhere") == pytest.approx(37 / 102)
    monkeypatch.setattr(os, "statvfs", lambda path: types.SimpleNamespace(f_blocks=100, f_bfree=0, f_bavail=0))
    assert disk_used_ratio("/anywhere") == 1.0


def test_a_new_epoch_cuts_adopted_entries_past_the_log_end(tmp_path, small_config):
    """A slave that adopted its master's epochs before catching up holds an entry starting past
    its own end; promoting it opens the new epoch at its end all the same."""
    with MessageStore.open(str(tmp_path), small_config) as store:
        fill(store, 10)
        end = store.commit_log.max_offset
        store.epochs.replace([EpochEntry(1, 0), EpochEntry(2, end), EpochEntry(3, end + 5000)])
        with pytest.raises(ValueError, match="must grow"):
            store.epochs.append(4, end)  # what promote did before
        store.open_epoch(4)
        assert store.epochs.entries == [EpochEntry(1, 0), EpochEntry(2, end), EpochEntry(4, end)]
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert store.epochs.entries == [EpochEntry(1, 0), EpochEntry(2, end), EpochEntry(4, end)]


def test_the_disk_is_measured_at_most_once_per_check_interval_of_the_time_given(tmp_path, monkeypatch):
    """disk_full_at takes the time: the usage measured at t is trusted until t + interval."""
    measured = []
    usage = {"ratio": 0.10}

    def fake_ratio(path):
        measured.append(path)
        return usage["ratio"]

    monkeypatch.setattr("commitlog.disk_watch.disk_used_ratio", fake_ratio)
    config = StoreConfig(commitlog_segment_size=SEGMENT_SIZE, disk_check_interval_ms=1000, disk_max_used_space_ratio=0.75)
    with MessageStore.open(str(tmp_path), config) as store:
        assert store.disk_full_at(100.0) is False and len(measured) == 1
        usage["ratio"] = 0.90
        assert store.disk_full_at(100.999) is False and len(measured) == 1  # within the interval: the cached figure
        assert store.disk_full_at(101.0) is True and len(measured) == 2  # due: measured again
        usage["ratio"] = 0.10
        assert store.disk_full_at(101.5) is True and len(measured) == 2
        assert store.disk_full_at(102.0) is False and len(measured) == 3
