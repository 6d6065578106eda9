"""The controller port's wire protocol: requests and answers as JSON objects in length-prefixed frames.

Theory of operation
-------------------
After the preface (``wire.py``, port kind 4) a broker (or ``hasvc status``) sends requests and the
controller answers each, in any order, matched by the request id the broker chose:

    u32 length (of what follows) | u8 kind | u32 request id | body (a UTF-8 JSON object)

    kind 1 REGISTER              group, identity, client_address, ha_address
    kind 2 HEARTBEAT             group, broker_id, epoch, max_offset [, lost_tail]
    kind 3 ALTER_SYNC_STATE_SET  group, master_id, epoch, sync_state_set_epoch, sync_state_set
    kind 4 STATUS                (no field)
    kind 5 ELECT                 group, broker_id (the member to make master; null: the controller picks)
    kind 6 SNAPSHOT              index, offset (a controller fetching another's state: one chunk)
    kind 128 + k                 the answer to kind k

Every answer has ``status`` ("OK", "NOT_LEADER", "REFUSED"); one that is not OK has ``reason``,
NOT_LEADER ``leader`` too, and a REFUSED ALTER_SYNC_STATE_SET the group's view (the master reads
the set it must go on with from it) (the controller leader's address as HOST:PORT, or null when none is
known). An OK answer to REGISTER, HEARTBEAT, ALTER_SYNC_STATE_SET or ELECT carries the group's
view (``GroupView``: master, its addresses, epoch, SyncStateSet and its epoch; REGISTER's the
broker's id too, HEARTBEAT's ``lease``: whether the asking master may acknowledge for
``master_lease_seconds`` from when it sent the heartbeat); an OK answer to STATUS carries ``controller``, the controller's status object;
an OK answer to SNAPSHOT one chunk of the answering controller's state snapshot (``SnapshotChunk``:
``index``, ``size``, ``offset``, ``data`` as base64; ``hasvc.state.controller.snapshot_transfer``).

Controller traffic is a few small requests a second per broker, off the data path, so bodies are
JSON objects with named fields, as RocketMQ's remoting headers are. The decoder checks every
field's presence, type and range, and refuses a missing, unknown or duplicated field, a frame
over ``frame_size_max``, an unknown kind, a body that is not one UTF-8 JSON object, and a request
kind where an answer is expected (or the other way round): ``ProtocolError``, that connection
alone. Sans-IO: ``ControllerDecoder.receive_data``/``next_event``; ``encode`` returns bytes.
docs/PROTOCOL.md §5 has the byte tables.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import struct
from typing import ClassVar, Final

from hasvc.protocol.wire import Buffer, ProtocolError

# A STATUS answer of a controller with a few thousand groups is the largest frame (~200 bytes a
# group); every other frame is well under a kilobyte.
FRAME_SIZE_MAX_DEFAULT: Final = 1024 * 1024
# Group names, identities, addresses and reasons: a name or a sentence, never more.
TEXT_SIZE_MAX: Final = 4096
# Members of one broker group a SyncStateSet may name (RocketMQ's groups are 2-5 brokers).
SYNC_STATE_SET_SIZE_MAX: Final = 64
# Request ids, broker ids, epochs and offsets fit an i64 (Java's long, the store's offsets).
INT_MAX: Final = (1 << 63) - 1
# One SNAPSHOT answer's chunk of a state snapshot: base64 makes it 683 KiB, under FRAME_SIZE_MAX_DEFAULT
# with room for the other fields (a snapshot is up to 64 MiB: SNAPSHOT_SIZE_MAX, in 128 chunks).
SNAPSHOT_CHUNK_SIZE_MAX: Final = 512 * 1024

FRAME_HEADER = struct.Struct(">IBI")  # length of what follows (kind, request id, body), kind, request id
assert FRAME_HEADER.size == 9
LENGTH_SIZE: Final = 4  # the length field itself, not counted in it
HEAD_SIZE: Final = FRAME_HEADER.size - LENGTH_SIZE  # kind and request id: the least a length can be
REQUEST_ID_MAX: Final = (1 << 32) - 1

REGISTER: Final = 1
HEARTBEAT: Final = 2
ALTER_SYNC_STATE_SET: Final = 3
STATUS: Final = 4
ELECT: Final = 5
SNAPSHOT: Final = 6
ANSWER: Final = 128  # answer kind = ANSWER + request kind
KIND_NAMES: Final = {REGISTER: "REGISTER", HEARTBEAT: "HEARTBEAT", ALTER_SYNC_STATE_SET: "ALTER_SYNC_STATE_SET",
                     STATUS: "STATUS", ELECT: "ELECT", SNAPSHOT: "SNAPSHOT"}  # fmt: skip

STATUS_OK: Final = "OK"
STATUS_NOT_LEADER: Final = "NOT_LEADER"
STATUS_REFUSED: Final = "REFUSED"
ANSWER_STATUSES: Final = (STATUS_OK, STATUS_NOT_LEADER, STATUS_REFUSED)


# -- field types: each checks one decoded JSON value and returns it as the dataclass holds it --


def _text(value, name: str) -> str:
    if type(value) is not str:
        raise ProtocolError(f"field {name!r} must be a string, not {_json_type(value)}")
    if len(value.encode()) > TEXT_SIZE_MAX:
        raise ProtocolError(f"field {name!r} is longer than {TEXT_SIZE_MAX} bytes")
    return value


def _name(value, name: str) -> str:
    value = _text(value, name)
    if not value:
        raise ProtocolError(f"field {name!r} must not be empty")
    return value


def _optional_text(value, name: str) -> str | None:
    return None if value is None else _text(value, name)


def _optional_count(value, name: str) -> int | None:
    return None if value is None else _count(value, name)


def _count(value, name: str) -> int:
    """An integer 0..INT_MAX (epochs, offsets)."""
    if type(value) is not int:
        raise ProtocolError(f"field {name!r} must be an integer, not {_json_type(value)}")
    if not 0 <= value <= INT_MAX:
        raise ProtocolError(f"field {name!r} is {value}, outside 0..{INT_MAX}")
    return value


def _broker_id(value, name: str) -> int:
    value = _count(value, name)
    if value < 1:
        raise ProtocolError(f"field {name!r} is {value}: broker ids start at 1")
    return value


def _optional_broker_id(value, name: str) -> int | None:
    return None if value is None else _broker_id(value, name)


def _id_set(value, name: str) -> tuple[int, ...]:
    """A SyncStateSet: a list of distinct broker ids, sent sorted (kept as a sorted tuple)."""
    if type(value) is not list:
        raise ProtocolError(f"field {name!r} must be a list, not {_json_type(value)}")
    if len(value) > SYNC_STATE_SET_SIZE_MAX:
        raise ProtocolError(f"field {name!r} names {len(value)} brokers (at most {SYNC_STATE_SET_SIZE_MAX})")
    ids = tuple(sorted(_broker_id(item, name) for item in value))
    if len(set(ids)) != len(ids):
        raise ProtocolError(f"field {name!r} names a broker twice")
    return ids


def _status(value, name: str) -> str:
    if value not in ANSWER_STATUSES or type(value) is not str:
        raise ProtocolError(f"field {name!r} is {value!r}, not one of {', '.join(ANSWER_STATUSES)}")
    return value


def _boolean(value, name: str) -> bool:
    if type(value) is not bool:
        raise ProtocolError(f"field {name!r} must be true or false, not {_json_type(value)}")
    return value


def _object(value, name: str) -> dict:
    if type(value) is not dict:
        raise ProtocolError(f"field {name!r} must be an object, not {_json_type(value)}")
    return value


def _base64(value, name: str) -> bytes:
    if type(value) is not str:
        raise ProtocolError(f"field {name!r} must be a base64 string, not {_json_type(value)}")
    if len(value) > (SNAPSHOT_CHUNK_SIZE_MAX + 2) // 3 * 4:
        raise ProtocolError(f"field {name!r} holds more than {SNAPSHOT_CHUNK_SIZE_MAX} bytes")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"field {name!r} is not base64") from None


def _json_type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
            bool: "true/false", type(None): "null"}.get(type(value), type(value).__name__)  # fmt: skip


_CHECKS = {"text": _name, "optional_text": _optional_text, "count": _count, "broker_id": _broker_id,
           "optional_broker_id": _optional_broker_id, "optional_count": _optional_count, "id_set": _id_set, "status": _status, "object": _object,
           "boolean": _boolean, "base64": _base64}  # fmt: skip


def _checked(fields: dict[str, str], body: dict, what: str, optional: dict[str, str] | None = None) -> dict:
    """``body``'s fields checked against ``fields`` (name -> check): all present, none else;
    ``optional`` ones (name -> check) may be absent (an older sender's), then not in the result."""
    optional = optional or {}
    unknown = body.keys() - fields.keys() - optional.keys()
    if unknown:
        raise ProtocolError(f"{what}: unknown field {sorted(unknown)[0]!r}")
    missing = fields.keys() - body.keys()
    if missing:
        raise ProtocolError(f"{what}: field {sorted(missing)[0]!r} is missing")
    checked = {name: _CHECKS[check](body[name], name) for name, check in fields.items()}
    checked.update({name: _CHECKS[check](body[name], name) for name, check in optional.items() if name in body})
    return checked


# -- requests ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RegisterRequest:
    """A broker joins ``group``; ``identity`` is its store's (``STORE/identity``): the same store
    gets the same broker id back, its addresses updated."""

    KIND: ClassVar[int] = REGISTER
    FIELDS: ClassVar[dict] = {"group": "text", "identity": "text", "client_address": "text", "ha_address": "text"}
    group: str
    identity: str
    client_address: str  # HOST:PORT clients reach the broker at
    ha_address: str  # HOST:PORT its slaves connect to when it is master


@dataclasses.dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    KIND: ClassVar[int] = HEARTBEAT
    FIELDS: ClassVar[dict] = {"group": "text", "broker_id": "broker_id", "epoch": "count", "max_offset": "count"}
    # Sent only when not null (a broker before it sends none, and a controller before it would
    # refuse the unknown field): the start of the broker's newest epoch when that is past its log
    # end -- a power loss cut bytes this store held when the epoch began (docs/design/controller.md).
    OPTIONAL: ClassVar[dict] = {"lost_tail": "optional_count"}
    group: str
    broker_id: int
    epoch: int  # the broker's newest epoch (its epoch file's last)
    max_offset: int  # the broker's log end
    lost_tail: int | None = None  # that epoch's start offset when it is past max_offset; None: no tail lost


@dataclasses.dataclass(frozen=True, slots=True)
class AlterSyncStateSetRequest:
    """The master proposes a new SyncStateSet; accepted only when the master and both epochs are
    the current ones (``hasvc/state/controller/state.py``)."""

    KIND: ClassVar[int] = ALTER_SYNC_STATE_SET
    FIELDS: ClassVar[dict] = {"group": "text", "master_id": "broker_id", "epoch": "count",
                              "sync_state_set_epoch": "count", "sync_state_set": "id_set"}  # fmt: skip
    group: str
    master_id: int
    epoch: int
    sync_state_set_epoch: int
    sync_state_set: tuple[int, ...]  # sorted


@dataclasses.dataclass(frozen=True, slots=True)
class StatusRequest:
    KIND: ClassVar[int] = STATUS
    FIELDS: ClassVar[dict] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class ElectRequest:
    """An operator's switchover: make ``broker_id`` master (None: the controller picks, as it
    does when a master lapses)."""

    KIND: ClassVar[int] = ELECT
    FIELDS: ClassVar[dict] = {"group": "text", "broker_id": "optional_broker_id"}
    group: str
    broker_id: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """One chunk of the answering controller's state snapshot, asked by a controller whose log
    starts past its state (the leader RESET it). ``offset`` 0: a snapshot reflecting at least
    Raft entry ``index``; above 0: the bytes from ``offset`` of the snapshot of exactly ``index``
    (the one the first chunk's answer named)."""

    KIND: ClassVar[int] = SNAPSHOT
    FIELDS: ClassVar[dict] = {"index": "count", "offset": "count"}
    index: int
    offset: int


Request = RegisterRequest | HeartbeatRequest | AlterSyncStateSetRequest | StatusRequest | ElectRequest | SnapshotRequest
REQUEST_TYPES: Final = {cls.KIND: cls for cls in (RegisterRequest, HeartbeatRequest, AlterSyncStateSetRequest,
                                                  StatusRequest, ElectRequest, SnapshotRequest)}  # fmt: skip


# -- answers -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class GroupView:
    """What a broker learns of its group from an answer: who is master in which epoch, and the
    SyncStateSet."""

    FIELDS: ClassVar[dict] = {"group": "text", "master_id": "optional_broker_id",
                              "master_client_address": "optional_text", "master_ha_address": "optional_text",
                              "epoch": "count", "sync_state_set": "id_set", "sync_state_set_epoch": "count"}  # fmt: skip
    group: str
    master_id: int | None  # None: no master (never elected, or nobody electable)
    master_client_address: str | None
    master_ha_address: str | None
    epoch: int
    sync_state_set: tuple[int, ...]  # sorted
    sync_state_set_epoch: int
    # HEARTBEAT answers only (None in the others): the asking broker is the master and may
    # acknowledge for master_lease_seconds from when it sent this heartbeat.
    lease: bool | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """An OK SNAPSHOT answer's part: ``data`` is the snapshot's bytes from ``offset`` (the last
    chunk ends at ``size``)."""

    FIELDS: ClassVar[dict] = {"index": "count", "size": "count", "offset": "count", "data": "base64"}
    index: int  # the Raft index the snapshot reflects
    size: int  # the whole snapshot's bytes
    offset: int
    data: bytes

    def __post_init__(self) -> None:
        if len(self.data) > SNAPSHOT_CHUNK_SIZE_MAX or self.offset + len(self.data) > self.size:
            raise ValueError(f"a snapshot chunk of {len(self.data)} bytes at {self.offset} of {self.size}")


# OK answers: the fields each kind carries besides ``status`` (a GroupView's are flattened in).
_OK_FIELDS: Final = {
    REGISTER: {"broker_id": "broker_id", **GroupView.FIELDS},
    HEARTBEAT: {**GroupView.FIELDS, "lease": "boolean"},
    ALTER_SYNC_STATE_SET: dict(GroupView.FIELDS),
    ELECT: dict(GroupView.FIELDS),
    STATUS: {"controller": "object"},
    SNAPSHOT: dict(SnapshotChunk.FIELDS),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """The answer to a request of kind ``kind``: ``status`` OK with the kind's fields
    (``view``, ``broker_id`` for REGISTER, ``controller`` for STATUS), or NOT_LEADER (``leader``)
    or REFUSED with a ``reason``."""

    kind: int  # the request kind answered
    status: str
    reason: str | None = None
    leader: str | None = None  # NOT_LEADER: the controller leader's address, None when unknown
    view: GroupView | None = None
    broker_id: int | None = None  # REGISTER
    controller: dict | None = None  # STATUS
    snapshot: SnapshotChunk | None = None  # SNAPSHOT

    def __post_init__(self) -> None:
        if self.kind not in REQUEST_TYPES or self.status not in ANSWER_STATUSES:
            raise ValueError(f"an answer of kind {self.kind} with status {self.status!r}")
        if self.status == STATUS_OK:
            if ((self.kind == STATUS) != (self.controller is not None) or (self.kind == SNAPSHOT) != (self.snapshot is not None)
                    or (self.kind not in (STATUS, SNAPSHOT)) != (self.view is not None)):  # fmt: skip
                raise ValueError(f"an OK {KIND_NAMES[self.kind]} answer needs "
                                 f"{ {STATUS: 'controller', SNAPSHOT: 'snapshot'}.get(self.kind, 'view')} alone")
            if (self.kind == REGISTER) != (self.broker_id is not None):
                raise ValueError("broker_id goes in an OK REGISTER answer only")
            if self.kind == HEARTBEAT and self.view.lease is None:
                raise ValueError("an OK HEARTBEAT answer's view says whether it grants a lease (true or false)")
        elif self.reason is None or self.controller is not None or self.broker_id is not None or self.snapshot is not None:
            raise ValueError(f"a {self.status} answer has a reason and nothing but leader (or a refused set change's view)")
        elif (self.view is not None) != (self.status == STATUS_REFUSED and self.kind == ALTER_SYNC_STATE_SET):
            raise ValueError("a REFUSED ALTER_SYNC_STATE_SET answer carries the group's view, no other answer that is not OK")
        if self.view is not None and self.view.lease is not None and not (self.ok and self.kind == HEARTBEAT):
            raise ValueError("lease goes in an OK HEARTBEAT answer's view only")
        if self.leader is not None and self.status != STATUS_NOT_LEADER:
            raise ValueError("leader goes in a NOT_LEADER answer only")

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK


def not_leader(kind: int, leader: str | None, reason: str) -> Answer:
    return Answer(kind, STATUS_NOT_LEADER, reason=reason, leader=leader)


def refused(kind: int, reason: str, view: GroupView | None = None) -> Answer:
    """REFUSED; ``view``: the group as the controller holds it (an ALTER_SYNC_STATE_SET's, always)."""
    return Answer(kind, STATUS_REFUSED, reason=reason, view=view)


def _answer_body(answer: Answer) -> dict:
    if answer.status != STATUS_OK:
        body = {"status": answer.status, "reason": answer.reason}
        if answer.status == STATUS_NOT_LEADER:
            body["leader"] = answer.leader
        if answer.view is None:
            return body
    else:
        body = {"status": STATUS_OK}
    if answer.kind == STATUS:
        body["controller"] = answer.controller
        return body
    if answer.kind == SNAPSHOT:
        chunk = answer.snapshot
        body.update(index=chunk.index, size=chunk.size, offset=chunk.offset, data=base64.b64encode(chunk.data).decode())
        return body
    if answer.kind == REGISTER:
        body["broker_id"] = answer.broker_id
    view = dataclasses.asdict(answer.view)
    view["sync_state_set"] = sorted(view["sync_state_set"])
    if view["lease"] is None:
        del view["lease"]
    body.update(view)
    return body


def _decode_answer(kind: int, body: dict) -> Answer:
    what = f"{KIND_NAMES[kind]} answer"
    status = body.get("status")
    if status is None:
        raise ProtocolError(f"{what}: field 'status' is missing")
    _status(status, "status")
    if status == STATUS_NOT_LEADER:
        fields = _checked({"status": "status", "reason": "text", "leader": "optional_text"}, body, what)
        return Answer(kind, status, reason=fields["reason"], leader=fields["leader"])
    if status == STATUS_REFUSED and kind == ALTER_SYNC_STATE_SET:  # with the controller's view of the set
        fields = _checked({"status": "status", "reason": "text", **GroupView.FIELDS}, body, what)
        return Answer(kind, status, reason=fields["reason"], view=_view(fields, what))
    if status == STATUS_REFUSED:
        fields = _checked({"status": "status", "reason": "text"}, body, what)
        return Answer(kind, status, reason=fields["reason"])
    fields = _checked({"status": "status", **_OK_FIELDS[kind]}, body, what)
    if kind == STATUS:
        return Answer(kind, status, controller=fields["controller"])
    if kind == SNAPSHOT:
        try:
            return Answer(kind, status, snapshot=SnapshotChunk(**{name: fields[name] for name in SnapshotChunk.FIELDS}))
        except ValueError as error:
            raise ProtocolError(f"{what}: {error}") from None
    return Answer(kind, status, view=_view(fields, what), broker_id=fields.get("broker_id"))


def _view(fields: dict, what: str) -> GroupView:
    view = GroupView(**{name: fields[name] for name in GroupView.FIELDS}, lease=fields.get("lease"))
    if view.master_id is not None and view.master_id not in view.sync_state_set:
        raise ProtocolError(f"{what}: master {view.master_id} is not in its SyncStateSet {list(view.sync_state_set)}")
    return view


# -- frames ------------------------------------------------------------------------------------


def _frame(kind: int, request_id: int, body: dict) -> bytes:
    if not 0 <= request_id <= REQUEST_ID_MAX:
        raise ValueError(f"request id {request_id} is outside 0..{REQUEST_ID_MAX}")
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return FRAME_HEADER.pack(HEAD_SIZE + len(data), kind, request_id) + data


def encode_request(request_id: int, request: Request) -> bytes:
    body = {}
    for field in dataclasses.fields(request):
        value = getattr(request, field.name)
        if value is None and field.name in getattr(request, "OPTIONAL", {}):
            continue  # absent means null: a controller that predates the field accepts the request
        body[field.name] = sorted(value) if isinstance(value, (tuple, frozenset, set)) else value
    return _frame(request.KIND, request_id, body)


def encode_answer(request_id: int, answer: Answer) -> bytes:
    return _frame(ANSWER + answer.kind, request_id, _answer_body(answer))


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    body = dict(pairs)
    if len(body) != len(pairs):
        raise ProtocolError("a JSON object names a field twice")
    return body


def _no_constant(name: str):
    raise ProtocolError(f"{name} is not JSON a controller sends")


def _parse_body(data: bytes) -> dict:
    try:
        body = json.loads(data.decode(), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise ProtocolError("a frame body is not UTF-8") from None
    except (ValueError, RecursionError) as error:  # JSONDecodeError, too many digits, nesting too deep
        raise ProtocolError(f"a frame body is not JSON: {str(error)[:200]}") from None
    if type(body) is not dict:
        raise ProtocolError(f"a frame body is {_json_type(body)}, not a JSON object")
    return body


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame: its request id and the request or answer it carries."""

    request_id: int
    message: Request | Answer


class ControllerDecoder:
    """Bytes in, ``Frame``s out (h11 style: ``receive_data``/``next_event``). ``answers=False``:
    the controller's side (requests expected); True: a client's (answers expected)."""

    def __init__(self, *, answers: bool, frame_size_max: int = FRAME_SIZE_MAX_DEFAULT) -> None:
        self.answers = answers
        self.frame_size_max = frame_size_max
        self._buffer = Buffer(size_max=frame_size_max + LENGTH_SIZE)

    def receive_data(self, data: bytes) -> None:
        self._buffer.feed(data)

    def next_event(self) -> Frame | None:
        """The next whole frame decoded, or None until more bytes come."""
        header = self._buffer.unpack(FRAME_HEADER)
        if header is None:
            if len(self._buffer) >= LENGTH_SIZE:  # a length too small for a header is refused at once
                self._check_length(int.from_bytes(self._buffer.peek(LENGTH_SIZE), "big"))
            return None
        length, kind, request_id = header
        self._check_length(length)
        if len(self._buffer) < LENGTH_SIZE + length:
            return None
        self._buffer.skip(FRAME_HEADER.size)
        body = _parse_body(self._buffer.take(length - HEAD_SIZE))
        if self.answers:
            if kind - ANSWER not in REQUEST_TYPES:
                raise ProtocolError(f"frame kind {kind} is not a controller answer")
            return Frame(request_id, _decode_answer(kind - ANSWER, body))
        cls = REQUEST_TYPES.get(kind)
        if cls is None:
            raise ProtocolError(f"frame kind {kind} is not a controller request")
        return Frame(request_id, cls(**_checked(cls.FIELDS, body, KIND_NAMES[kind], getattr(cls, "OPTIONAL", None))))

    def _check_length(self, length: int) -> None:
        if not HEAD_SIZE <= length <= self.frame_size_max:
            raise ProtocolError(f"frame of {length} bytes ({HEAD_SIZE}..{self.frame_size_max} allowed)")
