"""DLedger entry codec: the byte layout against hand-built bytes, round trips, and malformed input
(fed whole, truncated, garbage) raising EntryFormatError and nothing else."""

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitlog.dledger import entry_codec as codec

INT64 = st.integers(min_value=0, max_value=2**63 - 1)
BODY = st.binary(max_size=512)


def test_header_layout_matches_dledger_entry_coder_field_by_field():
    body = b"hello"
    data = codec.encode_entry(index=7, term=3, pos=4096, body=body)
    # DLedgerEntryCoder.encode: putInt magic, putInt size, putLong index, putLong term, putLong pos,
    # putInt channel, putInt chainCrc, putInt bodyCrc, putInt body.length, put body.
    expected = (
        struct.pack(">i", 1)
        + struct.pack(">i", 48 + 5)
        + struct.pack(">q", 7)
        + struct.pack(">q", 3)
        + struct.pack(">q", 4096)
        + struct.pack(">i", 0)
        + struct.pack(">i", 0)
        + struct.pack(">I", zlib.crc32(body))
        + struct.pack(">i", 5)
        + body
    )
    assert data == expected
    assert data[codec.POS_OFFSET : codec.POS_OFFSET + 8] == struct.pack(">q", 4096)
    assert data[codec.BODY_OFFSET :] == body
    assert codec.HEADER_SIZE == 44 and codec.BODY_OFFSET == 48


def test_index_unit_and_blank_layout():
    unit = codec.encode_index_unit(pos=1 << 40, size=1072, index=99, term=5)
    assert unit == struct.pack(">i", 1) + struct.pack(">q", 1 << 40) + struct.pack(">i", 1072) + struct.pack(">q", 99) + struct.pack(">q", 5)
    assert codec.encode_blank(600) == struct.pack(">ii", -1, 600)
    assert codec.peek_blank(codec.encode_blank(600) + bytes(592), 0) == 600
    assert codec.peek_blank(unit, 0) is None
    with pytest.raises(ValueError):
        codec.encode_blank(7)


def test_a_dledger_written_entry_with_zero_body_crc_decodes():
    body = b"written by Java DLedger"
    data = bytearray(codec.encode_entry(index=0, term=0, pos=0, body=body))
    data[40:44] = bytes(4)  # DLedger 0.3.1.2 never computes bodyCrc
    header, decoded = codec.decode_entry(bytes(data))
    assert header.body_crc == 0 and decoded == body


@given(index=INT64, term=INT64, pos=INT64, body=BODY)
def test_entry_round_trip(index, term, pos, body):
    data = codec.encode_entry(index=index, term=term, pos=pos, body=body)
    header, decoded = codec.decode_entry(data)
    assert (header.index, header.term, header.pos, header.size, header.body_size) == (index, term, pos, len(data), len(body))
    assert decoded == body
    # with trailing bytes, at an offset
    header2, decoded2 = codec.decode_entry(b"x" * 3 + data + b"trailing", 3)
    assert header2 == header and decoded2 == body


@given(index=INT64, term=INT64, pos=INT64, body=BODY, at=st.integers(0, 16))
def test_write_entry_into_a_buffer_matches_encode_entry(index, term, pos, body, at):
    buffer = bytearray(b"\xee" * (at + 48 + len(body) + 3))
    size = codec.write_entry(buffer, at, index=index, term=term, pos=pos, body=body)
    assert bytes(buffer[at : at + size]) == codec.encode_entry(index=index, term=term, pos=pos, body=body)
    assert buffer[:at] == b"\xee" * at and buffer[at + size :] == b"\xee" * 3


@given(index=INT64, term=INT64, pos=INT64, body=BODY, cut=st.data())
def test_truncated_entry_raises_entry_format_error(index, term, pos, body, cut):
    data = codec.encode_entry(index=index, term=term, pos=pos, body=body)
    length = cut.draw(st.integers(min_value=0, max_value=len(data) - 1))
    with pytest.raises(codec.EntryFormatError):
        codec.decode_entry(data[:length])


def test_entry_fed_byte_by_byte_decodes_only_when_whole():
    data = codec.encode_entry(index=1, term=1, pos=48, body=b"abc")
    for length in range(len(data)):
        with pytest.raises(codec.EntryFormatError):
            codec.decode_entry(data[:length])
    assert codec.decode_entry(data)[1] == b"abc"


@given(body=st.binary(min_size=1, max_size=256), flip=st.data())
def test_body_damage_is_caught_by_body_crc(body, flip):
    data = bytearray(codec.encode_entry(index=0, term=0, pos=0, body=body))
    at = flip.draw(st.integers(min_value=48, max_value=len(data) - 1))
    data[at] ^= flip.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(codec.EntryFormatError, match="bodyCrc"):
        codec.decode_entry(bytes(data))


@given(garbage=st.binary(max_size=200), position=st.integers(min_value=-4, max_value=210))
def test_garbage_raises_only_entry_format_error(garbage, position):
    for decode in (codec.decode_entry, codec.decode_entry_header, codec.decode_index_unit):
        try:
            decode(garbage, position)
        except codec.EntryFormatError:
            pass
    codec.peek_blank(garbage, position)


@given(magic=st.integers(-(2**31), 2**31 - 1), size=st.integers(-(2**31), 2**31 - 1),
       body_size=st.integers(-(2**31), 2**31 - 1), index=st.integers(-(2**63), 2**63 - 1))
def test_headers_with_bad_fields_are_refused(magic, size, body_size, index):
    header = codec.ENTRY_HEADER.pack(magic, size, index, 0, 0, 0, 0, 0, body_size)
    valid = magic == 1 and 48 <= size <= codec.ENTRY_SIZE_MAX and body_size + 48 == size and index >= 0
    if valid:
        assert codec.decode_entry_header(header).index == index
    else:
        with pytest.raises(codec.EntryFormatError):
            codec.decode_entry_header(header)


@given(pos=INT64, size=st.integers(48, codec.ENTRY_SIZE_MAX), index=INT64, term=INT64)
def test_index_unit_round_trip(pos, size, index, term):
    unit = codec.encode_index_unit(pos=pos, size=size, index=index, term=term)
    assert codec.decode_index_unit(unit) == codec.IndexUnit(1, pos, size, index, term)
    for length in range(len(unit)):
        with pytest.raises(codec.EntryFormatError):
            codec.decode_index_unit(unit[:length])


def test_encode_refuses_oversized_or_negative():
    with pytest.raises(ValueError):
        codec.encode_entry(index=0, term=0, pos=0, body=bytes(codec.ENTRY_SIZE_MAX))
    with pytest.raises(ValueError):
        codec.encode_entry(index=-1, term=0, pos=0, body=b"")
