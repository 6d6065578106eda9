"""The record CRC tail (``append_record_crc``, RocketMQ's ``enabledAppendPropCRC``): its bytes,
the native and Python encoders and scans agreeing on it, and a flipped header bit found wherever
records are checked (scan, recovery, verify, scrub, reads), while records without a tail check as
before."""

import os
import struct
import zlib

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import inspect
from commitlog import native
from commitlog import record as rec
from commitlog.commit_log import DamagedLogError, ReadError
from commitlog.config import StoreConfig
from commitlog.mapped_file import segment_name
from commitlog.scan import ScanCode, _scan_python, scan_segment
from commitlog.scrub import Scrubber
from commitlog.store import MessageStore
from tests.sizes import SEGMENT_SIZE

STORE_IP = bytes([10, 0, 0, 7])
STORE_TIMESTAMP = 1_700_000_000_123


def encode(message: rec.Message, *, offset: int = 0, queue_offset: int = 0, crc=crc32c.crc32c, record_crc=True) -> bytes:
    prepared = rec.prepare_message(message, crc_function=crc, record_crc=record_crc)
    buffer = bytearray(prepared.size)
    rec.write_record(
        buffer, 0, prepared, queue_offset=queue_offset, physical_offset=offset,
        store_timestamp=STORE_TIMESTAMP, store_ip=STORE_IP, store_port=10911,
    )  # fmt: skip
    return bytes(buffer)


def rocketmq_digits(crc: int) -> bytes:
    """MessageDecoder.createCrc32's loop, transcribed: ten digits, least significant first."""
    out = bytearray()
    for _ in range(10):
        digit = ord("0")
        if crc > 0:
            digit += crc % 10
            crc //= 10
        out.append(digit)
    return bytes(out)


def rocketmq_parse(value: str) -> int:
    """CommitLog.checkMessageAndReturnSize's parse of the __CRC32# value: right to left."""
    crc = 0
    for char in reversed(value):
        crc = crc * 10 + (ord(char) - ord("0"))
    return crc


# -- bytes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("crc", [crc32c.crc32c, zlib.crc32], ids=["crc32c", "crc32"])
def test_the_tail_holds_the_crc_of_every_byte_before_it_least_significant_digit_first(crc):
    message = rec.Message("FooBar", b"Once, there was a chance for me!", queue_id=3, properties={"TAGS": "TAG1", "KEYS": "k"})
    data = encode(message, offset=4096, queue_offset=9, crc=crc)
    without = encode(message, offset=4096, queue_offset=9, crc=crc, record_crc=False)
    assert len(data) == len(without) + 20  # the properties already end with 0x02: no separator added
    assert struct.unpack_from(">i", data, 0)[0] == len(data)
    properties_size = len(rec.encode_properties(message.properties))
    properties_length_at = len(without) - 2 - properties_size
    assert data[4:properties_length_at] == without[4:properties_length_at]  # the rest is as without
    assert struct.unpack_from(">h", data, properties_length_at)[0] == properties_size + 20
    assert data[properties_length_at + 2 : -20] == without[properties_length_at + 2 :]
    expected_crc = crc(data[:-20]) & 0x7FFFFFFF
    assert data[-20:] == b"__CRC32#\x01" + str(expected_crc).zfill(10)[::-1].encode() + b"\x02"
    assert data[-11:-1] == rocketmq_digits(expected_crc)
    assert rocketmq_parse(data[-11:-1].decode()) == expected_crc
    record = rec.decode_record(data, crc_function=crc)
    assert record.properties == {"TAGS": "TAG1", "KEYS": "k"}  # the tail is not a user property
    assert record.record_crc == expected_crc
    assert record.queue_offset == 9 and record.physical_offset == 4096 and record.store_timestamp == STORE_TIMESTAMP


def test_rocketmq_digit_order_on_a_known_value():
    assert rec.record_crc_tail(1234567) == b"__CRC32#\x01" + b"7654321000" + b"\x02"
    assert rec.record_crc_tail(0) == b"__CRC32#\x01" + b"0" * 10 + b"\x02"
    assert rec.record_crc_tail(0x7FFFFFFF) == b"__CRC32#\x01" + b"7463847412" + b"\x02"
    assert rocketmq_digits(1234567) == b"7654321000"


@pytest.mark.parametrize(
    ("properties", "extra"),
    [(b"", 20), (b"TAGS\x01a\x02", 20), (b"TAGS\x01a", 21)],
    ids=["empty: the tail alone", "ends with 0x02", "a separator first"],
)
def test_the_tail_adds_a_separator_only_where_rocketmq_does(properties, extra):
    batch = rec.MessageBatch("T", [b"body"], properties=properties)
    plain = rec.prepare_batch(batch)
    sealed = rec.prepare_batch(batch, record_crc=True)
    assert sealed.total == plain.total + extra
    for use_native in {False, native.AVAILABLE}:
        buffer = bytearray(sealed.total)
        rec.write_batch(buffer, 0, sealed, queue_offset_first=0, physical_base=0, store_timestamp=1,
                        store_ip=STORE_IP, store_port=1, native=use_native)  # fmt: skip
        (properties_size,) = struct.unpack_from(">h", buffer, len(buffer) - 2 - len(properties) - extra)
        assert properties_size == len(properties) + extra
        stored = bytes(buffer[len(buffer) - properties_size :])
        assert stored[: len(properties)] == properties
        assert stored[len(properties) : -20] == (b"\x02" if extra == 21 else b"")
        assert stored[-20:] == rec.record_crc_tail(crc32c.crc32c(bytes(buffer[:-20])) & rec.CRC_MASK)
        assert rec.decode_record(buffer).properties == rec.decode_properties(properties)


def test_a_user_property_named_like_the_tail_is_not_shown():
    assert rec.decode_properties(b"A\x01b\x02__CRC32#\x010000000001\x02") == {"A": "b"}


# -- native and Python twins ------------------------------------------------------------------

batches = st.builds(
    rec.MessageBatch,
    topic=st.from_regex(r"[a-zA-Z0-9]{1,140}", fullmatch=True),
    bodies=st.lists(st.binary(max_size=200), min_size=1, max_size=8),
    queue_id=st.integers(0, 3),
    properties=st.one_of(
        st.just({}), st.just({"TAGS": "x"}), st.binary(max_size=30).filter(lambda b: b"__CRC32#" not in b),
        st.lists(st.sampled_from([b"", b"KEYS\x01k\x02", b"TAGS\x01\xc3\xa9", b"A\x01b"]), min_size=8, max_size=8),
    ),
    born_host=st.sampled_from([("127.0.0.1", 1), ("::1", 2)]),
    sysflag=st.sampled_from([0, rec.SYSFLAG_TRANSACTION_PREPARED]),
)


@pytest.mark.skipif(not native.AVAILABLE, reason="native module not built")
@given(batches, st.booleans())
def test_native_and_python_encoders_write_identical_sealed_records(batch, store_v6):
    if isinstance(batch.properties, list):
        batch.properties = batch.properties[: len(batch.bodies)]
    prepared = rec.prepare_batch(batch, store_v6=store_v6, record_crc=True)
    outputs = []
    for use_native in (True, False):
        buffer = bytearray(prepared.total + 16)
        written = rec.write_batch(
            buffer, 16, prepared, queue_offset_first=5, physical_base=1 << 20, store_timestamp=77,
            store_ip=bytes(16) if store_v6 else STORE_IP, store_port=9, native=use_native,
        )  # fmt: skip
        assert written == prepared.total
        outputs.append(bytes(buffer))
    assert outputs[0] == outputs[1]
    position = 16
    for size in prepared.sizes:  # every record's tail, computed independently
        record = outputs[0][position : position + size]
        assert record[-20:] == rec.record_crc_tail(crc32c.crc32c(record[:-20]) & rec.CRC_MASK)
        position += size
    result = scan_segment(outputs[0], start=16, end=len(outputs[0]), file_from_offset=1 << 20)
    assert result.count == len(batch.bodies) and result.code is ScanCode.END_OF_DATA


@pytest.mark.skipif(native.record_sizes is None, reason="native module not built")
@given(
    st.lists(st.binary(max_size=300), max_size=40),
    st.one_of(st.binary(max_size=40), st.lists(st.binary(max_size=40), max_size=40)),
    st.integers(0, 300),
)  # fmt: skip
def test_native_and_python_record_sizes_agree_with_the_tail(bodies, properties, fixed):
    def outcome(function):
        try:
            return function(bodies, properties, fixed, True)
        except ValueError as error:
            return str(error)

    assert outcome(native.record_sizes) == outcome(rec.record_sizes_python)


messages = st.builds(
    rec.Message,
    topic=st.from_regex(r"[a-zA-Z0-9_%|-]{1,140}", fullmatch=True),
    body=st.binary(max_size=200),
    queue_id=st.integers(0, 7),
    properties=st.dictionaries(
        st.from_regex(r"[A-Z]{1,6}", fullmatch=True), st.text(max_size=12).filter(lambda v: "\x01" not in v and "\x02" not in v), max_size=3
    ),
    born_host=st.sampled_from([("127.0.0.1", 1), ("::1", 2), ("192.168.0.9", 3)]),
    reconsume_times=st.integers(0, 3),
)


def _log_of(messages_list, *, size=8192, record_crc=True):
    buffer = bytearray(size)
    starts = []
    position = 0
    for message in messages_list:
        data = encode(message, offset=position, record_crc=record_crc)
        if position + len(data) + 8 > size:
            break
        buffer[position : position + len(data)] = data
        starts.append(position)
        position += len(data)
    return buffer, starts, position


def _both_scans(buffer):
    python = _scan_python(buffer, start=0, end=len(buffer), file_from_offset=0, crc_function=crc32c.crc32c)
    if native.AVAILABLE:
        assert scan_segment(buffer, start=0, end=len(buffer), file_from_offset=0, native=True) == python
    return python


@settings(max_examples=300)
@given(st.lists(messages, min_size=1, max_size=6), st.data())
def test_a_flipped_bit_anywhere_in_a_sealed_record_stops_the_scan_at_that_record(messages_list, data):
    """Both scans, which agree; the flip's record is named by its offset. A flip in a header field
    the body CRC does not cover (queue id, flag, queue offset, timestamps, hosts, reconsume times,
    prepared offset, topic, properties, the tail) is a record CRC mismatch."""
    buffer, starts, end = _log_of(messages_list)
    assert _both_scans(buffer).position == end
    index = data.draw(st.integers(0, len(starts) - 1))
    start = starts[index]
    size = struct.unpack_from(">i", buffer, start)[0]
    at = data.draw(st.integers(0, size - 1))
    bit = data.draw(st.integers(0, 7))
    buffer[start + at] ^= 1 << bit
    result = _both_scans(buffer)
    assert not result.code.clean
    assert result.position == start and result.count == index
    sysflag = struct.unpack_from(">i", buffer, start + 36)[0]
    header = 48 + (20 if sysflag & 0x10 else 8) + 8 + (20 if sysflag & 0x20 else 8) + 12
    covered_by_the_tail_only = 12 <= at < 28 or 40 <= at < header
    if covered_by_the_tail_only:
        assert result.code is ScanCode.RECORD_CRC_MISMATCH, (at, result)
    with pytest.raises(rec.RecordError):
        rec.decode_record(buffer, start)


HEADER_FIELDS = {  # IPv4 hosts: (position, size)
    "QUEUEID": (12, 4), "FLAG": (16, 4), "QUEUEOFFSET": (20, 8), "SYSFLAG": (36, 4), "BORNTIMESTAMP": (40, 8),
    "BORNHOST": (48, 8), "STORETIMESTAMP": (56, 8), "STOREHOST": (64, 8), "RECONSUMETIMES": (72, 4),
    "PREPARED_TX_OFFSET": (76, 4),
}  # fmt: skip


@pytest.mark.parametrize("field", sorted(HEADER_FIELDS))
def test_each_header_field_flipped_is_a_record_crc_mismatch_and_without_the_tail_is_not_seen(field):
    position, size = HEADER_FIELDS[field]
    for record_crc, expected in ((True, ScanCode.RECORD_CRC_MISMATCH), (False, ScanCode.END_OF_DATA)):
        buffer, starts, end = _log_of([rec.Message("T", b"a" * 50, properties={"TAGS": "x"})] * 3, record_crc=record_crc)
        buffer[starts[1] + position + size - 1] ^= 0x04  # a low bit: SYSFLAG's host bits stay as they are
        result = _both_scans(buffer)
        assert result.code is expected, (field, record_crc)
        if record_crc:
            assert (result.position, result.count) == (starts[1], 1)
            assert result.reason.startswith("record CRC mismatch")
            with pytest.raises(rec.RecordError, match="record CRC mismatch"):
                rec.decode_record(buffer, starts[1])


def test_a_body_flip_in_a_sealed_record_is_still_named_a_body_crc_mismatch():
    buffer, starts, _ = _log_of([rec.Message("T", b"a" * 50)] * 2)
    buffer[starts[1] + 100] ^= 1
    assert _both_scans(buffer).code is ScanCode.BODY_CRC_MISMATCH


@pytest.mark.parametrize("at", range(-20, 0))
def test_a_flipped_bit_in_the_tail_itself_is_a_record_crc_mismatch(at):
    buffer, starts, end = _log_of([rec.Message("T", b"a" * 50, properties={"TAGS": "x"})] * 2)
    buffer[starts[1] + (end - starts[1]) + at] ^= 0x01
    result = _both_scans(buffer)
    assert (result.code, result.position) == (ScanCode.RECORD_CRC_MISMATCH, starts[1])


@given(st.lists(messages, max_size=6))
def test_records_without_the_tail_scan_and_decode_as_before(messages_list):
    buffer, starts, end = _log_of(messages_list, record_crc=False)
    result = _both_scans(buffer)
    assert (result.code, result.position, result.count) == (ScanCode.END_OF_DATA, end, len(starts))
    for start in starts:
        assert rec.decode_record(buffer, start).record_crc is None


# -- the store: recovery, verify, scrub, reads -------------------------------------------------


def _flip(root, offset: int, *, at: int, bits: int = 0x01) -> None:
    path = os.path.join(root, "commitlog", segment_name(offset - offset % SEGMENT_SIZE))
    with open(path, "r+b") as file:
        file.seek(offset % SEGMENT_SIZE + at)
        byte = file.read(1)[0]
        file.seek(offset % SEGMENT_SIZE + at)
        file.write(bytes([byte ^ bits]))


def _fill(store, count=120):
    results = []
    for i in range(count):
        result = store.append([rec.Message("T", bytes([i % 251]) * 300, queue_id=i % 2, properties={"TAGS": f"t{i % 3}"})])
        assert result.status is rec.PutMessageStatus.PUT_OK
        results.append(result)
    return results


def test_the_store_seals_records_by_default_and_not_with_the_setting_off(tmp_path, small_config):
    assert StoreConfig().append_record_crc is True
    with MessageStore.open(str(tmp_path / "on"), small_config) as store:
        [result] = _fill(store, 1)
        assert store.get_record(result.wrote_offset, check_crc=True).record_crc is not None
    off = StoreConfig(**{**small_config.__dict__, "append_record_crc": False})
    with MessageStore.open(str(tmp_path / "off"), off) as store:
        [result] = _fill(store, 1)
        assert store.get_record(result.wrote_offset, check_crc=True).record_crc is None
        # A message the batch path does not take (reconsume times) is sealed by write_record.
    with MessageStore.open(str(tmp_path / "single"), small_config) as store:
        result = store.append([rec.Message("T", b"x", reconsume_times=2, properties={"A": "b"})])
        record = store.get_record(result.wrote_offset, check_crc=True)
        assert record.record_crc is not None and record.properties == {"A": "b"} and record.reconsume_times == 2


def test_a_header_flip_after_a_clean_stop_is_refused_in_one_line_and_nothing_is_cut(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        results = _fill(store)
    victim = results[-20]  # in the newest segment: the clean restart's scan passes it
    _flip(tmp_path, victim.wrote_offset, at=20 + 7)  # the queue offset's low byte
    with pytest.raises(DamagedLogError) as caught:
        MessageStore.open(str(tmp_path), small_config)
    message = str(caught.value)
    assert "\n" not in message
    assert f"[{victim.wrote_offset}, {victim.next_offset})" in message and "record CRC mismatch" in message
    [damage] = caught.value.damaged
    assert (damage.from_offset, damage.to_offset) == (victim.wrote_offset, victim.next_offset)


def test_a_header_flip_below_the_flushed_offset_after_a_crash_is_refused(tmp_path, small_config):
    store = MessageStore.open(str(tmp_path), small_config)
    results = _fill(store)
    store.flush_commitlog(0)
    store.write_checkpoint()
    store.close(clean=False)
    victim = results[-10]
    _flip(tmp_path, victim.wrote_offset, at=56 + 7)  # the store timestamp
    with pytest.raises(DamagedLogError, match="record CRC mismatch.*below the checkpoint's flushed offset"):
        MessageStore.open(str(tmp_path), small_config)


def test_reads_refuse_a_header_flip_and_verify_names_it(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        results = _fill(store)
        store.dispatch()
        victim = results[30]
        segment = store.commit_log.mapped_file_queue.find_mapped_file_by_offset(victim.wrote_offset)
        segment.view()[victim.wrote_offset - segment.file_from_offset + 12 + 3] ^= 0x02  # the queue id
        with pytest.raises(ReadError, match="record CRC mismatch"):
            store.get_record(victim.wrote_offset, check_crc=True)
        assert store.get_record(results[29].wrote_offset, check_crc=True).queue_id == 29 % 2
    report = inspect.verify(str(tmp_path))
    assert report.corrupt_offset == victim.wrote_offset
    assert report.reason.startswith("record CRC mismatch")
    flagged = {offset: ok for offset, _record, ok in inspect.iter_records(str(tmp_path), from_offset=results[29].wrote_offset)
               if offset <= victim.wrote_offset}  # fmt: skip
    assert flagged == {results[29].wrote_offset: True, victim.wrote_offset: False}


def test_the_scrubber_reports_a_header_flip_with_its_segment_and_offset(tmp_path, small_config):
    store = MessageStore.open(str(tmp_path), small_config)
    try:
        results = _fill(store)
        store.dispatch()
        victim = results[50]
        segment = store.commit_log.mapped_file_queue.find_mapped_file_by_offset(victim.wrote_offset)
        segment.view()[victim.wrote_offset - segment.file_from_offset + 48 + 3] ^= 0x10  # the born host's address
        scrubber = Scrubber(store, crc_function=store.crc_function)
        damaged = []
        while True:
            step = scrubber.step(4096)
            damaged.extend(step.damaged)
            if step.pass_completed:
                break
        assert [(d.file, d.from_offset, d.to_offset) for d in damaged] == [(segment.path, victim.wrote_offset, victim.next_offset)]
        assert damaged[0].reason.startswith("record CRC mismatch")
    finally:
        store.close()


def test_a_store_of_records_without_the_tail_opens_verifies_and_reads_as_before(tmp_path, small_config):
    off = StoreConfig(**{**small_config.__dict__, "append_record_crc": False})
    with MessageStore.open(str(tmp_path), off) as store:
        old = _fill(store, 60)
    with MessageStore.open(str(tmp_path), small_config) as store:  # turned on: new records get it
        new = _fill(store, 60)
        assert store.get_record(old[0].wrote_offset, check_crc=True).record_crc is None
        assert store.get_record(new[0].wrote_offset, check_crc=True).record_crc is not None
    report = inspect.verify(str(tmp_path))
    assert report.corrupt_offset is None and report.records == 120
    with MessageStore.open(str(tmp_path), small_config) as store:
        assert store.commit_log.max_offset == new[-1].next_offset


# -- the read check (commitlog/read_check.py) --------------------------------------------------


@settings(max_examples=200)
@given(st.lists(messages, min_size=2, max_size=6), st.data())
def test_the_read_check_refuses_a_header_flip_native_and_python_alike(messages_list, data):
    from commitlog import read_check

    buffer, starts, end = _log_of(messages_list)
    spans = [(start, struct.unpack_from(">i", buffer, start)[0], 0) for start in starts]
    index = data.draw(st.integers(0, len(starts) - 1))
    start, size, _ = spans[index]
    at = data.draw(st.sampled_from([*range(12, 28), *range(40, 84)]))  # header fields only the tail covers (IPv4 or not)
    buffer[start + at] ^= 1 << data.draw(st.integers(0, 7))
    view = memoryview(bytes(buffer))
    python = read_check._check_spans_python(view, spans, 0, 0, crc32c.crc32c)
    if native.AVAILABLE:
        assert native.check_spans(view, spans, 0, 0, 2) == tuple(int(v) for v in python)
    for use_native in {False, native.AVAILABLE}:
        checked = read_check.read_records(lambda offset: (view, 0, "segment"), spans, crc_function=crc32c.crc32c,
                                          native=use_native)  # fmt: skip
        assert [bytes(v) for v in checked.views] == [bytes(view[s : s + n]) for s, n, _ in spans[:index]]
        assert checked.damage is not None and (checked.damage.from_offset, checked.damage.to_offset) == (start, start + size)
        assert checked.damage.reason != "body CRC mismatch"  # the header's damage, not the body's
        ranged = read_check.read_range(lambda o, n: view[o : o + n], lambda o: "segment", 0, len(view),
                                       crc_function=crc32c.crc32c, segment_end=len(view), native=use_native)  # fmt: skip
        assert ranged.damage is not None and ranged.damage.from_offset == start


def test_a_store_read_serves_the_records_before_a_header_flip_and_refuses_at_it(tmp_path, small_config):
    from commitlog.read_check import DamagedRecordError

    with MessageStore.open(str(tmp_path), small_config) as store:
        results = _fill(store, 40)
        store.dispatch()
        victim = results[20]
        segment = store.commit_log.mapped_file_queue.find_mapped_file_by_offset(victim.wrote_offset)
        segment.view()[victim.wrote_offset - segment.file_from_offset + 20 + 7] ^= 0x01  # its queue offset
        spans = [(r.wrote_offset, r.wrote_bytes) for r in results[18:23]]
        checked = store.read_records(spans)
        assert [bytes(v) for v in checked.views] == [bytes(store.read(o, n)) for o, n in spans[:2]]
        assert checked.damage.from_offset == victim.wrote_offset and checked.damage.reason.startswith("record CRC mismatch")
        assert store.read_checked(victim.wrote_offset, 1 << 16).damage.reason.startswith("record CRC mismatch")
        with pytest.raises(DamagedRecordError, match=f"record at offset {victim.wrote_offset} is damaged \\(record CRC mismatch"):
            store.get_record(victim.wrote_offset, check_crc=True)
        assert [d.from_offset for d in store.damaged] == [victim.wrote_offset]


def test_the_client_library_refuses_a_header_flip_on_arrival():
    from hasvc.client.connection import _checked_record
    from hasvc.client.results import DamagedRecordError as ClientDamagedRecordError

    data = bytearray(encode(rec.Message("T", b"body", properties={"TAGS": "a"}), offset=4096))
    assert _checked_record(bytes(data)).properties == {"TAGS": "a"}
    data[72 + 3] ^= 0x01  # RECONSUMETIMES
    with pytest.raises(ClientDamagedRecordError, match="record at offset 4096 failed its record CRC on arrival"):
        _checked_record(bytes(data))


@pytest.mark.skipif(native.module is None, reason="native module not built")
@given(st.integers(0, 3 * 8192 + 3 * 256 + 64), st.integers(0, 7), st.randoms(use_true_random=False))
def test_the_native_crc32c_in_three_streams_matches_the_package(size, skip, random):
    """The native CRC32C walks blocks of 3 x 256 and 3 x 8192 bytes as three chains joined by a
    shift: every length around those blocks, at every alignment, gives the package's CRC."""
    data = random.randbytes(size + skip)[skip:]
    assert native.module.crc32c(data) == crc32c.crc32c(data)


@pytest.mark.parametrize("lost", [1, 2, 11])
def test_a_tail_whose_digits_a_lost_write_zeroed_is_damage(lost):
    """The tail's name intact and its last bytes zero (a write that never reached the disk): the
    record was sealed, so it is damaged, not a record without a tail (both walks)."""
    buffer, starts, end = _log_of([rec.Message("T", b"a" * 50, properties={"TAGS": "x"})] * 2)
    buffer[end - lost : end] = bytes(lost)
    result = _both_scans(buffer)
    assert (result.code, result.position) == (ScanCode.RECORD_CRC_MISMATCH, starts[1])


@pytest.mark.parametrize("as_batch", [False, True])
def test_a_producer_cannot_send_the_tails_property(as_batch):
    """The name is the store's own: a producer's property of that name is refused (a value shaped
    like a tail could otherwise pass for a damaged one and make a store refuse to open)."""
    with pytest.raises(rec.MessageRejected, match="__CRC32#"):
        if as_batch:
            rec.prepare_batch(rec.MessageBatch("T", [b"x", b"y"], properties=b"__CRC32#\x01123456789X\x02"))
        else:
            rec.prepare_message(rec.Message("T", b"x", properties={"__CRC32#": "123456789X"}))
