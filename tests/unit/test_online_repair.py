"""The pure parts of online repair: which peer a damaged range is fetched from, and how much of
what a peer sent replaces it (whole valid records from the range's start to a record boundary at
or past its end; anything else refused, never an unexpected exception)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import record as rec
from commitlog.config import StoreConfig
from commitlog.damage import DamagedRange
from commitlog.store import MessageStore
from hasvc.broker.online_repair import RepairRefused, repair_sources, usable_size
from hasvc.state.replication import SlaveProgress

SEGMENT_SIZE = 64 * 1024
CRC = rec.CRC_FUNCTIONS["crc32c"]


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """(the first segment's bytes, the records' offsets in it, its written end)."""
    store = MessageStore.open(str(tmp_path_factory.mktemp("s")), StoreConfig(commitlog_segment_size=SEGMENT_SIZE))
    offsets = [store.append([rec.Message(topic="T", body=b"%05d" % n * (n % 7 + 1), queue_id=0)]).offsets[0] for n in range(200)]
    first = store.commit_log.mapped_file_queue.mapped_files[0]
    data = bytes(first.view()[: first.wrote_position])
    store.close()
    return data, [o for o in offsets if o < len(data)], len(data)


def _range(start, end):
    return DamagedRange("00000000000000000000", start, end, "body CRC mismatch")


def test_a_range_of_whole_records_is_replaced_exactly(log):
    data, offsets, _ = log
    damage = _range(offsets[10], offsets[11])
    assert usable_size(data[offsets[10] :], damage, segment_end=SEGMENT_SIZE, crc_function=CRC) >= offsets[11] - offsets[10]
    assert usable_size(data[offsets[10] : offsets[11]], damage, segment_end=SEGMENT_SIZE, crc_function=CRC) == offsets[11] - offsets[10]


def test_a_range_whose_end_is_a_guess_is_replaced_to_the_next_boundary(log):
    data, offsets, _ = log
    damage = _range(offsets[10], offsets[11] - 5)  # a damaged size word said 5 bytes less
    fetched = data[offsets[10] : offsets[12] + 3]  # the fetch went on into the record after next
    assert usable_size(fetched, damage, segment_end=SEGMENT_SIZE, crc_function=CRC) == offsets[12] - offsets[10]


def test_bytes_that_fail_their_checks_or_fall_short_are_refused(log):
    data, offsets, _ = log
    damage = _range(offsets[10], offsets[12])
    broken = bytearray(data[offsets[10] : offsets[12]])
    broken[offsets[11] - offsets[10] + 90] ^= 1  # a body byte of the second record
    with pytest.raises(RepairRefused, match="fail at offset"):
        usable_size(bytes(broken), damage, segment_end=SEGMENT_SIZE, crc_function=CRC)
    with pytest.raises(RepairRefused, match="only"):
        usable_size(data[offsets[10] : offsets[11]], damage, segment_end=SEGMENT_SIZE, crc_function=CRC)
    shifted = _range(offsets[10] + 4, offsets[12])  # not a record start: its PHYSICALOFFSET or size cannot check
    with pytest.raises(RepairRefused):
        usable_size(data[offsets[10] + 4 : offsets[12] + 4], shifted, segment_end=SEGMENT_SIZE, crc_function=CRC)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=4096), start=st.integers(0, 1 << 20), length=st.integers(0, 4096))
def test_any_bytes_a_peer_sends_give_a_size_or_a_refusal(data, start, length):
    damage = _range(start, start + length)
    try:
        size = usable_size(data, damage, segment_end=start + 1024 * 1024, crc_function=CRC)
    except RepairRefused:
        return
    assert length <= size <= len(data)


def _slave(name, ack, address="127.0.0.1:1"):
    return SlaveProgress(connection_id=hash(name), slave_id=name, address=address, connected_since=0.0, ack_offset=ack)


def test_a_master_asks_the_slaves_that_hold_the_range_most_advanced_first_and_a_slave_its_master():
    damage = _range(1000, 2000)
    slaves = [_slave("a", 1500, "A:1"), _slave("b", 5000, "B:1"), _slave("c", 2000, "C:1"), _slave("d", 9000, "")]
    assert repair_sources(damage, is_slave=False, master_client_address=None, slaves=slaves) == ["B:1", "C:1"]
    assert repair_sources(damage, is_slave=True, master_client_address="M:1", slaves=slaves) == ["M:1"]
    assert repair_sources(damage, is_slave=True, master_client_address=None, slaves=[]) == []
