"""The LogStorage contract (commitlog/storage.py), run against CommitLog: what a master and a
slave of classic replication do with a log, through the protocol's methods only."""

import pytest

from commitlog import record as rec
from commitlog.commit_log import CommitLog
from commitlog.storage import LogStorage
from tests.sizes import SEGMENT_SIZE


@pytest.fixture
def logs(tmp_path):
    opened = []
    for name in ("master", "slave"):
        log = CommitLog(str(tmp_path / name), segment_size=SEGMENT_SIZE)
        log.load()
        opened.append(log)
    yield opened
    for log in opened:
        log.close()


def check_invariants(log: LogStorage) -> None:
    assert log.min_offset <= log.max_offset <= log.max_wrote_offset
    assert log.flushed_offset <= log.max_wrote_offset


def test_commit_log_is_a_log_storage(logs):
    assert all(isinstance(log, LogStorage) for log in logs)


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
