"""The Raft port's wire protocol: one HELLO frame, then the core's messages, big-endian.

Theory of operation
-------------------
After the preface (``wire.py``), the dialling side sends one HELLO (group, its own id, the id it
means to reach, its client address, where its log starts, its data-file size) -- the accepting
driver checks them against its configuration -- and then message frames, whose source and target
are those of the HELLO; the accepting side sends nothing on that connection. Every frame is

    u32 length (of what follows) | u8 kind | body

    kind 0 HELLO              u8 version | u8 g | group (g bytes UTF-8) | u8 s | source id | u8 t | target id
                              [| u8 c | the sender's client address, HOST:PORT (c may be 0)
                               [| i64 data start offset [| i64 data file size (>= 1)]]]
    kind 1 VOTE_REQUEST       i64 term | i64 ledger end index | i64 ledger end term | u8 flags
                              (flags bit 0: pre-vote, bit 1: transfer)
    kind 2 VOTE_RESPONSE      i64 term | u8 result (VoteResult) | u8 flags (bit 0: pre-vote)
    kind 3 HEARTBEAT          i64 term | i64 commit index [| i64 retain-from index (when >= 0)]
    kind 4 HEARTBEAT_RESPONSE i64 term | u8 result (HeartbeatResult) [| u8 flags (bit 0: disk full; sent when set)]
    kind 5 PUSH               COMPARE/TRUNCATE (not 3 APPEND, 4 RESET): i64 term | u8 type (PushType)
                              | i64 index | i64 previous term
                              | i64 commit index | u32 n | n x (i64 index | i64 term | u32 size | body)
    kind 8 APPEND             i64 term | i64 index | i64 previous term | i64 commit index | u32 n
                              | i64 last term | the n entries as stored (48-byte DLedger header + body
                              each, docs/FORMAT.md), filling the rest of the frame
    kind 6 PUSH_RESPONSE      i64 term | u8 type | u8 result (PushResult) | i64 request index
                              | i64 ack index | i64 begin index | i64 end index | i64 term at index
    kind 7 TIMEOUT_NOW        i64 term
    kind 9 RESET              i64 term | i64 index | i64 previous term | i64 first term | i64 pos
                              | i64 commit index   (answered by a PUSH_RESPONSE of type RESET, 4)

APPEND (protocol version 2) carries the leader's stored bytes, which the follower's store checks
entry by entry before it copies them (``commitlog.dledger.entry_run``); this decoder checks the
frame: n >= 1, n headers' worth of bytes at least, the terms and indexes in range. A PUSH of
type APPEND (version 1's form) is a protocol error.

A frame over ``frame_size_max``, an unknown kind or enum value, a negative term, an index below
-1, a body whose fields do not fill its length exactly, or a message before HELLO raises
``ProtocolError`` (the driver closes that connection alone). docs/PROTOCOL.md §4 has the byte
tables.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Final

from hasvc.protocol.wire import Buffer, ProtocolError
from hasvc.state.raft.messages import (
    Heartbeat,
    HeartbeatResponse,
    HeartbeatResult,
    Message,
    Push,
    PushResponse,
    PushResult,
    PushType,
    ResetPush,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from hasvc.state.raft.storage import Entry, EntryRun

# 2: APPEND as stored bytes (kind 8); version 1 members sent APPEND in PUSH frames. A HELLO of
# another version is refused: upgrade every member of a group together.
RAFT_PROTOCOL_VERSION: Final = 2
# RocketMQ remoting's frameMaxLength (16 MiB): room for a 4 MiB message (maxMessageSize) in a push.
FRAME_SIZE_MAX_DEFAULT: Final = 16 * 1024 * 1024
ID_SIZE_MAX: Final = 255  # group and member ids: one length byte

FRAME_HEADER = struct.Struct(">IB")  # length of what follows (kind included), kind
assert FRAME_HEADER.size == 5
VOTE_REQUEST = struct.Struct(">qqqB")  # term, ledger end index, ledger end term, flags
assert VOTE_REQUEST.size == 25
VOTE_RESPONSE = struct.Struct(">qBB")  # term, result, flags
assert VOTE_RESPONSE.size == 10
HEARTBEAT = struct.Struct(">qq")  # term, commit index
assert HEARTBEAT.size == 16
RETAIN_FROM = struct.Struct(">q")  # HEARTBEAT's optional last field: the leader's retention floor
assert RETAIN_FROM.size == 8
HEARTBEAT_RESPONSE = struct.Struct(">qB")  # term, result
assert HEARTBEAT_RESPONSE.size == 9
HEARTBEAT_RESPONSE_FLAGS = struct.Struct(">B")  # HEARTBEAT_RESPONSE's optional last field (sent when not 0)
assert HEARTBEAT_RESPONSE_FLAGS.size == 1
PUSH = struct.Struct(">qBqqqI")  # term, type, index, previous term, commit index, entry count
assert PUSH.size == 37
ENTRY_HEADER = struct.Struct(">qqI")  # index, term, body size
assert ENTRY_HEADER.size == 20
PUSH_RESPONSE = struct.Struct(">qBBqqqqq")  # term, type, result, request/ack/begin/end index, term at index
assert PUSH_RESPONSE.size == 50
TIMEOUT_NOW = struct.Struct(">q")  # term
assert TIMEOUT_NOW.size == 8
APPEND = struct.Struct(">qqqqIq")  # term, first index, previous term, commit index, entry count, last term
assert APPEND.size == 44
RESET = struct.Struct(">qqqqqq")  # term, index, previous term, first term, pos, commit index
assert RESET.size == 48
DATA_START = struct.Struct(">q")  # HELLO's optional field after the client address
DATA_FILE_SIZE = struct.Struct(">q")  # HELLO's optional last field: every member's must be equal
HELLO_HEAD = struct.Struct(">B")  # version (then three u8-length-prefixed ids)
assert HELLO_HEAD.size == 1

ENTRY_RUN_HEADER_SIZE: Final = 48  # a stored entry's header (commitlog.dledger.entry_codec.ENTRY_HEADER)
HELLO: Final = 0
VOTE_REQUEST_KIND: Final = 1
VOTE_RESPONSE_KIND: Final = 2
HEARTBEAT_KIND: Final = 3
HEARTBEAT_RESPONSE_KIND: Final = 4
PUSH_KIND: Final = 5
PUSH_RESPONSE_KIND: Final = 6
TIMEOUT_NOW_KIND: Final = 7
APPEND_KIND: Final = 8
RESET_KIND: Final = 9

FLAG_PRE_VOTE: Final = 0x1
FLAG_TRANSFER: Final = 0x2
FLAG_DISK_FULL: Final = 0x1  # HEARTBEAT_RESPONSE: the follower cannot append now (no room on its disk)


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    group: str
    source: str  # the connecting member
    target: str  # the member it meant to reach
    version: int = RAFT_PROTOCOL_VERSION
    client_address: str = ""  # the sender's client port, HOST:PORT ("" unknown; absent before 2026-11-24)
    data_start_offset: int = 0  # where the sender's log starts: 0, or a smooth upgrade's divide
    # The sender's data-file size (commitlog_segment_size): it decides every entry's pos and every
    # blank record, so members of one group must agree on it; 0: not said (sent from 2026-11-28).
    data_file_size: int = 0


def _id(value: str) -> bytes:
    data = value.encode()
    if not 0 < len(data) <= ID_SIZE_MAX:
        raise ValueError(f"id {value!r} must be 1..{ID_SIZE_MAX} bytes of UTF-8")
    return bytes([len(data)]) + data


def _frame(kind: int, body: bytes) -> bytes:
    return FRAME_HEADER.pack(len(body) + 1, kind) + body


def encode_hello(hello: Hello) -> bytes:
    address = hello.client_address.encode()
    if len(address) > ID_SIZE_MAX:
        raise ValueError(f"client address {hello.client_address!r} is longer than {ID_SIZE_MAX} bytes")
    if hello.data_file_size < 0:
        raise ValueError(f"data file size {hello.data_file_size} is negative")
    size = DATA_FILE_SIZE.pack(hello.data_file_size) if hello.data_file_size else b""
    return _frame(HELLO, HELLO_HEAD.pack(hello.version) + _id(hello.group) + _id(hello.source) + _id(hello.target)
                  + bytes([len(address)]) + address + DATA_START.pack(hello.data_start_offset) + size)  # fmt: skip


def encode_append_header(push: Push) -> bytes:
    """The frame header and fixed fields of an APPEND whose run holds its bytes; the run's bytes
    follow as they are (the sender writes both with one writev, the bytes from the mapping)."""
    run = push.entries
    assert push.type is PushType.APPEND and isinstance(run, EntryRun) and run.data is not None, push
    return append_header(term=push.term, index=push.index, prev_term=push.prev_term, commit_index=push.commit_index,
                         count=run.count, last_term=run.last_term, size=len(run.data))  # fmt: skip


def append_header(*, term: int, index: int, prev_term: int, commit_index: int, count: int, last_term: int,
                  size: int) -> bytes:  # fmt: skip
    """What precedes ``size`` bytes of ``count`` stored entries in an APPEND frame."""
    return FRAME_HEADER.pack(1 + APPEND.size + size, APPEND_KIND) + APPEND.pack(
        term, index, prev_term, commit_index, count, last_term)


def encode(message: Message) -> bytes:
    """One frame for `message` (its source and target are the connection's)."""
    if isinstance(message, Push) and message.type is PushType.APPEND:
        return encode_append_header(message) + bytes(message.entries.data)
    if isinstance(message, Push):
        parts = [PUSH.pack(message.term, message.type, message.index, message.prev_term, message.commit_index,
                           len(message.entries))]  # fmt: skip
        for entry in message.entries:
            parts.append(ENTRY_HEADER.pack(entry.index, entry.term, len(entry.body)))
            parts.append(entry.body)
        return _frame(PUSH_KIND, b"".join(parts))
    if isinstance(message, PushResponse):
        return _frame(PUSH_RESPONSE_KIND, PUSH_RESPONSE.pack(
            message.term, message.type, message.result, message.request_index, message.ack_index,
            message.begin_index, message.end_index, message.term_at_index))  # fmt: skip
    if isinstance(message, VoteRequest):
        flags = (FLAG_PRE_VOTE if message.pre_vote else 0) | (FLAG_TRANSFER if message.transfer else 0)
        return _frame(VOTE_REQUEST_KIND, VOTE_REQUEST.pack(message.term, message.ledger_end_index,
                                                           message.ledger_end_term, flags))  # fmt: skip
    if isinstance(message, VoteResponse):
        flags = FLAG_PRE_VOTE if message.pre_vote else 0
        return _frame(VOTE_RESPONSE_KIND, VOTE_RESPONSE.pack(message.term, message.result, flags))
    if isinstance(message, Heartbeat):
        body = HEARTBEAT.pack(message.term, message.commit_index)
        if message.retain_from_index >= 0:
            body += RETAIN_FROM.pack(message.retain_from_index)
        return _frame(HEARTBEAT_KIND, body)
    if isinstance(message, HeartbeatResponse):
        body = HEARTBEAT_RESPONSE.pack(message.term, message.result)
        if message.disk_full:
            body += HEARTBEAT_RESPONSE_FLAGS.pack(FLAG_DISK_FULL)
        return _frame(HEARTBEAT_RESPONSE_KIND, body)
    if isinstance(message, TimeoutNow):
        return _frame(TIMEOUT_NOW_KIND, TIMEOUT_NOW.pack(message.term))
    if isinstance(message, ResetPush):
        return _frame(RESET_KIND, RESET.pack(message.term, message.index, message.prev_term, message.first_term,
                                             message.pos, message.commit_index))  # fmt: skip
    raise TypeError(f"not a Raft message: {message!r}")


class _Body:
    """Cursor over one frame body; every read is bounds-checked."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    def unpack(self, layout: struct.Struct) -> tuple:
        if self.position + layout.size > len(self.data):
            raise ProtocolError("frame ends in the middle of a field")
        values = layout.unpack_from(self.data, self.position)
        self.position += layout.size
        return values

    def raw(self, size: int) -> bytes:
        if self.position + size > len(self.data):
            raise ProtocolError(f"a {size}-byte field runs past the frame")
        piece = self.data[self.position : self.position + size]
        self.position += size
        return piece

    def text(self) -> str:
        """A ``u8``-length-prefixed UTF-8 string, possibly empty."""
        (size,) = self.unpack(HELLO_HEAD)
        try:
            return self.raw(size).decode()
        except UnicodeDecodeError:
            raise ProtocolError("a text field is not UTF-8") from None

    def identifier(self) -> str:
        (size,) = self.unpack(HELLO_HEAD)
        try:
            value = self.raw(size).decode()
        except UnicodeDecodeError:
            raise ProtocolError("an id is not UTF-8") from None
        if not value:
            raise ProtocolError("an empty id")
        return value

    def done(self) -> None:
        if self.position != len(self.data):
            raise ProtocolError(f"{len(self.data) - self.position} unexpected bytes at the end of a frame")


def _enum(kind, value: int):
    try:
        return kind(value)
    except ValueError:
        raise ProtocolError(f"{value} is not a {kind.__name__}") from None


def _check_term(term: int) -> int:
    if term < 0:
        raise ProtocolError(f"negative term {term}")
    return term


def _check_index(index: int, name: str) -> int:
    if index < -1:
        raise ProtocolError(f"{name} {index} is below -1")
    return index


def _decode_append(body: _Body, source: str, target: str) -> Push:
    """An APPEND: the run's bytes are a view of the frame (checked by the follower's store)."""
    term, index, prev_term, commit, count, last_term = body.unpack(APPEND)
    size = len(body.data) - body.position
    if count < 1 or size < count * ENTRY_RUN_HEADER_SIZE:
        raise ProtocolError(f"APPEND of {count} entries in {size} bytes (at least 1 entry of at least 48 bytes each)")
    if index < 0 or last_term < max(prev_term, 0):
        raise ProtocolError(f"APPEND from index {index} with last term {last_term} after previous term {prev_term}")
    if term < 0 or last_term < 0 or prev_term < -1 or commit < -1:  # the checks one by one, for the reason
        _check_term(last_term)
        _check_term(term)
        _check_index(prev_term, "previous term")
        _check_index(commit, "commit index")
    run = EntryRun(index, count, last_term, memoryview(body.data)[body.position :])
    body.position = len(body.data)
    return Push(source, target, term, PushType.APPEND, index, prev_term, commit, run)


def _decode_push(body: _Body, source: str, target: str) -> Push:
    term, kind, index, prev_term, commit, count = body.unpack(PUSH)
    if kind == PushType.APPEND:
        raise ProtocolError("an APPEND in a PUSH frame (protocol version 1): APPEND is frame kind 8")
    if kind == PushType.RESET:
        raise ProtocolError("a PUSH of type RESET (4): a RESET has its own frame, kind 9")
    if count * ENTRY_HEADER.size > len(body.data) - body.position:
        raise ProtocolError(f"push of {count} entries in a {len(body.data)}-byte frame")
    entries = []
    for _ in range(count):
        entry_index, entry_term, size = body.unpack(ENTRY_HEADER)
        if entry_index < 0:
            raise ProtocolError(f"entry index {entry_index}")
        entries.append(Entry(entry_index, _check_term(entry_term), body.raw(size)))
    return Push(source, target, _check_term(term), _enum(PushType, kind), _check_index(index, "push index"),
                _check_index(prev_term, "previous term"), _check_index(commit, "commit index"), tuple(entries))  # fmt: skip


_PUSH_TYPES = {member.value: member for member in PushType}
_PUSH_RESULTS = {member.value: member for member in PushResult}


def _decode_push_response(body: _Body, source: str, target: str) -> PushResponse:
    """The checks of ``_check_term``/``_enum``/``_check_index`` at once (a leader decodes one per
    follower per push: a call per field was a tenth of its calls a message); on a failure they
    run one by one for the reason."""
    term, kind, result, request, ack, begin, end, term_at = body.unpack(PUSH_RESPONSE)
    push_type, push_result = _PUSH_TYPES.get(kind), _PUSH_RESULTS.get(result)
    if term < 0 or push_type is None or push_result is None or min(request, ack, begin, end, term_at) < -1:
        _check_term(term)
        _enum(PushType, kind)
        _enum(PushResult, result)
        for value, name in ((request, "request index"), (ack, "ack index"), (begin, "begin index"),
                            (end, "end index"), (term_at, "term at index")):  # fmt: skip
            _check_index(value, name)
        raise AssertionError("a check failed above")
    return PushResponse(source, target, term, push_type, push_result, request, ack, begin, end, term_at)


def _decode_reset(body: _Body, source: str, target: str) -> ResetPush:
    term, index, prev_term, first_term, pos, commit = body.unpack(RESET)
    if index < 1:
        raise ProtocolError(f"reset index {index} (a log restarts at 1 or later)")
    if not 0 <= prev_term <= first_term <= term:
        raise ProtocolError(f"reset terms: previous {prev_term}, first {first_term}, current {term} (need 0 <= p <= f <= t)")
    if pos < 0:
        raise ProtocolError(f"negative reset pos {pos}")
    return ResetPush(source, target, term, index, prev_term, first_term, pos, _check_index(commit, "commit index"))


def _decode_message(kind: int, body: _Body, source: str, target: str) -> Message:
    if kind == PUSH_KIND:
        return _decode_push(body, source, target)
    if kind == APPEND_KIND:
        return _decode_append(body, source, target)
    if kind == PUSH_RESPONSE_KIND:
        return _decode_push_response(body, source, target)
    if kind == VOTE_REQUEST_KIND:
        term, end_index, end_term, flags = body.unpack(VOTE_REQUEST)
        return VoteRequest(source, target, _check_term(term), _check_index(end_index, "ledger end index"),
                           _check_index(end_term, "ledger end term"), bool(flags & FLAG_PRE_VOTE),
                           bool(flags & FLAG_TRANSFER))  # fmt: skip
    if kind == VOTE_RESPONSE_KIND:
        term, result, flags = body.unpack(VOTE_RESPONSE)
        return VoteResponse(source, target, _check_term(term), _enum(VoteResult, result), bool(flags & FLAG_PRE_VOTE))
    if kind == HEARTBEAT_KIND:
        term, commit = body.unpack(HEARTBEAT)
        retain_from = -1
        if body.position < len(body.data):  # optional: present only when the leader names one
            (retain_from,) = body.unpack(RETAIN_FROM)
            if retain_from < 0:
                raise ProtocolError(f"retain-from index {retain_from} is negative")
        return Heartbeat(source, target, _check_term(term), _check_index(commit, "commit index"), retain_from)
    if kind == HEARTBEAT_RESPONSE_KIND:
        term, result = body.unpack(HEARTBEAT_RESPONSE)
        flags = body.unpack(HEARTBEAT_RESPONSE_FLAGS)[0] if body.position < len(body.data) else 0  # optional
        if flags & ~FLAG_DISK_FULL:
            raise ProtocolError(f"HEARTBEAT_RESPONSE flags {flags:#04x}: unknown bits")
        return HeartbeatResponse(source, target, _check_term(term), _enum(HeartbeatResult, result),
                                 bool(flags & FLAG_DISK_FULL))  # fmt: skip
    if kind == TIMEOUT_NOW_KIND:
        (term,) = body.unpack(TIMEOUT_NOW)
        return TimeoutNow(source, target, _check_term(term))
    if kind == RESET_KIND:
        return _decode_reset(body, source, target)
    raise ProtocolError(f"unknown Raft frame kind {kind}")


class RaftDecoder:
    """Bytes in, the peer's ``Hello`` and then its messages out (h11 style: ``receive_data``/``next_event``)."""

    def __init__(self, *, frame_size_max: int = FRAME_SIZE_MAX_DEFAULT) -> None:
        self.frame_size_max = frame_size_max
        self.hello: Hello | None = None
        self._buffer = Buffer(size_max=frame_size_max + FRAME_HEADER.size)

    def receive_data(self, data: bytes) -> None:
        self._buffer.feed(data)

    def next_event(self) -> Hello | Message | None:
        """The next whole frame decoded, or None until more bytes come."""
        header = self._buffer.unpack(FRAME_HEADER)
        if header is None:
            return None
        length, kind = header
        if not 1 <= length <= self.frame_size_max:
            raise ProtocolError(f"frame of {length} bytes (1..{self.frame_size_max} allowed)")
        if len(self._buffer) < 4 + length:
            return None
        self._buffer.skip(FRAME_HEADER.size)
        body = _Body(self._buffer.take(length - 1))
        if kind == HELLO:
            event = self._decode_hello(body)
        elif self.hello is None:
            raise ProtocolError(f"frame kind {kind} before HELLO")
        else:
            event = _decode_message(kind, body, self.hello.source, self.hello.target)
        body.done()
        return event

    def _decode_hello(self, body: _Body) -> Hello:
        if self.hello is not None:
            raise ProtocolError("a second HELLO")
        (version,) = body.unpack(HELLO_HEAD)
        if version != RAFT_PROTOCOL_VERSION:
            raise ProtocolError(f"Raft protocol version {version}, this member speaks {RAFT_PROTOCOL_VERSION}")
        group, source, target = body.identifier(), body.identifier(), body.identifier()
        address = body.text() if body.position < len(body.data) else ""  # optional: older members omit it
        (start,) = body.unpack(DATA_START) if body.position < len(body.data) else (0,)
        if start < 0:
            raise ProtocolError(f"negative data start offset {start}")
        file_size = 0  # optional: members before 2026-11-28 end the HELLO at the data start offset
        if body.position < len(body.data):
            (file_size,) = body.unpack(DATA_FILE_SIZE)
            if file_size < 1:
                raise ProtocolError(f"data file size {file_size} (at least 1 when present)")
        self.hello = Hello(group, source, target, version, address, start, file_size)
        return self.hello
