"""The vectorised decoder agrees with the record decoder field for field and with the recovery
scan stop for stop (commitlog.columnar vs commitlog.record / commitlog.scan)."""

import os

import pytest

pytest.importorskip("numpy")
pytest.importorskip("pyarrow")

import pyarrow as pa  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from commitlog import columnar  # noqa: E402
from commitlog import record as rec  # noqa: E402
from commitlog.damage import DamagedRange  # noqa: E402
from commitlog.read_check import DamagedRecordError  # noqa: E402
from commitlog.scan import ScanCode, scan_segment  # noqa: E402

SEGMENT = 64 * 1024

hosts = st.one_of(
    st.tuples(st.sampled_from(["127.0.0.1", "10.1.2.3", "192.168.0.255"]), st.integers(0, 65535)),
    st.tuples(st.sampled_from(["::1", "fe80::1", "2001:db8::42"]), st.integers(0, 65535)),
)
property_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), max_size=8)
messages = st.builds(
    rec.Message,
    topic=st.one_of(st.text("abcXYZ_-|%0123456789", min_size=1, max_size=20), st.just("T" * 200)),
    body=st.binary(max_size=600),
    queue_id=st.integers(0, 2**31 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    properties=st.dictionaries(st.one_of(st.sampled_from(["TAGS", "KEYS"]), property_text), property_text, max_size=4),
    born_timestamp=st.integers(0, 2**45),
    born_host=hosts,
    sysflag=st.sampled_from([0, rec.SYSFLAG_TRANSACTION_PREPARED, rec.SYSFLAG_MULTI_TAGS]),
)


def build_segment(message_list, *, store_host=("10.9.8.7", 10911), base=0, blank=True, sealed=False) -> tuple[bytearray, list[int]]:
    """Records laid end to end in a SEGMENT-byte buffer, ended by a blank record when ``blank``;
    with the record CRC tail when ``sealed``."""
    buffer = bytearray(SEGMENT)
    store_ip, store_port, store_v6 = rec.encode_host(store_host)
    position = 0
    starts = []
    for index, message in enumerate(message_list):
        prepared = rec.prepare_message(message, record_crc=sealed)
        size = rec.with_store_host(prepared, store_v6=store_v6)
        if position + size + rec.BLANK_SIZE > SEGMENT:
            break
        starts.append(position)
        position += rec.write_record(buffer, position, prepared, queue_offset=index, physical_offset=base + position,
                                     store_timestamp=1_700_000_000_000 + index, store_ip=store_ip, store_port=store_port)  # fmt: skip
    if blank:
        rec.write_blank(buffer, position, SEGMENT - position)
    return buffer, starts


def decode(buffer, *, start=0, stop=SEGMENT, base=0, **options):
    batches, end = columnar.decode_range(buffer, start=start, stop=stop, segment_end=SEGMENT, file_from_offset=base,
                                         store="S", options=columnar.Options(**options))  # fmt: skip
    schema = pa.schema([columnar.ARROW_SCHEMA.field(name) for name in columnar.Options(**options).columns])
    table = pa.Table.from_batches(batches, schema=schema)
    for name in ("born_ts", "store_ts"):  # as integers: a flipped bit can make a date Python cannot hold
        if name in table.column_names:
            index = table.column_names.index(name)
            table = table.set_column(index, name, table.column(name).cast(pa.int64()))
    return table.to_pylist(), end


def in_spark_range(millis: int) -> int | None:
    return millis if columnar._MILLIS_MIN <= millis <= columnar._MILLIS_MAX else None


def expected_row(buffer, position, base=0):
    record = rec.decode_record(buffer, position, crc_function=None, errors="replace")
    return {
        "store": "S",
        "phy_offset": base + position,
        "size": record.size,
        "topic": record.topic,
        "queue_id": record.queue_id,
        "queue_offset": record.queue_offset,
        "tags": record.tags,
        "keys": record.keys,
        "born_ts": in_spark_range(record.born_timestamp),
        "store_ts": in_spark_range(record.store_timestamp),
        "born_host": columnar.host_text(record.born_host),
        "store_host": columnar.host_text(record.store_host),
        "sysflag": record.sysflag,
        "flag": record.flag,
        "body_crc": record.body_crc,
        "body_size": len(record.body),
        "properties": record.properties,
        "body": bytes(record.body),
        "crc_ok": rec.crcs_ok(buffer, position, record, rec.crc_function_by_name("crc32c")),
    }


def millis(micros: int | None) -> int | None:
    return None if micros is None else micros // 1000


def comparable(row):
    row = dict(row)
    row["born_ts"] = millis(row["born_ts"])
    row["store_ts"] = millis(row["store_ts"])
    row["properties"] = dict(row["properties"])
    return row


@given(st.lists(messages, min_size=1, max_size=40), hosts, st.booleans())
def test_every_field_matches_the_record_decoder(message_list, store_host, sealed):
    buffer, starts = build_segment(message_list, store_host=store_host, base=SEGMENT * 3, sealed=sealed)
    rows, end = decode(buffer, base=SEGMENT * 3)
    assert end.code is ScanCode.END_OF_SEGMENT and end.records == len(starts)
    assert [comparable(row) for row in rows] == [expected_row(buffer, s, base=SEGMENT * 3) for s in starts]


def test_born_timestamps_survive_as_milliseconds():
    buffer, starts = build_segment([rec.Message("T", b"x", born_timestamp=1_700_000_000_123)])
    rows, _ = decode(buffer)
    assert millis(rows[0]["born_ts"]) == 1_700_000_000_123


def sample_segment(count=30):
    return build_segment(
        [rec.Message(f"t{i % 3}", os.urandom(50 + i * 7), queue_id=i % 4, properties={"TAGS": f"g{i % 2}", "KEYS": str(i)})
         for i in range(count)]
    )  # fmt: skip


@given(st.lists(st.tuples(st.integers(0, SEGMENT - 1), st.integers(0, 255)), min_size=1, max_size=4),
       st.booleans(), st.booleans())  # fmt: skip
def test_stops_where_the_recovery_scan_stops(flips, zero_tail, blank):
    buffer, starts = sample_segment()
    if not blank:
        buffer[starts[-1] + 100 :] = bytes(SEGMENT - starts[-1] - 100)  # a torn last record, zero after it
    for position, value in flips:
        buffer[position] = value
    if zero_tail:
        cut = flips[0][0]
        buffer[cut:] = bytes(SEGMENT - cut)
    expected = scan_segment(buffer, start=0, end=SEGMENT, file_from_offset=0, crc_function=None, native=False)
    rows, end = decode(buffer)
    assert (end.position, end.code) == (expected.position, expected.code)
    assert end.records == expected.count == len(rows)
    for row in rows:
        assert comparable(row) == expected_row(buffer, row["phy_offset"])


def test_a_bit_flip_in_a_body_is_a_row_with_crc_ok_false():
    buffer, starts = sample_segment()
    record = rec.decode_record(buffer, starts[5])
    body_at = starts[5] + record.size - len(record.body) - 2 - len(record.topic) - 1 - 2 - len(rec.encode_properties(record.properties))
    buffer[body_at + 3] ^= 0x10
    rows, end = decode(buffer)
    assert len(rows) == len(starts) and end.code is ScanCode.END_OF_SEGMENT
    assert [row["phy_offset"] for row in rows if not row["crc_ok"]] == [starts[5]]
    rows, _ = decode(buffer, crc="crc32")  # the wrong checksum: every body fails, none is dropped
    assert len(rows) == len(starts) and not any(row["crc_ok"] for row in rows)
    rows, _ = decode(buffer, crc=None)
    assert {row["crc_ok"] for row in rows} == {None}


@pytest.mark.parametrize("native", [True, False])
def test_with_damaged_fail_a_bit_flip_raises_naming_the_record(native, monkeypatch):
    if native and columnar._native.crc_ranges is None:
        pytest.skip("native module not built")
    if not native:
        monkeypatch.setattr(columnar._native, "crc_ranges", None)
    buffer, starts = sample_segment()
    buffer[starts[5] + 100] ^= 0x10  # inside the body
    size = rec.decode_record(buffer, starts[5], crc_function=None).size
    for columns in (columnar.COLUMN_NAMES, ("phy_offset",)):  # checked whether crc_ok is asked for or not
        with pytest.raises(DamagedRecordError) as error:
            columnar.decode_range(buffer, start=0, stop=SEGMENT, segment_end=SEGMENT, file_from_offset=0, path="seg",
                                  options=columnar.Options(columns=columns, damaged="fail"))  # fmt: skip
        assert error.value.damage == DamagedRange("seg", starts[5], starts[5] + size, "body CRC mismatch")
    batches, _ = columnar.decode_range(buffer, start=0, stop=starts[5], segment_end=SEGMENT, file_from_offset=0,
                                       options=columnar.Options(damaged="fail"))  # fmt: skip
    assert sum(len(b) for b in batches) == 5  # the records before it decode


def test_split_ranges_yield_every_record_once():
    buffer, starts = sample_segment(120)
    points = columnar.split_points(buffer, SEGMENT, 4096)
    assert points and set(points) <= set(starts)
    seen = []
    for start, stop in columnar.iter_segment_ranges(SEGMENT, points):
        rows, end = decode(buffer, start=start, stop=stop)
        seen += [row["phy_offset"] for row in rows]
        assert end.clean
    assert seen == starts


def test_offset_and_topic_filters():
    buffer, starts = sample_segment()
    rows, end = decode(buffer, from_offset=starts[3], to_offset=starts[9], topics=frozenset({"t1"}))
    assert [row["phy_offset"] for row in rows] == [s for i, s in enumerate(starts) if 3 <= i < 9 and i % 3 == 1]
    assert end.records == len(starts)  # filters do not change where the range ends


def test_column_subset_and_unknown_column():
    buffer, starts = sample_segment()
    batches, _ = columnar.decode_range(buffer, start=0, stop=SEGMENT, segment_end=SEGMENT, file_from_offset=0,
                                       options=columnar.Options(columns=("phy_offset", "crc_ok")))  # fmt: skip
    assert batches[0].schema.names == ["phy_offset", "crc_ok"]
    with pytest.raises(ValueError, match="unknown columns"):
        columnar.decode_range(buffer, start=0, stop=SEGMENT, segment_end=SEGMENT, file_from_offset=0,
                              options=columnar.Options(columns=("nope",)))  # fmt: skip


def test_properties_that_are_not_utf8_are_replaced_as_the_record_decoder_does():
    buffer, starts = build_segment([rec.Message("T", b"x", properties={"TAGS": "a"})])
    record = rec.decode_record(buffer, 0)
    properties_at = record.size - len(b"TAGS\x01a\x02")
    buffer[properties_at + 5] = 0xFF  # the value byte
    rows, _ = decode(buffer)
    assert comparable(rows[0])["properties"] == rec.decode_record(buffer, 0).properties == {"TAGS": "\ufffd"}


def test_batches_are_bounded(monkeypatch):
    monkeypatch.setattr(columnar, "BATCH_ROWS_MAX", 7)
    buffer, starts = sample_segment()
    batches, _ = columnar.decode_range(buffer, start=0, stop=SEGMENT, segment_end=SEGMENT, file_from_offset=0)
    assert max(len(b) for b in batches) == 7 and sum(len(b) for b in batches) == len(starts)


@pytest.mark.parametrize("native", [True, False])
def test_a_header_flip_in_a_sealed_record_is_a_row_with_crc_ok_false_and_the_tail_is_no_property(native, monkeypatch):
    if native and columnar._native.crc_ranges is None:
        pytest.skip("native module not built")
    if not native:
        monkeypatch.setattr(columnar._native, "crc_ranges", None)
    buffer, starts = build_segment(
        [rec.Message("T", os.urandom(60), queue_id=i % 4, properties={"TAGS": f"g{i % 2}"}) for i in range(20)], sealed=True
    )  # fmt: skip
    rows, _ = decode(buffer)
    assert all(row["crc_ok"] for row in rows)
    assert all(dict(row["properties"]) == {"TAGS": row["tags"]} for row in rows)  # no __CRC32#
    buffer[starts[4] + 12 + 3] ^= 0x01  # the queue id: not covered by the body CRC
    buffer[starts[9] + 56 + 7] ^= 0x01  # the store timestamp
    buffer[starts[13] + rec.decode_record(buffer, starts[13], crc_function=None).size - 5] ^= 0x01  # a tail digit
    rows, end = decode(buffer)
    assert len(rows) == len(starts) and end.code is ScanCode.END_OF_SEGMENT
    assert [row["phy_offset"] for row in rows if not row["crc_ok"]] == [starts[4], starts[9], starts[13]]


@pytest.mark.parametrize("native", [True, False])
def test_native_and_python_body_checks_agree(native, monkeypatch):
    if native and columnar._native.crc_ranges is None:
        pytest.skip("native module not built")
    if not native:
        monkeypatch.setattr(columnar._native, "crc_ranges", None)
    buffer, starts = sample_segment()
    for index in (0, 7, len(starts) - 1):
        buffer[starts[index] + 100] ^= 0x01  # inside the body (bodies are 50 bytes or more)
    rows, _ = decode(buffer)
    assert [row["phy_offset"] for row in rows if not row["crc_ok"]] == [starts[0], starts[7], starts[-1]]


@given(st.lists(st.tuples(st.integers(0, SEGMENT - 1), st.integers(0, 255)), max_size=4),
       st.integers(0, SEGMENT), st.integers(0, SEGMENT))  # fmt: skip
def test_native_and_python_walks_agree(flips, a, b):
    if columnar._native.walk_starts is None:
        pytest.skip("native module not built")
    buffer, starts = sample_segment()
    for position, value in flips:
        buffer[position] = value
    start = min([s for s in starts if s >= min(a, b)] or [SEGMENT])
    stop = max(a, b)
    native = columnar.walk(buffer, start, stop, SEGMENT, native=True)
    python = columnar.walk(buffer, start, stop, SEGMENT, native=False)
    assert native[0].tolist() == python[0].tolist() and native[1:] == python[1:]


def test_the_native_walk_continues_across_its_output_chunks(monkeypatch):
    if columnar._native.walk_starts is None:
        pytest.skip("native module not built")
    monkeypatch.setattr(columnar, "WALK_CHUNK_RECORDS", 7)
    buffer, starts = sample_segment()
    found, position, code = columnar.walk(buffer, 0, SEGMENT, SEGMENT, native=True)
    assert found.tolist() == starts and code is ScanCode.END_OF_SEGMENT


def test_a_topic_that_is_not_utf8_is_a_row_not_a_stop():
    """The recovery scan keeps such a record (the topic is outside the CRC), so the reader keeps
    it too, with U+FFFD in the topic, where the strict record decoder refuses it."""
    buffer, starts = sample_segment()
    record = rec.decode_record(buffer, starts[4])
    properties_size = len(rec.encode_properties(record.properties))
    topic_at = starts[4] + record.size - properties_size - 2 - len(record.topic)
    assert buffer[topic_at : topic_at + len(record.topic)] == record.topic.encode()
    buffer[topic_at] = 0x80
    with pytest.raises(rec.RecordError, match="undecodable"):
        rec.decode_record(buffer, starts[4])
    rows, end = decode(buffer)
    assert len(rows) == len(starts) and end.code is ScanCode.END_OF_SEGMENT
    assert rows[4]["topic"] == "\ufffd" + record.topic[1:]
