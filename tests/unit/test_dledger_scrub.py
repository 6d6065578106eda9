"""The DLedger scrub (``commitlog.scrub.EntryScrubber``) checks every entry of every data file --
recovery re-checks only the newest ones -- and a damaged entry is rewritten from a healthy
member's copy (``DLedgerMessageStore.repair_entry``), never cut. The healthy copy here is a copy
of the store taken before the damage (members' data files are byte-identical)."""

import os
import shutil

import pytest

from commitlog import native
from commitlog.dledger import entry_codec as codec
from commitlog.mapped_file import StoreError
from commitlog.scrub import EntryScrubber
from tests.unit.test_dledger_message_store import lead, message, noop, open_store, pulled


def _data_dir(path) -> str:
    return os.path.join(str(path), "dledger-n0", "data")


def _index_file(path) -> str:
    directory = os.path.join(str(path), "dledger-n0", "index")
    return os.path.join(directory, sorted(os.listdir(directory))[0])


def _healthy_and_damaged(tmp_path, count=200):
    """A store of ``count`` committed messages over many small data files, closed cleanly, and
    a byte-identical copy of it (the healthy member)."""
    damaged, healthy = tmp_path / "damaged", tmp_path / "healthy"
    store = open_store(damaged)
    noop(store, 1)
    for i in range(count):
        lead(store, [message(i, i % 2, 100)])
    store.close()
    shutil.copytree(damaged, healthy)
    return damaged, healthy


def _entry(store, index):
    pos, size = store.entries.entry_span(index)
    return pos, size


def _flip(path: str, position: int, bit: int = 0x01) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        byte = file.read(1)[0]
        file.seek(position)
        file.write(bytes([byte ^ bit]))


def _scrub_pass(scrubber, bytes_max=1500):
    damaged, steps = [], 0
    while not (step := scrubber.step(bytes_max)).pass_completed:
        damaged += step.damaged
        for damage in step.damaged:
            scrubber.skip(damage)
        steps += 1
        assert steps < 100_000
    return damaged


def _fetch(healthy, index) -> bytes:
    """The entry as the healthy member's READ would serve it (its stored bytes)."""
    store = open_store(healthy)
    try:
        pos, size = _entry(store, index)
        return bytes(store.read(pos, size))
    finally:
        store.close()


def _data_files(path) -> dict[str, bytes]:
    directory = _data_dir(path)
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


@pytest.mark.parametrize("where", ["message body", "entry term", "entry size", "entry pos", "record header"])
def test_damage_in_an_old_data_file_is_found_by_the_scrub_and_repaired_from_a_healthy_copy(tmp_path, where):
    damaged, healthy = _healthy_and_damaged(tmp_path)
    files = sorted(os.listdir(_data_dir(damaged)))
    assert len(files) >= 6  # the damage goes into the first, recovery scans the last 3 (or so)
    store = open_store(damaged)
    index = 5  # an entry of the first data file
    pos, size = _entry(store, index)
    assert pos < 4096 <= store.entries.recovery.start_offset  # in the first data file, which recovery skips
    store.close()
    first_file = os.path.join(_data_dir(damaged), files[0])
    if where == "message body":
        _flip(first_file, pos + size - 10)  # the message's properties: the entry's bodyCrc fails too
    elif where == "entry term":
        _flip(first_file, pos + 23)  # the term: under no CRC, only the index unit tells
    elif where == "entry size":
        _flip(first_file, pos + 6, 0x02)  # the size word: 512 bytes more
    elif where == "entry pos":
        _flip(first_file, pos + 30, 0x10)  # pos: under no CRC either
    else:
        _flip(first_file, pos + codec.BODY_OFFSET + 20)  # the record's QUEUEOFFSET: bodyCrc fails
    store = open_store(damaged)
    try:
        assert store.damaged == []  # recovery did not look there
        scrubber = EntryScrubber(store)
        (damage,) = _scrub_pass(scrubber)
        assert (damage.file, damage.from_offset, damage.to_offset, damage.index) == (first_file, pos, pos + size, index)
        assert damage.reason.startswith(f"entry {index}: ")
        assert scrubber.statistics.passes == 1 and scrubber.statistics.damaged_found == 1
        assert f"{files[0]} offsets [{pos}, {pos + size}) (index {index}): entry {index}" in damage.describe()
        # The broker's route: noted (STATUS damaged), fetched from a healthy member, rewritten.
        assert store.record_damage(damage) and store.damaged == [damage]
        rewritten = store.repair_entry(index, pos, _fetch(healthy, index))
        assert rewritten and "entry bytes" in rewritten[0]
        assert store.damaged == []
        assert _scrub_pass(scrubber) == []
        assert [bytes(b) for _, b in pulled(store, 1)] == [bytes([i % 256]) * 100 for i in range(1, 200, 2)]
    finally:
        store.close()
    assert _data_files(damaged) == _data_files(healthy)


@pytest.mark.parametrize("field", [31, 10, 15])  # the unit's term, pos, size
def test_a_damaged_index_unit_is_found_and_rewritten_from_the_healthy_copy(tmp_path, field):
    damaged, healthy = _healthy_and_damaged(tmp_path)
    store = open_store(damaged)
    pos, size = _entry(store, 3)
    store.close()
    _flip(_index_file(damaged), 3 * codec.INDEX_UNIT_SIZE + field)  # a field of entry 3's unit
    store = open_store(damaged)
    try:
        scrubber = EntryScrubber(store)
        (damage,) = _scrub_pass(scrubber)
        assert damage.index == 3 and damage.from_offset == pos and damage.to_offset == pos + size
        assert store.repair_entry(3, pos, _fetch(healthy, 3)) == (f"the index unit in {_index_file(damaged)}",)
        assert _scrub_pass(scrubber) == []
    finally:
        store.close()
    with open(_index_file(damaged), "rb") as ours, open(_index_file(healthy), "rb") as theirs:
        assert ours.read() == theirs.read()


def test_a_copy_that_is_not_the_same_entry_is_refused_and_nothing_is_written(tmp_path):
    damaged, healthy = _healthy_and_damaged(tmp_path, count=60)
    store = open_store(damaged)
    pos, size = _entry(store, 7)
    store.close()
    first_file = os.path.join(_data_dir(damaged), sorted(os.listdir(_data_dir(damaged)))[0])
    _flip(first_file, pos + size - 5)
    before = _data_files(damaged)
    good = _fetch(healthy, 7)
    store = open_store(damaged)
    try:
        other_term = codec.encode_entry(index=7, term=9, pos=pos, body=good[codec.BODY_OFFSET :])
        with pytest.raises(StoreError, match="term 9"):
            store.repair_entry(7, pos, other_term)  # another term: not the entry this log holds
        bad_body = bytearray(good)
        bad_body[-3] ^= 0x10
        with pytest.raises(StoreError, match="bodyCrc mismatch"):
            store.repair_entry(7, pos, bytes(bad_body))  # the peer's copy is damaged too
        with pytest.raises(StoreError, match="not a committed entry"):
            store.repair_entry(store.entries.last_index() + 1, pos, good)
        with pytest.raises(StoreError, match="is entry 7 at"):
            store.repair_entry(8, pos, good)
    finally:
        store.close()
    assert _data_files(damaged) == before


def test_a_copy_whose_message_fails_its_crc_is_refused(tmp_path):
    """bodyCrc 0 (DLedger's own files): the message's body CRC still decides."""
    damaged, _healthy = _healthy_and_damaged(tmp_path, count=20)
    store = open_store(damaged)
    try:
        pos, size = _entry(store, 4)
        good = bytes(store.read(pos, size))
        body = bytearray(good[codec.BODY_OFFSET :])
        body[len(body) // 2] ^= 0x02  # a byte of the message's body: its body CRC fails
        header = codec.ENTRY_HEADER.pack(codec.MAGIC_1, size, 4, 1, pos, 0, 0, 0, len(body))
        with pytest.raises(StoreError, match="the message in the copy fetched"):
            store.repair_entry(4, pos, header + bytes(body))
    finally:
        store.close()


def test_the_scrub_walks_every_entry_with_or_without_the_native_module(tmp_path, monkeypatch):
    damaged, _healthy = _healthy_and_damaged(tmp_path, count=80)
    store = open_store(damaged)
    try:
        scrubber = EntryScrubber(store)
        assert _scrub_pass(scrubber, bytes_max=700) == []
        assert scrubber.statistics.entries_checked == store.entries.last_index() + 1
        monkeypatch.setattr(native, "check_entries", None)
        monkeypatch.setattr(native, "index_units", None)
        monkeypatch.setattr(native, "check_spans", None)
        scrubber = EntryScrubber(store)
        assert _scrub_pass(scrubber, bytes_max=10**6) == []
        assert scrubber.statistics.entries_checked == store.entries.last_index() + 1
    finally:
        store.close()


def test_an_entry_without_a_body_crc_is_checked_by_its_messages_crc(tmp_path):
    """bodyCrc 0 (what DLedger itself writes): the entry's own check passes a flipped body byte;
    the message's body CRC, checked as a read checks it, finds it."""
    damaged, healthy = _healthy_and_damaged(tmp_path, count=60)
    store = open_store(damaged)
    pos, size = _entry(store, 6)
    store.close()
    first_file = os.path.join(_data_dir(damaged), sorted(os.listdir(_data_dir(damaged)))[0])
    with open(first_file, "r+b") as file:
        file.seek(pos + 40)
        file.write(bytes(4))  # bodyCrc 0: not computed
    _flip(first_file, pos + size - 60)  # a byte of the message's body
    store = open_store(damaged)
    try:
        scrubber = EntryScrubber(store)
        (damage,) = _scrub_pass(scrubber)
        assert damage.index == 6 and "its message: body CRC" in damage.reason, damage
        store.repair_entry(6, pos, _fetch(healthy, 6))
        assert _scrub_pass(scrubber) == []
    finally:
        store.close()
    assert _data_files(damaged) == _data_files(healthy)


def test_damage_a_read_found_is_mapped_to_its_entry_and_repaired(tmp_path):
    damaged, healthy = _healthy_and_damaged(tmp_path, count=60)
    store = open_store(damaged)
    pos, size = _entry(store, 9)  # message 8: queue 0, queue offset 4
    store.close()
    first_file = os.path.join(_data_dir(damaged), sorted(os.listdir(_data_dir(damaged)))[0])
    _flip(first_file, pos + size - 80)
    store = open_store(damaged)
    try:
        with pytest.raises(Exception, match="DAMAGED|damaged|CRC"):
            store.pull("T", 0, 4, 1)
        (damage,) = store.damaged
        assert damage.from_offset == pos + codec.BODY_OFFSET and damage.index == -1
        assert store.damaged_entry(damage) == (9, pos)
        store.repair_entry(9, pos, _fetch(healthy, 9))
        assert store.damaged == [] and [bytes(r.body) for r in store.pull("T", 0, 4, 1)] == [bytes([8]) * 100]
    finally:
        store.close()
    assert _data_files(damaged) == _data_files(healthy)
