"""``commitlog.dledger.member_repair``: a stopped member's store that its recovery refuses is
repaired entry by entry from a healthy member's bytes (here: a byte-identical copy taken before
the damage, read as READ serves it), or its loss accepted; nothing is written from a copy that
does not check."""

import os
import shutil

import pytest

from commitlog.dledger import DLedgerMmapFileStore, DLedgerStoreConfig, Entry
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.member_repair import MemberRepairError, accept_member_loss, repair_member_from
from commitlog.dledger.upgrade import dledger_directory
from commitlog.mapped_file import StoreError

CONFIG = DLedgerStoreConfig(data_file_size=4096, index_file_size=32 * 64)
ENTRIES = [Entry(i, 1 + i // 20, bytes([i]) * (100 + i * 37 % 300)) for i in range(60)]


def _build(root) -> str:
    directory = dledger_directory(str(root), "n0")
    store = DLedgerMmapFileStore.open(directory, CONFIG)
    store.append(ENTRIES)
    store.update_committed_index(len(ENTRIES) - 1)
    store.close()
    return directory


def _files(directory: str) -> dict[str, bytes]:
    data = os.path.join(directory, "data")
    return {name: open(os.path.join(data, name), "rb").read() for name in sorted(os.listdir(data))}


def _fetch_from(directory: str):
    """READ as a healthy member serves it: its data bytes from a data offset."""
    files = _files(directory)

    def fetch(offset: int, size_max: int) -> bytes:
        name = f"{offset - offset % CONFIG.data_file_size:020d}"
        data = files.get(name, b"")
        position = offset % CONFIG.data_file_size
        return data[position : position + size_max]

    return fetch


def _entry_at(directory: str, index: int) -> tuple[str, int, int]:
    """(data file path, position, size) of entry ``index``, found by walking the data files."""
    for name, data in _files(directory).items():
        position = 0
        while position + 8 <= len(data) and codec.peek_blank(data, position) is None and any(data[position : position + 8]):
            header = codec.decode_entry_header(data, position)
            if header.index == index:
                return os.path.join(directory, "data", name), position, header.size
            position += header.size
    raise AssertionError(index)


def _flip(path: str, position: int, bit: int = 0x01) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        byte = file.read(1)[0]
        file.seek(position)
        file.write(bytes([byte ^ bit]))


@pytest.fixture
def stores(tmp_path):
    damaged = _build(tmp_path / "damaged")
    healthy = str(tmp_path / "healthy")
    shutil.copytree(damaged, healthy)
    return damaged, healthy


@pytest.mark.parametrize("where", ["body", "term raised", "term lowered"])
def test_a_damaged_entry_is_rewritten_from_the_healthy_copy(stores, where):
    damaged, healthy = stores
    path, position, size = _entry_at(damaged, 55)  # in a data file recovery scans
    offset = {"body": codec.BODY_OFFSET + 5, "term raised": 19, "term lowered": 23}[where]  # term: bytes 16..23
    _flip(path, position + offset)  # entry 55's term is 3: 2**32 + 3, or 2
    with pytest.raises(StoreError, match="recovery refuses"):
        DLedgerMmapFileStore.open(damaged, CONFIG).close()
    root = os.path.dirname(damaged)
    report = repair_member_from(root, "n0", _fetch_from(healthy))
    (repaired,) = report.repaired
    assert repaired.index == 55 and repaired.from_offset == int(os.path.basename(path)) + position
    assert report.bytes_written == size
    assert _files(damaged) == _files(healthy)
    store = DLedgerMmapFileStore.open(damaged, CONFIG)
    try:
        assert store.last_index() == 59 and store.damaged == []
    finally:
        store.close()
    assert repair_member_from(root, "n0", _fetch_from(healthy)).repaired == ()  # nothing left to do


def test_a_lost_tail_below_the_flushed_index_is_rewritten_entry_by_entry(stores):
    damaged, healthy = stores
    path, position, _size = _entry_at(damaged, 57)
    with open(path, "r+b") as file:  # the writes of entries 57.. lost (their index units kept)
        file.seek(position)
        file.write(bytes(CONFIG.data_file_size - position))
    report = repair_member_from(os.path.dirname(damaged), "n0", _fetch_from(healthy))
    assert [d.index for d in report.repaired] == [57, 58, 59]
    assert _files(damaged) == _files(healthy)


def test_a_copy_that_is_not_this_store_s_entry_is_refused_and_nothing_is_written(stores, tmp_path):
    damaged, _healthy = stores
    other = dledger_directory(str(tmp_path / "other"), "n0")  # another log: other terms
    store = DLedgerMmapFileStore.open(other, CONFIG)
    store.append([Entry(e.index, e.term + 7, e.body) for e in ENTRIES])
    store.close()
    path, position, _size = _entry_at(damaged, 55)
    _flip(path, position + codec.BODY_OFFSET + 5)
    before = _files(damaged)
    with pytest.raises(MemberRepairError, match=r"entry 55 at offset \d+ .*is not what this store's header or index unit say"):
        repair_member_from(os.path.dirname(damaged), "n0", _fetch_from(other))
    assert _files(damaged) == before


def test_a_peer_that_holds_nothing_there_is_named(stores, tmp_path):
    damaged, _healthy = stores
    path, position, _size = _entry_at(damaged, 55)
    _flip(path, position + codec.BODY_OFFSET + 5)
    with pytest.raises(MemberRepairError, match="the peer holds no entry at offset"):
        repair_member_from(os.path.dirname(damaged), "n0", lambda offset, size_max: b"")


def test_accepting_the_loss_ends_the_log_at_its_last_good_entry(stores):
    damaged, _healthy = stores
    path, position, _size = _entry_at(damaged, 55)
    _flip(path, position + codec.BODY_OFFSET + 5)
    loss = accept_member_loss(os.path.dirname(damaged), "n0")
    assert loss.last_index == 54 and loss.lost_entries == 5 and [d.index for d in loss.damaged] == [55]
    store = DLedgerMmapFileStore.open(damaged, CONFIG)  # opens without a setting now
    try:
        assert store.last_index() == 54 and store.load_hard_state().catch_up_index == -1
    finally:
        store.close()
