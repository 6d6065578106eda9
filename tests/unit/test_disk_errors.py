"""The store on a full disk and after a failed sync, with the errors injected (ENOSPC from
``posix_fallocate``, EIO from the sync): what is refused, what goes on, what is never believed."""

from __future__ import annotations

import dataclasses
import errno
import os
import time

import pytest

from commitlog import mapped_file
from commitlog import record as rec
from commitlog.config import FlushDiskType
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
    monkeypatch.setattr("commitlog.store.disk_used_ratio", lambda path: measured.append(path) or 0.1)
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
