"""A pass of SENDs appended in one call: the classic master's per-message work, native when built.

Theory of operation
-------------------
The client port hands the put path every SEND read in one pass of its loop. Decoded one by one
and appended group by group (a batch per topic and queue), a pass cost Python per message: the
decode, the grouping, a merged batch and its checks, an append result cut out per request, an
answer built field by field. Here a pass is two calls, each one loop over every message of every
request, native when the optional module is built (``commitlog/_scan.c`` ``plan_pass`` and
``write_pass``, twins of the functions below: same results, same bytes). A request is a request
object (topic, queue_id, flag, born_timestamp, bodies, properties one per body) or a SEND's
payload as the client port read it: the native functions read the client protocol's SEND layout
themselves (as ``split_messages`` does), the twins are given its decoder.

1. ``plan_pass``: each request's queue key ((topic, queue id), numbered in the order first
   seen), the payloads the decoder refuses (malformed), the requests whose content
   ``record.prepare_batch`` would refuse as a batch of their own (no message, properties not one
   per body, the store's record CRC property, bodies over ``body_size_max`` together, properties
   over ``PROPERTIES_SIZE_MAX``), and per key the messages and the bytes of bodies and properties
   (the CRC tail counted) of the requests kept. ``append_pass`` checks each key's topic and queue
   id once (``record._batch_shape``, cached) and gets the status and reason of every refused
   request from ``record.prepare_batch`` itself, so refusals read word for word as the batch
   path's (and a malformed SEND's error is the decoder's: the caller's to ask).
2. ``write_pass``: every request kept, in the order read, encoded at ``buffer[position:]`` as
   ``record.write_batch`` would write it as a batch of its own (the same bytes:
   tests/unit/test_pass_encode.py), with queue offsets following on per key from
   ``first_queue_offsets``; returned with the records' offsets and queue offsets and, per
   request, its offsets packed for its answer (queue id, n, then n pairs of offset and queue
   offset, big-endian ``>iI`` + n x ``>qq``: the client protocol's SEND answer after its status).

A SEND_IDEMPOTENT is marked by its frame kind in ``kinds`` (one byte a request; None: every
request a plain SEND): its payload's head (producer id, first sequence) is read and checked by
``plan_pass`` as the client protocol's decoder checks it (a bad one is malformed), its messages
are tagged with its producer id and sequences as the broker tags them (``tag_properties``: the
tag counted in the property-size and CRC-tail checks) and written so; a request object of that
kind is tagged from its ``producer_id`` and ``first_sequence``. ``plan_pass`` returns each one's
producer id, first sequence, messages and bytes (``idempotent``) for the producer table.
Between the two calls, the caller may leave requests out (``append_pass``'s ``decide``: the
broker's producer table judging the pass's SEND_IDEMPOTENTs): they are excluded like the refused
ones and their messages taken off their key's count (``leave_out``); the caller answers them.

Records of one queue keep their order (a connection's SENDs to a queue land as sent); records of
different queues read in one pass interleave as they were read. Nothing is decided here: who may
write, the limits' values and what a put waits for are the caller's; a transactional sysflag is
not this path's (client SENDs carry none).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable

from commitlog import native as _native
from commitlog import record as rec

_PLAN_NATIVE = _native.plan_pass
_WRITE_NATIVE = _native.write_pass

_ANSWER_HEAD = struct.Struct(">iI")  # queue id, n
_ANSWER_PAIR = struct.Struct(">qq")  # offset, queue offset

# SEND_IDEMPOTENT: the client protocol's frame kind, its producer id's limit and the two properties
# its messages are tagged with, last (hasvc.protocol.client's and hasvc.state.dedupe's: the broker
# checks they are these; _scan.c has them too).
KIND_SEND_IDEMPOTENT = 7
PRODUCER_ID_SIZE_MAX = 64
PROPERTY_PRODUCER_ID = "HASVC_PRODUCER_ID"
PROPERTY_PRODUCER_SEQ = "HASVC_PRODUCER_SEQ"
_TAG_ID = f"{PROPERTY_PRODUCER_ID}\x01".encode()
_TAG_SEQ = f"\x02{PROPERTY_PRODUCER_SEQ}\x01".encode()


def tag_properties(properties: bytes, producer_id: str, sequence: int) -> bytes:
    """A message's properties with its producer id and sequence added, last (the reference of the
    native tag; ``hasvc.broker.put_service.tag_properties`` is the batch path's)."""
    separator = b"" if not properties or properties.endswith(b"\x02") else b"\x02"
    return b"".join((properties, separator, _TAG_ID, producer_id.encode(), _TAG_SEQ, str(sequence).encode(), b"\x02"))


class _Tagged:
    """A SEND_IDEMPOTENT as the pass writes it: its fields, its properties tagged."""

    __slots__ = ("topic", "queue_id", "bodies", "properties", "flag", "born_timestamp", "producer_id", "first_sequence")

    def __init__(self, request) -> None:
        self.topic, self.queue_id, self.bodies = request.topic, request.queue_id, request.bodies
        self.flag, self.born_timestamp = request.flag, request.born_timestamp
        self.producer_id, self.first_sequence = request.producer_id, request.first_sequence
        self.properties = [tag_properties(p, request.producer_id, request.first_sequence + i) for i, p in enumerate(request.properties)]


def _is_payload(request) -> bool:
    return isinstance(request, bytes | bytearray | memoryview)


def request_of(requests, number: int, kinds, decode: Callable | None):
    """Request ``number`` of a pass as it is written: a payload decoded (None when malformed), a
    SEND_IDEMPOTENT tagged (``_Tagged``)."""
    request = requests[number]
    idempotent = kinds is not None and kinds[number] == KIND_SEND_IDEMPOTENT
    if _is_payload(request):
        if decode is None:
            raise TypeError("a SEND payload in a pass planned without a decoder")
        request = decode(request, idempotent=idempotent)
        if request is None:
            return None
    return _Tagged(request) if idempotent else request


def plan_pass_python(requests, *, body_size_max: int, record_crc: bool, messages_max: int, decode: Callable | None = None,
                     kinds=None) -> tuple[list, list[int], list[int], list[int], list[int], list[int], tuple]:  # fmt: skip
    """(keys, key_of, refused, counts, variable, malformed, idempotent): ``keys`` the (topic,
    queue id) of the pass in the order first seen, ``key_of`` each request's index in ``keys``
    (-1 when malformed), ``refused`` the indexes of the requests refused for their content,
    ``counts`` and ``variable`` per key the messages and the body and properties bytes (with the
    CRC tail when ``record_crc``) of the requests kept, ``malformed`` the indexes of the SEND
    payloads that ``decode`` (the client protocol's, given ``messages_max``; called with
    ``idempotent=True`` for a SEND_IDEMPOTENT's) finds malformed: it returns None for those.
    ``idempotent``: (numbers, producer ids, first sequences, messages, sizes), one each a
    SEND_IDEMPOTENT not malformed, in the order read (sizes: what it adds to its key's
    ``variable``, 0 when refused). A request is a request object or a SEND's payload (bytes or a
    view); ``kinds`` one byte a request, its frame kind, or None (every request a plain SEND)."""
    keys: list = []
    index_of: dict = {}
    key_of: list[int] = []
    refused: list[int] = []
    counts: list[int] = []
    variable: list[int] = []
    malformed: list[int] = []
    idempotent: tuple = ([], [], [], [], [])
    for number in range(len(requests)):
        request = request_of(requests, number, kinds, decode)
        if request is None:
            key_of.append(-1)
            malformed.append(number)
            continue
        topic = request.topic
        if type(topic) is not str:
            raise TypeError("a request's topic must be a str")
        key = (topic, request.queue_id)
        index = index_of.get(key)
        if index is None:
            index = index_of[key] = len(keys)
            keys.append(key)
            counts.append(0)
            variable.append(0)
        key_of.append(index)
        bodies, properties = request.bodies, request.properties
        body_total = sum(len(body) for body in bodies)
        property_sizes = [len(p) + (rec.record_crc_extra_size(p) if record_crc else 0) for p in properties]
        tagged = type(request) is _Tagged
        if (not bodies or len(properties) != len(bodies) or any(rec.RECORD_CRC_TAIL_PREFIX in p for p in properties)
                or body_total > body_size_max or max(property_sizes) > rec.PROPERTIES_SIZE_MAX):  # fmt: skip
            refused.append(number)
            size = 0
        else:
            size = body_total + sum(property_sizes)
            counts[index] += len(bodies)
            variable[index] += size
        if tagged:
            for values, value in zip(idempotent, (number, request.producer_id, request.first_sequence, len(bodies), size)):
                values.append(value)
    return keys, key_of, refused, counts, variable, malformed, idempotent


def write_pass_python(buffer, position: int, *, physical_base: int, store_timestamp: int, store_ip: bytes, store_port: int,
                      born_ip: bytes, born_port: int, sysflag: int, record_crc: bool, requests, key_of: list[int],
                      excluded: bytes, topics: list[bytes], first_queue_offsets: list[int], messages_max: int,
                      decode: Callable | None = None, kinds=None) -> tuple[int, tuple, tuple, list]:  # fmt: skip
    """(bytes written, the records' offsets, their queue offsets, per request its packed answer
    offsets or None when excluded): the requests not ``excluded`` (one byte a request, nonzero
    to leave it out) written at ``buffer[position:]`` in their order, each as ``record.write_batch``
    writes a batch of it (a SEND_IDEMPOTENT's messages tagged: ``kinds`` as ``plan_pass``'s);
    ``topics`` the encoded topic of each key."""
    assert not sysflag & rec.SYSFLAG_TRANSACTION_MASK, sysflag
    next_queue_offsets = list(first_queue_offsets)
    offsets: list[int] = []
    queue_offsets: list[int] = []
    answers: list = []
    start = position
    for number in range(len(requests)):
        if excluded[number]:
            answers.append(None)
            continue
        request = request_of(requests, number, kinds, decode)
        index = key_of[number]
        topic = topics[index]
        v2 = len(topic) > rec.TOPIC_SIZE_MAX_V1
        properties = request.properties
        batch = rec.MessageBatch(request.topic, request.bodies, queue_id=request.queue_id, properties=list(properties),
                                 flag=request.flag, born_timestamp=request.born_timestamp)  # fmt: skip
        fixed = rec._fixed_record_size(len(topic), sysflag, v2)
        sizes = [fixed + len(body) + len(p) + (rec.record_crc_extra_size(p) if record_crc else 0)
                 for body, p in zip(request.bodies, properties, strict=True)]  # fmt: skip
        prepared = rec.PreparedBatch(batch, topic, list(properties), sysflag, born_ip, born_port, sizes, sum(sizes), record_crc)
        first = next_queue_offsets[index]
        next_queue_offsets[index] = first + len(sizes)
        written = rec.write_batch(buffer, position, prepared, queue_offset_first=first, physical_base=physical_base,
                                  store_timestamp=store_timestamp, store_ip=store_ip, store_port=store_port, native=False)  # fmt: skip
        assert written == prepared.total, (written, prepared.total)
        mine = []
        answer = bytearray(_ANSWER_HEAD.pack(request.queue_id, len(sizes)))
        for offset, size in enumerate(sizes, start=first):
            offsets.append(physical_base + position)
            queue_offsets.append(offset)
            mine.append(_ANSWER_PAIR.pack(physical_base + position, offset))
            position += size
        answers.append(bytes(answer + b"".join(mine)))
    return position - start, tuple(offsets), tuple(queue_offsets), answers


def plan_pass(requests, *, body_size_max: int, record_crc: bool, messages_max: int, decode: Callable | None = None,
              native: bool | None = None, kinds=None):  # fmt: skip
    """``plan_pass_python``, in one native call when the module is built (which reads SEND
    payloads itself: ``decode`` is for the twin)."""
    if _PLAN_NATIVE is not None and native is not False:
        return _PLAN_NATIVE(requests, body_size_max, record_crc, messages_max, kinds)
    return plan_pass_python(requests, body_size_max=body_size_max, record_crc=record_crc, messages_max=messages_max, decode=decode,
                            kinds=kinds)  # fmt: skip


def write_pass(buffer, position: int, *, physical_base: int, store_timestamp: int, store_ip: bytes, store_port: int,
               born_ip: bytes, born_port: int, sysflag: int, record_crc: bool, requests, key_of: list[int], excluded: bytes,
               topics: list[bytes], first_queue_offsets: list[int], messages_max: int, decode: Callable | None = None,
               native: bool | None = None, kinds=None) -> tuple[int, tuple, tuple, list]:  # fmt: skip
    """``write_pass_python``, in one native call when the module is built (CRC32C bodies only)."""
    if _WRITE_NATIVE is not None and native is not False:
        return _WRITE_NATIVE(buffer, position, physical_base, store_timestamp, store_ip, store_port, born_ip, born_port,
                             sysflag, record_crc, requests, key_of, excluded, topics, first_queue_offsets, messages_max, kinds)  # fmt: skip
    return write_pass_python(
        buffer, position, physical_base=physical_base, store_timestamp=store_timestamp, store_ip=store_ip,
        store_port=store_port, born_ip=born_ip, born_port=born_port, sysflag=sysflag, record_crc=record_crc,
        requests=requests, key_of=key_of, excluded=excluded, topics=topics, first_queue_offsets=first_queue_offsets,
        messages_max=messages_max, decode=decode, kinds=kinds,
    )  # fmt: skip


# Client SENDs carry no born host: their records hold MessageBatch's default, as the batch path's.
BORN_HOST = ("127.0.0.1", 0)
assert rec.MessageBatch.__dataclass_fields__["born_host"].default == BORN_HOST


class PassAppend:
    """What ``append_pass`` did: ``result`` the append of every request kept (one result for the
    pass, None when every request was refused), ``answers`` per request its packed answer offsets
    (None when refused or malformed), ``refusals`` the refused ones by index, each the
    ``MessageRejected`` that ``record.prepare_batch`` raises for it, and ``malformed`` the indexes
    of the SEND payloads the client protocol refuses (the caller answers them with its error)."""

    __slots__ = ("result", "answers", "refusals", "malformed", "left_out", "entry_sizes")

    def __init__(self, result, answers: list, refusals: dict[int, rec.MessageRejected], malformed: list[int],
                 left_out: frozenset = frozenset(), entry_sizes: list[int] | None = None) -> None:  # fmt: skip
        self.result = result
        self.answers = answers
        self.refusals = refusals
        self.malformed = malformed
        self.left_out = left_out  # the requests the caller's ``decide`` left out (answered by the caller)
        self.entry_sizes = entry_sizes  # a DLedger proposal's: each record's entry size, in the order of result.offsets


def refusal_of(request, *, body_size_max: int, store_v6: bool, record_crc: bool) -> rec.MessageRejected:
    """Why ``record.prepare_batch`` refuses a request as a batch of its own (a request this module
    found refused: never None)."""
    properties = request.properties
    batch = rec.MessageBatch(request.topic, request.bodies, queue_id=request.queue_id, properties=list(properties),
                             flag=request.flag, born_timestamp=request.born_timestamp)  # fmt: skip
    try:
        rec.prepare_batch(batch, body_size_max=body_size_max, store_v6=store_v6, record_crc=record_crc)
    except rec.MessageRejected as refusal:
        return refusal
    raise AssertionError(f"request to {request.topic!r}/{request.queue_id} refused by the pass but not by prepare_batch")


@dataclasses.dataclass(slots=True)
class PassShape:
    """What a planned pass's keys and requests come to, as ``append_pass`` and
    ``entry_pass.plan_entry_pass`` both need it: per key its topic's bytes (b"" for a bad key, one
    ``record._batch_shape`` refuses) and the fixed size of its records (0 for a bad key); the
    records' hosts and sysflag; one flag a request (1: not written: refused, malformed or of a bad
    key) and the refusal of each request refused or of a bad key, word for word the batch path's."""

    topics: list[bytes]
    bad_keys: set[int]
    born_ip: bytes | None
    born_port: int | None
    sysflag: int | None
    excluded: bytes
    refusals: dict[int, rec.MessageRejected]
    key_sizes: list[int]


# The shapes of the queue keys seen (``_key_shape``): producers send to the same queues. At most
# this many kept (cleared when full), as ``record._batch_shape``'s cache.
KEY_SHAPES_MAX = 1024
_key_shapes: dict[tuple, tuple] = {}


def _key_shape(key: tuple, store_v6: bool) -> tuple | None:
    """A valid key's (topic bytes, born ip, born port, sysflag, fixed record size), as
    ``shape_pass``'s loop makes them, from a cache; None for a key ``record._batch_shape`` refuses
    (the loop then says why)."""
    shape = _key_shapes.get((key, store_v6))
    if shape is None:
        try:
            topic_bytes, born_ip, born_port, sysflag, v2 = rec._batch_shape(key[0], key[1], BORN_HOST, 0)
        except rec.MessageRejected:
            return None
        sysflag |= rec.SYSFLAG_STOREHOST_V6 if store_v6 else 0
        shape = (topic_bytes, born_ip, born_port, sysflag, rec._fixed_record_size(len(topic_bytes), sysflag, v2))
        if len(_key_shapes) >= KEY_SHAPES_MAX:
            _key_shapes.clear()
        _key_shapes[(key, store_v6)] = shape
    return shape


def shape_pass(requests, keys: list, key_of: list[int], refused: list[int], malformed: list[int], counts: list[int], *,
               body_size_max: int, store_v6: bool, record_crc: bool, decode: Callable, kinds=None) -> PassShape:  # fmt: skip
    """The ``PassShape`` of a pass ``plan_pass`` planned (its keys, key_of, refused, malformed and
    counts): one ``record._batch_shape`` a key, one refusal a request refused."""
    if len(keys) == 1 and not refused and not malformed:  # a lone writer's pass (one queue, nothing refused)
        shape = _key_shape(keys[0], store_v6)
        if shape is not None:
            topic_bytes, born_ip, born_port, sysflag, key_size = shape
            return PassShape([topic_bytes], set(), born_ip, born_port, sysflag, bytes(len(requests)), {}, [key_size])
    topics: list[bytes] = []
    key_sizes: list[int] = []
    bad_keys: set[int] = set()
    born_ip = born_port = sysflag = None
    for index, (topic, queue_id) in enumerate(keys):
        try:
            topic_bytes, born_ip, born_port, sysflag, v2 = rec._batch_shape(topic, queue_id, BORN_HOST, 0)
        except rec.MessageRejected:
            bad_keys.add(index)
            topics.append(b"")
            key_sizes.append(0)
            continue
        sysflag |= rec.SYSFLAG_STOREHOST_V6 if store_v6 else 0
        topics.append(topic_bytes)
        key_sizes.append(rec._fixed_record_size(len(topic_bytes), sysflag, v2))
    excluded = bytearray(len(requests))
    for number in refused + malformed:
        excluded[number] = 1
    if bad_keys:
        for number, index in enumerate(key_of):
            if index in bad_keys:
                excluded[number] = 1
    refusals = {}
    if refused or bad_keys:
        for number in sorted({*refused, *(n for n, index in enumerate(key_of) if index in bad_keys)}):
            request = request_of(requests, number, kinds, decode)
            refusals[number] = refusal_of(request, body_size_max=body_size_max, store_v6=store_v6, record_crc=record_crc)
    return PassShape(topics, bad_keys, born_ip, born_port, sysflag, bytes(excluded), refusals, key_sizes)


def leave_out(shape: PassShape, key_of: list[int], counts: list[int], variable: list[int], malformed: list[int],
              decide: Callable | None, idempotent: tuple) -> frozenset:  # fmt: skip
    """The requests ``decide`` leaves out of a planned pass (a SEND_IDEMPOTENT the producer table
    finds a retry or refuses): ``decide`` is given the set of requests the pass will not write
    (refused for their content, malformed, of a bad key) and the plan's ``idempotent`` (the
    pass's SEND_IDEMPOTENTs: numbers, producer ids, first sequences, messages, sizes) and
    returns those it leaves out, some of these (the caller answers them). Each is excluded, its
    refusal for its content dropped (the caller's answer comes first, as the batch path looks
    the producer table up before it appends) and its messages and bytes taken off its key's
    ``counts`` and ``variable``."""
    if decide is None:
        return frozenset()
    left_out = frozenset(decide({*shape.refusals, *malformed}, idempotent))
    if not left_out:
        return left_out
    excluded = bytearray(shape.excluded)
    numbers, _, _, messages, sizes = idempotent
    place = {number: k for k, number in enumerate(numbers)}
    for number in left_out:
        if excluded[number]:
            shape.refusals.pop(number, None)
            continue
        excluded[number] = 1
        index, k = key_of[number], place[number]
        counts[index] -= messages[k]
        variable[index] -= sizes[k]
    shape.excluded = bytes(excluded)
    return left_out


def append_pass(store, requests, *, messages_max: int, decode: Callable, native: bool | None = None,
                decide: Callable | None = None, kinds=None) -> PassAppend | None:  # fmt: skip
    """Append a pass of SENDs (``requests``: each a request object with topic, queue_id, flag,
    born_timestamp, bodies and properties one per body, or a SEND's payload, which ``decode``
    turns into one or None when malformed) to ``store``'s commit log in one append, the records of
    the requests kept in their order; the refused and malformed ones answered apart. None when the pass must take the batch
    path, which answers those cases itself: the store refuses writes (a failed sync, the disk full),
    hashes bodies with another CRC than CRC32C, the pass does not fit one segment, or no segment
    had room (DISK_FULL, noted as the batch path notes it)."""
    config, commit_log = store.config, store.commit_log
    if store.crc_function is not rec.CRC_FUNCTIONS["crc32c"] or store.write_failure is not None or store.disk_full():
        return None
    body_size_max, record_crc, store_v6 = config.max_message_size, config.append_record_crc, commit_log.store_v6
    if _PLAN_NATIVE is not None and native is not False:  # plan_pass's native branch, called directly
        keys, key_of, refused, counts, variable, malformed, idempotent = _PLAN_NATIVE(requests, body_size_max, record_crc,
                                                                                      messages_max, kinds)  # fmt: skip
    else:
        keys, key_of, refused, counts, variable, malformed, idempotent = plan_pass(
            requests, body_size_max=body_size_max, record_crc=record_crc, messages_max=messages_max, decode=decode,
            native=native, kinds=kinds,
        )  # fmt: skip
    shape = shape_pass(requests, keys, key_of, refused, malformed, counts, body_size_max=body_size_max, store_v6=store_v6,
                       record_crc=record_crc, decode=decode, kinds=kinds)  # fmt: skip
    left_out = frozenset() if decide is None else leave_out(shape, key_of, counts, variable, malformed, decide, idempotent)
    bad_keys = shape.bad_keys
    if len(keys) == 1:  # one call fewer than the general sum's generator, twice (a lone writer's pass)
        total = 0 if bad_keys else shape.key_sizes[0] * counts[0] + variable[0]
    else:
        total = sum(shape.key_sizes[index] * counts[index] + variable[index] for index in range(len(keys)) if index not in bad_keys)
    if total == 0:
        return PassAppend(None, [None] * len(requests), shape.refusals, malformed, left_out)
    if total + rec.BLANK_SIZE > commit_log.segment_size:
        return None
    answers: list = []
    write_native = _WRITE_NATIVE if native is not False else None

    def write(buffer, position: int, base: int, store_timestamp: int) -> tuple[tuple, tuple]:
        table = commit_log.topic_queue_table  # the queue offsets reserved under the put lock, as append_batch does
        first_queue_offsets = []
        for index, key in enumerate(keys):
            first = table.get(key, 0)
            first_queue_offsets.append(first)
            if index not in bad_keys and counts[index]:
                table[key] = first + counts[index]
        if write_native is not None:  # write_pass's native branch, called directly (its keywords cost a call a put)
            written, offsets, queue_offsets, pieces = write_native(
                buffer, position, base, store_timestamp, commit_log.store_ip, commit_log.store_port, shape.born_ip,
                shape.born_port, shape.sysflag, record_crc, requests, key_of, shape.excluded, shape.topics,
                first_queue_offsets, messages_max, kinds,
            )  # fmt: skip
        else:
            written, offsets, queue_offsets, pieces = write_pass(
                buffer, position, physical_base=base, store_timestamp=store_timestamp, store_ip=commit_log.store_ip,
                store_port=commit_log.store_port, born_ip=shape.born_ip, born_port=shape.born_port, sysflag=shape.sysflag,
                record_crc=record_crc, requests=requests, key_of=key_of, excluded=shape.excluded, topics=shape.topics,
                first_queue_offsets=first_queue_offsets,
                messages_max=messages_max, decode=decode, native=native, kinds=kinds,
            )  # fmt: skip
        assert written == total, (written, total)
        answers.extend(pieces)
        return offsets, queue_offsets

    result = commit_log._append_locked(total, write)
    if result.status is not rec.PutMessageStatus.PUT_OK:
        if result.status is rec.PutMessageStatus.DISK_FULL:
            store.disk.no_room(result.reason)
        return None
    return PassAppend(result, answers, shape.refusals, malformed, left_out)


NATIVE = _PLAN_NATIVE is not None  # whether plan_pass and write_pass run natively
