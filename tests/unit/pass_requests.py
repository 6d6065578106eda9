"""The requests of a pass as the pass tests generate them (tests/unit/test_pass_encode.py,
tests/unit/test_entry_pass.py): request objects and SEND payloads (whole, cut, longer, garbage),
the decoder the pure twins are given, and a request as the batch path takes it."""

import dataclasses

from hypothesis import strategies as st

from commitlog import pass_encode as pe
from commitlog import record as rec
from hasvc.protocol import client as cp
from hasvc.protocol.client_frames import answers_of

BODY_SIZE_MAX = 600  # small, so that generated requests pass it alone and together
HUGE_PROPERTIES = b"k\x01" + b"v" * rec.PROPERTIES_SIZE_MAX  # over PROPERTIES_SIZE_MAX by itself
NEAR_PROPERTIES = b"k\x01" + b"v" * (rec.PROPERTIES_SIZE_MAX - 12)  # under it, over it with the CRC tail


@dataclasses.dataclass
class Request:  # the fields pass_encode reads (hasvc's SendRequest has these and more)
    topic: str
    queue_id: int
    bodies: list
    properties: list
    flag: int = 0
    born_timestamp: int = 0


properties_entries = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"KEYS\x01k\x02", b"a\x01b", b"x\x01" + rec.RECORD_CRC_TAIL_PREFIX + b"\x02", HUGE_PROPERTIES, NEAR_PROPERTIES]),
)  # fmt: skip


@st.composite
def requests(draw):
    topic = draw(st.sampled_from(["T", "Orders", "bad topic!", "", "L" * 200]))
    queue_id = draw(st.sampled_from([0, 1, 3, -1, 1 << 31]))
    bodies = draw(st.lists(st.binary(max_size=250), max_size=4))
    properties = draw(st.lists(properties_entries, min_size=len(bodies), max_size=len(bodies)))
    if draw(st.integers(0, 9)) == 0:  # not one properties entry per body
        properties = properties[:-1] if properties else [b""]
    flag = draw(st.integers(-(1 << 31), (1 << 31) - 1))
    born_timestamp = draw(st.integers(0, 1 << 62))
    return Request(topic, queue_id, bodies, properties, flag, born_timestamp)


def decode(payload, idempotent=False):
    """The client protocol's SEND (SEND_IDEMPOTENT) decoder, None when malformed: the pure twins' view of a payload."""
    try:
        return cp.decode_send(payload, idempotent=idempotent)
    except cp.ProtocolError:
        return None


@st.composite
def items(draw):
    """A request of a pass: an object, or a SEND's payload as the client port leaves it (whole,
    cut, with a byte more, with a topic that is not UTF-8, or garbage)."""
    request = draw(requests())
    encodable = -(1 << 31) <= request.queue_id < 1 << 31 and len(request.bodies) == len(request.properties)
    form = draw(st.sampled_from(["object", "payload", "payload", "cut", "longer", "not utf-8", "garbage"]))
    if form == "garbage":
        return draw(st.binary(max_size=60))
    if form == "object" or not encodable:
        return request
    payload = cp.encode_send(cp.SendRequest(request.topic, request.queue_id, request.bodies, request.properties,
                                            request.flag, request.born_timestamp))  # fmt: skip
    if form == "cut":
        return memoryview(payload)[: draw(st.integers(0, len(payload)))]
    if form == "longer":
        return payload + b"x"
    if form == "not utf-8" and request.topic:
        return payload[:2] + b"\xff" + payload[3:]
    return memoryview(payload)


passes = st.lists(items(), min_size=1, max_size=12)
PLANNING = {"body_size_max": BODY_SIZE_MAX, "messages_max": cp.SEND_MESSAGES_MAX, "decode": decode}


def batch_refusal(request, *, store_v6=False, record_crc=False):
    """What prepare_batch says of the request as a batch of its own (None: it is kept)."""
    try:
        rec.prepare_batch(batch_of(request), body_size_max=BODY_SIZE_MAX, store_v6=store_v6, record_crc=record_crc)
    except rec.MessageRejected as refusal:
        return refusal
    return None


def batch_of(item) -> rec.MessageBatch | None:
    """A request of a pass (an object or a payload) as the batch path takes it; None when malformed."""
    request = decode(item, idempotent=is_idempotent(item)) if pe._is_payload(item) else item
    if request is None:
        return None
    return rec.MessageBatch(request.topic, request.bodies, queue_id=request.queue_id, properties=list(request.properties),
                            flag=request.flag, born_timestamp=request.born_timestamp)  # fmt: skip


@st.composite
def idempotent_requests(draw):
    """A SEND_IDEMPOTENT as the client port decodes it: one of two producers, sequences from a
    small range (so a pass holds retries, partial overlaps, gaps and repeats of one producer),
    sometimes refused for its content (a bad topic, properties over the limit once tagged)."""
    count = draw(st.integers(1, 3))
    bodies = [draw(st.binary(max_size=60)) for _ in range(count)]
    properties = [draw(st.sampled_from([b"", b"KEYS\x01k\x02", b"a\x01b", NEAR_PROPERTIES])) for _ in range(count)]
    return cp.SendRequest(draw(st.sampled_from(["T", "T", "Orders", "bad topic!"])), draw(st.sampled_from([0, 1])), bodies,
                          properties, 0, draw(st.integers(0, 1 << 40)), draw(st.sampled_from(["p1", "p2", "pé"])),
                          draw(st.integers(0, 9)))  # fmt: skip


class IdempotentPayload(bytes):
    """A SEND_IDEMPOTENT's payload as the client port leaves it (its frame kind: 7)."""


def _idempotent_head(producer_id: bytes, first_sequence: int) -> bytes:
    return len(producer_id).to_bytes(2, "big") + producer_id + first_sequence.to_bytes(8, "big", signed=True)


@st.composite
def idempotent_items(draw):
    """A SEND_IDEMPOTENT of a pass: a request object as the client port used to decode it, or
    its payload as the port leaves it now (whole, cut, longer, garbage, a producer id empty, too
    long, with a separator or not UTF-8, a negative sequence, a sequence whose tags pass 2**63 - 1)."""
    request = draw(idempotent_requests())
    form = draw(st.sampled_from(["object", "payload", "payload", "payload", "cut", "longer", "garbage", "empty id", "long id",
                                 "longest id", "id with a separator", "id not utf-8", "negative", "highest"]))  # fmt: skip
    if form == "object":
        return request
    plain = cp.encode_send(dataclasses.replace(request, producer_id="", first_sequence=-1))
    payload = _idempotent_head(request.producer_id.encode(), request.first_sequence) + plain
    if form == "cut":
        payload = payload[: draw(st.integers(0, len(payload)))]
    elif form == "longer":
        payload += b"x"
    elif form == "garbage":
        payload = draw(st.binary(max_size=60))
    elif form in ("empty id", "long id", "longest id", "id with a separator", "id not utf-8"):
        producer_id = {"empty id": b"", "long id": b"p" * (cp.PRODUCER_ID_SIZE_MAX + 1), "longest id": b"q" * cp.PRODUCER_ID_SIZE_MAX,
                       "id with a separator": draw(st.sampled_from([b"p\x01", b"\x02p"])), "id not utf-8": b"p\xff"}[form]  # fmt: skip
        payload = _idempotent_head(producer_id, request.first_sequence) + plain
    elif form == "negative":
        payload = _idempotent_head(request.producer_id.encode(), -1 - request.first_sequence) + plain
    elif form == "highest":
        payload = _idempotent_head(b"high", (1 << 63) - draw(st.integers(1, 3))) + plain
    return IdempotentPayload(payload)


mixed_passes = st.lists(st.one_of(items(), idempotent_requests(), idempotent_items(), idempotent_items()), min_size=1, max_size=12)


def is_idempotent(item) -> bool:
    return isinstance(item, IdempotentPayload) or (isinstance(item, cp.SendRequest) and bool(item.producer_id))


def kinds_of(pass_requests) -> bytes:
    """A pass's frame kinds, as ``PutService._put_pass`` hands them over."""
    return bytes(cp.SEND_IDEMPOTENT if is_idempotent(item) else cp.SEND for item in pass_requests)


class Recorder:
    """An outbox that keeps what it is asked to send, by request id (a pass's number)."""

    def __init__(self):
        self.sent = {}

    def respond(self, frame, payload):
        self.sent[frame.request_id] = bytes(payload)

    def respond_joined(self, data, count):
        for answer in answers_of(data):
            self.respond(answer, answer.payload)

    def flush(self):
        pass


def answer_pairs(answer: bytes) -> tuple[tuple, tuple]:
    count = int.from_bytes(answer[4:8], "big")
    pairs = [(int.from_bytes(answer[8 + 16 * i : 16 + 16 * i], "big", signed=True),
              int.from_bytes(answer[16 + 16 * i : 24 + 16 * i], "big", signed=True)) for i in range(count)]  # fmt: skip
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def producer_pass(pass_requests, table, append) -> list:
    """A pass of SENDs and SEND_IDEMPOTENTs as ``PutService._put_pass`` puts it (its
    ``_IdempotentPass`` around ``append(requests, decide)``, a pass_encode.PassAppend): per
    request what it is answered (the producer table's refusal, the offsets stored or a retry's
    original ones, the pass's refusal, malformed)."""
    from types import SimpleNamespace

    from hasvc.broker.put_service import _IdempotentPass, _protocol_error

    outbox = Recorder()
    items = [(outbox, cp.Frame(cp.SEND_IDEMPOTENT if is_idempotent(item) else cp.SEND, number,
                               item if pe._is_payload(item) else b""),
              None if pe._is_payload(item) else item) for number, item in enumerate(pass_requests)]  # fmt: skip
    requests = list(pass_requests)
    idempotent = _IdempotentPass(table, items)
    done = append(requests, idempotent.decide, kinds_of(pass_requests))
    assert done is not None
    puts = SimpleNamespace(producers=table, duplicate_sends=0)
    duplicates = {frame.request_id: appended.result for (_, frame), appended in idempotent.stored(puts, done)}
    outcomes = []
    for number in range(len(pass_requests)):
        if number in outbox.sent:
            outcomes.append(("answered", outbox.sent[number]))
        elif number in duplicates:
            outcomes.append(("stored", duplicates[number].offsets, duplicates[number].queue_offsets))
        elif number in done.malformed:  # answered with the client protocol's error (``_put_pass``)
            outcomes.append(("malformed", _protocol_error(items[number][1])))
        elif number in done.refusals:
            outcomes.append((done.refusals[number].status, done.refusals[number].reason))
        else:
            outcomes.append(("stored", *answer_pairs(done.answers[number])))
    return outcomes


def producer_batches(pass_requests, table, append_one) -> list:
    """The same requests as the batch path puts them, one after the other
    (``PutService._append_idempotent``): ``append_one(batch)`` an AppendResult or a refusal's
    (status, reason)."""
    from hasvc.broker.outbox import error_response
    from hasvc.broker.put_service import stored_messages, tag_properties
    from hasvc.state.dedupe import Verdict

    outcomes = []
    for number, item in enumerate(pass_requests):
        request = item
        if pe._is_payload(item):  # the client port's decode, and its answer to a payload it cannot decode
            try:
                request = item = cp.decode_send(item, idempotent=is_idempotent(item))
            except cp.ProtocolError as error:
                outcomes.append(("malformed", str(error)))
                continue
        if is_idempotent(item):
            lookup = table.lookup(item.producer_id, item.first_sequence, len(item.bodies))
            if lookup.verdict is Verdict.REFUSED:
                outcomes.append(("answered", error_response(cp.Frame(cp.SEND_IDEMPOTENT, number, b""), lookup.reason)))
                continue
            if lookup.verdict is Verdict.DUPLICATE:
                outcomes.append(("stored", tuple(s.offset for s in lookup.stored), tuple(s.queue_offset for s in lookup.stored)))
                continue
            request = dataclasses.replace(item, properties=[tag_properties(p, item.producer_id, item.first_sequence + i)
                                                            for i, p in enumerate(item.properties)])  # fmt: skip
        batch = batch_of(request)
        if batch is None:
            outcomes.append("malformed")
            continue
        result = append_one(batch)
        if isinstance(result, tuple):
            outcomes.append(result)
            continue
        if is_idempotent(item):
            table.remember(item.producer_id, item.first_sequence, stored_messages(result, item.queue_id))
        outcomes.append(("stored", tuple(result.offsets), tuple(result.queue_offsets)))
    return outcomes


def table_state(table) -> dict:
    return {producer_id: (list(producer.sequences.items()), producer.high) for producer_id, producer in table._producers.items()}
