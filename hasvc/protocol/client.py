"""The client protocol: request/response frames with request ids, many in flight per connection.

Theory of operation
-------------------
After the preface (``wire.py``), both directions carry frames:

    u32 length (of what follows) | u8 kind | u32 request id | payload

A response has the request's kind with bit 0x80 set and the same request id; responses may come
in any order. Strings are ``u16 length | UTF-8``; blobs are ``u32 length | bytes``. Every response
payload starts with ``status`` (string) and ``reason`` (string, empty on success).

    kind 1 SEND    request : topic | i32 queue id | i32 flag | i64 born timestamp | u32 n
                             | n x (properties blob-16 | body blob-32)
                   response: status | reason | i32 queue id | u32 n | n x (i64 offset, i64 queue offset)
    kind 2 PULL    request : topic | i32 queue id | i64 queue offset | u32 count max
                   response: status | reason | i64 next queue offset | i64 max queue offset | u32 n
                             | n x record blob-32 (a commit log record, docs/FORMAT.md)
    kind 3 READ    request : i64 offset | u32 size max
                   response: status | reason | i64 offset | blob-32 (log bytes from offset)
    kind 4 STATUS  request : (empty)
                   response: status | reason | blob-32 (a JSON object, docs/PROTOCOL.md §2)
    kind 5 PROMOTE request : u8 role (1 SYNC_MASTER, 0 ASYNC_MASTER) [| string fence reason: start fenced]
                   response: status | reason | blob-32 (the STATUS JSON after the change)
    kind 6 DEMOTE  request : string new master's HA address (HOST:PORT)
                   response: as PROMOTE
    kind 7 SEND_IDEMPOTENT
                   request : string producer id | i64 first sequence | a SEND request payload
                   response: as SEND (a retry is answered with the original offsets; hasvc/dedupe.py)
    kind 8 TRANSFER_LEADER
                   request : string target member id (DLedger mode; 1..64 bytes)
                   response: status | reason | blob-32 (a JSON object: the outcome, docs/PROTOCOL.md §2)
    kind 9 FENCE   request : u8 fence (1: refuse writes from now on, 0: lift that fence) | string reason
                   response: as PROMOTE (a classic master; ``hasvc switchover``)

``properties blob-16`` is ``u16 length | name\\x01value\\x02...``. SEND statuses are RocketMQ's
PutMessageStatus names; the others use OK, NOT_FOUND, OFFSET_ILLEGAL, SERVICE_NOT_AVAILABLE,
DAMAGED and ERROR. A frame over ``frame_size_max`` or of an unknown kind closes the connection.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Final, NamedTuple

from commitlog import native
from hasvc.protocol import client_frames
from hasvc.protocol.wire import Buffer, ProtocolError

FRAME_HEADER = struct.Struct(">IBI")  # length, kind, request id
U32 = struct.Struct(">I")
LENGTH_KIND = struct.Struct(">IB")  # the header's first 5 bytes, checked before the request id is in
SEND_RESPONSE_HEAD = struct.Struct(">iI")  # queue id, n
SEND_HEAD = struct.Struct(">iiqI")  # queue id, flag, born timestamp, n
assert FRAME_HEADER.size == 9
# RocketMQ's remoting frameMaxLength: 16 MiB.
FRAME_SIZE_MAX_DEFAULT: Final = 16 * 1024 * 1024

SEND: Final = 1
PULL: Final = 2
READ: Final = 3
STATUS: Final = 4
PROMOTE: Final = 5
DEMOTE: Final = 6
SEND_IDEMPOTENT: Final = 7
TRANSFER_LEADER: Final = 8
FENCE: Final = 9
REQUEST_KINDS: Final = frozenset({SEND, PULL, READ, STATUS, PROMOTE, DEMOTE, SEND_IDEMPOTENT, TRANSFER_LEADER, FENCE})
# Requests answered from a task of their own (they wait for the store or for the group).
ADMIN_KINDS: Final = frozenset({PROMOTE, DEMOTE, TRANSFER_LEADER, FENCE})
SEND_KINDS: Final = frozenset({SEND, SEND_IDEMPOTENT})
RESPONSE_BIT: Final = 0x80

OK: Final = "OK"
NOT_FOUND: Final = "NOT_FOUND"
OFFSET_ILLEGAL: Final = "OFFSET_ILLEGAL"
SERVICE_NOT_AVAILABLE: Final = "SERVICE_NOT_AVAILABLE"
ERROR: Final = "ERROR"
# PULL/READ: the record at the requested offset failed its check on the way out (the reason names
# its offset and file; STATUS ``damaged`` lists it). Nothing at or past it is in the response.
DAMAGED: Final = "DAMAGED"


class Frame(NamedTuple):  # a tuple: built for every request a broker reads
    kind: int
    request_id: int
    payload: bytes | memoryview  # a read-only view on a broker (FrameDecoder(responses=False))


def encode_frame(kind: int, request_id: int, payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload) + 5, kind, request_id) + payload


_NEW_TUPLE = tuple.__new__
_split_frames = client_frames.split_frames


class FrameDecoder:
    """Frames out of a byte stream; ``request_side`` says which kinds are legal."""

    def __init__(self, *, frame_size_max: int = FRAME_SIZE_MAX_DEFAULT, responses: bool):
        self.frame_size_max = frame_size_max
        self.responses = responses
        self._buffer = Buffer(size_max=2 * frame_size_max + FRAME_HEADER.size)
        # The buffer's received pieces (Buffer.first_chunk written out: next_frame runs once per
        # frame and once more to find none, per read of every client connection).
        self._chunks = self._buffer._chunks
        self.buffered = self._chunks  # falsy when nothing is buffered (the client port's single-frame read)
        self._kinds = frozenset(k | RESPONSE_BIT for k in REQUEST_KINDS) if responses else REQUEST_KINDS
        self._kind_table = client_frames.kind_table(self._kinds, SEND_KINDS)  # take_frames' (SENDs plain)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:  # copied unless bytes (wire.Buffer.feed)
        self._buffer.feed(data)

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None until it is in. The length is checked as soon as its
        4 bytes are in and the kind as soon as its byte is, not once the 9-byte header is: a
        peer that sends a bad length alone is refused, not left waiting for 5 more bytes."""
        chunks = self._chunks
        if not chunks:
            return None
        buffer, first = self._buffer, chunks[0]
        if len(first) >= FRAME_HEADER.size:  # a frame per receive: header and payload taken in place
            length, kind, request_id = FRAME_HEADER.unpack_from(first)
            if length < 5 or length > self.frame_size_max or kind not in self._kinds:
                self._check(length, kind)  # raises
            end = 4 + length
            if len(first) >= end:
                buffer.skip(end)
                payload = first[FRAME_HEADER.size : end]
                # Frame(...) without its Python __new__ (a call a frame)
                return _NEW_TUPLE(Frame, (kind, request_id, bytes(payload) if self.responses else payload))
        head = self._buffer.unpack(FRAME_HEADER)
        if head is None:
            buffered = len(self._buffer)
            if buffered >= LENGTH_KIND.size:
                self._check(*self._buffer.unpack(LENGTH_KIND))
            elif buffered >= U32.size:
                self._check(*self._buffer.unpack(U32), None)
            return None
        length, kind, request_id = head
        self._check(length, kind)
        if len(self._buffer) < 4 + length:
            return None
        self._buffer.skip(FRAME_HEADER.size)
        if self.responses:
            return Frame(kind, request_id, self._buffer.take(length - 5))
        # A broker decodes a request before it reads on, and its fields come out as bytes (the
        # bodies by split_messages): the payload is a view, not a copy of up to 4 MiB (a 32 KiB
        # copy per SEND was ~3 % of a busy master).
        return Frame(kind, request_id, self._buffer.take_view(length - 5))

    def take_frames(self, count_max: int) -> tuple[list[Frame], bool, str | None]:
        """(frames, plain, error): up to ``count_max`` whole frames (a broker's: payloads are
        views), split by one call a received piece (``client_frames.split_frames``; a frame
        that spans two receives joined by ``next_frame``), ending after the first that is not
        a SEND; ``plain`` whether all are SENDs; ``error`` the refusal of the frame it stopped
        at (the caller raises it as a ``ProtocolError`` once it has handled the frames before
        it, as ``next_frame`` would have handed them out before refusing the bad one)."""
        assert not self.responses, "a client's decoder takes its frames one by one (next_frame)"
        chunks, frames = self._chunks, []
        while chunks and count_max > 0:
            got, consumed, error, got_plain = _split_frames(chunks[0], self.frame_size_max, self._kind_table, count_max, Frame)
            if consumed:
                self._buffer.skip(consumed)
                frames += got
                count_max -= len(got)
                if not got_plain:
                    return frames, False, None  # its last frame is not a SEND: answered before any more is taken
            if error is not None:
                return frames, True, error
            if count_max <= 0 or len(chunks) < 2:  # one piece left: its next frame is not in yet (split checked its head)
                break
            try:  # the next frame spans the first piece and the next: joined (or not all in yet)
                frame = self.next_frame()
            except ProtocolError as refusal:
                return frames, True, str(refusal)
            if frame is None:
                break
            frames.append(frame)
            count_max -= 1
            if frame.kind not in SEND_KINDS:
                return frames, False, None
        return frames, True, None

    def _check(self, length: int, kind: int | None) -> None:
        if length < 5 or length > self.frame_size_max:
            raise ProtocolError(f"frame of {length} bytes, outside 5..{self.frame_size_max}")
        if kind is not None and kind not in self._kinds:
            raise ProtocolError(f"unknown frame kind {kind}")


# -- payload fields -----------------------------------------------------------------------------


class Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def pack(self, fmt: str, *values) -> Writer:
        self.parts.append(struct.pack(fmt, *values))
        return self

    def text(self, value: str) -> Writer:
        data = value.encode()
        if len(data) > 0xFFFF:
            raise ValueError("string over 65535 bytes")
        self.parts.append(struct.pack(">H", len(data)))
        self.parts.append(data)
        return self

    def blob16(self, data: bytes) -> Writer:
        if len(data) > 0xFFFF:
            raise ValueError("field over 65535 bytes")
        self.parts.append(struct.pack(">H", len(data)))
        self.parts.append(data)
        return self

    def blob32(self, data) -> Writer:
        self.parts.append(struct.pack(">I", len(data)))
        self.parts.append(data)
        return self

    def bytes(self) -> bytes:
        return b"".join(self.parts)


class Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.view = memoryview(data)
        self.position = 0

    def unpack_struct(self, layout: struct.Struct):
        if self.position + layout.size > len(self.data):
            raise ProtocolError("payload ends in the middle of a field")
        values = layout.unpack_from(self.data, self.position)
        self.position += layout.size
        return values

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.position + size > len(self.data):
            raise ProtocolError("payload ends in the middle of a field")
        values = struct.unpack_from(fmt, self.data, self.position)
        self.position += size
        return values

    def _piece(self, size: int) -> bytes:
        if self.position + size > len(self.data):
            raise ProtocolError("field runs past the end of the payload")
        piece = self.data[self.position : self.position + size]
        self.position += size
        return piece if type(piece) is bytes else bytes(piece)

    def text(self) -> str:
        (size,) = self.unpack(">H")
        try:
            return self._piece(size).decode()
        except UnicodeDecodeError:
            raise ProtocolError("string field is not UTF-8") from None

    def blob16(self) -> bytes:
        (size,) = self.unpack(">H")
        return self._piece(size)

    def blob32(self) -> bytes:
        (size,) = self.unpack(">I")
        return self._piece(size)

    def done(self) -> None:
        if self.position != len(self.data):
            raise ProtocolError(f"{len(self.data) - self.position} unexpected bytes at the end of the payload")


# -- requests -------------------------------------------------------------------------------------

# At most this many messages in one SEND (RocketMQ batches are limited by size only; the body
# total is limited by max_message_size on the broker). The bound keeps a decoder's work finite.
SEND_MESSAGES_MAX: Final = 65536
PRODUCER_ID_SIZE_MAX: Final = 64


@dataclasses.dataclass(slots=True)  # not frozen: built for every put, and frozen __init__ costs 4x
class SendRequest:
    topic: str
    queue_id: int
    bodies: list[bytes]
    properties: list[bytes]  # encoded name\x01value\x02 strings, one per body
    flag: int = 0
    born_timestamp: int = 0
    producer_id: str = ""  # SEND_IDEMPOTENT only
    first_sequence: int = -1


def encode_send(request: SendRequest) -> bytes:
    writer = Writer()
    if request.producer_id:
        writer.text(request.producer_id).pack(">q", request.first_sequence)
    writer.text(request.topic).pack(">iiqI", request.queue_id, request.flag, request.born_timestamp, len(request.bodies))
    for properties, body in zip(request.properties, request.bodies, strict=True):
        writer.blob16(properties).blob32(body)
    return writer.bytes()


def split_messages_python(payload: bytes, position: int, count: int) -> tuple[list[bytes], list[bytes], int]:
    """The ``n x (blob16 properties, blob32 body)`` run of a SEND: properties, bodies and where
    the run ends. The native twin (commitlog/_scan.c ``split_messages``) does the same in C."""
    properties, bodies = [], []
    data = payload if type(payload) is bytes else bytes(payload)  # slices of a view would be views
    end = len(data)
    for _ in range(count):
        if position + 2 > end:
            raise ProtocolError("payload ends in the middle of a field")
        size = (data[position] << 8) | data[position + 1]
        position += 2
        if position + size > end:
            raise ProtocolError("field runs past the end of the payload")
        properties.append(data[position : position + size])
        position += size
        if position + 4 > end:
            raise ProtocolError("payload ends in the middle of a field")
        (size,) = U32.unpack_from(data, position)
        position += 4
        if position + size > end:
            raise ProtocolError("field runs past the end of the payload")
        bodies.append(data[position : position + size])
        position += size
    return properties, bodies, position


_NATIVE_PROBLEMS = {
    "truncated-field": "payload ends in the middle of a field",
    "truncated-value": "field runs past the end of the payload",
}


def _split_messages_native(payload: bytes, position: int, count: int) -> tuple[list[bytes], list[bytes], int]:
    try:
        return native.split_messages(payload, position, count)
    except ValueError as error:
        raise ProtocolError(_NATIVE_PROBLEMS[str(error)]) from None


# A broker splits every message it receives: in C when the module is built (a tenth of a busy
# master's CPU at 32-message batches went to the Python loop).
split_messages = _split_messages_native if native.split_messages is not None else split_messages_python


# Topics up to this many bytes have their text cached (producers send to a few topics; the
# Reader and decode of each SEND's topic were ~5 % of a master's loop at 64 x 32). Longer ones,
# which no RocketMQ topic is (127 characters at most), are decoded each time, so that a client
# cycling through long topics holds at most 1024 x 255 bytes here.
TOPIC_CACHE_BYTES_MAX = 255


@functools.lru_cache(maxsize=1024)
def _cached_text(raw: bytes) -> str:
    return raw.decode()  # a UnicodeDecodeError is raised, not cached


def _topic_text(raw: bytes) -> str:
    try:
        return _cached_text(raw) if len(raw) <= TOPIC_CACHE_BYTES_MAX else raw.decode()
    except UnicodeDecodeError:
        raise ProtocolError("string field is not UTF-8") from None


def decode_send(payload: bytes, *, idempotent: bool = False) -> SendRequest:
    position = 0
    producer_id, first_sequence = "", -1
    if idempotent:
        reader = Reader(payload)
        producer_id = reader.text()
        (first_sequence,) = reader.unpack(">q")
        if not producer_id or len(producer_id.encode()) > PRODUCER_ID_SIZE_MAX or "\x01" in producer_id or "\x02" in producer_id:
            raise ProtocolError(f"producer id must be 1..{PRODUCER_ID_SIZE_MAX} bytes without \\x01 or \\x02")
        if first_sequence < 0:
            raise ProtocolError(f"first sequence {first_sequence} is negative")
        position = reader.position
    # The topic and the head read in place (what Reader.text and unpack_struct check, same errors).
    end = len(payload)
    if position + 2 > end:
        raise ProtocolError("payload ends in the middle of a field")
    start = position + 2
    position = start + ((payload[position] << 8) | payload[position + 1])
    if position > end:
        raise ProtocolError("field runs past the end of the payload")
    topic = _topic_text(bytes(payload[start:position]))
    if position + SEND_HEAD.size > end:
        raise ProtocolError("payload ends in the middle of a field")
    queue_id, flag, born_timestamp, count = SEND_HEAD.unpack_from(payload, position)
    if count == 0 or count > SEND_MESSAGES_MAX:
        raise ProtocolError(f"SEND with {count} messages, outside 1..{SEND_MESSAGES_MAX}")
    properties, bodies, position = split_messages(payload, position + SEND_HEAD.size, count)
    if position != end:
        raise ProtocolError(f"{end - position} unexpected bytes at the end of the payload")
    return SendRequest(topic, queue_id, bodies, properties, flag, born_timestamp, producer_id, first_sequence)


@dataclasses.dataclass(frozen=True, slots=True)
class PullRequest:
    topic: str
    queue_id: int
    queue_offset: int
    count_max: int


def encode_pull(request: PullRequest) -> bytes:
    return Writer().text(request.topic).pack(">iqI", request.queue_id, request.queue_offset, request.count_max).bytes()


def decode_pull(payload: bytes) -> PullRequest:
    reader = Reader(payload)
    topic = reader.text()
    queue_id, queue_offset, count_max = reader.unpack(">iqI")
    reader.done()
    return PullRequest(topic, queue_id, queue_offset, count_max)


def encode_demote(master_ha: str) -> bytes:
    return Writer().text(master_ha).bytes()


def decode_demote(payload: bytes) -> str:
    reader = Reader(payload)
    address = reader.text()
    reader.done()
    return address


# A FENCE's reason: a line for STATUS ``fenced_by`` and the refusals, not a document.
FENCE_REASON_SIZE_MAX: Final = 1024


def encode_promote(sync: bool, fence_reason: str = "") -> bytes:
    """PROMOTE: the role byte, and a fence reason when the new master must start fenced (FENCE
    lifts it; ``hasvc switchover`` waits so for its old master to rejoin as a slave)."""
    return bytes([1 if sync else 0]) + (Writer().text(fence_reason).bytes() if fence_reason else b"")


def decode_promote(payload: bytes) -> tuple[bool, str]:
    """(sync, fence reason or "") of a PROMOTE request."""
    if len(payload) < 1 or payload[0] not in (0, 1):
        raise ProtocolError(f"PROMOTE payload must start with one byte, 0 (ASYNC_MASTER) or 1 (SYNC_MASTER), not {bytes(payload)[:8]!r}")
    if len(payload) == 1:
        return payload[0] == 1, ""
    try:
        reader = Reader(payload[1:])
        reason = reader.text()
        reader.done()
    except ProtocolError as error:
        raise ProtocolError(f"PROMOTE payload: after the role byte, a fence reason string: {error}") from None
    if not reason or len(reason.encode()) > FENCE_REASON_SIZE_MAX:
        raise ProtocolError(f"PROMOTE payload: the fence reason must be 1..{FENCE_REASON_SIZE_MAX} bytes")
    return payload[0] == 1, reason


def encode_fence(fence: bool, reason: str) -> bytes:
    return bytes([1 if fence else 0]) + Writer().text(reason).bytes()


def decode_fence(payload: bytes) -> tuple[bool, str]:
    """(fence, reason) of a FENCE request; ProtocolError for a flag other than 0 or 1 or an
    empty or oversized reason."""
    if len(payload) < 1 or payload[0] not in (0, 1):
        raise ProtocolError("FENCE payload must start with one byte, 1 (fence) or 0 (lift the fence)")
    reader = Reader(payload[1:])
    reason = reader.text()
    reader.done()
    if not reason or len(reason.encode()) > FENCE_REASON_SIZE_MAX:
        raise ProtocolError(f"FENCE reason must be 1..{FENCE_REASON_SIZE_MAX} bytes")
    return payload[0] == 1, reason


# A DLedger member id (``--self``, the ids of ``--peers``): short names such as n0; the bound
# keeps a decoder's work finite and matches the producer id's.
MEMBER_ID_SIZE_MAX: Final = 64


def encode_transfer_leader(target: str) -> bytes:
    return Writer().text(target).bytes()


def decode_transfer_leader(payload: bytes) -> str:
    reader = Reader(payload)
    target = reader.text()
    reader.done()
    if not target or len(target.encode()) > MEMBER_ID_SIZE_MAX:
        raise ProtocolError(f"TRANSFER_LEADER target must be a member id of 1..{MEMBER_ID_SIZE_MAX} bytes")
    return target


def encode_read(offset: int, size_max: int) -> bytes:
    return struct.pack(">qI", offset, size_max)


def decode_read(payload: bytes) -> tuple[int, int]:
    reader = Reader(payload)
    offset, size_max = reader.unpack(">qI")
    reader.done()
    return offset, size_max


# -- responses ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SendResponse:
    status: str
    reason: str
    queue_id: int
    offsets: list[int]
    queue_offsets: list[int]


def encode_send_response(response: SendResponse) -> bytes:
    return encode_send_response_fields(response.status, response.reason, response.queue_id, response.offsets, response.queue_offsets)


def encode_send_response_fields(status: str, reason: str, queue_id: int, offsets, queue_offsets) -> bytes:
    """encode_send_response without building a SendResponse."""
    return send_response_prefix(status, reason) + encode_send_response_rest(queue_id, offsets, queue_offsets)


@functools.lru_cache(maxsize=256)
def send_response_prefix(status: str, reason: str) -> bytes:
    """The ``status | reason`` a broker computes once for the puts it answers together (cached:
    a few statuses and reasons answer nearly every put)."""
    return Writer().text(status).text(reason).bytes()


SEND_RESPONSE_ONE = struct.Struct(">iIqq")  # queue id, n = 1, offset, queue offset


def encode_send_response_rest(queue_id: int, offsets, queue_offsets) -> bytes:
    """A SEND response after its prefix: queue id, n and the n offset pairs."""
    count = len(offsets)
    if len(queue_offsets) != count:
        raise ValueError("offsets and queue offsets differ in length")
    if count == 1:
        return SEND_RESPONSE_ONE.pack(queue_id, 1, offsets[0], queue_offsets[0])
    return SEND_RESPONSE_HEAD.pack(queue_id, count) + pack_offset_pairs(offsets, queue_offsets)


def pack_offset_pairs_python(offsets, queue_offsets) -> bytes:
    """The n (offset, queue offset) pairs of a SEND response, each ``>qq``. The native twin
    (commitlog/_scan.c ``pack_offset_pairs``) writes them in one C loop (~120 ns a message here)."""
    count = len(offsets)
    if len(queue_offsets) != count:
        raise ValueError("offsets and queue offsets differ in length")
    pairs = [0] * (2 * count)
    pairs[0::2] = offsets
    pairs[1::2] = queue_offsets
    return struct.pack(f">{2 * count}q", *pairs)


pack_offset_pairs = native.pack_offset_pairs or pack_offset_pairs_python


def decode_send_response(payload: bytes) -> SendResponse:
    reader = Reader(payload)
    status, reason = reader.text(), reader.text()
    queue_id, count = reader.unpack(">iI")
    if count > SEND_MESSAGES_MAX:
        raise ProtocolError(f"SEND response with {count} messages")
    pairs = [reader.unpack(">qq") for _ in range(count)]
    reader.done()
    return SendResponse(status, reason, queue_id, [p[0] for p in pairs], [p[1] for p in pairs])


@dataclasses.dataclass(frozen=True, slots=True)
class PullResponse:
    status: str
    reason: str
    next_queue_offset: int
    max_queue_offset: int
    records: list[bytes]


def encode_pull_response(response: PullResponse) -> bytes:
    writer = Writer().text(response.status).text(response.reason)
    writer.pack(">qqI", response.next_queue_offset, response.max_queue_offset, len(response.records))
    for record in response.records:
        writer.blob32(record)
    return writer.bytes()


def decode_pull_response(payload: bytes) -> PullResponse:
    reader = Reader(payload)
    status, reason = reader.text(), reader.text()
    next_queue_offset, max_queue_offset, count = reader.unpack(">qqI")
    if count > SEND_MESSAGES_MAX:
        raise ProtocolError(f"PULL response with {count} records")
    records = [reader.blob32() for _ in range(count)]
    reader.done()
    return PullResponse(status, reason, next_queue_offset, max_queue_offset, records)


def encode_simple_response(status: str, reason: str, *fields) -> bytes:
    """READ (i64 offset + blob) and STATUS (blob) responses."""
    writer = Writer().text(status).text(reason)
    for field in fields:
        if isinstance(field, int):
            writer.pack(">q", field)
        else:
            writer.blob32(field)
    return writer.bytes()


def decode_read_response(payload: bytes) -> tuple[str, str, int, bytes]:
    reader = Reader(payload)
    status, reason = reader.text(), reader.text()
    (offset,) = reader.unpack(">q")
    data = reader.blob32()
    reader.done()
    return status, reason, offset, data


def decode_status_response(payload: bytes) -> tuple[str, str, bytes]:
    reader = Reader(payload)
    status, reason = reader.text(), reader.text()
    data = reader.blob32()
    reader.done()
    return status, reason, data
