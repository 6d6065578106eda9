"""The controller port's codec: every request and answer fed whole, one byte at a time and followed
by the next frame; hypothesis round trips; bad fields and garbage raise ProtocolError and nothing else."""

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hasvc.protocol import controller as cp
from hasvc.protocol.wire import ProtocolError

names = st.text(min_size=1, max_size=12)
counts = st.integers(0, cp.INT_MAX)
broker_ids = st.integers(1, cp.INT_MAX)
id_sets = st.lists(st.integers(1, 1000), max_size=5, unique=True).map(lambda ids: tuple(sorted(ids)))
request_ids = st.integers(0, cp.REQUEST_ID_MAX)

requests = st.one_of(
    st.builds(cp.RegisterRequest, names, names, names, names),
    st.builds(cp.HeartbeatRequest, names, broker_ids, counts, counts, st.none() | counts),
    st.builds(cp.AlterSyncStateSetRequest, names, broker_ids, counts, counts, id_sets),
    st.just(cp.StatusRequest()),
    st.builds(cp.ElectRequest, names, st.none() | broker_ids),
    st.builds(cp.SnapshotRequest, counts, counts),
)


@st.composite
def views(draw):
    members = draw(id_sets)
    master = draw(st.none() | st.sampled_from(members)) if members else None
    address = st.none() | st.just("127.0.0.1:10911")
    return cp.GroupView(draw(names), master, draw(address), draw(address), draw(counts), members, draw(counts))


answers = st.one_of(
    st.builds(lambda kind, view: cp.Answer(kind, "OK", view=view),
              st.sampled_from([cp.ALTER_SYNC_STATE_SET, cp.ELECT]), views()),  # fmt: skip
    st.builds(lambda view, lease: cp.Answer(cp.HEARTBEAT, "OK", view=dataclasses.replace(view, lease=lease)),
              views(), st.booleans()),  # fmt: skip
    st.builds(lambda view, broker_id: cp.Answer(cp.REGISTER, "OK", view=view, broker_id=broker_id), views(), broker_ids),
    st.builds(lambda status: cp.Answer(cp.STATUS, "OK", controller=status),
              st.dictionaries(names, st.none() | st.integers() | names, max_size=4)),  # fmt: skip
    st.builds(lambda index, offset, data, tail: cp.Answer(cp.SNAPSHOT, "OK", snapshot=cp.SnapshotChunk(
        index, offset + len(data) + tail, offset, data)), counts, st.integers(0, 1 << 40), st.binary(max_size=64),
        st.integers(0, 1 << 20)),  # fmt: skip
    st.builds(cp.not_leader, st.sampled_from(list(cp.REQUEST_TYPES)), st.none() | st.just("127.0.0.1:9"), names),
    st.builds(cp.refused, st.sampled_from([k for k in cp.REQUEST_TYPES if k != cp.ALTER_SYNC_STATE_SET]), names),
    st.builds(lambda reason, view: cp.refused(cp.ALTER_SYNC_STATE_SET, reason, view), names, views()),
)

SAMPLE_REQUESTS = [
    cp.RegisterRequest("g1", "3f2a-identity", "127.0.0.1:10911", "127.0.0.1:10912"),
    cp.HeartbeatRequest("g1", 2, 3, 4096),
    cp.AlterSyncStateSetRequest("g1", 1, 3, 7, (1, 2)),
    cp.StatusRequest(),
    cp.ElectRequest("g1", None),
    cp.ElectRequest("g1", 2),
    cp.SnapshotRequest(1200, 0),
    cp.SnapshotRequest(1203, 524288),
]
VIEW = cp.GroupView("g1", 1, "127.0.0.1:10911", "127.0.0.1:10912", 3, (1, 2), 7)
SAMPLE_ANSWERS = [
    cp.Answer(cp.REGISTER, "OK", view=VIEW, broker_id=2),
    cp.Answer(cp.HEARTBEAT, "OK", view=dataclasses.replace(VIEW, lease=True)),
    cp.Answer(cp.HEARTBEAT, "OK", view=cp.GroupView("g1", None, None, None, 0, (), 0, lease=False)),
    cp.Answer(cp.ELECT, "OK", view=VIEW),
    cp.Answer(cp.STATUS, "OK", controller={"role": "leader", "groups": {}}),
    cp.not_leader(cp.HEARTBEAT, "127.0.0.1:9876", "c1 leads"),
    cp.not_leader(cp.HEARTBEAT, None, "no leader is known yet"),
    cp.refused(cp.ALTER_SYNC_STATE_SET, "epoch 2 is not the current epoch 3", VIEW),
    cp.refused(cp.REGISTER, "the controller holds 4096 groups already"),
    cp.Answer(cp.SNAPSHOT, "OK", snapshot=cp.SnapshotChunk(1203, 10, 4, b"\x00\xffHCS1")),
    cp.refused(cp.SNAPSHOT, "the state reflects entry 12, below the 1200 asked"),
]


def _decode_all(data: bytes, *, answers: bool, step: int | None = None) -> list[cp.Frame]:
    decoder = cp.ControllerDecoder(answers=answers)
    frames = []
    pieces = [data] if step is None else [data[i : i + step] for i in range(0, len(data), step)]
    for piece in pieces:
        decoder.receive_data(piece)
        while (frame := decoder.next_event()) is not None:
            frames.append(frame)
    return frames


@pytest.mark.parametrize("request_", SAMPLE_REQUESTS, ids=repr)
@pytest.mark.parametrize("step", [None, 1])
def test_request_whole_and_byte_by_byte(request_, step):
    data = cp.encode_request(7, request_)
    assert _decode_all(data, answers=False, step=step) == [cp.Frame(7, request_)]


@pytest.mark.parametrize("answer", SAMPLE_ANSWERS, ids=repr)
@pytest.mark.parametrize("step", [None, 1])
def test_answer_whole_and_byte_by_byte(answer, step):
    data = cp.encode_answer(cp.REQUEST_ID_MAX, answer)
    assert _decode_all(data, answers=True, step=step) == [cp.Frame(cp.REQUEST_ID_MAX, answer)]


def test_trailing_bytes_wait_for_the_next_frame():
    first, second = cp.encode_request(1, SAMPLE_REQUESTS[0]), cp.encode_request(2, SAMPLE_REQUESTS[1])
    decoder = cp.ControllerDecoder(answers=False)
    decoder.receive_data(first + second[:5])
    assert decoder.next_event() == cp.Frame(1, SAMPLE_REQUESTS[0])
    assert decoder.next_event() is None
    decoder.receive_data(second[5:])
    assert decoder.next_event() == cp.Frame(2, SAMPLE_REQUESTS[1])


def test_byte_table_of_a_heartbeat():
    """The bytes docs/PROTOCOL.md shows."""
    data = cp.encode_request(5, cp.HeartbeatRequest("g1", 2, 3, 4096))
    body = b'{"group":"g1","broker_id":2,"epoch":3,"max_offset":4096}'
    assert data == (5 + len(body)).to_bytes(4, "big") + b"\x02" + (5).to_bytes(4, "big") + body


def test_a_heartbeat_says_lost_tail_only_when_it_has_one_and_an_older_brokers_is_accepted():
    """``lost_tail`` is left out when null (a controller before it would refuse the unknown
    field), and a heartbeat without it (an older broker's) decodes with None."""
    data = cp.encode_request(5, cp.HeartbeatRequest("g1", 2, 3, 1696, 2120))
    assert data.endswith(b'{"group":"g1","broker_id":2,"epoch":3,"max_offset":1696,"lost_tail":2120}')
    assert _decode_all(data, answers=False) == [cp.Frame(5, cp.HeartbeatRequest("g1", 2, 3, 1696, 2120))]
    for body in (b'{"group":"g1","broker_id":2,"epoch":3,"max_offset":4096}',
                 b'{"group":"g1","broker_id":2,"epoch":3,"max_offset":4096,"lost_tail":null}'):  # fmt: skip
        [frame] = _decode_all(_raw(cp.HEARTBEAT, body), answers=False)
        assert frame.message == cp.HeartbeatRequest("g1", 2, 3, 4096) and frame.message.lost_tail is None


def test_byte_table_of_a_snapshot_request():
    """The bytes docs/PROTOCOL.md shows for SNAPSHOT."""
    data = cp.encode_request(1, cp.SnapshotRequest(290, 0))
    assert data == bytes.fromhex("0000001d" "06" "00000001") + b'{"index":290,"offset":0}'


@given(st.lists(st.tuples(request_ids, requests), max_size=5), st.integers(1, 40))
def test_requests_round_trip(frames, step):
    data = b"".join(cp.encode_request(request_id, request) for request_id, request in frames)
    assert _decode_all(data, answers=False, step=step) == [cp.Frame(i, r) for i, r in frames]


@given(st.lists(st.tuples(request_ids, answers), max_size=5), st.integers(1, 40))
def test_answers_round_trip(frames, step):
    data = b"".join(cp.encode_answer(request_id, answer) for request_id, answer in frames)
    assert _decode_all(data, answers=True, step=step) == [cp.Frame(i, a) for i, a in frames]


@given(st.binary(max_size=300), st.booleans())
def test_garbage_raises_protocol_error_only(data, answers):
    try:
        _decode_all(data, answers=answers)
    except ProtocolError:
        pass


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=8)  # fmt: skip
FIELD_NAMES = st.sampled_from(["lease", "group", "identity", "broker_id", "epoch", "max_offset", "master_id", "status",
                               "reason", "leader", "sync_state_set", "sync_state_set_epoch", "controller",
                               "client_address", "ha_address", "master_client_address", "master_ha_address", "x"])  # fmt: skip


@given(st.integers(0, 255), st.dictionaries(FIELD_NAMES, JSON_VALUES, max_size=8), st.booleans())
def test_any_json_object_is_a_message_or_a_protocol_error(kind, body, answers):
    """Well-framed JSON with arbitrary fields and values: decoded (then it encodes back the
    same) or refused, never another exception."""
    data = json.dumps(body).encode()
    frame = (5 + len(data)).to_bytes(4, "big") + bytes([kind]) + (1).to_bytes(4, "big") + data
    try:
        decoded = _decode_all(frame, answers=answers)
    except ProtocolError:
        return
    message = decoded[0].message
    again = cp.encode_answer(1, message) if answers else cp.encode_request(1, message)
    assert _decode_all(again, answers=answers) == decoded


def _raw(kind: int, body: bytes, request_id: int = 1) -> bytes:
    return (5 + len(body)).to_bytes(4, "big") + bytes([kind]) + request_id.to_bytes(4, "big") + body


@pytest.mark.parametrize("kind, body, answers, message", [
    (cp.HEARTBEAT, b'{"group":"g","broker_id":1,"epoch":0}', False, "'max_offset' is missing"),
    (cp.HEARTBEAT, b'{"group":"g","broker_id":1,"epoch":0,"max_offset":0,"x":1}', False, "unknown field 'x'"),
    (cp.HEARTBEAT, b'{"group":"g","broker_id":0,"epoch":0,"max_offset":0}', False, "broker ids start at 1"),
    (cp.HEARTBEAT, b'{"group":"g","broker_id":true,"epoch":0,"max_offset":0}', False, "must be an integer"),
    (cp.HEARTBEAT, b'{"group":"g","broker_id":1,"epoch":-1,"max_offset":0}', False, "outside 0.."),
    (cp.HEARTBEAT, b'{"group":"g","broker_id":1,"epoch":1.5,"max_offset":0}', False, "must be an integer"),
    (cp.HEARTBEAT, b'{"group":"","broker_id":1,"epoch":0,"max_offset":0}', False, "must not be empty"),
    (cp.HEARTBEAT, b'{"group":"g","group":"h","broker_id":1,"epoch":0,"max_offset":0}', False, "twice"),
    (cp.HEARTBEAT, b'{"group":"g","broker_id":1,"epoch":0,"max_offset":0,"lost_tail":-1}', False, "outside 0.."),
    (cp.HEARTBEAT, b'{"group":"g","broker_id":1,"epoch":0,"max_offset":0,"lost_tail":"9"}', False, "must be an integer"),
    (cp.ALTER_SYNC_STATE_SET, b'{"group":"g","master_id":1,"epoch":0,"sync_state_set_epoch":0,"sync_state_set":[1,1]}',
     False, "names a broker twice"),
    (cp.STATUS, b'[]', False, "not a JSON object"),
    (cp.STATUS, b'{"a":NaN}', False, "NaN"),
    (cp.STATUS, b'\xff', False, "not UTF-8"),
    (cp.STATUS, b'{', False, "not JSON"),
    (cp.STATUS, b'[' * 100000, False, "not JSON"),
    (9, b'{}', False, "not a controller request"),
    (cp.ANSWER + cp.STATUS, b'{"status":"OK","controller":{}}', False, "not a controller request"),
    (cp.STATUS, b'{}', True, "not a controller answer"),
    (cp.ANSWER + cp.HEARTBEAT, b'{"status":"MAYBE","reason":"r"}', True, "not one of"),
    (cp.ANSWER + cp.HEARTBEAT, b'{"status":"REFUSED"}', True, "'reason' is missing"),
    (cp.ANSWER + cp.HEARTBEAT, b'{"status":"REFUSED","reason":"r","leader":null}', True, "unknown field 'leader'"),
    (cp.ANSWER + cp.ALTER_SYNC_STATE_SET, b'{"status":"REFUSED","reason":"r"}', True, "'epoch' is missing"),
    (cp.ANSWER + cp.HEARTBEAT, b'{"status":"OK","group":"g","master_id":3,"master_client_address":null,'
     b'"master_ha_address":null,"epoch":1,"sync_state_set":[1],"sync_state_set_epoch":1,"lease":false}', True,
     "not in its SyncStateSet"),
    (cp.ANSWER + cp.HEARTBEAT, b'{"status":"OK","group":"g","master_id":1,"master_client_address":null,'
     b'"master_ha_address":null,"epoch":1,"sync_state_set":[1],"sync_state_set_epoch":1}', True, "'lease' is missing"),
    (cp.ANSWER + cp.HEARTBEAT, b'{"status":"OK","group":"g","master_id":1,"master_client_address":null,'
     b'"master_ha_address":null,"epoch":1,"sync_state_set":[1],"sync_state_set_epoch":1,"lease":1}', True,
     "must be true or false"),
    (cp.ANSWER + cp.ELECT, b'{"status":"OK","group":"g","master_id":1,"master_client_address":null,'
     b'"master_ha_address":null,"epoch":1,"sync_state_set":[1],"sync_state_set_epoch":1,"lease":true}', True,
     "unknown field 'lease'"),
    (cp.SNAPSHOT, b'{"index":1}', False, "'offset' is missing"),
    (cp.ANSWER + cp.SNAPSHOT, b'{"status":"OK","index":1,"size":3,"offset":0,"data":"!!!!"}', True, "not base64"),
    (cp.ANSWER + cp.SNAPSHOT, b'{"status":"OK","index":1,"size":3,"offset":0,"data":1}', True, "base64 string"),
    (cp.ANSWER + cp.SNAPSHOT, b'{"status":"OK","index":1,"size":2,"offset":0,"data":"QUJD"}', True,
     "a snapshot chunk of 3 bytes at 0 of 2"),
    (cp.ANSWER + cp.SNAPSHOT, b'{"status":"OK","index":1,"size":3,"offset":0}', True, "'data' is missing"),
])  # fmt: skip
def test_bad_fields_are_protocol_errors(kind, body, answers, message):
    with pytest.raises(ProtocolError, match=message):
        _decode_all(_raw(kind, body), answers=answers)


def test_frame_size_limits():
    decoder = cp.ControllerDecoder(answers=False, frame_size_max=64)
    decoder.receive_data((65).to_bytes(4, "big"))
    with pytest.raises(ProtocolError, match="frame of 65 bytes"):
        decoder.next_event()
    decoder = cp.ControllerDecoder(answers=False)
    decoder.receive_data((4).to_bytes(4, "big"))  # shorter than kind and request id
    with pytest.raises(ProtocolError, match="frame of 4 bytes"):
        decoder.next_event()


def test_the_codec_imports_no_trio():
    import subprocess
    import sys

    code = ("import sys, hasvc.protocol.controller\n"
            "bad = [m for m in sys.modules if m == 'trio' or m.startswith('trio.')]\n"
            "assert not bad, bad\n")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)
