"""Read-only verify and entry iteration of a DLedger store: what recovery would find, without
changing a byte."""

import hashlib
import os

import pytest

from commitlog.dledger import DLedgerMmapFileStore, DLedgerStoreConfig, Entry
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.inspect import iter_entries, verify
from commitlog.mapped_file import StoreError

CONFIG = DLedgerStoreConfig(data_file_size=4096, index_file_size=32 * 16)
ENTRIES = [Entry(i, i // 20, bytes([i + 1]) * 100) for i in range(60)]  # 148 bytes: 27 per data file


def build(path, count=60):
    store = DLedgerMmapFileStore.open(str(path), CONFIG)
    store.append(ENTRIES[:count])
    store.update_committed_index(count - 5)
    spans = [store.entry_span(i) for i in range(count)]
    store.close()
    return spans


def digest(path):
    result = hashlib.sha256()
    for root, _, names in sorted(os.walk(path)):
        for name in sorted(names):
            with open(os.path.join(root, name), "rb") as file:
                result.update(name.encode() + file.read())
    return result.hexdigest()


def write_at(path, directory, offset, data, size):
    with open(os.path.join(path, directory, f"{offset - offset % size:020d}"), "r+b") as file:
        file.seek(offset % size)
        file.write(data)


def test_verify_a_healthy_store(tmp_path):
    build(tmp_path)
    before = digest(tmp_path)
    report = verify(str(tmp_path))
    assert (report.data_files, report.data_file_size, report.index_file_size) == (3, 4096, 512)
    assert (report.first_index, report.last_index, report.last_term, report.entries) == (0, 59, 2, 60)
    assert report.corrupt_offset is None and report.index_mismatch_from is None
    assert report.later_files_holding_data == 0
    assert report.checkpoint["committedIndex"] == "55" and report.currterm is None
    assert report.as_json()["end_offset"] == 2 * 4096 + 6 * 148
    assert digest(tmp_path) == before


def test_verify_reports_damage_without_repairing_it(tmp_path):
    spans = build(tmp_path)
    write_at(tmp_path, "index", 40 * 32 + 8, b"\xff", CONFIG.index_file_size)
    pos, _ = spans[50]
    write_at(tmp_path, "data", pos + 60, b"torn", CONFIG.data_file_size)
    before = digest(tmp_path)
    report = verify(str(tmp_path))
    assert (report.last_index, report.corrupt_offset, report.index_mismatch_from) == (49, pos, 40)
    assert "bodyCrc" in report.reason
    assert digest(tmp_path) == before


def test_verify_sees_later_files_and_torn_tails(tmp_path):
    spans = build(tmp_path)
    pos, _ = spans[20]  # in the first data file: the next two hold data
    write_at(tmp_path, "data", pos, bytes(8), CONFIG.data_file_size)
    report = verify(str(tmp_path))
    assert (report.last_index, report.later_files_holding_data, report.corrupt_offset) == (19, 2, pos)
    assert "later data files" in report.reason
    other = tmp_path / "other"
    spans = build(other)
    pos, _ = spans[59]
    write_at(other, "data", pos, bytes(8), CONFIG.data_file_size)  # header start zeroed, the rest still there
    report = verify(str(other))
    assert (report.last_index, report.corrupt_offset) == (58, pos)
    assert "torn tail" in report.reason


def test_verify_an_empty_or_missing_store(tmp_path):
    DLedgerMmapFileStore.open(str(tmp_path), CONFIG).close()
    report = verify(str(tmp_path))
    assert (report.data_files, report.last_index, report.reason) == (0, -1, "no data files")
    with pytest.raises(StoreError, match="no such directory"):
        verify(str(tmp_path / "missing"))


def test_iter_entries_walks_the_data_files(tmp_path):
    spans = build(tmp_path)
    walked = [(header.index, header.term, header.pos, body) for header, body in iter_entries(str(tmp_path))]
    assert walked == [(e.index, e.term, pos, e.body) for e, (pos, _) in zip(ENTRIES, spans)]
    assert [h.index for h, _ in iter_entries(str(tmp_path), from_pos=spans[55][0])] == [55, 56, 57, 58, 59]
    with pytest.raises(codec.EntryFormatError):
        list(iter_entries(str(tmp_path), from_pos=spans[55][0] + 1))
    write_at(tmp_path, "data", spans[30][0] + 1, b"\x55", CONFIG.data_file_size)
    with pytest.raises(codec.EntryFormatError):
        list(iter_entries(str(tmp_path)))
