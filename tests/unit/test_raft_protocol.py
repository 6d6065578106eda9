"""The Raft wire codec: every message fed whole, one byte at a time and followed by the next frame;
hypothesis round trips; garbage raises ProtocolError and nothing else."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hasvc.protocol import raft as rp
from hasvc.protocol.wire import ProtocolError
from hasvc.state.raft import Entry, EntryRun
from hasvc.state.raft.messages import (
    Heartbeat,
    HeartbeatResponse,
    HeartbeatResult,
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

HELLO = rp.Hello("group-a", "n0", "n1")
terms = st.integers(0, 2**63 - 1)
indexes = st.integers(-1, 2**63 - 1)
entries = st.lists(st.builds(Entry, st.integers(0, 2**62), terms, st.binary(max_size=64)), max_size=4).map(tuple)
messages = st.one_of(
    st.builds(VoteRequest, st.just("n0"), st.just("n1"), terms, indexes, indexes, st.booleans(), st.booleans()),
    st.builds(VoteResponse, st.just("n0"), st.just("n1"), terms, st.sampled_from(VoteResult), st.booleans()),
    st.builds(Heartbeat, st.just("n0"), st.just("n1"), terms, indexes, indexes),
    st.builds(HeartbeatResponse, st.just("n0"), st.just("n1"), terms, st.sampled_from(HeartbeatResult), st.booleans()),
    st.builds(Push, st.just("n0"), st.just("n1"), terms, st.sampled_from([PushType.COMPARE, PushType.TRUNCATE]),
              indexes, indexes, indexes, entries),  # fmt: skip
    st.integers(1, 3).flatmap(lambda count: st.builds(
        lambda term, index, prev_term, commit, extra, data: Push(
            "n0", "n1", term, PushType.APPEND, index, prev_term, commit,
            EntryRun(index, count, max(prev_term, 0) + extra, data)),
        terms, st.integers(0, 2**62), st.integers(-1, 2**61), indexes, st.integers(0, 2**61),
        st.binary(min_size=48 * count, max_size=48 * count + 64))),  # fmt: skip
    st.builds(
        PushResponse,
        st.just("n0"),
        st.just("n1"),
        terms,
        st.sampled_from(PushType),
        st.sampled_from(PushResult),
        indexes,
        indexes,
        indexes,
        indexes,
        indexes,
    ),  # fmt: skip
    st.builds(TimeoutNow, st.just("n0"), st.just("n1"), terms),
    st.tuples(terms, terms, terms).map(sorted).flatmap(
        lambda t: st.builds(ResetPush, st.just("n0"), st.just("n1"), st.just(t[2]), st.integers(1, 2**63 - 1),
                            st.just(t[0]), st.just(t[1]), st.integers(0, 2**63 - 1), indexes)),  # fmt: skip
)
SAMPLES = [
    VoteRequest("n0", "n1", 3, 10, 2, pre_vote=True),
    VoteResponse("n0", "n1", 3, VoteResult.REJECT_LEADER_LEASE),
    Heartbeat("n0", "n1", 3, 9),
    Heartbeat("n0", "n1", 3, 9, 7),
    HeartbeatResponse("n0", "n1", 3, HeartbeatResult.EXPIRED_TERM),
    HeartbeatResponse("n0", "n1", 3, HeartbeatResult.SUCCESS, disk_full=True),
    Push("n0", "n1", 3, PushType.COMPARE, 7, -1, 6, (Entry(7, 3, b"abc"),)),
    Push("n0", "n1", 3, PushType.TRUNCATE, 7, -1, 6, (Entry(7, 3, b"abc"), Entry(8, 3, b""))),
    Push("n0", "n1", 3, PushType.APPEND, 7, 2, 6, EntryRun(7, 2, 3, bytes(range(48)) + b"abc" + bytes(48))),
    PushResponse("n0", "n1", 3, PushType.COMPARE, PushResult.MISMATCH, 7, -1, 0, 9, 2),
    TimeoutNow("n0", "n1", 3),
    ResetPush("n0", "n1", 3, 15, 1, 2, 1 << 30, 19),
    PushResponse("n0", "n1", 3, PushType.RESET, PushResult.SUCCESS, 15, 14, 15, 14),
]


def decode_all(data: bytes, *, piece: int | None = None) -> list:
    decoder = rp.RaftDecoder()
    events = []
    pieces = [data] if piece is None else [data[i : i + piece] for i in range(0, len(data), piece)]
    for chunk in pieces:
        decoder.receive_data(chunk)
        while (event := decoder.next_event()) is not None:
            events.append(event)
    return events


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_each_message_whole_byte_by_byte_and_followed_by_another(message):
    data = rp.encode_hello(HELLO) + rp.encode(message)
    assert decode_all(data) == [HELLO, message]
    assert decode_all(data, piece=1) == [HELLO, message]
    assert decode_all(data + rp.encode(message)) == [HELLO, message, message]


def test_header_sizes():
    assert rp.encode(TimeoutNow("n0", "n1", 5)) == b"\x00\x00\x00\x09\x07" + (5).to_bytes(8, "big")
    assert len(rp.encode(Heartbeat("n0", "n1", 1, 1))) == 5 + 16
    assert len(rp.encode(Heartbeat("n0", "n1", 1, 1, 0))) == 5 + 16 + 8  # the optional retain-from index


def test_reset_bytes():
    # kind 9: term, index, previous term, first term, pos, commit index: six big-endian i64
    data = rp.encode(ResetPush("n0", "n1", 3, 15, 1, 2, 4096, 19))
    assert data == b"\x00\x00\x00\x31\x09" + b"".join(v.to_bytes(8, "big") for v in (3, 15, 1, 2, 4096, 19))


def _reset_frame(term, index, prev_term, first_term, pos, commit) -> bytes:
    body = b"".join(v.to_bytes(8, "big", signed=True) for v in (term, index, prev_term, first_term, pos, commit))
    return rp.encode_hello(HELLO) + b"\x00\x00\x00\x31\x09" + body


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((3, 0, 0, 0, 0, 1), "reset index 0"),
        ((3, 5, -1, 2, 0, 1), "reset terms"),
        ((3, 5, 2, 1, 0, 1), "reset terms"),
        ((3, 5, 1, 4, 0, 1), "reset terms"),
        ((3, 5, 1, 2, -1, 1), "negative reset pos"),
        ((3, 5, 1, 2, 0, -2), "commit index -2"),
    ],
)
def test_a_reset_with_impossible_fields_is_refused(fields, message):
    with pytest.raises(ProtocolError, match=message):
        decode_all(_reset_frame(*fields))


def test_a_push_of_type_reset_is_refused():
    frame = bytearray(rp.encode(Push("n0", "n1", 3, PushType.COMPARE, 7, -1, 6)))
    frame[5 + 8] = PushType.RESET
    with pytest.raises(ProtocolError, match="its own frame, kind 9"):
        decode_all(rp.encode_hello(HELLO) + bytes(frame))


def test_a_heartbeat_retain_from_index_is_optional_and_never_negative():
    plain = rp.encode(Heartbeat("n0", "n1", 1, 1))
    assert rp.encode(Heartbeat("n0", "n1", 1, 1, 5)) == plain[:3] + b"\x19" + plain[4:] + (5).to_bytes(8, "big")
    negative = plain[:3] + b"\x19" + plain[4:] + (-2).to_bytes(8, "big", signed=True)
    decoder = rp.RaftDecoder()
    decoder.receive_data(rp.encode_hello(rp.Hello("g", "n0", "n1")) + negative)
    decoder.next_event()
    with pytest.raises(ProtocolError, match="retain-from index -2 is negative"):
        decoder.next_event()


@given(st.lists(messages, max_size=5), st.integers(1, 50))
def test_round_trip(batch, piece):
    data = rp.encode_hello(HELLO) + b"".join(rp.encode(m) for m in batch)
    assert decode_all(data) == [HELLO, *batch]
    assert decode_all(data, piece=piece) == [HELLO, *batch]


@given(st.binary(max_size=200))
def test_garbage_raises_protocol_error_only(data):
    try:
        decode_all(data)
    except ProtocolError:
        pass


@given(st.binary(max_size=120))
def test_garbage_after_hello_raises_protocol_error_only(data):
    try:
        decode_all(rp.encode_hello(HELLO) + data)
    except ProtocolError:
        pass


@given(messages, st.integers(0, 200), st.integers(0, 255))
def test_a_flipped_byte_raises_protocol_error_or_decodes(message, position, value):
    data = bytearray(rp.encode_hello(HELLO) + rp.encode(message))
    data[position % len(data)] = value
    try:
        decode_all(bytes(data))
    except ProtocolError:
        pass


def append_frame(*, term=1, index=0, prev_term=-1, commit=-1, count=1, last_term=1, size=48) -> bytes:
    """An APPEND frame with these header fields, whatever they claim, and ``size`` bytes of run."""
    body = rp.APPEND.pack(term, index, prev_term, commit, count, last_term) + bytes(size)
    return rp.FRAME_HEADER.pack(1 + len(body), rp.APPEND_KIND) + body


def test_an_append_frame_is_its_header_then_the_stored_bytes_as_they_are():
    run = EntryRun(7, 2, 3, bytes(range(100)))
    push = Push("n0", "n1", 4, PushType.APPEND, 7, 2, 6, run)
    data = rp.encode(push)
    assert data[:5] == (1 + 44 + 100).to_bytes(4, "big") + b"\x08" and data[-100:] == run.data
    assert data[5:49] == b"".join(v.to_bytes(8, "big") for v in (4, 7, 2, 6))[:32] + (2).to_bytes(4, "big") + (3).to_bytes(8, "big")
    (hello, decoded) = decode_all(rp.encode_hello(HELLO) + data)
    assert decoded == push and isinstance(decoded.entries.data, memoryview)  # a view of the frame: no copy


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (rp.encode(TimeoutNow("n0", "n1", 1)), "before HELLO"),
        (rp.encode_hello(HELLO) * 2, "a second HELLO"),
        (rp.encode_hello(rp.Hello("g", "a", "b", version=9)), "version 9"),
        (rp.encode_hello(rp.Hello("g", "a", "b", version=1)), "version 1, this member speaks 2"),
        (rp.encode_hello(HELLO) + rp.encode(Push("n0", "n1", 1, PushType.COMPARE, 0, -1, -1, ())).replace(
            b"\x01" + (0).to_bytes(8, "big"), b"\x03" + (0).to_bytes(8, "big"), 1), "APPEND is frame kind 8"),
        (rp.encode_hello(HELLO) + append_frame(count=0), "APPEND of 0 entries"),
        (rp.encode_hello(HELLO) + append_frame(count=3, size=2 * 48 + 40), "APPEND of 3 entries in 136 bytes"),
        (rp.encode_hello(HELLO) + append_frame(prev_term=5, last_term=4), "last term 4 after previous term 5"),
        (rp.encode_hello(HELLO) + append_frame(index=-1), "from index -1"),
        (rp.encode_hello(HELLO) + append_frame(term=-1), "negative term"),
        (rp.encode_hello(HELLO) + append_frame(commit=-2), "commit index -2 is below -1"),
        (rp.encode_hello(HELLO) + b"\x00\x00\x00\x01\x63", "unknown Raft frame kind 99"),
        (rp.encode_hello(HELLO) + b"\xff\xff\xff\xff\x01", "frame of 4294967295 bytes"),
        (
            rp.encode_hello(HELLO)
            + rp.encode(Heartbeat("n0", "n1", 1, 1))[:-1].replace(b"\x00\x00\x00\x11", b"\x00\x00\x00\x10", 1),
            "middle of a field",
        ),  # fmt: skip
        (rp.encode_hello(HELLO) + b"\x00\x00\x00\x0a\x07" + (1).to_bytes(8, "big") + b"x", "unexpected bytes"),
        (rp.encode_hello(HELLO) + b"\x00\x00\x00\x09\x07" + (-3).to_bytes(8, "big", signed=True), "negative term"),
        (
            rp.encode_hello(HELLO) + rp.encode(VoteResponse("n0", "n1", 1, VoteResult.ACCEPT))[:-2] + b"\x63\x00",
            "not a VoteResult",
        ),  # fmt: skip
    ],
)
def test_bad_frames_are_named(data, message):
    with pytest.raises(ProtocolError, match=message):
        decode_all(data)


def test_ids_must_fit_one_length_byte():
    with pytest.raises(ValueError, match="1..255 bytes"):
        rp.encode_hello(rp.Hello("g" * 256, "n0", "n1"))


@given(st.text(min_size=1, max_size=20).filter(lambda t: len(t.encode()) <= 64),
       st.text(max_size=30).filter(lambda t: len(t.encode()) <= 255))  # fmt: skip
def test_hello_carries_the_senders_client_address_and_data_start(group, address):
    hello = rp.Hello(group, "n0", "n1", client_address=address, data_start_offset=len(address) << 20)
    data = rp.encode_hello(hello)
    assert decode_all(data) == [hello] and decode_all(data, piece=3) == [hello]


def test_a_hello_without_the_client_address_field_is_read_as_an_older_members():
    old = bytes([rp.RAFT_PROTOCOL_VERSION, 7]) + b"group-a" + b"\x02n0" + b"\x02n1"  # version, group, source, target: nothing else
    frame = len(old + b"x").to_bytes(4, "big") + b"\x00" + old
    assert decode_all(frame) == [rp.Hello("group-a", "n0", "n1", client_address="")]
    truncated = rp.encode_hello(rp.Hello("g", "n0", "n1", client_address="127.0.0.1:1"))
    broken = (len(truncated) - 4 - 11).to_bytes(4, "big") + truncated[4:-11]  # the address cut short
    with pytest.raises(ProtocolError, match="runs past the frame"):
        decode_all(broken)


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**62))
def test_hello_carries_the_senders_data_file_size(data_file_size, data_start):
    hello = rp.Hello("g", "n0", "n1", client_address="h:1", data_start_offset=data_start, data_file_size=data_file_size)
    data = rp.encode_hello(hello)
    assert len(data) == 5 + 1 + 2 + 3 + 3 + 4 + 8 + (8 if data_file_size else 0)  # 0: the field is left out
    assert decode_all(data) == [hello] and decode_all(data, piece=5) == [hello]


def test_a_hello_without_the_data_file_size_field_says_none_and_one_of_zero_is_refused():
    older = rp.encode_hello(rp.Hello("g", "n0", "n1", client_address="h:1", data_start_offset=0))
    assert decode_all(older) == [rp.Hello("g", "n0", "n1", client_address="h:1")]
    assert decode_all(older)[0].data_file_size == 0
    for size in (0, -1):
        bad = (len(older) - 4 + 8).to_bytes(4, "big") + older[4:] + size.to_bytes(8, "big", signed=True)
        with pytest.raises(ProtocolError, match=f"data file size {size} "):
            decode_all(bad)
    with pytest.raises(ValueError, match="negative"):
        rp.encode_hello(rp.Hello("g", "n0", "n1", data_file_size=-1))


def test_a_hello_with_a_negative_data_start_is_refused():
    data = rp.encode_hello(rp.Hello("g", "n0", "n1", client_address="a:1", data_start_offset=1))
    data = data[:-8] + (-4).to_bytes(8, "big", signed=True)
    with pytest.raises(ProtocolError, match="negative data start"):
        decode_all(data)
