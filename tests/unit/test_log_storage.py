"""The LogStorage contract (commitlog/storage.py), run against CommitLog and against MemoryLog,
its in-memory twin: what a slave of classic replication does with a log, through the protocol's
methods only, copying a real CommitLog master."""

import random

import pytest

from commitlog import record as rec
from commitlog.commit_log import CommitLog, ReadError, ReplicationOffsetError
from commitlog.memory_log import MemoryLog
from commitlog.storage import LogStorage
from tests.sizes import SEGMENT_SIZE


def open_commit_log(path):
    log = CommitLog(str(path), segment_size=SEGMENT_SIZE)
    log.load()
    return log


@pytest.fixture(params=["CommitLog", "MemoryLog"])
def logs(request, tmp_path):
    master = open_commit_log(tmp_path / "master")
    slave = open_commit_log(tmp_path / "slave") if request.param == "CommitLog" else MemoryLog(segment_size=SEGMENT_SIZE)
    yield master, slave
    master.close()
    if isinstance(slave, CommitLog):
        slave.close()


def check_invariants(log: LogStorage) -> None:
    assert log.min_offset <= log.max_offset <= log.max_wrote_offset
    assert log.flushed_offset <= log.max_wrote_offset


def test_both_logs_are_log_storage(logs):
    assert all(isinstance(log, LogStorage) for log in logs)


def test_an_empty_log_starts_at_a_segment_boundary_then_only_at_its_end(logs):
    _, slave = logs
    with pytest.raises(ReplicationOffsetError):
        slave.append_replicated(100, b"x")
    slave.append_replicated(2 * SEGMENT_SIZE, b"abc")
    assert (slave.min_offset, slave.max_wrote_offset) == (2 * SEGMENT_SIZE, 2 * SEGMENT_SIZE + 3)
    with pytest.raises(ReplicationOffsetError):
        slave.append_replicated(2 * SEGMENT_SIZE + 4, b"x")
    with pytest.raises(ReadError):
        slave.read(2 * SEGMENT_SIZE + 3, 10)
    check_invariants(slave)


def test_a_memory_log_crash_keeps_the_flushed_prefix_and_at_most_a_torn_piece_of_the_rest():
    for seed in range(50):
        log = MemoryLog(segment_size=SEGMENT_SIZE)
        log.append_replicated(0, bytes(range(256)) * 4)
        log.flush()
        log.append_replicated(1024, b"u" * 500)
        end = log.crash(random.Random(seed))
        assert 1024 <= end <= 1524 and log.flushed_offset == 1024
        assert bytes(log.read(0, 1024)) == bytes(range(256)) * 4
        check_invariants(log)
    log = MemoryLog(segment_size=SEGMENT_SIZE)
    log.append_replicated(0, b"kept by a process kill")
    assert log.crash(lose_unflushed=False) == 22 and log.crash() == 0  # then a power loss


def test_a_slave_copies_the_masters_log_span_by_span_then_cuts_it_back(logs):
    master, slave = logs
    offsets = []
    for index in range(300):  # several segments
        result = master.append([rec.prepare_message(rec.Message("T", bytes([index % 251]) * 700))])
        offsets.append(result.wrote_offset)
    check_invariants(master)
    while slave.max_wrote_offset < master.max_offset:
        data = master.read(slave.max_wrote_offset, 5000)  # never across a segment
        assert (slave.max_wrote_offset + len(data) - 1) // SEGMENT_SIZE == slave.max_wrote_offset // SEGMENT_SIZE
        slave.append_replicated(slave.max_wrote_offset, data)
        check_invariants(slave)
    assert slave.max_offset == master.max_offset
    assert slave.flush() == slave.flushed_offset == slave.max_wrote_offset
    cut = offsets[200]
    slave.truncate(cut)
    check_invariants(slave)
    assert slave.max_wrote_offset == slave.max_offset == cut
    assert bytes(slave.read(offsets[199], cut - offsets[199])) == bytes(master.read(offsets[199], cut - offsets[199]))
    slave.append_replicated(cut, master.read(cut, offsets[201] - cut))  # and it follows again from there
    assert slave.max_wrote_offset == offsets[201]
