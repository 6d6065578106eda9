"""The store on a full disk and after a failed sync, with the errors injected (ENOSPC from
``posix_fallocate``, EIO from the sync): what is refused, what goes on, what is never believed."""

from __future__ import annotations

import dataclasses
import errno
import os
import time

import pytest

from commitlog import mapped_file, native
from commitlog import record as rec
from commitlog.config import FlushDiskType, StoreConfig
from commitlog.dledger.entry_store import DLedgerMmapFileStore, DLedgerStoreConfig, Entry
from commitlog.mapped_file import DiskFullError, SyncFailedError
from commitlog.mapped_file_queue import MappedFileQueue
from commitlog.services import StoreServices
from commitlog.store import MessageStore

BODY = b"b" * 1000


class NoRoom:
    """``os.posix_fallocate`` for the test: ENOSPC while ``full``, counting the tries."""

    def __init__(self, real):
        self.real = real
        self.full = False
        self.tries = 0

    def __call__(self, fd, offset, size):
        if self.full:
            self.tries += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.real(fd, offset, size)


@pytest.fixture
def no_room(monkeypatch) -> NoRoom:
    fake = NoRoom(os.posix_fallocate)
    monkeypatch.setattr(mapped_file.os, "posix_fallocate", fake)
    return fake


class FailingSync:
    """The native ``sync_range`` and ``os.fdatasync``: EIO once ``failing``, counting calls."""

    def __init__(self):
        self.failing = False
        self.calls = 0

    def __call__(self, *args):
        if self.failing:
            self.calls += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))


@pytest.fixture
def failing_sync(monkeypatch) -> FailingSync:
    fake = FailingSync()
    real_fdatasync, real_sync_range = os.fdatasync, mapped_file._native_sync_range

    def fdatasync(fd):
        fake(fd)
        real_fdatasync(fd)

    def sync_range(view, start, end):
        fake(view)
        if real_sync_range is not None:
            real_sync_range(view, start, end)

    monkeypatch.setattr(mapped_file.os, "fdatasync", fdatasync)
    if real_sync_range is not None:
        monkeypatch.setattr(mapped_file, "_native_sync_range", sync_range)
    return fake


def put(store: MessageStore) -> rec.PutMessageStatus:
    return store.append_batch(rec.MessageBatch("T", [BODY], queue_id=0)).status


def test_no_next_segment_answers_disk_full_until_space_frees(tmp_path, small_config, no_room):
    """The roll to the next segment fails: DISK_FULL, nothing raised, the log unchanged; the
    puts after it are refused without trying again until the next measurement is due; then,
    with room, puts go on where the log ended."""
    with MessageStore.open(str(tmp_path), small_config) as store:
        while len(store.commit_log.mapped_file_queue.mapped_files) < 2 or store.commit_log.mapped_file_queue.last.remaining > 2 * len(BODY):
            assert put(store) is rec.PutMessageStatus.PUT_OK
        end = store.commit_log.max_offset
        no_room.full = True
        while (status := put(store)) is rec.PutMessageStatus.PUT_OK:
            pass
        assert status is rec.PutMessageStatus.DISK_FULL
        assert "no space left" in store.disk.reason and store.disk.full
        tries = no_room.tries
        assert tries >= 1
        assert put(store) is rec.PutMessageStatus.DISK_FULL
        assert no_room.tries == tries  # refused from the cached answer: no segment made and removed per put
        assert os.listdir(tmp_path / "commitlog") == [mapped_file.segment_name(o) for o in (0, small_config.commitlog_segment_size)]
        assert store.commit_log.max_offset >= end
        assert store.get_record(0).body == BODY  # reads go on
        no_room.full = False
        assert store.disk_full_at(store.disk.due_at) is False  # the next measurement: room again
        assert put(store) is rec.PutMessageStatus.PUT_OK
        assert len(store.commit_log.mapped_file_queue.mapped_files) == 3


def test_the_disk_is_measured_again_as_soon_as_a_file_was_created(tmp_path, small_config, monkeypatch):
    """Files are preallocated whole: the disk's use jumps when one is made. The ratio measured
    at t is trusted until t + interval only while no file was created meanwhile."""
    measured = []
    monkeypatch.setattr("commitlog.disk_watch.disk_used_ratio", lambda path: measured.append(path) or 0.1)
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert store.disk_full_at(100.0) is False and len(measured) == 1
        assert store.disk_full_at(100.5) is False and len(measured) == 1
        store.commit_log.mapped_file_queue.get_last_mapped_file(0)  # the first segment, preallocated
        assert store.disk_full_at(100.6) is False and len(measured) == 2
        assert store.disk_full_at(100.7) is False and len(measured) == 2


def test_dispatch_without_room_for_a_consume_queue_file_waits_and_resumes(tmp_path, small_config, no_room):
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert put(store) is rec.PutMessageStatus.PUT_OK
        store.dispatch()
        units = small_config.consume_queue_units_per_file
        for _ in range(units + 5):  # past the first consume-queue file
            assert put(store) is rec.PutMessageStatus.PUT_OK
        no_room.full = True
        store.dispatch()  # does not raise
        assert store.dispatch_blocked is not None and "no space left" in store.dispatch_blocked
        assert store.reput_from_offset < store.commit_log.max_offset
        no_room.full = False
        while store.dispatch():
            pass
        assert store.dispatch_blocked is None
        assert store.reput_from_offset == store.commit_log.max_offset
        assert [r.queue_offset for r in store.pull("T", 0, units - 1, 3)] == [units - 1, units, units + 1]


def test_the_warm_up_thread_meets_a_full_disk_and_goes_on(tmp_path, small_config, no_room):
    """StoreServices: the warm-up's spare segment cannot be made: no thread stops, the put that
    needs the segment is answered DISK_FULL, and once there is room puts go on."""
    with MessageStore.open(str(tmp_path), small_config) as store:
        with StoreServices(store) as services:
            assert services.put_batch(rec.MessageBatch("T", [BODY], queue_id=0)).status is rec.PutMessageStatus.PUT_OK
            no_room.full = True
            status = rec.PutMessageStatus.PUT_OK
            for _ in range(1000):
                status = services.put_batch(rec.MessageBatch("T", [BODY], queue_id=0)).status
                if status is not rec.PutMessageStatus.PUT_OK:
                    break
            assert status is rec.PutMessageStatus.DISK_FULL
            no_room.full = False
            store.disk_full_at(store.disk.due_at)
            assert services.put_batch(rec.MessageBatch("T", [BODY], queue_id=0)).status is rec.PutMessageStatus.PUT_OK
        assert services.errors == []
        assert no_room.tries >= 1


def test_a_failed_sync_is_never_retried_and_believed(tmp_path, small_config, failing_sync):
    """EIO from the sync: the flush raises SyncFailedError, nothing is counted flushed, the store
    refuses writes with the reason, and no later flush syncs again (a retried fsync after EIO
    "succeeds" without the lost pages: PostgreSQL's fsyncgate), not even a clean close, which
    leaves the store to be recovered as after a crash."""
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert put(store) is rec.PutMessageStatus.PUT_OK
        flushed = store.flush_commitlog(0)
        assert put(store) is rec.PutMessageStatus.PUT_OK
        failing_sync.failing = True
        with pytest.raises(SyncFailedError, match="Input/output error"):
            store.flush_commitlog(0)
        assert failing_sync.calls == 1
        assert store.commit_log.flushed_offset == flushed
        assert store.checkpoint.master_flushed_offset == flushed
        assert "sync failed" in store.write_failure and "00000000000000000000" in store.write_failure
        result = store.append_batch(rec.MessageBatch("T", [BODY], queue_id=0))
        assert result.status is rec.PutMessageStatus.SERVICE_NOT_AVAILABLE and result.reason == store.write_failure
        assert store.append([rec.Message("T", b"x")]).status is rec.PutMessageStatus.SERVICE_NOT_AVAILABLE
        with pytest.raises(SyncFailedError):
            store.flush_commitlog(0)
        assert failing_sync.calls == 1  # not synced again
        assert store.commit_log.flushed_offset == flushed
        store.close()  # no sync: closed as after a crash
        assert failing_sync.calls == 1
    assert os.path.exists(tmp_path / "abort")
    failing_sync.failing = False
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert store.write_failure is None and not store.last_exit_ok
        assert put(store) is rec.PutMessageStatus.PUT_OK


def test_mapped_file_queue_make_room_makes_the_next_segment_as_the_spare(tmp_path, no_room):
    queue = MappedFileQueue(str(tmp_path / "q"), file_size=4096)
    queue.make_room(100)  # an empty queue: its first segment
    assert os.listdir(tmp_path / "q") == [mapped_file.segment_name(0)]
    first = queue.get_last_mapped_file(0)
    assert first.append(b"x" * 4000)
    queue.make_room(4000)  # fits: nothing made
    assert os.listdir(tmp_path / "q") == [mapped_file.segment_name(0)]
    no_room.full = True
    with pytest.raises(DiskFullError, match="00000000000000004096"):
        queue.make_room(4200)
    assert os.listdir(tmp_path / "q") == [mapped_file.segment_name(0)]  # the half-made file removed
    no_room.full = False
    queue.make_room(4200)
    no_room.full = True  # the write itself needs no new file now
    assert first.append(b"y" * 96) and queue.get_last_mapped_file(0).file_from_offset == 4096
    queue.close()


def test_an_entry_append_without_room_writes_nothing(tmp_path, no_room):
    """DLedger entries: the index file (or the next data file) cannot be made: DiskFullError
    before any byte is written, the store as it was; with room the same append goes in."""
    config = DLedgerStoreConfig(data_file_size=64 * 1024, index_file_size=32 * 64)
    store = DLedgerMmapFileStore.open(str(tmp_path / "d"), config)
    try:
        store.append([Entry(i, 1, b"e" * 500) for i in range(60)])
        before = (store.last_index(), store.data_end(), store.index_file_list.max_wrote_offset)
        no_room.full = True
        with pytest.raises(DiskFullError):
            store.append([Entry(60 + i, 1, b"f" * 500) for i in range(10)])  # past index file 0 (64 units)
        assert (store.last_index(), store.data_end(), store.index_file_list.max_wrote_offset) == before
        no_room.full = False
        store.append([Entry(60 + i, 1, b"f" * 500) for i in range(10)])
        assert store.last_index() == 69 and store.get(65).body == b"f" * 500
    finally:
        store.close()


@pytest.mark.parametrize("flush", [FlushDiskType.SYNC_FLUSH, FlushDiskType.ASYNC_FLUSH])
def test_store_services_after_a_failed_sync_refuse_puts_and_keep_running(tmp_path, small_config, failing_sync, flush):
    """StoreServices (threads): a put waiting for the failed group commit gets FLUSH_DISK_TIMEOUT
    (never PUT_OK), later puts SERVICE_NOT_AVAILABLE; no thread dies of it."""
    config = dataclasses.replace(small_config, flush_disk_type=flush, sync_flush_timeout_ms=600_000,
                                 flush_interval_commitlog_ms=10, flush_commitlog_least_pages=0)  # fmt: skip
    with MessageStore.open(str(tmp_path), config) as store:
        with StoreServices(store) as services:
            batch = rec.MessageBatch("T", [BODY], queue_id=0)
            assert services.put_batch(batch).status is rec.PutMessageStatus.PUT_OK
            failing_sync.failing = True
            status = services.put_batch(batch).status
            if flush is FlushDiskType.SYNC_FLUSH:
                assert status is rec.PutMessageStatus.FLUSH_DISK_TIMEOUT
            for _ in range(3000):  # ASYNC_FLUSH: the next flush (every 10 ms); a bound, not a timing
                if store.write_failure is not None:
                    break
                time.sleep(0.01)
            assert store.write_failure is not None
            assert services.put_batch(batch).status is rec.PutMessageStatus.SERVICE_NOT_AVAILABLE
            assert all(thread.is_alive() for thread in services._threads)
        assert services.errors == []
        assert failing_sync.calls == 1


def _disk_used(directory) -> int:
    """Bytes of disk the files under ``directory`` take (not their apparent size)."""
    return sum(os.stat(os.path.join(root, name)).st_blocks * 512 for root, _, names in os.walk(directory) for name in names)


def test_a_store_of_one_message_takes_a_step_of_disk_not_a_whole_segment(tmp_path):
    """Default settings (1 GiB segments): the segment is 1 GiB long but only its first
    preallocate_step_size is reserved; with 0 the whole segment is, as before."""
    config = dataclasses.replace(StoreConfig(), disk_max_used_space_ratio=1.0, disk_clean_ratio=1.0)
    with MessageStore.open(str(tmp_path / "s"), config) as store:
        assert put(store) is rec.PutMessageStatus.PUT_OK
    segment = tmp_path / "s" / "commitlog" / mapped_file.segment_name(0)
    assert os.path.getsize(segment) == config.commitlog_segment_size
    assert _disk_used(tmp_path / "s") < 2 * config.preallocate_step_size
    whole = dataclasses.replace(config, preallocate_step_size=0)
    with MessageStore.open(str(tmp_path / "w"), whole) as store:
        assert put(store) is rec.PutMessageStatus.PUT_OK
    assert _disk_used(tmp_path / "w" / "commitlog") >= config.commitlog_segment_size


def test_a_segment_reserves_ahead_as_it_fills_and_a_full_disk_mid_segment_is_disk_full(tmp_path, small_config, no_room):
    """Step 8 KiB in a larger segment: every byte written lies in reserved disk; when the next
    step cannot be reserved the put is DISK_FULL with nothing written (no SIGBUS, no partial
    record), reads go on, and with room again puts go on in the same segment."""
    step = 8192
    config = dataclasses.replace(small_config, preallocate_step_size=step)
    with MessageStore.open(str(tmp_path), config) as store:
        last = store.commit_log.mapped_file_queue.last
        for _ in range(20):
            assert put(store) is rec.PutMessageStatus.PUT_OK
            last = store.commit_log.mapped_file_queue.last
            assert last.wrote_position <= last.allocated_position <= last.file_size
            assert os.stat(last.path).st_blocks * 512 >= last.wrote_position
        assert last.allocated_position < last.file_size  # reserved a step at a time, not whole
        while last.wrote_position + len(BODY) + 200 <= last.allocated_position:  # fill what is reserved
            assert put(store) is rec.PutMessageStatus.PUT_OK
        end = store.commit_log.max_offset
        no_room.full = True
        status = put(store)
        assert status is rec.PutMessageStatus.DISK_FULL
        assert store.commit_log.max_offset == end and last.wrote_position <= last.allocated_position
        assert store.get_record(0).body == BODY
        no_room.full = False
        assert store.disk_full_at(store.disk.due_at) is False
        assert put(store) is rec.PutMessageStatus.PUT_OK
        assert store.commit_log.mapped_file_queue.last is last  # the same segment goes on


@pytest.mark.skipif(not native.AVAILABLE, reason="the warm-up faults nothing in without the native module")
def test_the_warm_up_faults_in_only_reserved_pages(tmp_path, no_room):
    queue = MappedFileQueue(str(tmp_path / "q"), file_size=1024 * 1024, preallocate_step_size=64 * 1024)
    first = queue.get_last_mapped_file(0)
    assert first.append(b"x" * 100)
    no_room.full = True
    queue.warm_ahead(512 * 1024)  # cannot reserve more: warms what is reserved, raises nothing
    assert first.populated_position <= first.allocated_position < 512 * 1024
    no_room.full = False
    queue.warm_ahead(512 * 1024)
    assert first.allocated_position >= first.populated_position >= 512 * 1024
    queue.close()


def test_an_entry_append_past_the_reserved_step_without_room_writes_nothing(tmp_path, no_room):
    """DLedger entries and their index units reserve their disk in make_room, before any byte."""
    config = DLedgerStoreConfig(data_file_size=256 * 1024, index_file_size=32 * 1024, preallocate_step_size=4096)
    store = DLedgerMmapFileStore.open(str(tmp_path / "d"), config)
    try:
        store.append([Entry(i, 1, b"e" * 500) for i in range(5)])
        before = (store.last_index(), store.data_end(), store.index_file_list.max_wrote_offset)
        no_room.full = True
        with pytest.raises(DiskFullError):
            store.append([Entry(5 + i, 1, b"f" * 500) for i in range(40)])  # past the reserved step
        assert (store.last_index(), store.data_end(), store.index_file_list.max_wrote_offset) == before
        no_room.full = False
        store.append([Entry(5 + i, 1, b"f" * 500) for i in range(40)])
        assert store.last_index() == 44 and store.get(40).body == b"f" * 500
        last = store.data_file_list.last
        assert last.wrote_position <= last.allocated_position
    finally:
        store.close()
