"""Encoding records: a message (or a batch sharing topic and queue) is validated and sized
outside the append lock (``prepare_message``, ``prepare_batch``), then written into a buffer it is
handed (``write_record``, ``write_batch``: native when built) with what the store fills in at
append time; ``write_blank`` ends a segment. Pure; the layout is in ``commitlog.record_layout``."""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Mapping

import crc32c as _crc32c

from commitlog import native as _native
from commitlog.record_crc import CRC_MASK, CrcFunction, record_crc_extra_size, record_crc_properties, seal_record
from commitlog.record_fields import Host, encode_host, encode_properties, tags_code
from commitlog.record_layout import (
    BLANK,
    BLANK_MAGIC,
    BLANK_SIZE,
    BODY_SIZE_MAX_DEFAULT,
    HEADERS,
    MAGIC_V1,
    MAGIC_V2,
    PROPERTIES_LENGTH,
    PROPERTIES_SIZE_MAX,
    PROPERTY_RECORD_CRC,
    RECORD_CRC_TAIL_PREFIX,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    TOPIC_LENGTH_V2,
    TOPIC_PATTERN,
    TOPIC_SIZE_MAX,
    TOPIC_SIZE_MAX_V1,
    MessageRejected,
    PutMessageStatus,
    calc_record_size,
)

_native_write = _native.write_batch

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
