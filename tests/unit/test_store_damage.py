"""A classic store tells damage from a torn tail: damage is never cut, the store refuses to open
with one line, and ``commitlog.repair`` rewrites the range from a healthy copy or cuts it."""

import os
import shutil
import struct

import hypothesis
import hypothesis.strategies as st
import pytest

from commitlog import repair
from commitlog import record as rec
from commitlog.checkpoint import StoreCheckpoint
from commitlog.commit_log import DamagedLogError
from commitlog.config import StoreConfig
from commitlog.mapped_file import StoreError
from commitlog.damage import DamagedRange
from commitlog.mapped_file import segment_name
from commitlog.scan import find_next_record
from commitlog.store import MessageStore
from tests.sizes import SEGMENT_SIZE
from tests.unit.test_store import fill


def _flip(root, offset: int, *, at: int) -> None:
    """XOR one byte of the record at global ``offset``, ``at`` bytes into it."""
    path = os.path.join(root, "commitlog", segment_name(offset - offset % SEGMENT_SIZE))
    with open(path, "r+b") as file:
        file.seek(offset % SEGMENT_SIZE + at)
        byte = file.read(1)[0]
        file.seek(offset % SEGMENT_SIZE + at)
        file.write(bytes([byte ^ 0x5A]))


def _files(root) -> dict[str, bytes]:
    directory = os.path.join(root, "commitlog")
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def _written(root, config, count=120) -> list:
    with MessageStore.open(str(root), config) as store:
        return fill(store, count)


def test_a_flipped_body_byte_after_a_clean_stop_is_refused_in_one_line_and_nothing_is_cut(tmp_path, small_config):
    results = _written(tmp_path, small_config)
    victim = results[-20]  # in the newest segment: the clean restart's scan passes it
    _flip(tmp_path, victim.wrote_offset, at=victim.wrote_bytes - 40)
    before = _files(tmp_path)
    with pytest.raises(DamagedLogError) as caught:
        MessageStore.open(str(tmp_path), small_config)
    message = str(caught.value)
    assert "\n" not in message
    assert segment_name(victim.wrote_offset - victim.wrote_offset % SEGMENT_SIZE) in message
    assert f"[{victim.wrote_offset}, {victim.next_offset})" in message and "body CRC mismatch" in message
    assert f"hasvc store repair {tmp_path} --from HOST:PORT" in message
    assert f"hasvc store repair {tmp_path} --accept-loss" in message
    [damage] = caught.value.damaged
    assert (damage.from_offset, damage.to_offset) == (victim.wrote_offset, victim.next_offset)
    assert _files(tmp_path) == before


def test_damage_below_the_checkpoints_flushed_offset_after_a_crash_is_refused(tmp_path, small_config):
    store = MessageStore.open(str(tmp_path), small_config)
    results = fill(store, 120)
    store.flush_commitlog(0)
    store.write_checkpoint()
    store.close(clean=False)
    victim = results[-10]
    _flip(tmp_path, victim.wrote_offset, at=victim.wrote_bytes - 40)
    with pytest.raises(DamagedLogError, match="below the checkpoint's flushed offset"):
        MessageStore.open(str(tmp_path), small_config)


def test_a_torn_record_past_the_flushed_offset_is_cut_as_before(tmp_path, small_config):
    store = MessageStore.open(str(tmp_path), small_config)
    results = fill(store, 100)
    store.flush_commitlog(0)
    store.write_checkpoint()
    flushed = store.checkpoint.master_flushed_offset
    later = fill(store, 5)  # never flushed nor checkpointed: may be torn
    store.close(clean=False)
    assert later[0].wrote_offset >= flushed == results[-1].next_offset
    _flip(tmp_path, later[2].wrote_offset, at=later[2].wrote_bytes - 40)
    with MessageStore.open(str(tmp_path), small_config) as reopened:
        assert reopened.recovery.corrupt_offset == later[2].wrote_offset
        assert reopened.commit_log.max_offset == later[2].wrote_offset


def test_a_damaged_size_word_is_a_range_up_to_the_next_valid_record(tmp_path, small_config):
    results = _written(tmp_path, small_config)
    victim = results[-20]
    _flip(tmp_path, victim.wrote_offset, at=1)  # the size word: the walk cannot step over it
    with pytest.raises(DamagedLogError) as caught:
        MessageStore.open(str(tmp_path), small_config)
    [damage] = caught.value.damaged
    assert (damage.from_offset, damage.to_offset) == (victim.wrote_offset, victim.next_offset)


def test_two_damaged_records_are_two_ranges(tmp_path, small_config):
    results = _written(tmp_path, small_config)
    first, second = results[-30], results[-5]
    _flip(tmp_path, first.wrote_offset, at=first.wrote_bytes - 40)
    _flip(tmp_path, second.wrote_offset, at=8)  # the body CRC field
    with pytest.raises(DamagedLogError, match="and 1 more damaged ranges") as caught:
        MessageStore.open(str(tmp_path), small_config)
    assert [(d.from_offset, d.to_offset) for d in caught.value.damaged] == [
        (first.wrote_offset, first.next_offset), (second.wrote_offset, second.next_offset),
    ]  # fmt: skip


def _record(body: bytes, physical_offset: int) -> bytes:
    prepared = rec.prepare_message(rec.Message("T", body))
    buffer = bytearray(prepared.size)
    rec.write_record(buffer, 0, prepared, queue_offset=0, physical_offset=physical_offset, store_timestamp=1,
                     store_ip=bytes([127, 0, 0, 1]), store_port=10911)  # fmt: skip
    return bytes(buffer)


def test_find_next_record_resynchronises_on_magic_and_physical_offset():
    data = bytearray()
    for i in range(3):
        data += _record(bytes([i]) * 50, len(data))
    size = len(data) // 3
    data += bytes(1000)
    garbled = bytearray(data)
    struct.pack_into(">i", garbled, size, 7)  # record 1's size word: nonsense
    assert find_next_record(garbled, start=size, end=len(garbled), file_from_offset=0) == 2 * size
    struct.pack_into(">i", garbled, size, 3 * size)  # a size word that lands on nothing valid
    assert find_next_record(garbled, start=size, end=len(garbled), file_from_offset=0) == 2 * size
    struct.pack_into(">i", garbled, size, 7)
    garbled[2 * size + 4] ^= 1  # record 2's magic too: no valid record follows, the range runs to the end
    assert find_next_record(garbled, start=size, end=len(garbled), file_from_offset=0) == len(garbled)


def test_repair_from_a_copy_rewrites_the_range_and_the_store_opens_clean(tmp_path, small_config):
    master, slave = tmp_path / "m", tmp_path / "s"
    results = _written(master, small_config, count=300)
    shutil.copytree(master, slave)
    first, second = results[-150], results[-3]
    _flip(master, first.wrote_offset, at=first.wrote_bytes - 40)
    _flip(master, second.wrote_offset, at=1)
    peer = MessageStore.open(str(slave), small_config)
    asked = []

    def fetch(offset, size_max):
        asked.append((offset, size_max))
        return bytes(peer.read(offset, size_max))

    try:
        report = repair.repair_from(str(master), fetch)
    finally:
        peer.close()
    assert [(d.from_offset, d.to_offset) for d in report.repaired] == [
        (first.wrote_offset, first.next_offset), (second.wrote_offset, second.next_offset),
    ]  # fmt: skip
    assert report.records_written == 2
    assert _files(master) == _files(slave)
    with MessageStore.open(str(master), small_config) as store:
        assert store.commit_log.max_offset == results[-1].next_offset


def test_repair_refuses_bytes_that_do_not_fill_the_range_and_writes_nothing(tmp_path, small_config):
    results = _written(tmp_path, small_config)
    victim = results[-20]
    _flip(tmp_path, victim.wrote_offset, at=victim.wrote_bytes - 40)
    before = _files(tmp_path)
    other = _record(b"y" * 10, victim.wrote_offset)  # valid, too short
    with pytest.raises(repair.RepairError, match="not whole valid records filling the range"):
        repair.repair_from(str(tmp_path), lambda offset, size_max: (other + bytes(size_max))[:size_max])
    damaged_copy = bytearray(before[segment_name(victim.wrote_offset - victim.wrote_offset % SEGMENT_SIZE)])
    position = victim.wrote_offset % SEGMENT_SIZE
    with pytest.raises(repair.RepairError, match="body CRC mismatch"):  # the peer's copy is damaged too
        repair.repair_from(str(tmp_path), lambda offset, size_max: bytes(damaged_copy[position : position + size_max]))
    assert _files(tmp_path) == before


def test_accept_loss_cuts_at_the_damage_and_says_what_went(tmp_path, small_config):
    results = _written(tmp_path, small_config, count=300)
    victim = results[-150]
    _flip(tmp_path, victim.wrote_offset, at=victim.wrote_bytes - 40)
    loss = repair.accept_loss(str(tmp_path))
    assert loss.cut_offset == victim.wrote_offset
    assert loss.dropped_records == 149
    assert loss.dropped_bytes == results[-1].next_offset - victim.wrote_offset - _blank_bytes(results, victim)
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert store.commit_log.max_offset == victim.wrote_offset
    assert StoreCheckpoint.open(str(tmp_path / "checkpoint")).master_flushed_offset <= victim.wrote_offset


def _blank_bytes(results, victim) -> int:
    """Bytes of segment ends after ``victim`` that hold no record (blank records count their
    8 nonzero bytes; the zeros after them are not data)."""
    ends = 0
    for before, after in zip(results, results[1:]):
        if before.wrote_offset >= victim.wrote_offset and after.wrote_offset != before.next_offset:
            ends += after.wrote_offset - before.next_offset - rec.BLANK_SIZE
    return ends


def test_truncate_lowers_the_checkpoints_flushed_offset_first(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        results = fill(store, 50)
        store.flush_commitlog(0)
        store.write_checkpoint()
        store.truncate(results[20].wrote_offset)
        assert StoreCheckpoint.open(str(tmp_path / "checkpoint")).master_flushed_offset == results[20].wrote_offset


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(data=st.binary(max_size=600), start=st.integers(0, 1000), size=st.integers(1, 600),
                  to_segment_end=st.booleans(), own=st.integers(0, 600))  # fmt: skip
def test_fetched_bytes_are_taken_only_as_whole_valid_records_or_refused(data, start, size, to_segment_end, own):
    """Whatever a peer sends, the check answers with a size inside the data and the range, or
    RepairError; never another exception."""
    damage = DamagedRange("segment", start, start + size, "body CRC mismatch")
    segment_end = start + size if to_segment_end else start + size + 100
    try:
        taken, count = repair.check_fetched(data, damage, segment_end=segment_end, own_end=start + min(own, size),
                                            crc_function=rec.CRC_FUNCTIONS["crc32c"])  # fmt: skip
    except repair.RepairError:
        return
    assert 0 <= taken <= min(len(data), size) and count >= 0
    assert taken == size or to_segment_end


def test_a_valid_run_of_records_fills_its_range_and_a_cut_one_does_not():
    data = _record(b"a" * 40, 1000) + _record(b"b" * 40, 1000 + len(_record(b"a" * 40, 0)))
    crc = rec.CRC_FUNCTIONS["crc32c"]
    whole = DamagedRange("segment", 1000, 1000 + len(data), "x")
    assert repair.check_fetched(data, whole, segment_end=10**6, own_end=1000, crc_function=crc) == (len(data), 2)
    with pytest.raises(repair.RepairError, match="not whole valid records"):
        repair.check_fetched(data, DamagedRange("segment", 1000, 1000 + len(data) - 1, "x"), segment_end=10**6,
                             own_end=1000, crc_function=crc)  # fmt: skip
    with pytest.raises(repair.RepairError, match="PHYSICALOFFSET"):  # the right bytes for another place
        repair.check_fetched(data, DamagedRange("segment", 2000, 2000 + len(data), "x"), segment_end=10**6,
                             own_end=2000, crc_function=crc)  # fmt: skip


def test_the_repair_command_wants_one_way_out_and_says_what_it_cut(tmp_path, small_config):
    from click.testing import CliRunner

    from hasvc.cli.store import store

    results = _written(tmp_path, small_config, count=300)
    victim = results[-150]
    _flip(tmp_path, victim.wrote_offset, at=victim.wrote_bytes - 40)
    runner = CliRunner()
    assert runner.invoke(store, ["repair", str(tmp_path)]).exit_code == 2
    assert runner.invoke(store, ["repair", str(tmp_path), "--accept-loss", "--from", "127.0.0.1:1"]).exit_code == 2
    done = runner.invoke(store, ["repair", str(tmp_path), "--accept-loss"])
    assert done.exit_code == 0, done.output
    line, marked = done.output.splitlines()
    assert f"cut the log at offset {victim.wrote_offset}" in line and "149 valid records after them" in line
    assert "starts as a slave from now on" in marked and os.path.exists(tmp_path / "loss-accepted")
    again = runner.invoke(store, ["repair", str(tmp_path), "--accept-loss"])
    assert again.exit_code == 0 and "no damage found" in again.output


def test_a_repairing_master_reads_from_where_the_slave_connected_when_it_listens_everywhere():
    from hasvc.broker.repairing import _reachable

    assert _reachable("0.0.0.0:5", "10.0.0.2:999") == "10.0.0.2:5"
    assert _reachable("127.0.0.1:5", "10.0.0.2:999") == "127.0.0.1:5"


# -- the checkpoint's two copies -----------------------------------------------------------------

def _checkpoint_file(tmp_path):
    from commitlog.checkpoint import StoreCheckpoint

    checkpoint = StoreCheckpoint(str(tmp_path / "checkpoint"), 1, 2, 3, 4000, 5)
    checkpoint.flush()
    return checkpoint.path


@pytest.mark.parametrize("position", [0, 7, 24, 39, 40, 43, 2048, 2048 + 24, 2048 + 43])
def test_a_flipped_bit_in_one_copy_of_the_checkpoint_is_survived(tmp_path, position):
    from commitlog.checkpoint import StoreCheckpoint

    path = _checkpoint_file(tmp_path)
    with open(path, "r+b") as file:
        file.seek(position)
        byte = file.read(1)[0]
        file.seek(position)
        file.write(bytes([byte ^ 0x01]))
    checkpoint = StoreCheckpoint.open(path)
    assert checkpoint.trusted
    assert (checkpoint.physic_msg_timestamp, checkpoint.master_flushed_offset, checkpoint.confirm_phy_offset) == (1, 4000, 5)
    assert "fails its CRC" in checkpoint.damage


def test_a_checkpoint_damaged_in_both_copies_vouches_for_nothing(tmp_path):
    from commitlog.checkpoint import StoreCheckpoint

    path = _checkpoint_file(tmp_path)
    with open(path, "r+b") as file:
        for position in (24, 2048 + 24):
            file.seek(position)
            file.write(b"\x7f")
    checkpoint = StoreCheckpoint.open(path)
    assert not checkpoint.trusted
    assert checkpoint.recovery_flushed_offset == 1 << 62
    assert checkpoint.master_flushed_offset == 0
    assert "copy 1" in checkpoint.damage and "copy 2" in checkpoint.damage
    checkpoint.master_flushed_offset = 9
    checkpoint.flush()  # written anew, both copies
    assert StoreCheckpoint.open(path).trusted


def test_a_checkpoint_without_crc_reads_as_before(tmp_path):
    """RocketMQ's (and an older hasvc's): five int64 and nothing else in 4 KiB."""
    import struct

    from commitlog.checkpoint import StoreCheckpoint

    path = tmp_path / "checkpoint"
    path.write_bytes(struct.pack(">qqqqq", 1, 2, 3, 4000, 5) + bytes(4096 - 40))
    checkpoint = StoreCheckpoint.open(str(path))
    assert checkpoint.trusted and checkpoint.master_flushed_offset == 4000 and not checkpoint.damage


def test_a_log_that_ends_below_its_flushed_offset_is_damage_not_a_tail(tmp_path):
    """Lost writes: bytes the checkpoint says were flushed read as zeros. The store refuses (one
    line naming the range) instead of taking the shorter log as its end."""
    store = MessageStore.open(str(tmp_path), StoreConfig(commitlog_segment_size=64 * 1024))
    for number in range(40):
        if number == 38:
            lost_from = store.commit_log.max_offset
        store.append([rec.Message(topic="T", body=b"%04d" % number * 50, queue_id=0)])
    end = store.commit_log.max_offset
    store.close()
    segment = tmp_path / "commitlog" / f"{0:020d}"
    with open(segment, "r+b") as file:
        file.seek(lost_from)
        file.write(bytes(end - lost_from))  # the last two records, flushed, never reached the disk
    with pytest.raises(StoreError) as caught:
        MessageStore.open(str(tmp_path), StoreConfig(commitlog_segment_size=64 * 1024))
    message = str(caught.value)
    assert "\n" not in message
    assert "lost writes" in message and f"[{lost_from}, {end})" in message


def test_a_missing_last_segment_below_the_flushed_offset_is_damage_and_repaired_from_a_copy(tmp_path):
    """Lost writes of a whole segment: the newest segment file is gone, though the checkpoint says
    its bytes were flushed. The store refuses; repair from a copy makes the segment anew."""
    size = 64 * 1024
    config = StoreConfig(commitlog_segment_size=size)
    store = MessageStore.open(str(tmp_path / "a"), config)
    number = 0
    while len(store.commit_log.mapped_file_queue.mapped_files) < 3:
        store.append([rec.Message(topic="T", body=b"%05d" % number * 40, queue_id=number % 2)])
        number += 1
    end = store.commit_log.max_offset
    store.close()
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    os.unlink(tmp_path / "a" / "commitlog" / segment_name(2 * size))
    with pytest.raises(StoreError) as caught:
        MessageStore.open(str(tmp_path / "a"), config)
    assert "segment that starts there is missing" in str(caught.value) and "\n" not in str(caught.value)

    peer = MessageStore.open(str(tmp_path / "copy"), config)
    try:
        report = repair.repair_from(str(tmp_path / "a"), lambda offset, size_max: bytes(peer.read(offset, size_max)))
    finally:
        peer.close()
    assert report.repaired and report.repaired[0].from_offset == 2 * size
    store = MessageStore.open(str(tmp_path / "a"), config)
    try:
        assert store.commit_log.max_offset == end
        assert [bytes(r.body) for r in store.pull("T", 0, 0, 10_000)][-1].startswith(b"%05d" % (number - 1 - (number - 1) % 2))
    finally:
        store.close()
