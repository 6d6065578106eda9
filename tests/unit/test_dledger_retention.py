"""Retention in DLedger mode (DLedgerMmapFileStore's CleanSpaceService / deleteExpiredFiles): whole
head data files go, never an entry above the committed, flushed or driver-given index, never the
file being written; the log starts later after a reopen, also after a power loss mid-deletion;
consume queues follow the new minimum offset."""

import os

import pytest

from commitlog.dledger import DLedgerMmapFileStore, DLedgerStoreConfig, Entry
from commitlog.dledger.message_inspect import verify_member
from commitlog.dledger.upgrade import dledger_directory
from tests.unit.test_dledger_message_store import CONFIG, classic_store_with, lead, message, noop, open_store

SMALL = DLedgerStoreConfig(data_file_size=4096, index_file_size=32 * 16)
PER_FILE = 27  # entries of 100-byte bodies (148 bytes) a 4096-byte data file holds, 8 bytes kept for a blank
HOUR_MS = 3600 * 1000


def entries(start, count, *, term=1, size=100):
    return [Entry(index, term, bytes([index % 251]) * size) for index in range(start, start + count)]


def filled_store(path, count=PER_FILE * 4 + 5):
    store = DLedgerMmapFileStore.open(str(path), SMALL)
    store.append(entries(0, count))
    store.flush()
    store.update_committed_index(count - 1)
    return store


def data_files(path):
    return sorted(os.listdir(os.path.join(path, "data")))


def test_head_files_below_the_committed_index_go_and_first_index_moves_up(tmp_path):
    store = filled_store(tmp_path)
    assert len(data_files(tmp_path)) == 5
    chosen = store.deletable_head_files(keep_from_index=1 << 60, count_max=10)
    assert [next_first for _, next_first in chosen] == [PER_FILE, 2 * PER_FILE, 3 * PER_FILE, 4 * PER_FILE]
    deleted = store.delete_head_files(count=2, keep_from_index=1 << 60)
    assert [os.path.basename(p) for p in deleted[:2]] == [f"{0:020d}", f"{4096:020d}"]
    assert store.first_index() == 2 * PER_FILE
    assert store.read(2 * PER_FILE, 2 * PER_FILE + 1, size_max=1 << 20) == entries(2 * PER_FILE, 1)
    with pytest.raises(IndexError):
        store.read(PER_FILE, PER_FILE + 1, size_max=1 << 20)
    with pytest.raises(IndexError):
        store.term_at(2 * PER_FILE - 1)
    # index files (16 units each) wholly below entry 54 went too: 3 of them (units 0..47)
    assert sorted(os.listdir(os.path.join(tmp_path, "index")))[0] == f"{3 * 16 * 32:020d}"
    store.append(entries(store.last_index() + 1, 3))
    store.close()
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    assert (store.first_index(), store.last_index()) == (2 * PER_FILE, PER_FILE * 4 + 7)
    assert store.read(store.first_index(), store.last_index() + 1, size_max=1 << 30) == entries(2 * PER_FILE, 2 * PER_FILE + 8)
    store.close()


@pytest.mark.parametrize("limit", ["committed", "committed_entry_stays", "flushed", "keep_from"])
def test_nothing_at_or_above_the_committed_flushed_or_given_index_is_deleted(tmp_path, limit):
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    store.append(entries(0, PER_FILE * 4))
    store.flush()
    store.update_committed_index(PER_FILE * 4 - 1)
    keep_from = 1 << 60
    if limit == "committed":
        store.append(entries(PER_FILE * 4, 2))
        store.flush()
        store._committed_index = 2 * PER_FILE  # file 1 committed and the first entry of file 2 (which stays)
    elif limit == "committed_entry_stays":
        store._committed_index = 2 * PER_FILE - 1  # the last entry of file 1: file 1 stays with it
    elif limit == "flushed":
        store._flushed_index = 2 * PER_FILE - 2  # the last entry of file 1 not yet durable
    else:
        keep_from = PER_FILE + 3  # a member still needs entry 30 (in file 1)
    chosen = store.deletable_head_files(keep_from_index=keep_from, count_max=10)
    expected = {"committed": 2, "committed_entry_stays": 1, "flushed": 1, "keep_from": 1}[limit]
    assert len(chosen) == expected
    with pytest.raises(ValueError):
        store.delete_head_files(count=expected + 1, keep_from_index=keep_from)
    store.delete_head_files(count=expected, keep_from_index=keep_from)
    assert store.first_index() == expected * PER_FILE
    store.abandon()


def test_the_file_being_written_and_a_warmed_empty_file_never_go(tmp_path):
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    store.append(entries(0, PER_FILE))  # exactly one full file's worth: the file being written
    store.flush()
    store.update_committed_index(PER_FILE - 1)
    store.warm_ahead(4096)  # may create the next, empty, data file
    assert store.deletable_head_files(keep_from_index=1 << 60, count_max=10) == []
    store.close()


def test_power_loss_part_way_through_a_deletion_recovers_with_the_head_gone(tmp_path):
    store = filled_store(tmp_path)
    store.persist_checkpoint()
    first_files = data_files(tmp_path)[:2]
    store.abandon()
    # A crash after the first two data files were unlinked, before the index files were: the
    # index files of the deleted entries are left over.
    for name in first_files:
        os.unlink(os.path.join(tmp_path, "data", name))
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    assert store.first_index() == 2 * PER_FILE
    assert store.last_index() == PER_FILE * 4 + 4
    assert store.read(2 * PER_FILE, 1 << 20, size_max=1 << 30) == entries(2 * PER_FILE, 2 * PER_FILE + 5)
    # the next pass removes the left-over index files with the next data file
    store.update_committed_index(store.last_index())
    store.delete_head_files(count=1, keep_from_index=1 << 60)
    assert store.first_index() == 3 * PER_FILE
    assert sorted(os.listdir(os.path.join(tmp_path, "index")))[0] == f"{5 * 16 * 32:020d}"
    store.close()
    store = DLedgerMmapFileStore.open(str(tmp_path), SMALL)
    assert store.first_index() == 3 * PER_FILE
    store.close()


# -- the message store ------------------------------------------------------------------


def filled_message_store(path, batches=140):
    store = open_store(path)
    noop(store, 1)
    for i in range(batches):
        lead(store, [message(i, queue_id=0, size=300)])
    store.entries.flush()
    return store


def readable(store):
    """(queue offset, body) of every unit of queue T/0 whose message is at or above the minimum."""
    queue = store.consume_queues.find("T", 0)
    units = queue.read(queue.min_offset_in_queue, 1000)
    return [(r.queue_offset, bytes(r.body)) for r in (store.get_record(o) for o, _, _ in units if o >= store.min_offset)]


def test_expired_files_go_consume_queues_follow_and_a_reopen_keeps_it(tmp_path):
    store = filled_message_store(tmp_path)
    files = store.entries.data_file_list.mapped_files
    queue = store.consume_queues.find("T", 0)
    assert len(files) >= 10 and len(queue.mapped_file_queue.mapped_files) == 3  # 64 units a file
    assert store.clean_expired(keep_from_index=1 << 60) == []  # young files stay
    now = int(os.path.getmtime(files[-1].path) * 1000) + 73 * HOUR_MS
    deleted = store.clean_expired(keep_from_index=1 << 60, now_ms_value=now)
    data_deleted = [p for p in deleted if os.sep + "data" + os.sep in p]
    assert len(data_deleted) == CONFIG.delete_segments_per_pass_max  # a bounded number a pass
    deleted += store.clean_expired(keep_from_index=1 << 60, now_ms_value=now)
    data_deleted = [p for p in deleted if os.sep + "data" + os.sep in p]
    assert len(data_deleted) == len(files) - 1 and store.entries.first_index() > 0  # all but the one written
    minimum = store.min_offset
    assert minimum == store.entries.data_file_list.min_offset == store.entries.pos_at(store.entries.first_index())
    # consume-queue files whose every unit points below the minimum went; the last one stays
    assert len(queue.mapped_file_queue.mapped_files) == 1 and queue.min_offset_in_queue == 128
    kept = readable(store)
    assert kept and kept[-1] == (139, message(139, size=300).body)
    lead(store, [message(140, queue_id=0, size=300)])
    store.close(clean=False)  # a crash: the next open recovers with the head gone
    store = open_store(tmp_path)
    assert store.min_offset == minimum and store.entries.first_index() > 0
    assert readable(store) == kept + [(140, message(140, size=300).body)]
    assert store.clean_expired(keep_from_index=1 << 60, now_ms_value=now) == []  # nothing below the written file
    plan = lead(store, [message(141, queue_id=0, size=300)])
    assert plan.queue_offsets == (141,)  # queue offsets continue after the expired units
    store.close()
    report = verify_member(str(tmp_path), "n0")
    assert report.ok, report


def test_a_young_file_goes_only_above_the_disk_ratio_and_never_past_the_keep_index(tmp_path):
    store = filled_message_store(tmp_path)
    assert store.clean_expired(keep_from_index=1 << 60, over_ratio=False) == []
    assert store.clean_expired(keep_from_index=0, over_ratio=True) == []  # a member still needs entry 0
    deleted = store.clean_expired(keep_from_index=1 << 60, over_ratio=True)
    assert deleted and store.entries.first_index() > 0
    assert os.path.isdir(dledger_directory(str(tmp_path), "n0"))
    store.close()


def test_a_smoothly_upgraded_store_deletes_its_sealed_classic_segments_first(tmp_path):
    old = classic_store_with(tmp_path, 30)  # 700-byte messages: several 4 KiB classic segments
    store = open_store(tmp_path, upgrade_classic=True)
    classic_files = store.classic.mapped_file_queue.mapped_files
    assert len(classic_files) >= 3
    noop(store, 1)
    for i in range(60):
        lead(store, [message(i, queue_id=0, size=300)])
    store.entries.flush()
    now = int(os.path.getmtime(store.entries.data_file_list.mapped_files[-1].path) * 1000) + 73 * HOUR_MS
    deleted = store.clean_expired(keep_from_index=1 << 60, now_ms_value=now)
    names = [os.path.relpath(p, tmp_path).split(os.sep)[0] for p in deleted]
    assert names[: len(classic_files) - 1] == ["commitlog"] * (len(classic_files) - 1)  # all but the newest, first
    assert len(store.classic.mapped_file_queue.mapped_files) == 1
    assert store.entries.first_index() > 0 and store.min_offset == store.entries.data_file_list.min_offset
    assert store.min_offset > old[-1]
    store.close()
    store = open_store(tmp_path)
    assert store.min_offset == store.entries.data_file_list.min_offset and store.entries.first_index() > 0
    store.close()
