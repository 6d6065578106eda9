"""Decoding records: ``decode_record`` (every field, lengths and CRCs checked), ``decode_dispatch``
(the fields a consume queue needs, nothing decoded it does not), ``peek_blank`` and ``crcs_ok``.
Decoders raise ``RecordError`` (never ``struct.error`` or ``IndexError``) on anything malformed.
Pure; the layout is in ``commitlog.record_layout``."""

from __future__ import annotations

import dataclasses
import struct

import crc32c as _crc32c

from commitlog.record_crc import CRC_MASK, CrcFunction, stored_record_crc
from commitlog.record_fields import Host, decode_host, decode_properties, tags_code
from commitlog.record_layout import (
    BLANK,
    BLANK_MAGIC,
    BLANK_SIZE,
    HEADERS,
    MAGIC_V1,
    MAGIC_V2,
    PROPERTIES_LENGTH,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    RECORD_CRC_TAIL_SIZE,
    SYSFLAG,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_POSITION,
    SYSFLAG_STOREHOST_V6,
    SYSFLAG_TRANSACTION_MASK,
    TOPIC_LENGTH_V1,
    TOPIC_LENGTH_V2,
    RecordError,
    calc_record_size,
)

@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """A decoded record. ``body`` is a zero-copy view into the buffer it was decoded from."""

    size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sysflag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: memoryview
    topic: str
    properties: dict[str, str]  # without the record CRC tail
    # What the record CRC tail holds (``stored_record_crc``); None: the record has no tail.
    record_crc: int | None = None

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @property
    def tags_code(self) -> int:
        return tags_code(self.properties)

    @property
    def transaction_type(self) -> int:
        return self.sysflag & SYSFLAG_TRANSACTION_MASK


BLANK_RECORD_SIZE = 0  # what peek_size reports for a blank (end of segment) record


def decode_record(
    buffer: bytes | bytearray | memoryview,
    position: int = 0,
    *,
    crc_function: CrcFunction | None = _crc32c.crc32c,
    limit: int | None = None,
    errors: str = "strict",
) -> Record:
    """Decode the record at ``position``; check magic, lengths and (unless ``crc_function`` is
    None) the body CRC. ``limit`` bounds the bytes that may belong to the record (default: the
    buffer's end). A topic that is not UTF-8 raises RecordError, or with ``errors="replace"``
    reads with U+FFFD in place of the bad bytes (as the Spark reader does, which keeps every
    record the recovery scan keeps). A blank record raises ``RecordError("blank record")``."""
    view = memoryview(buffer)
    limit = len(view) if limit is None else min(limit, len(view))
    available = limit - position
    if position < 0 or available < 8:
        raise RecordError(f"{max(available, 0)} bytes left, too few for a record", position=position)
    total_size, magic = BLANK.unpack_from(view, position)
    if magic == BLANK_MAGIC:
        raise RecordError("blank record", position=position)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise RecordError(f"bad magic 0x{magic:08X}", position=position)
    if total_size < 91 or total_size > available:
        raise RecordError(f"total size {total_size} outside 91..{available}", position=position)
    (sysflag,) = SYSFLAG.unpack_from(view, position + SYSFLAG_POSITION)
    header = HEADERS[bool(sysflag & SYSFLAG_BORNHOST_V6)][bool(sysflag & SYSFLAG_STOREHOST_V6)]
    if header.size + 3 > total_size:
        raise RecordError(f"total size {total_size} smaller than the header", position=position)
    fields = header.unpack_from(view, position)
    body_crc, queue_id, flag, queue_offset, physical_offset, _, born_ts = fields[2:9]
    born_ip, born_port, store_ts, store_ip, store_port, reconsume, prepared_tx, body_size = fields[9:]
    end = position + total_size
    cursor = position + header.size
    if body_size < 0 or cursor + body_size > end:
        raise RecordError(f"body length {body_size} runs past the record", position=position)
    body = view[cursor : cursor + body_size]
    cursor += body_size
    v2 = magic == MAGIC_V2
    length_struct = TOPIC_LENGTH_V2 if v2 else TOPIC_LENGTH_V1
    if cursor + length_struct.size > end:
        raise RecordError("topic length runs past the record", position=position)
    (topic_size,) = length_struct.unpack_from(view, cursor)
    cursor += length_struct.size
    if topic_size < 0 or cursor + topic_size + 2 > end:
        raise RecordError(f"topic length {topic_size} runs past the record", position=position)
    topic = bytes(view[cursor : cursor + topic_size])
    cursor += topic_size
    (properties_size,) = PROPERTIES_LENGTH.unpack_from(view, cursor)
    cursor += 2
    if properties_size < 0 or cursor + properties_size > end:
        raise RecordError(f"properties length {properties_size} runs past the record", position=position)
    properties = view[cursor : cursor + properties_size]
    expected = calc_record_size(
        body_size=body_size, topic_size=topic_size, properties_size=properties_size, sysflag=sysflag, v2=v2
    )
    if expected != total_size:
        raise RecordError(f"total size {total_size} but fields add up to {expected}", position=position)
    stored = stored_record_crc(view, end, properties_size)
    if stored is not None:
        properties = properties[: properties_size - RECORD_CRC_TAIL_SIZE]  # not a user property
    if crc_function is not None:
        # With a tail, one CRC over the record checks everything but the tail (the body among it);
        # the body's own CRC is computed only to name what failed.
        if stored is None or stored != crc_function(view[position : end - RECORD_CRC_TAIL_SIZE]) & CRC_MASK:
            if crc_function(body) & CRC_MASK != body_crc:
                raise RecordError("body CRC mismatch", position=position)
            if stored is not None:
                raise RecordError("record CRC mismatch", position=position)
    try:
        topic_text = topic.decode(errors=errors)
        born_host = decode_host(born_ip, born_port)
        store_host = decode_host(store_ip, store_port)
    except (UnicodeDecodeError, ValueError) as error:
        raise RecordError(f"undecodable field: {error}", position=position) from None
    return Record(
        size=total_size,
        magic=magic,
        body_crc=body_crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sysflag=sysflag,
        born_timestamp=born_ts,
        born_host=born_host,
        store_timestamp=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared_tx,
        body=body,
        topic=topic_text,
        properties=decode_properties(properties),
        record_crc=stored,
    )


def crcs_ok(buffer, position: int, record: Record, crc_function: CrcFunction) -> bool:
    """The body CRC of ``record`` (decoded at ``position`` of ``buffer``) matches, and so does its
    record CRC when it has a tail."""
    if crc_function(record.body) & CRC_MASK != record.body_crc:
        return False
    if record.record_crc is None:
        return True
    tail_at = position + record.size - RECORD_CRC_TAIL_SIZE
    return record.record_crc == crc_function(memoryview(buffer)[position:tail_at]) & CRC_MASK


def peek_blank(buffer: bytes | bytearray | memoryview, position: int) -> int | None:
    """The size of the blank record at ``position``, or None if there is none."""
    if len(buffer) - position < BLANK_SIZE or position < 0:
        return None
    remaining, magic = BLANK.unpack_from(buffer, position)
    if magic != BLANK_MAGIC:
        return None
    return remaining


_DISPATCH_PREFIX = struct.Struct(">iIiiiqqi")  # TOTALSIZE .. SYSFLAG
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_TAGS_KEY = b"TAGS\x01"


def decode_dispatch(view: memoryview, position: int, limit: int) -> tuple[int, int, str, int, int, int, int, int]:
    """The fields a consume queue needs, without checking the CRC or decoding hosts:
    ``(size, physical_offset, topic, queue_id, queue_offset, sysflag, store_timestamp, tags_code)``.
    Raises RecordError on anything malformed (a slave dispatches bytes nobody validated)."""
    if limit - position < 91:
        raise RecordError(f"{limit - position} bytes left, too few for a record", position=position)
    size, magic, _crc, queue_id, _flag, queue_offset, physical_offset, sysflag = _DISPATCH_PREFIX.unpack_from(
        view, position
    )
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        raise RecordError(f"bad magic 0x{magic:08X}", position=position)
    if size < 91 or size > limit - position:
        raise RecordError(f"total size {size} out of bounds", position=position)
    born = 20 if sysflag & SYSFLAG_BORNHOST_V6 else 8
    store = 20 if sysflag & SYSFLAG_STOREHOST_V6 else 8
    (store_timestamp,) = _INT64.unpack_from(view, position + 48 + born)
    body_length_at = position + 48 + born + 8 + store + 12
    end = position + size
    if body_length_at + 7 > end:
        raise RecordError("header runs past the record", position=position)
    (body_size,) = _INT32.unpack_from(view, body_length_at)
    cursor = body_length_at + 4 + body_size
    if body_size < 0 or cursor + 3 > end:
        raise RecordError(f"body length {body_size} runs past the record", position=position)
    if magic == MAGIC_V1:
        topic_size = view[cursor]
        cursor += 1
    else:
        (topic_size,) = TOPIC_LENGTH_V2.unpack_from(view, cursor)
        cursor += 2
    if topic_size < 0 or topic_size > 0x7FFF or cursor + topic_size + 2 > end:
        raise RecordError(f"topic length {topic_size} runs past the record", position=position)
    topic = bytes(view[cursor : cursor + topic_size])
    cursor += topic_size
    (properties_size,) = PROPERTIES_LENGTH.unpack_from(view, cursor)
    cursor += 2
    if properties_size < 0 or cursor + properties_size != end:
        raise RecordError("field lengths do not add up to the size word", position=position)
    code = 0
    if properties_size:
        properties = bytes(view[cursor:end])
        if _TAGS_KEY in properties:
            code = tags_code(decode_properties(properties))
    try:
        topic_text = topic.decode()
    except UnicodeDecodeError:
        raise RecordError("topic is not UTF-8", position=position) from None
    return size, physical_offset, topic_text, queue_id, queue_offset, sysflag, store_timestamp, code
