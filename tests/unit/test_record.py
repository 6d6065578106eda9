import struct
import zlib

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitlog import native
from commitlog import record as rec
from commitlog.scan import ScanCode, _scan_python, scan_segment

GOLDEN_PROPERTIES = {"TAGS": "TAG1", "KEYS": "1700000000000"}


def encode(message: rec.Message, *, offset: int = 0, queue_offset: int = 0, crc=crc32c.crc32c, store_v6=False) -> bytes:
    prepared = rec.prepare_message(message, crc_function=crc)
    rec.with_store_host(prepared, store_v6=store_v6)
    buffer = bytearray(prepared.size)
    store_ip = bytes(16) if store_v6 else bytes([127, 0, 0, 1])
    rec.write_record(
        buffer, 0, prepared, queue_offset=queue_offset, physical_offset=offset,
        store_timestamp=1_700_000_000_123, store_ip=store_ip, store_port=10911,
    )  # fmt: skip
    return bytes(buffer)


def test_golden_record_is_158_bytes_as_in_rocketmq():
    message = rec.Message("FooBar", b"Once, there was a chance for me!", properties=GOLDEN_PROPERTIES)
    data = encode(message)
    assert len(data) == 158
    assert struct.unpack_from(">i", data, 0)[0] == 158
    assert struct.unpack_from(">I", data, 4)[0] == rec.MAGIC_V1
    assert rec.calc_record_size(body_size=32, topic_size=6, properties_size=29) == 158


def test_round_trip_keeps_every_field():
    message = rec.Message(
        "Orders", b"\x00body\xff", queue_id=3, flag=7, properties={"TAGS": "a", "KEYS": "k1 k2", "X": "y"},
        born_timestamp=123, born_host=("10.1.2.3", 4567), reconsume_times=2, prepared_transaction_offset=99,
    )  # fmt: skip
    data = encode(message, offset=4096, queue_offset=41)
    record = rec.decode_record(data)
    assert record.topic == "Orders"
    assert bytes(record.body) == b"\x00body\xff"
    assert (record.queue_id, record.flag, record.queue_offset, record.physical_offset) == (3, 7, 41, 4096)
    assert record.properties == {"TAGS": "a", "KEYS": "k1 k2", "X": "y"}
    assert record.born_host == ("10.1.2.3", 4567)
    assert record.store_host == ("127.0.0.1", 10911)
    assert (record.born_timestamp, record.store_timestamp) == (123, 1_700_000_000_123)
    assert (record.reconsume_times, record.prepared_transaction_offset) == (2, 99)
    assert record.tags == "a" and record.keys == "k1 k2"


def test_ipv6_hosts_add_twelve_bytes_each_and_set_sysflag_bits():
    message = rec.Message("T", b"x", born_host=("::1", 9))
    v4 = len(encode(rec.Message("T", b"x")))
    data = encode(message, store_v6=True)
    assert len(data) == v4 + 24
    record = rec.decode_record(data)
    assert record.sysflag & rec.SYSFLAG_BORNHOST_V6 and record.sysflag & rec.SYSFLAG_STOREHOST_V6
    assert record.born_host == ("::1", 9)


def test_topic_longer_than_127_bytes_uses_v2_magic_and_two_byte_length():
    topic = "t" * 128
    data = encode(rec.Message(topic, b"b"))
    assert struct.unpack_from(">I", data, 4)[0] == rec.MAGIC_V2
    assert len(data) == rec.calc_record_size(body_size=1, topic_size=128, properties_size=0, v2=True)
    assert rec.decode_record(data).topic == topic
    assert len(encode(rec.Message("t" * 127, b"b"))) == len(data) - 2  # V1: one length byte, one char fewer


def test_record_written_with_zlib_crc32_reads_with_the_crc32_option():
    data = encode(rec.Message("Rocket", b"payload"), crc=zlib.crc32)
    assert struct.unpack_from(">i", data, 8)[0] == zlib.crc32(b"payload") & 0x7FFFFFFF
    assert bytes(rec.decode_record(data, crc_function=zlib.crc32).body) == b"payload"
    with pytest.raises(rec.RecordError, match="CRC"):
        rec.decode_record(data, crc_function=crc32c.crc32c)


def test_java_string_hash_matches_java():
    assert rec.java_string_hash("") == 0
    assert rec.java_string_hash("hello") == 99162322
    assert rec.java_string_hash("TagA") == 2598919  # "TagA".hashCode()
    assert rec.java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00  # a surrogate pair
    assert rec.java_string_hash("polygenelubricants") == -2147483648  # overflow to Integer.MIN_VALUE


def test_properties_skip_malformed_segments_like_rocketmq():
    assert rec.decode_properties(b"A\x01b\x02\x01x\x02C\x01\x02D\x01dd\x02") == {"A": "b", "D": "dd"}
    assert rec.encode_properties({"TAGS": "x", "N": None}) == b"TAGS\x01x\x02"


@pytest.mark.parametrize(
    ("message", "status"),
    [
        (rec.Message("T", b"x" * (rec.BODY_SIZE_MAX_DEFAULT + 1)), rec.PutMessageStatus.MESSAGE_ILLEGAL),
        (rec.Message("t" * 256, b"x"), rec.PutMessageStatus.MESSAGE_ILLEGAL),
        (rec.Message("../etc", b"x"), rec.PutMessageStatus.MESSAGE_ILLEGAL),
        (rec.Message("", b"x"), rec.PutMessageStatus.MESSAGE_ILLEGAL),
        (rec.Message("T", b"x", properties={"K": "v" * 32767}), rec.PutMessageStatus.PROPERTIES_SIZE_EXCEEDED),
        (rec.Message("T", b"x", born_host=("not-an-ip", 1)), rec.PutMessageStatus.MESSAGE_ILLEGAL),
    ],
)
def test_invalid_messages_are_rejected_with_their_status(message, status):
    with pytest.raises(rec.MessageRejected) as raised:
        rec.prepare_message(message)
    assert raised.value.status is status


@given(st.binary(max_size=400), st.integers(min_value=0, max_value=64))
def test_decode_record_on_garbage_raises_record_error_only(data, position):
    try:
        rec.decode_record(data, position)
    except rec.RecordError:
        pass


@given(st.binary(max_size=400), st.integers(min_value=0, max_value=64))
def test_decode_dispatch_on_garbage_raises_record_error_only(data, position):
    try:
        rec.decode_dispatch(memoryview(data), position, len(data))
    except rec.RecordError:
        pass


messages = st.builds(
    rec.Message,
    topic=st.from_regex(r"[a-zA-Z0-9_%|-]{1,140}", fullmatch=True),
    body=st.binary(max_size=300),
    queue_id=st.integers(0, 7),
    properties=st.dictionaries(
        st.from_regex(r"[A-Z]{1,6}", fullmatch=True), st.text(max_size=12).filter(lambda v: "\x01" not in v and "\x02" not in v), max_size=3
    ),
    born_host=st.sampled_from([("127.0.0.1", 1), ("::1", 2), ("192.168.0.9", 3)]),
)


@given(messages)
def test_any_valid_message_round_trips(message):
    data = encode(message)
    record = rec.decode_record(data)
    assert bytes(record.body) == message.body
    assert record.topic == message.topic
    assert record.properties == {k: v for k, v in message.properties.items() if len(k) + len(v) >= 2 and v}


def _log_of(messages_list, *, base=0, size=8192):
    buffer = bytearray(size)
    position = 0
    for message in messages_list:
        data = encode(message, offset=base + position)
        if position + len(data) + 8 > size:
            break
        buffer[position : position + len(data)] = data
        position += len(data)
    return buffer, position


@pytest.mark.skipif(not native.AVAILABLE, reason="native module not built")
@given(st.lists(messages, max_size=12), st.lists(st.tuples(st.integers(0, 8191), st.integers(0, 255)), max_size=3),
       st.integers(0, 4096), st.booleans())  # fmt: skip
def test_native_and_python_scans_agree_on_corrupted_logs(messages_list, flips, truncate_at, blank):
    buffer, end = _log_of(messages_list)
    if blank and end:
        rec.write_blank(buffer, end, len(buffer) - end)
    for position, value in flips:
        buffer[position] = value
    if truncate_at < end:
        buffer[truncate_at:] = bytes(len(buffer) - truncate_at)
    for crc in (crc32c.crc32c, None):
        python = _scan_python(buffer, start=0, end=len(buffer), file_from_offset=0, crc_function=crc)
        fast = scan_segment(buffer, start=0, end=len(buffer), file_from_offset=0, crc_function=crc, native=True)
        assert fast == python


@given(st.lists(messages, max_size=10))
def test_scan_accepts_exactly_what_was_written(messages_list):
    buffer, end = _log_of(messages_list)
    result = scan_segment(buffer, start=0, end=len(buffer), file_from_offset=0)
    assert result.code is ScanCode.END_OF_DATA
    assert result.position == end


def test_scan_reports_each_kind_of_damage():
    buffer, end = _log_of([rec.Message("T", b"a" * 50), rec.Message("T", b"b" * 50)])
    second = rec.decode_record(buffer).size
    cases = {
        ScanCode.BODY_CRC_MISMATCH: lambda b: b.__setitem__(second + 100, b[second + 100] ^ 1),
        ScanCode.BAD_MAGIC: lambda b: b.__setitem__(second + 5, 0),
        ScanCode.SIZE_OUT_OF_BOUNDS: lambda b: struct.pack_into(">i", b, second, 10),
        ScanCode.FIELDS_DO_NOT_ADD_UP: lambda b: struct.pack_into(">i", b, second, struct.unpack_from(">i", b, second)[0] + 1),
        ScanCode.PHYSICAL_OFFSET_MISMATCH: lambda b: struct.pack_into(">q", b, second + 28, 1),
        ScanCode.BAD_BLANK: lambda b: rec.write_blank(b, end, 8),
    }
    for code, damage in cases.items():
        for use_native in {False, native.AVAILABLE}:
            damaged = bytearray(buffer)
            damage(damaged)
            result = scan_segment(damaged, start=0, end=len(damaged), file_from_offset=0, native=use_native)
            assert result.code is code, (code, use_native)
            assert result.count == (2 if code is ScanCode.BAD_BLANK else 1)


batches = st.builds(
    rec.MessageBatch,
    topic=st.from_regex(r"[a-zA-Z0-9]{1,140}", fullmatch=True),
    bodies=st.lists(st.binary(max_size=200), min_size=1, max_size=8),
    queue_id=st.integers(0, 3),
    properties=st.one_of(
        st.just({}), st.just({"TAGS": "x"}), st.lists(st.just({"KEYS": "k", "TAGS": "é"}), min_size=8, max_size=8)
    ),
    born_host=st.sampled_from([("127.0.0.1", 1), ("::1", 2)]),
    sysflag=st.sampled_from([0, rec.SYSFLAG_TRANSACTION_PREPARED]),
)


@pytest.mark.skipif(not native.AVAILABLE, reason="native module not built")
@given(batches, st.booleans())
def test_native_and_python_batch_encoders_write_identical_bytes(batch, store_v6):
    if isinstance(batch.properties, list):
        batch.properties = batch.properties[: len(batch.bodies)]
    prepared = rec.prepare_batch(batch, store_v6=store_v6)
    outputs = []
    for use_native in (True, False):
        buffer = bytearray(prepared.total + 16)
        written = rec.write_batch(
            buffer, 16, prepared, queue_offset_first=5, physical_base=1 << 20, store_timestamp=77,
            store_ip=bytes(16) if store_v6 else b"\x7f\x00\x00\x01", store_port=9, native=use_native,
        )  # fmt: skip
        assert written == prepared.total
        outputs.append(bytes(buffer))
    assert outputs[0] == outputs[1]
    result = scan_segment(outputs[0], start=16, end=len(outputs[0]), file_from_offset=(1 << 20))
    assert result.count == len(batch.bodies) and result.code is ScanCode.END_OF_DATA


tag_values = st.one_of(st.just(None), st.text(max_size=6).filter(lambda v: "\x01" not in v and "\x02" not in v))


@pytest.mark.skipif(not native.AVAILABLE, reason="native module not built")
@given(st.lists(st.tuples(messages, tag_values), max_size=12), st.booleans())
def test_native_dispatch_units_match_the_python_twin(items, gap):
    from commitlog.dispatch import _dispatch_units_python

    built = []
    for message, tags in items:
        if tags is not None:
            message.properties = {**message.properties, "TAGS": tags}
        built.append(message)
    buffer, end = _log_of(built)
    if gap and end:  # a queue offset that skips: runs must split there
        struct.pack_into(">q", buffer, 20, 7)
    fast = native.dispatch_units(buffer, 0, end, 0, 100)
    slow = _dispatch_units_python(memoryview(buffer), 0, end, 0, 100)
    assert fast == slow


def test_non_utf8_tags_are_dispatched_by_python(tmp_path, small_config):
    from commitlog.store import MessageStore

    with MessageStore.open(str(tmp_path), small_config) as store:
        store.append([rec.Message("T", b"1", properties={"TAGS": "ok"})])
        result = store.append([rec.Message("T", b"2", properties={"TAGS": "x"})])
        view = store.commit_log.mapped_file_queue.last.view()
        record = bytes(view[result.wrote_offset : result.wrote_offset + result.wrote_bytes])
        position = result.wrote_offset + record.index(b"TAGS\x01x\x02") + 5  # the "x" (a record CRC tail may follow)
        view[position] = 0xFF
        store.append([rec.Message("T", b"3", properties={"TAGS": "é"})])
        store.dispatch()
        units = store.consume_queues.find("T", 0).all_units()
    assert [u[2] for u in units] == [rec.java_string_hash("ok"), rec.java_string_hash("\ufffd"), rec.java_string_hash("é")]


@pytest.mark.skipif(native.record_sizes is None, reason="native module not built")
@given(
    st.lists(st.binary(max_size=300), max_size=40),
    st.one_of(st.binary(max_size=40), st.lists(st.binary(max_size=40), max_size=40)),
    st.integers(0, 300),
    st.sampled_from([list, tuple]),
)  # fmt: skip
def test_native_and_python_record_sizes_agree(bodies, properties, fixed, container):
    """The C sizer ``prepare_batch`` uses and its Python twin: the same sizes, totals and largest
    properties size, for one properties value for all and one per body, or the same refusal."""

    def outcome(function):
        try:
            return function(container(bodies), properties, fixed)
        except ValueError as error:
            return str(error)

    assert outcome(native.record_sizes) == outcome(rec.record_sizes_python)
    if isinstance(properties, bytes) or len(properties) == len(bodies):
        sizes, total, body_total, _ = native.record_sizes(bodies, properties, fixed)
        assert total == sum(sizes) and body_total == sum(map(len, bodies))


@pytest.mark.skipif(native.record_offsets is None, reason="native module not built")
@given(st.lists(st.integers(0, 1 << 30), max_size=40), st.integers(0, 1 << 50))
def test_native_and_python_record_offsets_agree(sizes, start):
    from commitlog.commit_log import record_offsets_python

    assert native.record_offsets(sizes, start) == record_offsets_python(sizes, start)
    assert type(native.record_offsets(sizes, start)) is tuple
