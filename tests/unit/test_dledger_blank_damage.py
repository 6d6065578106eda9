"""A damaged blank record (the padding at a DLedger data file's end) is found and written again,
by recovery (the newest data files) and by the scrub (every data file): a blank is fully
determined by where it lies, and the next data file's first entry says one lies there. Nothing is
cut, no catch-up, no other copy needed; the files end as they were."""

import dataclasses
import os
import shutil

import pytest

from commitlog.dledger import DLedgerMmapFileStore, DLedgerStoreConfig, Entry
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.inspect import verify
from commitlog.scrub import EntryScrubber
from tests.unit.test_dledger_scrub import _data_dir, _data_files, _flip, _healthy_and_damaged, _scrub_pass
from tests.unit.test_dledger_message_store import open_store

CONFIG = DLedgerStoreConfig(data_file_size=4096, index_file_size=32 * 64)
ENTRIES = [Entry(i, 1 + i // 20, bytes([i]) * (100 + i * 37 % 300)) for i in range(60)]
# where in the blank a byte is flipped: its magic, its size word, its padding
WHERE = {"magic": (0, 0x01), "size": (6, 0x01), "padding": (20, 0x40)}


def _blank_position(path: str, file_size: int) -> int:
    """Where the blank record of the data file at ``path`` starts (its entries walked by size)."""
    with open(path, "rb") as file:
        data = file.read()
    position = 0
    while codec.peek_blank(data, position) is None:
        position += codec.decode_entry_header(data, position).size
    assert position > 0 and file_size - position > 40, position  # room for a padding byte to flip
    return position


def _files(directory: str) -> dict[str, bytes]:
    data = os.path.join(directory, "data")
    return {name: open(os.path.join(data, name), "rb").read() for name in sorted(os.listdir(data))}


@pytest.mark.parametrize("config", [CONFIG, dataclasses.replace(CONFIG, recovery_repair_from_peers=True)],
                         ids=["refusing", "repairing"])  # fmt: skip
@pytest.mark.parametrize("where", sorted(WHERE))
def test_recovery_writes_a_damaged_blank_again_and_cuts_nothing(tmp_path, where, config):
    directory = str(tmp_path / "store")
    store = DLedgerMmapFileStore.open(directory, CONFIG)
    store.append(ENTRIES)
    store.update_committed_index(len(ENTRIES) - 1)
    store.close()
    before = _files(directory)
    names = sorted(before)
    assert len(names) >= 3
    damaged_file = os.path.join(directory, "data", names[-2])  # a file recovery scans, before the last
    position = _blank_position(damaged_file, CONFIG.data_file_size)
    offset, bit = WHERE[where]
    _flip(damaged_file, position + offset, bit)
    report = verify(directory)
    assert report.corrupt_offset == int(names[-2]) + position, report
    store = DLedgerMmapFileStore.open(directory, config)
    try:
        assert store.last_index() == len(ENTRIES) - 1  # nothing cut
        assert store.damaged == [] and store.load_hard_state().catch_up_index == -1
        (blank,) = store.recovery.blanks_rewritten
        assert (blank.file, blank.from_offset) == (damaged_file, int(names[-2]) + position)
        assert blank.reason.startswith("blank record: ")
        assert [e.body for e in store.read(0, len(ENTRIES), size_max=1 << 20)] == [e.body for e in ENTRIES]
    finally:
        store.close()
    assert _files(directory) == before
    assert verify(directory).corrupt_offset is None


@pytest.mark.parametrize("where", sorted(WHERE))
def test_the_scrub_writes_a_damaged_blank_in_an_old_data_file_again(tmp_path, where):
    damaged, healthy = _healthy_and_damaged(tmp_path)
    files = sorted(os.listdir(_data_dir(damaged)))
    first_file = os.path.join(_data_dir(damaged), files[0])  # recovery does not scan it
    position = _blank_position(first_file, 4096)
    offset, bit = WHERE[where]
    _flip(first_file, position + offset, bit)
    store = open_store(damaged)
    try:
        assert store.damaged == [] and store.entries.recovery.start_offset >= 4096  # recovery did not look there
        scrubber = EntryScrubber(store)
        assert _scrub_pass(scrubber) == []  # no damaged entry: nothing to fetch from a peer
        assert scrubber.statistics.blanks_rewritten == 1
        assert _scrub_pass(scrubber) == [] and scrubber.statistics.blanks_rewritten == 1
    finally:
        store.close()
    assert _data_files(damaged) == _data_files(healthy)


def test_a_whole_entry_is_never_taken_for_a_blank(tmp_path):
    """Damage in the last entry of a data file (bodyCrc fails) is not a blank: the next file's
    first entry follows the damaged one, not the last good one. Refused, as before."""
    directory = str(tmp_path / "store")
    store = DLedgerMmapFileStore.open(directory, CONFIG)
    store.append(ENTRIES)
    store.close()
    names = sorted(_files(directory))
    damaged_file = os.path.join(directory, "data", names[-2])
    position = _blank_position(damaged_file, CONFIG.data_file_size)
    with open(damaged_file, "rb") as file:
        data = file.read()
    last = 0
    while last + codec.decode_entry_header(data, last).size < position:
        last += codec.decode_entry_header(data, last).size
    _flip(damaged_file, last + codec.BODY_OFFSET + 3)  # the body of the file's last entry
    from commitlog.mapped_file import StoreError

    with pytest.raises(StoreError, match="bodyCrc mismatch"):
        DLedgerMmapFileStore.open(directory, CONFIG)
    shutil.rmtree(directory)
