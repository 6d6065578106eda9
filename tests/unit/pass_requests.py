"""The requests of a pass as the pass tests generate them (tests/unit/test_pass_encode.py,
tests/unit/test_entry_pass.py): request objects and SEND payloads (whole, cut, longer, garbage),
the decoder the pure twins are given, and a request as the batch path takes it."""

import dataclasses

from hypothesis import strategies as st

from commitlog import pass_encode as pe
from commitlog import record as rec
from hasvc.protocol import client as cp

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


def decode(payload):
    """The client protocol's SEND decoder, None when malformed: the pure twins' view of a payload."""
    try:
        return cp.decode_send(payload)
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
    request = decode(item) if pe._is_payload(item) else item
    if request is None:
        return None
    return rec.MessageBatch(request.topic, request.bodies, queue_id=request.queue_id, properties=list(request.properties),
                            flag=request.flag, born_timestamp=request.born_timestamp)  # fmt: skip
