import os
import struct

import pytest

from commitlog import record as rec
from commitlog.commit_log import CommitLog, ReadError, ReplicationOffsetError
from commitlog.mapped_file import segment_name
from tests.sizes import SEGMENT_SIZE


@pytest.fixture
def log(tmp_path):
    commit_log = CommitLog(str(tmp_path / "commitlog"), segment_size=SEGMENT_SIZE)
    commit_log.load()
    yield commit_log
    commit_log.close()


def append(log, *messages):
    return log.append([rec.prepare_message(message) for message in messages])


def test_ten_golden_records_end_at_1580(log):
    for _ in range(10):
        result = append(log, rec.Message("FooBar", b"Once, there was a chance for me!", properties={"TAGS": "TAG1", "KEYS": "1700000000000"}))
        assert result.status is rec.PutMessageStatus.PUT_OK
    assert log.max_offset == 1580


def test_append_assigns_physical_and_queue_offsets(log):
    first = append(log, rec.Message("A", b"1"), rec.Message("A", b"2", queue_id=1), rec.Message("A", b"3"))
    assert first.queue_offsets == (0, 0, 1)
    assert first.offsets[0] == 0 and first.offsets[1] == log.get_record(0).size
    second = append(log, rec.Message("A", b"4"))
    assert second.queue_offsets == (2,)
    record = log.get_record(second.wrote_offset)
    assert (record.physical_offset, record.queue_offset, bytes(record.body)) == (second.wrote_offset, 2, b"4")
    assert record.store_timestamp == second.store_timestamp


def test_a_record_that_does_not_fit_ends_the_segment_with_a_blank(log):
    body = b"x" * 1000
    size = rec.calc_record_size(body_size=1000, topic_size=1, properties_size=0)
    while SEGMENT_SIZE - log.max_offset >= size + 8:
        append(log, rec.Message("T", body))
    remaining = SEGMENT_SIZE - log.max_offset
    result = append(log, rec.Message("T", body))
    assert result.wrote_offset == SEGMENT_SIZE
    first = log.mapped_file_queue.mapped_files[0]
    assert rec.peek_blank(first.view(), SEGMENT_SIZE - remaining) == remaining
    assert log.next_record_offset(SEGMENT_SIZE - remaining) == SEGMENT_SIZE


def test_a_record_of_exactly_remaining_minus_8_fits(log):
    append(log, rec.Message("T", b"x" * 1000))
    remaining = SEGMENT_SIZE - log.max_offset
    body_size = remaining - 8 - rec.calc_record_size(body_size=0, topic_size=1, properties_size=0)
    result = append(log, rec.Message("T", b"y" * body_size))
    assert result.wrote_offset < SEGMENT_SIZE
    assert SEGMENT_SIZE - log.max_offset == 8
    assert append(log, rec.Message("T", b"")).wrote_offset == SEGMENT_SIZE


def test_a_batch_lands_whole_in_one_segment(log):
    append(log, rec.Message("T", b"x" * (SEGMENT_SIZE - 3000)))
    batch = rec.prepare_batch(rec.MessageBatch("T", [b"b" * 1000] * 3))
    result = log.append_batch(batch)
    assert result.wrote_offset == SEGMENT_SIZE
    assert result.offsets == tuple(SEGMENT_SIZE + i * batch.sizes[0] for i in range(3))
    assert [log.get_record(o).queue_offset for o in result.offsets] == [1, 2, 3]


def test_batch_larger_than_a_segment_is_illegal_and_writes_nothing(log):
    result = log.append_batch(rec.prepare_batch(rec.MessageBatch("T", [b"x" * 30000] * 3)))
    assert result.status is rec.PutMessageStatus.MESSAGE_ILLEGAL
    assert log.max_offset == 0


def test_reads_outside_the_log_or_between_records_are_clear_errors(log):
    result = append(log, rec.Message("T", b"hello"), rec.Message("T", b"world"))
    with pytest.raises(ReadError, match="outside the log"):
        log.get_record(log.max_offset)
    with pytest.raises(ReadError, match="no record starts at offset 3"):
        log.get_record(3)
    with pytest.raises(ReadError, match="outside"):
        log.read(-1, 10)
    assert bytes(log.read(result.offsets[1], 10**6)) == bytes(log.read(0, 10**6))[result.offsets[1] :]


def test_replicated_bytes_are_copied_verbatim_and_must_start_at_the_end(tmp_path, log):
    for i in range(200):
        append(log, rec.Message("T", bytes([i]) * 700))
    slave = CommitLog(str(tmp_path / "slave"), segment_size=SEGMENT_SIZE)
    slave.load()
    offset = 0
    while offset < log.max_offset:
        chunk = log.read(offset, 32 * 1024)
        slave.append_replicated(offset, chunk)
        offset += len(chunk)
    assert slave.max_offset == log.max_offset
    assert bytes(slave.read(SEGMENT_SIZE, 10**9)) == bytes(log.read(SEGMENT_SIZE, 10**9))
    with pytest.raises(ReplicationOffsetError, match="local log ends"):
        slave.append_replicated(offset + 1, b"x")
    with pytest.raises(ReplicationOffsetError, match="local log ends"):
        slave.append_replicated(offset - 10, b"x")
    slave.close()


def test_replicated_bytes_from_a_pipe_are_the_same_bytes(tmp_path, log):
    for i in range(200):
        append(log, rec.Message("T", bytes([i]) * 700))
    slave = CommitLog(str(tmp_path / "slave"), segment_size=SEGMENT_SIZE)
    slave.load()
    read_fd, write_fd = os.pipe()
    try:
        offset = 0
        while offset < log.max_offset:
            chunk = bytes(log.read(offset, 32 * 1024))
            os.write(write_fd, chunk)  # < 64 KiB: the default pipe holds it
            slave.append_replicated_from_pipe(offset, read_fd, len(chunk))
            offset += len(chunk)
        assert slave.max_offset == log.max_offset
        assert bytes(slave.read(SEGMENT_SIZE, 10**9)) == bytes(log.read(SEGMENT_SIZE, 10**9))
        os.write(write_fd, b"x")
        with pytest.raises(ReplicationOffsetError, match="local log ends"):
            slave.append_replicated_from_pipe(offset + 1, read_fd, 1)
        assert os.read(read_fd, 10) == b"x"  # refused before anything was taken from the pipe
    finally:
        os.close(read_fd)
        os.close(write_fd)
    slave.close()


def test_empty_slave_starts_at_a_segment_boundary_only(tmp_path):
    slave = CommitLog(str(tmp_path / "slave"), segment_size=SEGMENT_SIZE)
    slave.load()
    with pytest.raises(ReplicationOffsetError, match="segment boundary"):
        slave.append_replicated(100, b"x")
    slave.append_replicated(2 * SEGMENT_SIZE, b"abc")
    assert (slave.min_offset, slave.max_offset) == (2 * SEGMENT_SIZE, 2 * SEGMENT_SIZE + 3)
    assert (tmp_path / "slave" / segment_name(2 * SEGMENT_SIZE)).exists()
    slave.close()


def test_truncate_only_at_a_record_boundary(log):
    result = append(log, rec.Message("T", b"a"), rec.Message("T", b"b"), rec.Message("T", b"c"))
    with pytest.raises(ReadError):
        log.truncate(result.offsets[1] + 1)
    log.truncate(result.offsets[1])
    assert log.max_offset == result.offsets[1]
    view = log.mapped_file_queue.mapped_files[0].view()
    assert bytes(view[result.offsets[1] : result.next_offset]) == bytes(result.next_offset - result.offsets[1])


def test_store_timestamps_never_go_backwards(log, monkeypatch):
    import commitlog.commit_log as module

    first = append(log, rec.Message("T", b"a")).store_timestamp
    monkeypatch.setattr(module, "now_ms", lambda: first - 10_000)
    assert append(log, rec.Message("T", b"b")).store_timestamp == first
    assert struct.unpack_from(">q", bytes(log.read(0, 200)), 56)[0] == first


# -- large appends written with pwrite (WRITE_THROUGH_MIN) ---------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from commitlog import commit_log as commit_log_module  # noqa: E402
from commitlog.mapped_file import MappedFile  # noqa: E402

# Batches of (messages, body size): some of WRITE_THROUGH_MIN and more, some far below.
_BATCHES = st.lists(st.tuples(st.integers(1, 120), st.integers(1, 1500)), min_size=1, max_size=12)


def _log_bytes(commit_log) -> bytes:
    return b"".join(bytes(f.view()[: f.wrote_position]) for f in commit_log.mapped_file_queue.mapped_files)


def _append_batches(directory, batches, *, through_min: int):
    """Append ``batches`` (one batch each) to a new log at ``directory`` with the clock fixed and
    WRITE_THROUGH_MIN set to ``through_min``; (log bytes, results, appends written with pwrite)."""
    saved = commit_log_module.now_ms, commit_log_module.WRITE_THROUGH_MIN, MappedFile.write_through
    through = []

    def write_through(self, data):
        through.append(len(data))
        return saved[2](self, data)

    commit_log_module.now_ms = lambda: 1_700_000_000_000
    commit_log_module.WRITE_THROUGH_MIN = through_min
    MappedFile.write_through = write_through
    commit_log = CommitLog(directory, segment_size=4 * 1024 * 1024)
    try:
        commit_log.load()
        results = []
        for number, (count, size) in enumerate(batches):
            batch = rec.MessageBatch(f"T{number % 3}", [bytes([number % 251]) * size] * count, queue_id=number % 2)
            result = commit_log.append_batch(rec.prepare_batch(batch, record_crc=True))
            assert result.status is rec.PutMessageStatus.PUT_OK
            results.append((result.wrote_offset, result.wrote_bytes, result.offsets, result.queue_offsets))
        return _log_bytes(commit_log), results, through
    finally:
        commit_log.close()
        commit_log_module.now_ms, commit_log_module.WRITE_THROUGH_MIN, MappedFile.write_through = saved


@given(_BATCHES)
@settings(max_examples=30, deadline=None)
def test_large_appends_written_with_pwrite_store_the_bytes_the_mapping_stores(tmp_path_factory, batches):
    """An append of WRITE_THROUGH_MIN or more is encoded into the log's buffer and written with
    ``pwrite`` past the warmed pages: the same log bytes, offsets and queue offsets as every append
    through the mapping, and reads through the mapping see them."""
    mapped, mapped_results, none = _append_batches(str(tmp_path_factory.mktemp("mapped")), batches, through_min=1 << 40)
    written, written_results, through = _append_batches(str(tmp_path_factory.mktemp("through")), batches,
                                                        through_min=commit_log_module.WRITE_THROUGH_MIN)  # fmt: skip
    assert none == []
    assert written == mapped
    assert written_results == mapped_results
    sizes = [wrote_bytes for _, wrote_bytes, _, _ in mapped_results]
    if any(commit_log_module.WRITE_THROUGH_MIN <= size <= commit_log_module.WRITE_THROUGH_MAX for size in sizes):
        assert through  # the large ones did go by pwrite (the warm-up never ran here)


def test_a_segment_written_with_pwrite_does_not_read_ahead_through_the_mapping_past_the_flushed_end(tmp_path):
    """Past the first append written with pwrite, faults through the mapping read no pages ahead
    (``MappedFile.read_ahead_off_from``: the warm-up's marked folios kept a read-ahead going that
    zeroed the pages the writer wrote next); behind the flushed end it reads ahead again."""
    commit_log = CommitLog(str(tmp_path / "commitlog"), segment_size=256 * 1024 * 1024)
    commit_log.load()
    try:
        small = commit_log.append_batch(rec.prepare_batch(rec.MessageBatch("T", [b"x" * 1000])))
        mapped_file = commit_log.mapped_file_queue.mapped_files[-1]
        assert mapped_file.read_ahead_end == mapped_file.file_size  # small appends: the mapping as it was
        large = commit_log.append_batch(rec.prepare_batch(rec.MessageBatch("T", [b"y" * 1000] * 80)))
        assert large.wrote_bytes >= commit_log_module.WRITE_THROUGH_MIN
        assert mapped_file.read_ahead_end == small.wrote_bytes // 4096 * 4096
        while commit_log.max_offset < 80 * 1024 * 1024:
            commit_log.append_batch(rec.prepare_batch(rec.MessageBatch("T", [b"z" * 1000] * 100)))
        mapped_file.flush()
        assert 0 < mapped_file.read_ahead_end < mapped_file.flushed_position  # read-ahead again behind the flush
        assert bytes(commit_log.get_record(large.offsets[-1]).body) == b"y" * 1000
    finally:
        commit_log.close()


def test_the_warm_up_waits_while_appends_are_large_and_resumes_after_small_ones(tmp_path):
    """``large_appends`` (the broker's warm-up stays behind while it holds): set by an append of
    WRITE_THROUGH_MIN or more, kept through fewer than WARM_AFTER_SMALL_APPENDS small ones in a
    row, cleared by that many."""
    commit_log = CommitLog(str(tmp_path / "commitlog"), segment_size=4 * 1024 * 1024)
    commit_log.load()

    def put(count):
        result = commit_log.append_batch(rec.prepare_batch(rec.MessageBatch("T", [b"x" * 1000] * count)))
        assert result.status is rec.PutMessageStatus.PUT_OK
        return result.wrote_bytes

    try:
        assert put(1) < commit_log_module.WRITE_THROUGH_MIN and not commit_log.large_appends
        assert put(80) >= commit_log_module.WRITE_THROUGH_MIN and commit_log.large_appends
        for _ in range(commit_log_module.WARM_AFTER_SMALL_APPENDS - 1):
            put(1)
        assert commit_log.large_appends
        assert put(80) and commit_log.large_appends  # a large one starts the count again
        for _ in range(commit_log_module.WARM_AFTER_SMALL_APPENDS):
            put(1)
        assert not commit_log.large_appends
    finally:
        commit_log.close()
