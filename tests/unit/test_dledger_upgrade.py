"""Smooth upgrade: a classic store continued by DLedger at dividedCommitlogOffset (DLedgerCommitLog;
RocketMQ's MixCommitlogTest): old offsets still read from the classic log, new ones from DLedger."""

import os
import struct

import pytest

from commitlog import record as rec
from commitlog.commit_log import ReadError
from commitlog.config import StoreConfig
from commitlog.dledger import DLedgerStoreConfig, Entry
from commitlog.dledger.upgrade import LogPart, dledger_directory, open_after_classic, seal_classic_commit_log
from commitlog.store import MessageStore

SEGMENT_SIZE = 64 * 1024
CLASSIC = StoreConfig(commitlog_segment_size=SEGMENT_SIZE, consume_queue_units_per_file=64,
                      disk_max_used_space_ratio=1.0, disk_clean_ratio=1.0)  # fmt: skip
DLEDGER = DLedgerStoreConfig(data_file_size=SEGMENT_SIZE, index_file_size=32 * 64)


def classic_store_with(path, count, size=1000):
    store = MessageStore.open(str(path), CLASSIC)
    offsets = []
    for i in range(count):
        result = store.append([rec.Message("T", bytes([i % 256]) * size)])
        assert result.status is rec.PutMessageStatus.PUT_OK
        offsets.extend(result.offsets)
    records = {offset: bytes(store.commit_log.read(offset, store.commit_log.get_record(offset).size)) for offset in offsets}
    store.close()
    return records


def test_the_classic_log_is_sealed_and_dledger_starts_at_the_next_boundary(tmp_path):
    records = classic_store_with(tmp_path, 100)  # ~109 KB: the second segment is partly written
    store = MessageStore.open(str(tmp_path), CLASSIC)
    end = store.commit_log.max_offset
    assert SEGMENT_SIZE < end < 2 * SEGMENT_SIZE
    log = open_after_classic(dledger_directory(str(tmp_path), "n0"), DLEDGER, commit_log=store.commit_log)
    assert log.divided_commitlog_offset == 2 * SEGMENT_SIZE
    last = store.commit_log.mapped_file_queue.last
    assert bytes(last.view()[end - SEGMENT_SIZE : end - SEGMENT_SIZE + 8]) == struct.pack(">iI", 2 * SEGMENT_SIZE - end, rec.BLANK_MAGIC)
    assert os.listdir(tmp_path / "dledger-n0" / "data") == [f"{2 * SEGMENT_SIZE:020d}"]

    log.dledger.append([Entry(i, 1, f"message {i}".encode()) for i in range(3)])
    assert log.dledger.pos_at(0) == 2 * SEGMENT_SIZE
    log.dledger.update_committed_index(1)
    for offset, data in records.items():
        assert log.part_of(offset) is LogPart.CLASSIC
        assert log.message_bytes(offset) == data
    physical = [log.dledger.pos_at(i) + 48 for i in range(3)]
    assert [log.part_of(offset) for offset in physical] == [LogPart.DLEDGER] * 3
    assert [log.message_bytes(offset) for offset in physical[:2]] == [b"message 0", b"message 1"]
    with pytest.raises(ReadError, match="not committed"):
        log.message_bytes(physical[2])
    with pytest.raises(ReadError, match="no DLedger message"):
        log.message_bytes(physical[0] + 1)
    assert log.max_offset == log.dledger.committed_pos
    log.close()
    store.close()

    store = MessageStore.open(str(tmp_path), CLASSIC)  # reopened: the divide comes from the DLedger files
    log = open_after_classic(dledger_directory(str(tmp_path), "n0"), DLEDGER, commit_log=store.commit_log)
    assert log.divided_commitlog_offset == 2 * SEGMENT_SIZE
    assert log.dledger.read(0, 10, size_max=1 << 20)[2].body == b"message 2"
    assert all(log.message_bytes(offset) == data for offset, data in records.items())
    log.close()
    store.close()


def test_a_crash_between_seal_and_the_first_dledger_file_gives_the_same_divide(tmp_path):
    classic_store_with(tmp_path, 10)
    store = MessageStore.open(str(tmp_path), CLASSIC)
    divided = seal_classic_commit_log(store.commit_log)
    assert divided == SEGMENT_SIZE
    store.close(clean=False)
    store = MessageStore.open(str(tmp_path), CLASSIC)
    log = open_after_classic(dledger_directory(str(tmp_path), "n0"), DLEDGER, commit_log=store.commit_log)
    assert log.divided_commitlog_offset == SEGMENT_SIZE
    log.close()
    store.close()


def test_a_full_last_segment_is_not_written_again(tmp_path):
    classic_store_with(tmp_path, 10)
    store = MessageStore.open(str(tmp_path), CLASSIC)
    first = seal_classic_commit_log(store.commit_log)
    before = bytes(store.commit_log.mapped_file_queue.last.view())
    assert seal_classic_commit_log(store.commit_log) == first
    assert bytes(store.commit_log.mapped_file_queue.last.view()) == before
    store.close()


def test_without_a_classic_log_dledger_starts_at_zero(tmp_path):
    store = MessageStore.open(str(tmp_path), CLASSIC)
    log = open_after_classic(dledger_directory(str(tmp_path), "n0"), DLEDGER, commit_log=store.commit_log)
    assert log.divided_commitlog_offset == -1
    log.dledger.append([Entry(0, 1, b"first")])
    assert log.dledger.pos_at(0) == 0
    assert log.part_of(0) is LogPart.DLEDGER
    log.close()
    store.close()


def test_data_files_of_another_size_are_refused(tmp_path):
    store = MessageStore.open(str(tmp_path), CLASSIC)
    with pytest.raises(ValueError, match="segment size"):
        open_after_classic(str(tmp_path / "d"), DLedgerStoreConfig(data_file_size=4096, index_file_size=32), commit_log=store.commit_log)
    store.close()
