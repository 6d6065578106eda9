"""DLedgerMmapFileStore: append/read/reopen, truncate, segment roll with blank padding, the
checkpoint and currterm files, crash recovery (torn tail cut, middle damage refused) and the
store scenarios of openmessaging/dledger's DLedgerMappedFileStoreTest (rocketmq-notes §9)."""

import dataclasses
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog.dledger import DLedgerMmapFileStore, DLedgerStoreConfig, Entry, HardState
from commitlog.dledger import entry_codec as codec
from commitlog.mapped_file import StoreError

MIN_BLANK_LEN = codec.MIN_BLANK_SIZE
INDEX_UNIT_SIZE = codec.INDEX_UNIT_SIZE
SMALL = DLedgerStoreConfig(data_file_size=4096, index_file_size=32 * 16)


def open_store(path, config=SMALL, **kwargs):
    return DLedgerMmapFileStore.open(str(path), config, **kwargs)


def entries(start, count, *, term=0, size=100):
    return [Entry(index, term, bytes([index % 251]) * size) for index in range(start, start + count)]


def data_files(path):
    return sorted(os.listdir(os.path.join(path, "data")))


def test_an_empty_store_follows_the_entrylog_conventions(tmp_path):
    store = open_store(tmp_path)
    assert (store.first_index(), store.last_index(), store.last_term(), store.flushed_index()) == (0, -1, -1, -1)
    assert store.read(0, 10, size_max=1 << 20) == []
    with pytest.raises(IndexError):
        store.term_at(0)
    assert store.load_hard_state() == HardState(0, None, -1)
    store.close()


def test_append_read_reopen_and_positions(tmp_path):
    store = open_store(tmp_path)
    appended = entries(0, 5, term=1) + entries(5, 5, term=2, size=7)
    store.append(appended[:3])
    store.append(appended[3:])
    assert store.read(0, 100, size_max=1 << 20) == appended
    assert (store.last_index(), store.last_term(), store.term_at(4), store.term_at(5)) == (9, 2, 1, 2)
    pos = 0
    for entry in appended:  # entries laid end to end from offset 0, each at its own pos
        stored = store.get(entry.index)
        assert (stored.pos, stored.size, stored.body) == (pos, 48 + len(entry.body), entry.body)
        assert store.pos_at(entry.index) == pos
        pos += stored.size
    assert store.flush() == 9
    store.close()
    store = open_store(tmp_path)
    assert store.read(0, 100, size_max=1 << 20) == appended
    assert (store.first_index(), store.last_index(), store.last_term(), store.flushed_index()) == (0, 9, 2, 9)
    store.close()


def test_read_stops_before_size_max_but_returns_at_least_one(tmp_path):
    store = open_store(tmp_path)
    store.append(entries(0, 10, size=100))
    assert [e.index for e in store.read(2, 10, size_max=250)] == [2, 3]
    assert [e.index for e in store.read(2, 10, size_max=1)] == [2]
    assert [e.index for e in store.read(8, 100, size_max=1 << 20)] == [8, 9]
    store.close()


@pytest.mark.parametrize(
    "bad",
    [
        [Entry(1, 0, b"gap")],
        [Entry(0, 0, b"a"), Entry(2, 0, b"gap")],
        [Entry(0, 2, b"a"), Entry(1, 1, b"term goes down")],
        [Entry(0, -1, b"negative term")],
        [Entry(0, 0, bytes(4096))],  # larger than a data file less 8
    ],
)
def test_bad_appends_are_refused_and_write_nothing(tmp_path, bad):
    store = open_store(tmp_path)
    with pytest.raises(ValueError):
        store.append(bad)
    assert store.last_index() == -1 and store.data_file_list.max_wrote_offset == 0
    store.close()


def test_segment_roll_writes_dledger_blank_padding(tmp_path):
    config = DLedgerStoreConfig(data_file_size=1024, index_file_size=32 * 4)
    store = open_store(tmp_path, config)
    # 48 + 400 = 448 bytes each: two fit (896), the third needs 448 + 8 > 128 left
    store.append(entries(0, 3, size=400))
    assert [store.pos_at(i) for i in range(3)] == [0, 448, 1024]
    store.flush()
    first = (tmp_path / "data" / data_files(tmp_path)[0]).read_bytes()
    assert first[896:904] == struct.pack(">ii", -1, 1024 - 896)  # [int32 -1][int32 remaining]
    assert first[904:] == bytes(1024 - 904)
    assert data_files(tmp_path) == ["00000000000000000000", "00000000000000001024"]
    # index units: 4 per file, so entry 4 starts the second index file
    store.append(entries(3, 2, size=10))
    assert sorted(os.listdir(tmp_path / "index")) == ["00000000000000000000", "00000000000000000128"]
    store.close()
    store = open_store(tmp_path, config)
    assert [store.pos_at(i) for i in range(5)] == [0, 448, 1024, 1472, 1530]
    store.close()


def test_an_entry_that_leaves_exactly_eight_bytes_stays_and_the_next_rolls(tmp_path):
    config = DLedgerStoreConfig(data_file_size=1024, index_file_size=32 * 4)
    store = open_store(tmp_path, config)
    store.append([Entry(0, 0, bytes(1024 - 8 - 48)), Entry(1, 0, b"x")])  # first: 1016 bytes, 8 left
    assert (store.pos_at(0), store.pos_at(1)) == (0, 1024)
    view = store.data_file_list.mapped_files[0].view()
    assert bytes(view[1016:1024]) == struct.pack(">ii", -1, 8)
    store.close()


@given(batches=st.lists(st.lists(st.integers(0, 968), min_size=1, max_size=5), min_size=1, max_size=6))
def test_plan_positions_predicts_where_append_lands(tmp_path_factory, batches):
    config = DLedgerStoreConfig(data_file_size=1024, index_file_size=32 * 4)
    store = open_store(tmp_path_factory.mktemp("plan"), config)
    for sizes in batches:
        predicted = store.plan_positions([48 + size for size in sizes])
        assert store.next_pos(48 + sizes[0]) == predicted[0]
        first = store.last_index() + 1
        store.append([Entry(first + i, 0, bytes(size)) for i, size in enumerate(sizes)])
        assert [store.pos_at(first + i) for i in range(len(sizes))] == predicted
    store.close()


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from([0, 0, 0, -1, 1]), st.integers(-1, 1), st.sampled_from([0, 10, 968, 969])),
                      min_size=1, max_size=6))  # fmt: skip
def test_append_refuses_exactly_entries_out_of_order_or_too_large(tmp_path_factory, steps):
    """append's checks: indexes consecutive after the last, terms never lower, each entry fitting
    a data file with a blank record after it; the refusal names the first entry that fails them,
    and a refused append writes nothing."""
    config = DLedgerStoreConfig(data_file_size=1024, index_file_size=32 * 4)
    store = open_store(tmp_path_factory.mktemp("check"), config)
    store.append([Entry(0, 2, b"x")])
    entries, index, term = [], 0, 2
    for index_step, term_step, size in steps:
        index, term = index + 1 + index_step, term + term_step
        entries.append(Entry(index, term, bytes(size)))
    ok, index, term = True, 0, 2
    for entry in entries:
        if entry.index != index + 1 or entry.term < term or 48 + len(entry.body) > 1024 - 8:
            ok = False
            break
        index, term = entry.index, entry.term
    if ok:
        store.append(entries)
        assert store.last_index() == entries[-1].index
    else:
        with pytest.raises(ValueError, match=f"entry (index )?{entry.index} "):
            store.append(entries)
        assert store.last_index() == 0 and store.next_pos(48) == 49
    store.close()


def test_two_stores_fed_the_same_entries_hold_identical_bytes(tmp_path):
    """Followers land entries at the leader's pos without being told (appendAsFollower checks it)."""
    leader, follower = open_store(tmp_path / "n0"), open_store(tmp_path / "n1")
    batch = [Entry(i, i // 7, bytes([i]) * (i * 37 % 700)) for i in range(40)]
    leader.append(batch)
    for entry in batch:
        follower.append([entry])
    leader.close()
    follower.close()
    assert data_files(tmp_path / "n0") == data_files(tmp_path / "n1")
    for name in data_files(tmp_path / "n0"):
        assert (tmp_path / "n0" / "data" / name).read_bytes() == (tmp_path / "n1" / "data" / name).read_bytes()


def test_truncate_then_append_and_reopen(tmp_path):
    store = open_store(tmp_path)
    store.append(entries(0, 30, term=1))  # 148 bytes each: 27 per 4096-byte file, so two files
    store.flush()
    assert len(data_files(tmp_path)) == 2
    store.truncate(after_index=20)
    assert (store.last_index(), store.last_term(), store.flushed_index()) == (20, 1, 20)
    # DLedgerManagedFileStoreTruncateTest: the flushed position is the new end right after a truncate
    assert store.data_file_list.flushed_where == store.data_file_list.max_wrote_offset
    assert data_files(tmp_path) == ["00000000000000000000"]  # the second file went
    assert store.data_file_list.max_wrote_offset == store.pos_at(20) + 148
    assert store.index_file_list.max_wrote_offset == 21 * INDEX_UNIT_SIZE
    replacement = entries(21, 10, term=2, size=50)
    store.append(replacement)
    assert store.read(21, 100, size_max=1 << 20) == replacement
    store.close()
    store = open_store(tmp_path)
    assert store.read(0, 100, size_max=1 << 20) == entries(0, 21, term=1) + replacement
    store.truncate(after_index=-1)
    assert (store.first_index(), store.last_index(), store.last_term()) == (0, -1, -1)
    store.append(entries(0, 2, term=3))
    assert store.pos_at(0) == 0
    store.close()
    store = open_store(tmp_path)
    assert store.read(0, 100, size_max=1 << 20) == entries(0, 2, term=3)
    store.close()


def test_truncate_refuses_to_drop_committed_entries(tmp_path):
    store = open_store(tmp_path)
    store.append(entries(0, 10))
    store.update_committed_index(6)
    with pytest.raises(ValueError, match="committed"):
        store.truncate(after_index=5)
    store.truncate(after_index=6)
    assert store.last_index() == 6
    store.close()


def test_truncate_below_a_checkpointed_flush_rewrites_the_checkpoint_first(tmp_path):
    store = open_store(tmp_path)
    store.append(entries(0, 10))
    store.flush()
    store.persist_checkpoint()
    store.truncate(after_index=3)
    store.abandon()  # crash: no close, no checkpoint from close
    store = open_store(tmp_path)  # not refused: the checkpoint no longer claims 9 was flushed
    assert store.last_index() == 3
    store.close()


# -- checkpoint and currterm -------------------------------------------------------------------


def test_hard_state_is_durable_and_in_dledger_currterm_format(tmp_path):
    store = open_store(tmp_path)
    store.append(entries(0, 5))
    store.save_hard_state(HardState(3, "n1", 2))
    text = (tmp_path / "currterm").read_text()
    lines = set(text.splitlines())
    assert {"currTerm=3", "voteLeader=n1", "committedIndex=2"} <= lines  # DLedger's keys and values
    assert {line.split("=")[0] for line in lines - {"currTerm=3", "voteLeader=n1", "committedIndex=2"}} == {"crc32c"}
    assert (tmp_path / "currterm.bak").read_text() == text
    store.save_hard_state(HardState(4, None, 2))
    assert "voteLeader=\n" in (tmp_path / "currterm").read_text()
    with pytest.raises(ValueError):
        store.save_hard_state(HardState(3, "n0", 2))  # the term never goes back
    with pytest.raises(ValueError):
        store.save_hard_state(HardState(5, "n 0", 2))
    store.flush()
    store.abandon()
    store = open_store(tmp_path)
    assert store.load_hard_state() == HardState(4, None, 2)
    store.close()


def test_a_currterm_and_checkpoint_written_by_dledger_are_read(tmp_path):
    """DLedger writes properties in hash order, without our extra keys; a stale .tmp is ignored."""
    store = open_store(tmp_path)
    store.append(entries(0, 10))
    store.close()
    (tmp_path / "currterm").write_text("voteLeader=n2\ncurrTerm=7\n")
    (tmp_path / "checkpoint").write_text("# written by DLedger\ncommittedIndex=8\nendIndex=9\n")
    (tmp_path / "currterm.tmp").write_text("currTe")
    store = open_store(tmp_path)
    assert store.load_hard_state() == HardState(7, "n2", 8)
    assert store.committed_index == 8
    store.close()


@pytest.mark.parametrize("text", ["currTerm=x\n", "currTerm\n", "currTerm=-5\n", "\xff\xfe"])
def test_a_damaged_currterm_is_refused_naming_the_file(tmp_path, text):
    open_store(tmp_path).close()
    (tmp_path / "currterm").write_bytes(text.encode("latin-1"))
    with pytest.raises(StoreError, match="currterm"):
        open_store(tmp_path)


def test_checkpoint_holds_end_committed_and_flushed_index(tmp_path):
    store = open_store(tmp_path)
    store.append(entries(0, 10))
    store.flush()
    store.append(entries(10, 2))
    store.update_committed_index(7)
    store.persist_checkpoint()
    lines = set((tmp_path / "checkpoint").read_text().splitlines())
    assert {line for line in lines if not line.startswith("crc32c=")} == {"endIndex=11", "committedIndex=7", "flushedIndex=9"}
    store.close()


# -- upstream DLedgerMappedFileStoreTest scenarios --------------------------------------------


def test_upstream_committed_index_survives_restart(tmp_path):
    """testCommittedIndex: 100 entries, committed 90, restart: begin 0, end 99, committed 90."""
    config = DLedgerStoreConfig(data_file_size=10 * 1024 * 1024, index_file_size=INDEX_UNIT_SIZE * 1024 * 1024)
    store = open_store(tmp_path, config)
    store.append([Entry(i, 0, bytes(128)) for i in range(100)])
    store.update_committed_index(90)
    assert (store.last_index(), store.committed_index) == (99, 90)
    store.close()
    store = open_store(tmp_path, config)
    assert (store.first_index(), store.last_index(), store.committed_index) == (0, 99, 90)
    store.close()


def test_upstream_committed_pos_follows_the_committed_index(tmp_path):
    """testAppendAsLeader: committedPos = pos + size of the committed entry; -1, smaller and
    past-the-end updates are ignored or capped."""
    store = open_store(tmp_path)
    store.append([Entry(i, 0, f"Hello Leader{i}".encode()) for i in range(10)])
    for i in range(10):
        assert store.update_committed_index(i) == i
        stored = store.get(i)
        assert store.committed_pos == stored.pos + stored.size
    assert store.committed_pos == store.data_file_list.max_wrote_offset
    assert store.update_committed_index(-1) == 9
    assert store.update_committed_index(0) == 9
    store.truncate(after_index=9)
    assert store.update_committed_index(10) == 9
    store.close()


def test_upstream_abnormal_recovery_after_deleting_data_files(tmp_path):
    """testAbnormalRecovery: 100 entries of 1 KiB in 12 data files of 10 KiB + 8; deleting the
    last 2 leaves ledger end 89; deleting 10 more leaves an empty log. hasvc refuses both until
    told to accept the loss, because the checkpoint says those entries were flushed."""
    config = DLedgerStoreConfig(data_file_size=10 * 1024 + MIN_BLANK_LEN, index_file_size=10 * INDEX_UNIT_SIZE)
    store = open_store(tmp_path, config)
    store.append([Entry(i, 0, bytes(1024)) for i in range(100)])
    assert (len(store.data_file_list.mapped_files), store.last_index(), store.first_index()) == (12, 99, 0)
    store.close()
    for name in data_files(tmp_path)[-2:]:
        os.unlink(tmp_path / "data" / name)
    with pytest.raises(StoreError, match=r"00000000000000092232.*entries up to 99 were flushed; 10 of them are gone"):
        open_store(tmp_path, config)
    accepting = dataclasses.replace(config, recovery_accept_lost_entries=True)
    store = open_store(tmp_path, accepting)
    assert (len(store.data_file_list.mapped_files), store.first_index(), store.last_index()) == (10, 0, 89)
    assert store.recovery.lost_entries == 10
    for i in range(90):
        assert store.get(i).index == i
    store.close()
    store = open_store(tmp_path, config)  # the accepted loss is not refused again
    assert store.last_index() == 89
    store.close()
    for name in data_files(tmp_path):
        os.unlink(tmp_path / "data" / name)
    store = open_store(tmp_path, accepting)
    assert (len(store.data_file_list.mapped_files), store.first_index(), store.last_index()) == (0, 0, -1)
    assert store.index_file_list.mapped_files == []
    store.close()


def test_upstream_truncate_mid_just_after_and_at_the_end(tmp_path):
    """testTruncate: 10 entries of 1 KiB in data files of 8 KiB + 8 (two files); truncating after
    5, 6 and 9 leaves the data and index files ending right after that entry."""
    config = DLedgerStoreConfig(data_file_size=8 * 1024 + MIN_BLANK_LEN, index_file_size=8 * INDEX_UNIT_SIZE)
    store = open_store(tmp_path / "a", config)
    other = open_store(tmp_path / "b", config)
    batch = [Entry(i, 0, bytes(1024)) for i in range(10)]
    store.append(batch)
    other.append(batch)
    assert len(store.data_file_list.mapped_files) == 2
    store.truncate(after_index=9)  # at the end: nothing to do
    for after in (6, 5):
        store.truncate(after_index=after)
        mid = other.get(after)
        assert (store.first_index(), store.last_index()) == (0, after)
        assert store.data_file_list.max_wrote_offset == mid.pos + mid.size
        assert store.index_file_list.max_wrote_offset == (after + 1) * INDEX_UNIT_SIZE
    store.append(batch[6:])  # back to the end, at the same positions as the other store
    assert [store.pos_at(i) for i in range(10)] == [other.pos_at(i) for i in range(10)]
    store.close()
    other.close()


def test_upstream_normal_recovery(tmp_path):
    store = open_store(tmp_path)
    store.append([Entry(i, 0, f"Hello Leader With Recovery{i}".encode()) for i in range(10)])
    store.close()
    store = open_store(tmp_path)
    assert (store.first_index(), store.last_index()) == (0, 9)
    assert [e.body for e in store.read(0, 10, size_max=1 << 20)] == [f"Hello Leader With Recovery{i}".encode() for i in range(10)]
    assert store.recovery.corrupt_offset is None and store.recovery.index_rebuilt_from is None
    store.close()


# -- crashes: torn tails cut, damage in the middle refused -------------------------------------


def crash_with_unflushed(path, flushed, unflushed, config=SMALL):
    """Append and flush ``flushed`` entries, append ``unflushed`` more, crash (no flush)."""
    store = open_store(path, config)
    store.append(entries(0, flushed))
    store.flush()
    store.persist_checkpoint()
    store.append(entries(flushed, unflushed))
    spans = {i: store.entry_span(i) for i in range(flushed + unflushed)}
    store.abandon()
    return spans


def damage(path, offset, data, config=SMALL, directory="data"):
    size = config.data_file_size if directory == "data" else config.index_file_size
    name = f"{offset - offset % size:020d}"
    with open(os.path.join(path, directory, name), "r+b") as file:
        file.seek(offset % size)
        file.write(data)


def test_a_torn_tail_is_cut_and_zeroed(tmp_path):
    spans = crash_with_unflushed(tmp_path, 10, 5)
    pos, size = spans[12]
    damage(tmp_path, pos + 60, bytes(size - 60))  # entry 12's body half lost: bodyCrc catches it
    store = open_store(tmp_path)
    assert store.last_index() == 11
    assert store.recovery.corrupt_offset == pos
    assert "bodyCrc" in store.recovery.reason
    view = store.data_file_list.mapped_files[0].view()
    assert not any(view[pos:])  # entries 13, 14 and the torn 12 are zeroed on disk
    store.append(entries(12, 1, term=1))
    assert store.get(12).pos == pos
    store.close()


def test_a_torn_header_is_cut(tmp_path):
    spans = crash_with_unflushed(tmp_path, 10, 5)
    pos, _ = spans[13]
    damage(tmp_path, pos + 4, b"\x00\x00\x00\x07")  # size field torn
    store = open_store(tmp_path)
    assert store.last_index() == 12 and store.recovery.corrupt_offset == pos
    store.close()


def test_a_lost_unflushed_next_file_and_blank_are_cut(tmp_path):
    spans = crash_with_unflushed(tmp_path, 25, 5)  # 27 per file: 27.. go to the second file
    pos, _ = spans[25]
    damage(tmp_path, pos, bytes(4096 - pos))  # entries 25, 26 and the blank never reached the disk
    store = open_store(tmp_path)  # the second file still holds 27..29: one later file, cut
    assert store.last_index() == 24
    assert data_files(tmp_path) == ["00000000000000000000"]
    store.close()


def test_damage_below_the_checkpointed_flush_is_refused_naming_file_and_offset(tmp_path):
    spans = crash_with_unflushed(tmp_path, 20, 0)
    pos, _ = spans[8]
    damage(tmp_path, pos + 100, b"garbage")
    with pytest.raises(StoreError, match=rf"offset {pos} \(.*/data/00000000000000000000: bodyCrc mismatch"):
        open_store(tmp_path)
    with pytest.raises(StoreError, match="12 of them are gone"):
        open_store(tmp_path)  # nothing was changed by the refusal: refused again
    assert store_bytes_at(tmp_path, pos + 100, 7) == b"garbage"


def store_bytes_at(path, offset, size, config=SMALL):
    name = f"{offset - offset % config.data_file_size:020d}"
    with open(os.path.join(path, "data", name), "rb") as file:
        file.seek(offset % config.data_file_size)
        return file.read(size)


def test_damage_in_an_early_file_is_refused_even_without_a_checkpoint(tmp_path):
    """DLedger's rule: a cut that would delete more than one later data file holding data."""
    store = open_store(tmp_path)
    store.append(entries(0, 100))  # 4 files
    store.flush()
    spans = {i: store.entry_span(i) for i in range(100)}
    store.abandon()
    pos, _ = spans[30]  # in the second file
    damage(tmp_path, pos + 2, b"\x7f")
    with pytest.raises(StoreError, match=r"would delete 2 later data files holding data"):
        open_store(tmp_path)
    assert len(data_files(tmp_path)) == 4  # nothing changed
    store = open_store(tmp_path, dataclasses.replace(SMALL, recovery_cut_segments_max=2))
    assert store.last_index() == 29
    store.close()


def test_damaged_index_units_are_rebuilt_from_the_data(tmp_path):
    store = open_store(tmp_path)
    store.append(entries(0, 40))
    store.close()
    damage(tmp_path, 17 * INDEX_UNIT_SIZE + 4, b"\xff" * 8, directory="index")
    store = open_store(tmp_path)
    assert store.recovery.index_rebuilt_from == 17
    assert store.read(0, 100, size_max=1 << 20) == entries(0, 40)
    store.close()
    for name in os.listdir(tmp_path / "index"):
        os.unlink(tmp_path / "index" / name)
    store = open_store(tmp_path)
    assert store.recovery.index_rebuilt_from == 0
    assert store.read(0, 100, size_max=1 << 20) == entries(0, 40)
    store.close()


def test_a_data_file_of_the_wrong_size_is_refused(tmp_path):
    store = open_store(tmp_path)
    store.append(entries(0, 3))
    store.close()
    with open(tmp_path / "data" / data_files(tmp_path)[0], "ab") as file:
        file.write(b"x")
    with pytest.raises(StoreError, match="4097 bytes"):
        open_store(tmp_path)


def test_the_first_data_file_can_start_at_a_segment_boundary(tmp_path):
    """Smooth upgrade: DLedger data starts at dividedCommitlogOffset, a data-file boundary."""
    store = open_store(tmp_path, data_start_offset=3 * 4096)
    store.append(entries(0, 3))
    assert store.pos_at(0) == 3 * 4096
    store.close()
    store = open_store(tmp_path)
    assert (store.first_index(), store.last_index(), store.pos_at(2)) == (0, 2, 3 * 4096 + 2 * 148)
    store.close()
    with pytest.raises(ValueError):
        open_store(tmp_path / "x", data_start_offset=100)


def test_the_dledger_package_imports_neither_trio_nor_hasvc():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import commitlog.dledger, commitlog.dledger.upgrade\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('trio', 'hasvc')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_empty_bodies_are_entries_of_48_bytes(tmp_path):
    """A leader's no-op entry has an empty body (DLedger's recovery accepts size 48 > HEADER_SIZE 44)."""
    store = open_store(tmp_path)
    store.append([Entry(0, 1, b""), Entry(1, 1, b"x"), Entry(2, 2, b"")])
    assert [store.entry_span(i) for i in range(3)] == [(0, 48), (48, 49), (97, 48)]
    store.close()
    store = open_store(tmp_path)
    assert store.read(0, 3, size_max=0) == [Entry(0, 1, b"")]
    assert store.read(0, 3, size_max=1 << 20) == [Entry(0, 1, b""), Entry(1, 1, b"x"), Entry(2, 2, b"")]
    store.close()


def test_a_log_whose_first_data_files_were_deleted_starts_at_their_successor(tmp_path):
    """reviseLedgerBeginIndex: the first index is the first remaining data file's first entry."""
    store = open_store(tmp_path)
    store.append(entries(0, 100))  # 27 entries per data file
    store.close()
    for name in data_files(tmp_path)[:2]:
        os.unlink(tmp_path / "data" / name)
    store = open_store(tmp_path)
    assert (store.first_index(), store.last_index(), store.term_at(54)) == (54, 99, 0)
    assert store.read(54, 56, size_max=1 << 20) == entries(54, 2)
    with pytest.raises(IndexError):
        store.term_at(53)
    store.truncate(after_index=60)
    store.append(entries(61, 1, term=1))
    store.close()
    store = open_store(tmp_path)
    assert (store.first_index(), store.last_index(), store.last_term()) == (54, 61, 1)
    store.close()


def test_read_and_load_hard_state_build_the_raft_cores_types(tmp_path):
    """Entry and HardState are defined once (commitlog.dledger.entry_types); the Raft core's
    (hasvc.state.raft.storage) are the same classes, so what the store builds compares equal to
    what the core makes, and is of its type."""
    from hasvc.state.raft import storage

    assert storage.Entry is Entry and storage.HardState is HardState
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    store.append(storage.new_entries(0, 1, [b"a"]))
    store.save_hard_state(storage.HardState(1, "n1", 0))
    [entry] = store.read(0, 1, size_max=10)
    assert type(entry) is storage.Entry and entry == storage.Entry(0, 1, b"a")
    hard_state = store.load_hard_state()
    assert type(hard_state) is storage.HardState and hard_state == storage.HardState(1, "n1", 0)
    store.close()


class Crash(BaseException):
    pass


def test_a_crash_part_way_through_a_truncate_leaves_a_prefix_of_the_log(tmp_path, monkeypatch):
    """Later data files go newest first before the cut file is cut: a crash in between leaves a
    shorter log, never a cut file followed by files it should have dropped (which recovery would
    take for damage in the middle)."""
    from commitlog.mapped_file import MappedFile

    store = open_store(tmp_path)
    store.append(entries(0, 100))  # 4 data files
    store.flush()
    store.persist_checkpoint()
    original = MappedFile.destroy
    destroyed = []

    def destroy_then_crash(self):
        if destroyed:
            raise Crash(self.path)
        destroyed.append(self.path)
        original(self)

    monkeypatch.setattr(MappedFile, "destroy", destroy_then_crash)
    with pytest.raises(Crash):
        store.truncate(after_index=10)
    monkeypatch.undo()
    assert destroyed == [str(tmp_path / "data" / f"{3 * 4096:020d}")]
    store.abandon()
    store = open_store(tmp_path)
    assert store.last_index() == 80  # the first three files' entries, whole
    assert store.read(0, 100, size_max=1 << 20) == entries(0, 81)
    store.close()


def test_a_tail_torn_at_any_byte_loses_exactly_the_torn_entry(tmp_path):
    """The last entry written, not flushed, cut at every byte of its header and every 16th of its
    body (bodyCrc covers the rest): recovery ends right before it."""
    import shutil

    body = bytes(range(1, 201))  # no zero byte: a zeroed byte always changes the entry
    size = 48 + len(body)
    base = tmp_path / "base"
    store = open_store(base)
    store.append([Entry(i, 1, body) for i in range(5)])
    store.flush()
    store.persist_checkpoint()
    store.append([Entry(5, 2, body)])
    pos = store.pos_at(5)
    store.abandon()
    for keep in [*range(48), *range(48, size, 16), size - 1]:
        path = tmp_path / f"torn{keep}"
        shutil.copytree(base, path)
        damage(path, pos + keep, bytes(size - keep))
        store = open_store(path)
        assert (store.last_index(), store.last_term()) == (4, 1), keep
        store.close()


def test_a_log_with_dledger_s_zero_body_crcs_reads(tmp_path):
    """DLedger leaves bodyCrc 0; such entries are read (and recovered) without a check."""
    store = open_store(tmp_path)
    store.append(entries(0, 10))
    spans = [store.entry_span(i) for i in range(10)]
    store.close()
    for pos, _ in spans:
        damage(tmp_path, pos + 40, bytes(4))
    store = open_store(tmp_path)
    assert store.read(0, 10, size_max=1 << 20) == entries(0, 10)
    assert store.recovery.index_rebuilt_from is None
    store.close()


def test_warm_ahead_creates_the_next_files_and_recovery_ignores_them(tmp_path):
    store = open_store(tmp_path)
    store.append(entries(0, 20))  # more than half of the first data file
    store.warm_ahead(4096)
    assert data_files(tmp_path) == ["00000000000000000000", "00000000000000004096"]  # the spare, zeros
    store.abandon()
    store = open_store(tmp_path)  # the spare (all zeros) is not data
    assert store.last_index() == 19
    store.warm_ahead(4096)
    store.append(entries(20, 20))  # rolls into the warmed file
    assert store.pos_at(27) == 4096
    store.close()
    store = open_store(tmp_path)
    assert store.read(0, 100, size_max=1 << 20) == entries(0, 40)
    store.close()


@pytest.mark.parametrize("where", ["body", "header", "index unit"])
def test_damage_after_recovery_is_a_store_error_on_read(tmp_path, where):
    """Reads check every entry against its index unit and its bodyCrc (pair assertions)."""
    store = open_store(tmp_path)
    store.append(entries(0, 10))
    store.flush()
    pos, _ = store.entry_span(6)
    if where == "body":
        damage(tmp_path, pos + 70, b"\x00\x01")
    elif where == "header":
        damage(tmp_path, pos + 16, struct.pack(">q", 5))  # the term
    else:
        damage(tmp_path, 6 * INDEX_UNIT_SIZE + 4, struct.pack(">q", pos + 1), directory="index")
    assert store.read(0, 6, size_max=1 << 20) == entries(0, 6)
    with pytest.raises(StoreError, match="entry 6|entry at offset"):
        store.read(0, 10, size_max=1 << 20)
    with pytest.raises(StoreError):
        store.get(6)
    store.abandon()


def test_an_empty_follower_can_start_where_the_leader_s_log_starts(tmp_path):
    """A leader upgraded from a classic log starts at the divide; an empty follower learns it
    from the first entry's pos, so that both hold the same bytes at the same offsets."""
    store = open_store(tmp_path)
    store.append(entries(0, 2))
    with pytest.raises(ValueError, match="fixed"):
        store.start_at(2 * 4096)
    store.truncate(after_index=-1)
    with pytest.raises(ValueError, match="multiple"):
        store.start_at(100)
    store.start_at(2 * 4096)
    assert data_files(tmp_path) == [] and store.next_pos(148) == 2 * 4096
    store.append(entries(0, 3))
    assert store.pos_at(0) == 2 * 4096
    store.close()
    store = open_store(tmp_path)
    assert (store.first_index(), store.last_index(), store.pos_at(2)) == (0, 2, 2 * 4096 + 2 * 148)
    store.close()


def test_a_flush_marks_flushed_what_was_appended_when_it_began(tmp_path):
    """Group commit: flush_target, then sync_files (a driver's worker thread) while appends go
    on, then flushed_to(target): the entries appended during the sync wait for the next flush."""
    store = open_store(tmp_path)
    store.append(entries(0, 3, term=1))
    target = store.flush_target()
    store.append(entries(3, 40, term=1))  # rolls into the next data files meanwhile
    store.sync_files()
    assert store.flushed_to(target) == 2 and store.flushed_index() == 2
    assert store.flush() == store.last_index() == 42
    store.close()


@pytest.mark.parametrize("halves_at_once", [False, True], ids=["sync_files", "data_and_index_halves_at_once"])
def test_sync_files_in_a_thread_while_the_owner_appends(tmp_path, halves_at_once):
    """A worker thread syncs while the owner appends; or (the driver's way) the data and the index
    halves in two threads at once. Either way the flushed entries survive a reopen."""
    import threading

    store = open_store(tmp_path)
    done = threading.Event()
    errors = []

    def sync_now():
        if not halves_at_once:
            store.sync_files()
            return
        index_half = threading.Thread(target=store.sync_index_files)
        index_half.start()
        store.sync_data_files()
        index_half.join()

    def syncer():
        try:
            while not done.is_set():
                target = store.flush_target()
                sync_now()
                assert store.data_file_list.flushed_where <= store.data_file_list.max_wrote_offset, target
                assert store.index_file_list.flushed_where <= store.index_file_list.max_wrote_offset, target
        except BaseException as error:  # reported to the test below
            errors.append(error)

    thread = threading.Thread(target=syncer)
    thread.start()
    try:
        for start in range(0, 400, 4):
            store.append(entries(start, 4, term=1, size=50))
    finally:
        done.set()
        thread.join()
    assert errors == []
    target = store.flush_target()
    sync_now()
    assert store.flushed_to(target) == 399
    store.close()
    reopened = open_store(tmp_path)
    assert reopened.last_index() == 399
    assert reopened.read(399, 400, size_max=1 << 20) == entries(399, 1, term=1, size=50)
    reopened.close()


def test_flushed_entries_far_behind_are_dropped_from_the_page_cache_with_page_cache_keep_size(tmp_path):
    """``page_cache_keep_size`` (the commit log's setting, given to a DLedger member's entry
    files): after a sync of the data files, their pages more than that far behind the flushed
    end leave the page cache; the entries read back the same (from the disk). 0 drops nothing."""
    from commitlog.mapped_file_queue import DROP_CACHED_STEP_MIN
    from commitlog.pagecache import resident_pages

    size = 2 * DROP_CACHED_STEP_MIN
    keep = 256 * 1024
    for keep_size in (0, keep):
        config = DLedgerStoreConfig(data_file_size=size, page_cache_keep_size=keep_size)
        store = open_store(tmp_path / str(keep_size), config)
        written = entries(0, (size - 64 * 1024) // (codec.BODY_OFFSET + 4000), size=4000)
        store.append(written)
        store.sync_data_files()
        path = os.path.join(str(tmp_path / str(keep_size)), "data", data_files(str(tmp_path / str(keep_size)))[0])
        pages = resident_pages(path)
        end_page = store.data_file_list.flushed_where // 4096
        if keep_size:
            below = (store.data_file_list.flushed_where - keep) // (2 << 20) * (2 << 20) // 4096  # DROP_CACHED_ALIGN
            assert not any(pages[:below]), "flushed pages beyond the kept bytes stayed cached"
            assert all(pages[below + 1 : end_page]), "pages within the kept bytes were dropped"
        else:
            assert all(pages[:end_page])
        assert [stored.body for stored in store.read(0, len(written), size_max=1 << 30)] == [e.body for e in written]
        store.close()
