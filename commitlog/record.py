"""The commit log message record: RocketMQ's MessageExtEncoder / MessageDecoder layout.

Theory of operation
-------------------
A commit log is a sequence of records laid end to end. Every integer is big-endian. A record
(V1 magic, IPv4 hosts) looks like this; docs/FORMAT.md has the full table with IPv6 and V2:

    offset size field
    0      4    TOTALSIZE            whole record, this field included
    4      4    MAGIC                0xDAA320A7 (V1) or 0xDAA320AB (V2: 2-byte topic length)
    8      4    BODYCRC              crc(body) & 0x7FFFFFFF (CRC32C here, CRC32 in RocketMQ stores)
    12     4    QUEUEID
    16     4    FLAG
    20     8    QUEUEOFFSET          index of the record in its consume queue
    28     8    PHYSICALOFFSET       the record's own commit log offset
    36     4    SYSFLAG              bit 0x10: born host is IPv6, bit 0x20: store host is IPv6
    40     8    BORNTIMESTAMP        ms
    48     8    BORNHOST             4-byte IPv4 + int32 port (20 bytes: 16-byte IPv6 + port)
    56     8    STORETIMESTAMP       ms, set by the store inside its append lock
    64     8    STOREHOST            as BORNHOST
    72     4    RECONSUMETIMES
    76     8    PREPARED_TX_OFFSET
    84     4+n  BODY                 int32 length, then the body
    88+n   1+t  TOPIC                V1: signed byte length; V2: int16 length
    ..     2+p  PROPERTIES           int16 length, then name\\x01value\\x02 pairs (UTF-8)

With ``append_record_crc`` (RocketMQ's ``enabledAppendPropCRC``) the properties end with a
20-byte tail ``"__CRC32#" 0x01 <10 ASCII digits> 0x02`` (a 0x02 separator is added before it when
the properties do not end with one): the digits, least significant first, are the masked CRC of
the record's bytes ``[0, TOTALSIZE - 20)``, written after the queue offset, physical offset and
store timestamp are filled. The body CRC covers only the body; the tail covers the header too.

A segment that cannot hold the next record plus 8 bytes ends with a blank record
``[int32 remaining][int32 0xCBD43194]``; the rest of the segment is zero. Records never span
segments.

This module is pure: it encodes into buffers it is handed and decodes from buffers it is handed.
Decoders raise ``RecordError`` (never ``struct.error`` or ``IndexError``) on anything malformed.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import ipaddress
import operator
import re
import struct
import zlib
from collections.abc import Callable, Mapping
from typing import Final

import crc32c as _crc32c

from commitlog import native as _native

_native_write = _native.write_batch

MAGIC_V1: Final = 0xDAA320A7
MAGIC_V2: Final = 0xDAA320AB
BLANK_MAGIC: Final = 0xCBD43194
BLANK_SIZE: Final = 8  # END_FILE_MIN_BLANK_LENGTH: [int32 remaining][int32 BLANK_MAGIC]

SYSFLAG_COMPRESSED: Final = 0x1
SYSFLAG_MULTI_TAGS: Final = 0x2
SYSFLAG_TRANSACTION_MASK: Final = 0xC
SYSFLAG_TRANSACTION_PREPARED: Final = 0x4
SYSFLAG_TRANSACTION_COMMIT: Final = 0x8
SYSFLAG_TRANSACTION_ROLLBACK: Final = 0xC
SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20

PROPERTY_NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_KEYS: Final = "KEYS"
# The record CRC tail (RocketMQ's MessageConst.PROPERTY_CRC32 and CommitLog.CRC32_RESERVED_LEN):
# a system property, never shown as a user property.
PROPERTY_RECORD_CRC: Final = "__CRC32#"
RECORD_CRC_TAIL_PREFIX: Final = b"__CRC32#\x01"
RECORD_CRC_DIGITS: Final = 10  # a masked CRC is below 2**31: at most 10 decimal digits
RECORD_CRC_TAIL_SIZE: Final = len(RECORD_CRC_TAIL_PREFIX) + RECORD_CRC_DIGITS + 1
assert RECORD_CRC_TAIL_SIZE == 20

# Limits. Bodies follow RocketMQ's maxMessageSize (4 MiB); topics longer than 127 bytes switch to
# the V2 magic (RocketMQ's autoMessageVersionOnTopicLen) and we cap them at 255 bytes so that a
# topic is always a valid directory name; properties are bounded by their int16 length field.
BODY_SIZE_MAX_DEFAULT: Final = 4 * 1024 * 1024
TOPIC_SIZE_MAX: Final = 255
TOPIC_SIZE_MAX_V1: Final = 127
PROPERTIES_SIZE_MAX: Final = 32767
# Topic names become directory names under consumequeue/: RocketMQ's own character set.
TOPIC_PATTERN: Final = re.compile(r"[%|a-zA-Z0-9_-]+")

# The fixed part of a record up to and including the body length, per (born v6, store v6).
PREFIX = struct.Struct(">iIiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP
assert PREFIX.size == 48
TOTAL_SIZE = struct.Struct(">i")
SYSFLAG = struct.Struct(">i")
MAGIC = struct.Struct(">I")
BLANK = struct.Struct(">iI")
assert BLANK.size == BLANK_SIZE
TOPIC_LENGTH_V1 = struct.Struct(">b")
TOPIC_LENGTH_V2 = struct.Struct(">h")
PROPERTIES_LENGTH = struct.Struct(">h")

PHYSICAL_OFFSET_POSITION: Final = 28
QUEUE_OFFSET_POSITION: Final = 20
SYSFLAG_POSITION: Final = 36
BORN_HOST_POSITION: Final = 48


def _header_struct(*, born_v6: bool, store_v6: bool) -> struct.Struct:
    host = lambda v6: "16si" if v6 else "4si"  # noqa: E731
    return struct.Struct(">iIiiiqqiq" + host(born_v6) + "q" + host(store_v6) + "iqi")


# HEADERS[born_v6][store_v6]: everything from TOTALSIZE to the body length field.
HEADERS: Final = tuple(
    tuple(_header_struct(born_v6=b, store_v6=s) for s in (False, True)) for b in (False, True)
)
assert HEADERS[0][0].size == 88
assert HEADERS[1][1].size == 112


def host_size(v6: bool) -> int:
    return 20 if v6 else 8


def calc_record_size(
    *, body_size: int, topic_size: int, properties_size: int, sysflag: int = 0, v2: bool = False
) -> int:
    """RocketMQ's MessageExtEncoder.calMsgLength."""
    born = host_size(bool(sysflag & SYSFLAG_BORNHOST_V6))
    store = host_size(bool(sysflag & SYSFLAG_STOREHOST_V6))
    fixed = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + born + 8 + store + 4 + 8
    topic_length_size = 2 if v2 else 1
    return fixed + 4 + max(body_size, 0) + topic_length_size + topic_size + 2 + max(properties_size, 0)


assert calc_record_size(body_size=0, topic_size=0, properties_size=0) == 91


class RecordError(ValueError):
    """A record that cannot be decoded; ``reason`` says why in a few words."""

    def __init__(self, reason: str, *, position: int | None = None):
        self.reason = reason
        self.position = position
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"{reason}{where}")


class PutMessageStatus(enum.Enum):
    """RocketMQ's PutMessageStatus; the names are what clients see."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"
    DISK_FULL = "DISK_FULL"

    @property
    def stored(self) -> bool:
        """True when the message is in the log (RocketMQ's PutMessageResult.isOk, sendOK)."""
        return self in _STORED


_STORED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)


class MessageRejected(ValueError):
    """A message the store refuses before writing anything."""

    def __init__(self, status: PutMessageStatus, reason: str):
        self.status = status
        self.reason = reason
        super().__init__(f"{status.name}: {reason}")


# -- checksums -------------------------------------------------------------------------------

CrcFunction = Callable[[bytes | bytearray | memoryview], int]
CRC_FUNCTIONS: Final[dict[str, CrcFunction]] = {"crc32c": _crc32c.crc32c, "crc32": zlib.crc32}
CRC_MASK: Final = 0x7FFFFFFF


def crc_function_by_name(name: str) -> CrcFunction:
    try:
        return CRC_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown checksum {name!r}; choose one of {sorted(CRC_FUNCTIONS)}") from None


# -- the record CRC tail ---------------------------------------------------------------------

_DIGIT_ZERO: Final = ord("0")
_TAIL_SEPARATOR: Final = ord(PROPERTY_SEPARATOR)
RECORD_CRC_DAMAGED: Final = -1  # what stored_record_crc says of a tail out of its shape


def record_crc_tail(crc: int) -> bytes:
    """The 20-byte tail holding the masked CRC ``crc``: ten digits, least significant first, as
    RocketMQ's ``MessageDecoder.createCrc32`` writes them."""
    assert 0 <= crc <= CRC_MASK, crc
    digits = bytearray(RECORD_CRC_DIGITS)
    for index in range(RECORD_CRC_DIGITS):
        crc, digit = divmod(crc, 10)
        digits[index] = _DIGIT_ZERO + digit
    return RECORD_CRC_TAIL_PREFIX + bytes(digits) + PROPERTY_SEPARATOR.encode()


def record_crc_properties(properties: bytes) -> bytes:
    """The properties a record with the tail stores, the tail's digits still zero: a 0x02 first
    when the properties do not end with one (RocketMQ's needAppendLastPropertySeparator)."""
    separator = PROPERTY_SEPARATOR.encode() if properties and properties[-1] != _TAIL_SEPARATOR else b""
    return properties + separator + record_crc_tail(0)


def record_crc_extra_size(properties: bytes) -> int:
    """The bytes the tail adds to a record with these properties (20, or 21 with a separator)."""
    return RECORD_CRC_TAIL_SIZE + (1 if properties and properties[-1] != _TAIL_SEPARATOR else 0)


def seal_record(buffer, position: int, size: int, crc_function: CrcFunction) -> None:
    """Write the tail of the record at ``position``: the CRC of its bytes before the tail. Called
    once every other field is in place (queue offset, physical offset, store timestamp)."""
    end = position + size
    tail_at = end - RECORD_CRC_TAIL_SIZE
    buffer[tail_at:end] = record_crc_tail(crc_function(memoryview(buffer)[position:tail_at]) & CRC_MASK)


def stored_record_crc(view, end: int, properties_size: int) -> int | None:
    """The CRC the tail of the record ending at ``end`` holds; None when the record has no tail
    (written without one, by an older store or RocketMQ); ``RECORD_CRC_DAMAGED`` when the tail's
    name is there and its digits or separator are not, or the name is one byte off and the rest
    is in shape (the name is not covered by the CRC, so it is recognised by its shape).
    ``commitlog/_scan.c`` (``record_crc_state``) is its twin."""
    if properties_size < RECORD_CRC_TAIL_SIZE:
        return None
    tail = bytes(view[end - RECORD_CRC_TAIL_SIZE : end])
    prefix_size = len(RECORD_CRC_TAIL_PREFIX)
    digits = tail[prefix_size:-1]
    if tail[-1] == _TAIL_SEPARATOR and digits.isdigit() and tail.startswith(RECORD_CRC_TAIL_PREFIX):
        return int(digits[::-1])
    prefix_off = sum(a != b for a, b in zip(tail, RECORD_CRC_TAIL_PREFIX))
    rest_off = sum(not _DIGIT_ZERO <= c <= _DIGIT_ZERO + 9 for c in digits) + (tail[-1] != _TAIL_SEPARATOR)
    # The name intact: the record was sealed (no producer may send that name), so any digit or
    # separator wrong is damage (zeros where a torn or lost write left them, too); the name one
    # byte off with the rest in shape: damage as well.
    if prefix_off == 0 or (prefix_off == 1 and rest_off == 0):
        return RECORD_CRC_DAMAGED
    return None


# -- properties and tags ---------------------------------------------------------------------


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """``name\\x01value\\x02`` for every pair (MessageDecoder.messageProperties2String)."""
    return "".join(
        f"{name}{PROPERTY_NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
        for name, value in properties.items()
        if value is not None
    ).encode()


def decode_properties(data: bytes | memoryview) -> dict[str, str]:
    """MessageDecoder.string2messageProperties: malformed segments are skipped, as upstream."""
    text = bytes(data).decode("utf-8", errors="replace")
    properties: dict[str, str] = {}
    for segment in text.split(PROPERTY_SEPARATOR):
        index = segment.find(PROPERTY_NAME_VALUE_SEPARATOR)
        if len(segment) >= 3 and 0 < index < len(segment) - 1:
            properties[segment[:index]] = segment[index + 1 :]
    properties.pop(PROPERTY_RECORD_CRC, None)  # the record CRC tail is not a user property
    return properties


@functools.lru_cache(maxsize=4096)
def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: int32 arithmetic over UTF-16 code units."""
    value = 0
    units = text.encode("utf-16-be")
    for (unit,) in struct.iter_unpack(">H", units):
        value = (31 * value + unit) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def tags_code(properties: Mapping[str, str]) -> int:
    """The consume queue's tag hash: Java hashCode of the TAGS property, 0 without one."""
    tags = properties.get(PROPERTY_TAGS)
    return java_string_hash(tags) if tags else 0


# -- hosts -----------------------------------------------------------------------------------

Host = tuple[str, int]


@functools.lru_cache(maxsize=1024)
def encode_host(host: Host) -> tuple[bytes, int, bool]:
    """(packed ip, port, is_v6) for a ("ip", port) pair."""
    ip = ipaddress.ip_address(host[0])
    return ip.packed, host[1], ip.version == 6


def decode_host(ip: bytes, port: int) -> Host:
    return str(ipaddress.ip_address(ip)), port


# -- messages (input) ------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Message:
    """A message as a producer hands it to the store."""

    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    born_timestamp: int = 0
    born_host: Host = ("127.0.0.1", 0)
    sysflag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


@dataclasses.dataclass(slots=True)
class PreparedMessage:
    """A message validated and encoded except for what the store fills in at append time.

    Preparing happens outside the append lock; ``write_record`` then only packs the header and
    copies three byte strings.
    """

    message: Message
    topic: bytes
    properties: bytes
    body_crc: int
    sysflag: int
    born_ip: bytes
    born_port: int
    size: int
    v2: bool
    tags_code: int
    # The CRC that seals the record's tail (``properties`` then end with the tail); None: no tail.
    record_crc: CrcFunction | None = None


def prepare_message(
    message: Message,
    *,
    crc_function: CrcFunction = _crc32c.crc32c,
    body_size_max: int = BODY_SIZE_MAX_DEFAULT,
    record_crc: bool = False,
) -> PreparedMessage:
    """Validate and pre-encode; raise ``MessageRejected`` with the status the producer sees.
    ``record_crc``: the record gets the CRC tail (sealed by ``write_record``)."""
    topic = message.topic.encode()
    if not topic or len(topic) > TOPIC_SIZE_MAX or not TOPIC_PATTERN.fullmatch(message.topic):
        raise MessageRejected(
            PutMessageStatus.MESSAGE_ILLEGAL,
            f"topic must be 1..{TOPIC_SIZE_MAX} bytes of [%|a-zA-Z0-9_-], got {message.topic[:300]!r}",
        )
    body = message.body
    if len(body) > body_size_max:
        raise MessageRejected(
            PutMessageStatus.MESSAGE_ILLEGAL,
            f"body is {len(body)} bytes, more than max_message_size {body_size_max}",
        )
    if not 0 <= message.queue_id < 1 << 31:
        raise MessageRejected(PutMessageStatus.MESSAGE_ILLEGAL, f"queue id {message.queue_id} out of range")
    properties = encode_properties(message.properties)
    if RECORD_CRC_TAIL_PREFIX in properties:
        raise MessageRejected(PutMessageStatus.MESSAGE_ILLEGAL,
                              f"the property {PROPERTY_RECORD_CRC} is the store's own (the record CRC tail)")  # fmt: skip
    if record_crc:
        properties = record_crc_properties(properties)
    if len(properties) > PROPERTIES_SIZE_MAX:
        raise MessageRejected(
            PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
            f"properties are {len(properties)} bytes, more than {PROPERTIES_SIZE_MAX}",
        )
    try:
        born_ip, born_port, born_v6 = encode_host(message.born_host)
    except ValueError as error:
        raise MessageRejected(PutMessageStatus.MESSAGE_ILLEGAL, f"born host: {error}") from None
    sysflag = message.sysflag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    if born_v6:
        sysflag |= SYSFLAG_BORNHOST_V6
    v2 = len(topic) > TOPIC_SIZE_MAX_V1
    size = calc_record_size(
        body_size=len(body), topic_size=len(topic), properties_size=len(properties), sysflag=sysflag, v2=v2
    )
    return PreparedMessage(
        message=message,
        topic=topic,
        properties=properties,
        body_crc=crc_function(body) & CRC_MASK,
        sysflag=sysflag,
        born_ip=born_ip,
        born_port=born_port,
        size=size,
        v2=v2,
        tags_code=tags_code(message.properties),
        record_crc=crc_function if record_crc else None,
    )


def with_store_host(prepared: PreparedMessage, *, store_v6: bool) -> int:
    """The record size once the store host's address family is known."""
    if store_v6 and not prepared.sysflag & SYSFLAG_STOREHOST_V6:
        prepared.sysflag |= SYSFLAG_STOREHOST_V6
        prepared.size += 12
    return prepared.size


def write_record(
    buffer: bytearray | memoryview,
    position: int,
    prepared: PreparedMessage,
    *,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    store_ip: bytes,
    store_port: int,
) -> int:
    """Write one record at ``position``; return its size. The store host family must match
    ``with_store_host``."""
    message = prepared.message
    size = _write_one(
        buffer, position, prepared.size, prepared.v2, prepared.body_crc, message.queue_id, message.flag,
        queue_offset, physical_offset, prepared.sysflag, message.born_timestamp, prepared.born_ip,
        prepared.born_port, store_timestamp, store_ip, store_port, message.reconsume_times,
        message.prepared_transaction_offset, message.body, prepared.topic, prepared.properties,
    )  # fmt: skip
    if prepared.record_crc is not None:
        seal_record(buffer, position, size, prepared.record_crc)
    return size


def _write_one(
    buffer, position, size, v2, body_crc, queue_id, flag, queue_offset, physical_offset, sysflag, born_timestamp,
    born_ip, born_port, store_timestamp, store_ip, store_port, reconsume_times, prepared_transaction_offset,
    body, topic, properties,
) -> int:  # fmt: skip
    header = HEADERS[len(born_ip) == 16][len(store_ip) == 16]
    header.pack_into(
        buffer, position, size, MAGIC_V2 if v2 else MAGIC_V1, body_crc, queue_id, flag, queue_offset,
        physical_offset, sysflag, born_timestamp, born_ip, born_port, store_timestamp, store_ip, store_port,
        reconsume_times, prepared_transaction_offset, len(body),
    )  # fmt: skip
    cursor = position + header.size
    end = cursor + len(body)
    buffer[cursor:end] = body
    if v2:
        TOPIC_LENGTH_V2.pack_into(buffer, end, len(topic))
        end += 2
    else:
        buffer[end] = len(topic)
        end += 1
    buffer[end : end + len(topic)] = topic
    end += len(topic)
    PROPERTIES_LENGTH.pack_into(buffer, end, len(properties))
    end += 2
    buffer[end : end + len(properties)] = properties
    end += len(properties)
    assert end - position == size, (end - position, size)
    return size


# -- batches ---------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class MessageBatch:
    """Messages that share topic, queue, flag, born host and timestamp (RocketMQ's MessageBatch:
    one topic, one queue). ``properties`` is one mapping (or encoded bytes) for all, or one per body."""

    topic: str
    bodies: list[bytes]
    queue_id: int = 0
    properties: Mapping[str, str] | bytes | list[Mapping[str, str] | bytes] = dataclasses.field(default_factory=dict)
    flag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("127.0.0.1", 0)
    sysflag: int = 0


@dataclasses.dataclass(slots=True)
class PreparedBatch:
    batch: MessageBatch
    topic: bytes
    properties: bytes | list[bytes]
    sysflag: int
    born_ip: bytes
    born_port: int
    sizes: list[int]
    total: int
    record_crc: bool = False  # every record gets the CRC tail (``properties`` are without it)

    @property
    def count(self) -> int:
        return len(self.sizes)


def prepare_batch(
    batch: MessageBatch, *, body_size_max: int = BODY_SIZE_MAX_DEFAULT, store_v6: bool = False, record_crc: bool = False
) -> PreparedBatch:
    """Validate and size a batch; raise ``MessageRejected``. Bodies are limited one by one and in
    total by ``body_size_max`` (RocketMQ checks a batch's whole body against maxMessageSize).
    ``record_crc``: every record gets the CRC tail (its size counts it; ``write_batch`` seals it)."""
    if not batch.bodies:
        raise MessageRejected(PutMessageStatus.MESSAGE_ILLEGAL, "empty batch")
    topic, born_ip, born_port, sysflag, v2 = _batch_shape(batch.topic, batch.queue_id, batch.born_host, batch.sysflag)
    if type(batch.properties) is bytes:  # as a client sends them: kept as they are
        properties: bytes | list[bytes] = batch.properties
    elif isinstance(batch.properties, Mapping | bytes):
        properties = _encoded(batch.properties)
    else:
        if len(batch.properties) != len(batch.bodies):
            _check_body_total(sum(map(len, batch.bodies)), body_size_max)  # reported first, as it always was
            raise MessageRejected(PutMessageStatus.MESSAGE_ILLEGAL, "one properties entry per body, or one for all")
        properties = [_encoded(entry) for entry in batch.properties]
    if RECORD_CRC_TAIL_PREFIX in properties if type(properties) is bytes else any(RECORD_CRC_TAIL_PREFIX in p for p in properties):
        raise MessageRejected(PutMessageStatus.MESSAGE_ILLEGAL,
                              f"the property {PROPERTY_RECORD_CRC} is the store's own (the record CRC tail)")  # fmt: skip
    sysflag |= SYSFLAG_STOREHOST_V6 if store_v6 else 0
    fixed = _fixed_record_size(len(topic), sysflag, v2)
    # Per-message work in one C loop: batches are the hot path.
    sizes, total, body_total, properties_size_max = record_sizes(batch.bodies, properties, fixed, record_crc)
    if body_total > body_size_max:
        _check_body_total(body_total, body_size_max)
    if properties_size_max > PROPERTIES_SIZE_MAX:
        raise MessageRejected(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, f"properties over {PROPERTIES_SIZE_MAX} bytes")
    return PreparedBatch(batch, topic, properties, sysflag, born_ip, born_port, sizes, total, record_crc)


@functools.lru_cache(maxsize=1024)
def _fixed_record_size(topic_size: int, sysflag: int, v2: bool) -> int:
    """A batch's record size besides body and properties (cached: three calls a put saved)."""
    return calc_record_size(body_size=0, topic_size=topic_size, properties_size=0, sysflag=sysflag, v2=v2)


def _check_body_total(body_total: int, body_size_max: int) -> None:
    if body_total > body_size_max:
        raise MessageRejected(
            PutMessageStatus.MESSAGE_ILLEGAL,
            f"batch bodies total {body_total} bytes, more than max_message_size {body_size_max}",
        )


def record_sizes_python(
    bodies, properties: bytes | list[bytes], fixed: int, record_crc: bool = False
) -> tuple[list[int], int, int, int]:
    """(record sizes, their total, the bodies' total, the largest properties size) of a batch whose records
    have ``fixed`` bytes besides body and properties; ``properties`` one bytes for all or one per
    body; with ``record_crc`` the properties sizes count the CRC tail (and its separator). The native
    twin (commitlog/_scan.c ``record_sizes``) does the same in one C loop."""
    body_sizes = list(map(len, bodies))
    if type(properties) is bytes:
        properties_size = len(properties) + (record_crc_extra_size(properties) if record_crc else 0)
        sizes = list(map((fixed + properties_size).__add__, body_sizes))
        return sizes, sum(sizes), sum(body_sizes), properties_size
    if len(properties) != len(body_sizes):
        raise ValueError("one properties entry per body")
    if record_crc:
        property_sizes = [len(entry) + record_crc_extra_size(entry) for entry in properties]
    else:
        property_sizes = list(map(len, properties))
    sizes = list(map(operator.add, map(fixed.__add__, body_sizes), property_sizes))
    return sizes, sum(sizes), sum(body_sizes), max(property_sizes, default=0)


record_sizes = _native.record_sizes or record_sizes_python


def _encoded(properties: Mapping[str, str] | bytes) -> bytes:
    """Properties as stored: a mapping is encoded; bytes (already ``name\x01value\x02``, as a
    client sends them) are kept as they are."""
    return properties if isinstance(properties, bytes) else encode_properties(properties)


@functools.lru_cache(maxsize=1024)
def _batch_shape(topic: str, queue_id: int, born_host: Host, sysflag: int) -> tuple[bytes, bytes, int, int, bool]:
    """Validated (topic bytes, born ip, born port, sysflag, v2) for a batch; cached because the
    same producers send to the same queues. Raises MessageRejected (not cached)."""
    shape = prepare_message(Message(topic, b"", queue_id=queue_id, born_host=born_host, sysflag=sysflag))
    return shape.topic, shape.born_ip, shape.born_port, shape.sysflag, shape.v2


def write_batch(
    buffer,
    position: int,
    prepared: PreparedBatch,
    *,
    queue_offset_first: int,
    physical_base: int,
    store_timestamp: int,
    store_ip: bytes,
    store_port: int,
    crc_function: CrcFunction = _crc32c.crc32c,
    native: bool | None = None,
) -> int:
    """Write a prepared batch at ``position`` (``physical_base`` is the segment's start offset);
    return the bytes written. Native when available (CRC32C only), else the same bytes from Python.
    With ``prepared.record_crc`` each record's tail is sealed as it is written (the native call
    does that in its one loop too)."""
    batch = prepared.batch
    if native is None:
        native = _native_write is not None
    if native and _native_write is not None and crc_function is _crc32c.crc32c:
        return _native_write(
            buffer, position, physical_base, queue_offset_first, store_timestamp, prepared.topic, batch.queue_id,
            batch.flag, prepared.sysflag, batch.born_timestamp, prepared.born_ip, prepared.born_port, store_ip,
            store_port, batch.bodies, prepared.properties, prepared.record_crc,
        )  # fmt: skip
    shared = isinstance(prepared.properties, bytes)
    sealed = prepared.record_crc
    properties = prepared.properties
    if sealed:
        properties = record_crc_properties(properties) if shared else [record_crc_properties(p) for p in properties]
    transactional = prepared.sysflag & SYSFLAG_TRANSACTION_MASK in (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)
    v2 = len(prepared.topic) > TOPIC_SIZE_MAX_V1
    start = position
    for index, (body, size) in enumerate(zip(batch.bodies, prepared.sizes)):
        _write_one(
            buffer, position, size, v2, crc_function(body) & CRC_MASK, batch.queue_id, batch.flag,
            0 if transactional else queue_offset_first + index, physical_base + position, prepared.sysflag,
            batch.born_timestamp, prepared.born_ip, prepared.born_port, store_timestamp, store_ip, store_port, 0, 0,
            body, prepared.topic, properties if shared else properties[index],
        )  # fmt: skip
        if sealed:
            seal_record(buffer, position, size, crc_function)
        position += size
    return position - start


def write_blank(buffer: bytearray | memoryview, position: int, remaining: int) -> None:
    assert remaining >= BLANK_SIZE, remaining
    BLANK.pack_into(buffer, position, remaining, BLANK_MAGIC)


# -- decoding --------------------------------------------------------------------------------


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
