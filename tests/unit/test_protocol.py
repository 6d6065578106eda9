"""Sans-IO codecs: every sample whole, one byte at a time and with trailing bytes; hypothesis
round trips and garbage (a decoder raises ProtocolError, never struct.error or IndexError)."""

import functools
from unittest import mock

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from commitlog import native
from hasvc.protocol import client as cp
from hasvc.protocol import ha, wire

texts = st.text(max_size=40)
epochs = st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**62)), max_size=5).map(tuple)


def feed_in_pieces(decoder, data: bytes, piece: int):
    for start in range(0, len(data), piece):
        decoder.receive_data(data[start : start + piece])


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("feed"), st.binary(max_size=40), st.sampled_from([bytes, bytearray, memoryview])),
            st.tuples(st.just("take"), st.integers(0, 50), st.none()),
            st.tuples(st.just("skip"), st.integers(0, 50), st.none()),
        ),
        max_size=40,
    )
)
def test_buffer_hands_out_what_was_fed_in_order(steps):
    """Whether a receive is kept as it came (nothing held) or gathered (a frame split across
    receives), takes and skips see the same byte stream; a take returns bytes that later feeds
    do not change."""
    buffer, model, taken = wire.Buffer(size_max=1 << 20), bytearray(), []
    for action, value, kind in steps:
        if action != "feed":
            value %= len(model) + 2  # all of it, and one past it, come up often
        if action == "feed":
            buffer.feed(kind(bytearray(value)) if kind is not bytes else value)
            model += value
        elif action == "take":
            piece = buffer.take(value)
            if value > len(model):
                assert piece is None
                continue
            assert type(piece) is bytes and piece == model[:value]
            taken.append((piece, bytes(piece)))
            del model[:value]
        elif value <= len(model):
            assert buffer.peek(value) == model[:value]
            buffer.skip(value)
            del model[:value]
        assert len(buffer) == len(model)
    assert all(piece == copy for piece, copy in taken)
    assert buffer.take_all() == model and len(buffer) == 0


@given(texts, texts, st.integers(0, 2**62), epochs, st.booleans())
def test_slave_hello_round_trips(slave_id, address, max_offset, entries, last_file):
    hello = ha.SlaveHello(slave_id, address, max_offset, entries, last_file)
    buffer = wire.Buffer(size_max=1 << 20)
    encoded = ha.encode_slave_hello(hello)
    for index in range(len(encoded) - 1):
        buffer.feed(encoded[index : index + 1])
        assert ha.take_handshake_frame(buffer) is None
    buffer.feed(encoded[-1:] + b"trailing")
    assert ha.decode_slave_hello(ha.take_handshake_frame(buffer)) == hello
    assert buffer.take_all() == b"trailing"


@given(st.integers(0, 1), st.integers(0, 2**40), st.integers(0, 2**40), st.integers(1, 2**40), epochs, texts, texts)
def test_master_hello_round_trips(status, a, b, segment, entries, reason, client_address):
    low, high = min(a, b), max(a, b)
    hello = ha.MasterHello(status, high, low, segment, entries, reason, client_address)
    buffer = wire.Buffer(size_max=1 << 20)
    buffer.feed(ha.encode_master_hello(hello))
    assert ha.decode_master_hello(ha.take_handshake_frame(buffer)) == hello


def test_a_master_hello_without_the_client_address_leaves_it_unknown():
    """An older master's hello ends after the reason: the slave does not know where to send."""
    hello = ha.MasterHello(ha.STATUS_OK, 100, 0, 1024, ((1, 0),), "", "127.0.0.1:10911")
    body = ha.encode_master_hello(hello)[4:]
    older = body[: -len(b"\x00\x0f127.0.0.1:10911")]
    assert ha.decode_master_hello(older).client_address == ""
    assert ha.decode_master_hello(body).client_address == "127.0.0.1:10911"


@given(st.binary(max_size=300))
def test_handshake_decoders_on_garbage_raise_protocol_error_only(data):
    for decode in (ha.decode_slave_hello, ha.decode_master_hello):
        try:
            decode(data)
        except wire.ProtocolError:
            pass
    buffer = wire.Buffer(size_max=1 << 20)
    buffer.feed(data)
    try:
        ha.take_handshake_frame(buffer)
    except wire.ProtocolError:
        pass


def test_oversize_handshake_frame_is_refused():
    buffer = wire.Buffer(size_max=1 << 20)
    buffer.feed(ha.LENGTH.pack(ha.HANDSHAKE_SIZE_MAX + 1))
    with pytest.raises(wire.ProtocolError, match="handshake frame"):
        ha.take_handshake_frame(buffer)


@given(st.lists(st.integers(0, 2**62), max_size=20), st.integers(1, 9))
def test_reports_decode_in_order_whatever_the_pieces(offsets, piece):
    decoder = ha.ReportDecoder()
    feed_in_pieces(decoder, b"".join(ha.REPORT.pack(o) for o in offsets), piece)
    decoded = []
    while (offset := decoder.next_report()) is not None:
        decoded.append(offset)
    assert decoded == offsets


@given(st.lists(st.integers(0, 2**62), max_size=20), st.integers(1, 17))
def test_reports_taken_a_receive_at_a_time_are_the_reports_in_order(offsets, piece):
    """``reports``: what ``next_report`` would take after each receive (a lone report's receive
    taken without buffering it), whatever the pieces."""
    decoder = ha.ReportDecoder()
    data = b"".join(ha.REPORT.pack(o) for o in offsets)
    decoded = []
    for start in range(0, len(data), piece):
        decoded += decoder.reports(data[start : start + piece])
    assert decoded == offsets


def test_a_negative_report_is_a_protocol_error():
    decoder = ha.ReportDecoder()
    decoder.receive_data(ha.REPORT.pack(-5))
    with pytest.raises(wire.ProtocolError, match="negative"):
        decoder.next_report()
    with pytest.raises(wire.ProtocolError, match="negative"):
        ha.ReportDecoder().reports(ha.REPORT.pack(-5))  # a lone report's receive


@given(st.lists(st.tuples(st.integers(0, 2**50), st.binary(max_size=200)), max_size=8), st.integers(1, 50))
def test_transfer_frames_round_trip(frames, piece):
    decoder = ha.TransferDecoder(size_max=1024)
    data = b"".join(ha.encode_transfer_header(o, len(b)) + b for o, b in frames)
    decoded = []
    for start in range(0, len(data), piece):
        decoder.receive_data(data[start : start + piece])
        while (frame := decoder.next_frame()) is not None:
            decoded.append(frame)
    assert decoded == frames


@given(st.binary(min_size=12, max_size=12))
def test_transfer_header_garbage(data):
    try:
        header = ha.decode_transfer_header(data, size_max=4096)
        assert header.offset >= 0 and 0 <= header.size <= 4096
    except wire.ProtocolError:
        pass


def test_transfer_frame_over_the_limit_is_refused():
    with pytest.raises(wire.ProtocolError, match="outside 0..1024"):
        ha.decode_transfer_header(ha.encode_transfer_header(0, 1025), size_max=1024)


def test_preface_proofs_depend_on_the_secret_and_both_nonces():
    server_nonce, client_nonce = wire.new_nonce(), wire.new_nonce()
    auth = wire.encode_auth(secret=b"s3cret", server_nonce=server_nonce, client_nonce=client_nonce)
    assert wire.check_auth(auth, secret=b"s3cret", server_nonce=server_nonce) == (wire.AUTH_STATUS_OK, client_nonce)
    assert wire.check_auth(auth, secret=b"other", server_nonce=server_nonce)[0] == wire.AUTH_STATUS_BAD_PROOF
    assert wire.check_auth(auth, secret=b"s3cret", server_nonce=wire.new_nonce())[0] == wire.AUTH_STATUS_BAD_PROOF
    no_secret = wire.encode_auth(secret=None, server_nonce=server_nonce, client_nonce=client_nonce)
    assert wire.check_auth(no_secret, secret=b"s3cret", server_nonce=server_nonce)[0] == wire.AUTH_STATUS_BAD_PROOF
    assert wire.check_auth(no_secret, secret=None, server_nonce=server_nonce)[0] == wire.AUTH_STATUS_OK
    assert wire.server_proof(b"s3cret", client_nonce, server_nonce) != wire.client_proof(b"s3cret", server_nonce, client_nonce)


sends = st.builds(
    cp.SendRequest,
    topic=st.from_regex(r"[A-Za-z0-9]{1,20}", fullmatch=True),
    queue_id=st.integers(-(2**31), 2**31 - 1),
    bodies=st.lists(st.binary(max_size=100), min_size=1, max_size=5),
    properties=st.just([]),
    flag=st.integers(-(2**31), 2**31 - 1),
    born_timestamp=st.integers(0, 2**62),
)


@given(sends, st.integers(1, 64))
def test_send_requests_round_trip_through_frames(request, piece):
    request = cp.SendRequest(request.topic, request.queue_id, request.bodies, [b"TAGS\x01a\x02"] * len(request.bodies),
                             request.flag, request.born_timestamp)  # fmt: skip
    data = cp.encode_frame(cp.SEND, 7, cp.encode_send(request)) * 2
    decoder = cp.FrameDecoder(responses=False)
    frames = []
    for start in range(0, len(data), piece):
        decoder.receive_data(data[start : start + piece])
        while (frame := decoder.next_frame()) is not None:
            frames.append(frame)
    assert [f.request_id for f in frames] == [7, 7]
    # A broker's payloads are views on what it received; what is decoded from one is bytes and
    # str all the same, whichever splitter runs (a view kept in a request would be stored as one).
    for split in {cp.split_messages, cp.split_messages_python}:
        with mock.patch.object(cp, "split_messages", split):
            decoded = cp.decode_send(frames[0].payload)
        assert decoded == request
        assert all(type(each) is bytes for each in decoded.bodies + decoded.properties) and type(decoded.topic) is str


def test_responses_round_trip():
    send = cp.SendResponse("PUT_OK", "", 3, [10, 20], [0, 1])
    assert cp.decode_send_response(cp.encode_send_response(send)) == send
    pull = cp.PullResponse("OK", "", 5, 9, [b"abc", b""])
    assert cp.decode_pull_response(cp.encode_pull_response(pull)) == pull
    assert cp.decode_read_response(cp.encode_simple_response("OK", "", 42, b"xyz")) == ("OK", "", 42, b"xyz")
    assert cp.decode_status_response(cp.encode_simple_response("OK", "", b"{}")) == ("OK", "", b"{}")
    assert cp.decode_pull(cp.encode_pull(cp.PullRequest("T", 1, 2, 3))) == cp.PullRequest("T", 1, 2, 3)
    assert cp.decode_read(cp.encode_read(5, 6)) == (5, 6)


@given(sends, st.from_regex(r"[a-f0-9]{1,64}", fullmatch=True), st.integers(0, 2**62))
def test_idempotent_sends_round_trip(request, producer_id, first):
    request = cp.SendRequest(request.topic, request.queue_id, request.bodies, [b""] * len(request.bodies), request.flag,
                             request.born_timestamp, producer_id, first)  # fmt: skip
    assert cp.decode_send(cp.encode_send(request), idempotent=True) == request
    with pytest.raises(wire.ProtocolError):  # the idempotent prefix is not a plain SEND
        assert cp.decode_send(cp.encode_send(request)) != request


@pytest.mark.parametrize(("producer_id", "first", "message"), [
    ("", 0, "producer id must be 1..64 bytes"), ("x" * 65, 0, "producer id must be 1..64 bytes"),
    ("a\x01b", 0, "without"), ("p", -1, "first sequence -1 is negative"),
])  # fmt: skip
def test_idempotent_sends_with_bad_producer_fields_are_refused(producer_id, first, message):
    payload = cp.Writer().text(producer_id).pack(">q", first).bytes() + cp.encode_send(cp.SendRequest("T", 0, [b"x"], [b""]))
    with pytest.raises(wire.ProtocolError, match=message):
        cp.decode_send(payload, idempotent=True)


@given(st.binary(max_size=200))
def test_payload_decoders_on_garbage_raise_protocol_error_only(data):
    payloads = (cp.decode_send, cp.decode_pull, cp.decode_read, cp.decode_demote, cp.decode_transfer_leader)
    for decode in payloads:  # a broker's payloads are views
        try:
            decode(memoryview(data))
        except wire.ProtocolError:
            pass
    for decode in (cp.decode_send, functools.partial(cp.decode_send, idempotent=True), cp.decode_pull, cp.decode_read, cp.decode_send_response, cp.decode_pull_response,
                   cp.decode_read_response, cp.decode_status_response):  # fmt: skip
        try:
            decode(data)
        except wire.ProtocolError:
            pass


@given(st.binary(max_size=64), st.booleans())
def test_frame_decoder_on_garbage_raises_protocol_error_only(data, responses):
    decoder = cp.FrameDecoder(frame_size_max=1024, responses=responses)
    try:
        decoder.receive_data(data)
        while decoder.next_frame() is not None:
            pass
    except wire.ProtocolError:
        pass


def _frames_or_error(data: bytes, piece: int, responses: bool) -> tuple[list, str | None, int]:
    """What a decoder makes of ``data`` fed ``piece`` bytes at a time: the frames, the error
    and how many bytes had been fed when it was raised."""
    decoder = cp.FrameDecoder(frame_size_max=1024, responses=responses)
    frames, fed = [], 0
    try:
        for start in range(0, len(data), piece):
            decoder.receive_data(data[start : start + piece])
            fed = min(len(data), start + piece)
            while (frame := decoder.next_frame()) is not None:
                frames.append((frame.kind, frame.request_id, bytes(frame.payload)))
    except wire.ProtocolError as error:
        return frames, str(error), fed
    return frames, None, fed


@given(st.binary(max_size=64), st.booleans(), st.integers(1, 9))
def test_frame_decoder_gives_the_same_frames_and_error_whatever_the_pieces(data, responses, piece):
    whole = _frames_or_error(data, len(data) or 1, responses)
    pieces = _frames_or_error(data, piece, responses)
    assert pieces[:2] == whole[:2]


@given(st.integers(0, 2**32 - 1), st.integers(0, 255), st.booleans())
@example(5, cp.SEND, False)  # the header alone is a whole frame: an empty payload
def test_a_bad_length_is_refused_at_its_fourth_byte_and_a_bad_kind_at_its_own(length, kind, responses):
    """A peer that sends a bad length (or kind) and then nothing more is refused, not left waiting."""
    head = cp.FRAME_HEADER.pack(length, kind, 1)
    bad_length = not 5 <= length <= 1024
    legal = {k | (cp.RESPONSE_BIT if responses else 0) for k in cp.REQUEST_KINDS}
    frames, error, fed = _frames_or_error(head, 1, responses)
    if bad_length:
        assert (frames, error, fed) == ([], f"frame of {length} bytes, outside 5..1024", 4)
    elif kind not in legal:
        assert (frames, error, fed) == ([], f"unknown frame kind {kind}", 5)
    else:
        assert error is None
        assert frames == ([(kind, 1, b"")] if length == 5 else [])  # 5: kind and request id, nothing after


@given(st.text(min_size=1, max_size=20))
def test_transfer_leader_requests_round_trip(target):
    payload = cp.encode_transfer_leader(target)
    assert cp.decode_transfer_leader(memoryview(payload)) == target
    with pytest.raises(wire.ProtocolError, match="unexpected bytes"):
        cp.decode_transfer_leader(payload + b"x")


def test_transfer_leader_targets_are_member_ids():
    for target in ("", "n" * 65):
        with pytest.raises(wire.ProtocolError, match="member id of 1..64 bytes"):
            cp.decode_transfer_leader(cp.encode_transfer_leader(target))
    frame = cp.encode_frame(cp.TRANSFER_LEADER, 7, cp.encode_transfer_leader("n1"))
    decoder = cp.FrameDecoder(responses=False)
    decoder.receive_data(frame)
    assert decoder.next_frame() == (cp.TRANSFER_LEADER, 7, b"\x00\x02n1")


@given(st.booleans(), st.text(min_size=1, max_size=200))
def test_fence_round_trips(fence, reason):
    assert cp.decode_fence(cp.encode_fence(fence, reason)) == (fence, reason)


@given(st.binary(max_size=64))
def test_fence_decoder_raises_only_its_protocol_error(payload):
    try:
        fence, reason = cp.decode_fence(payload)
    except wire.ProtocolError:
        return
    assert payload[0] in (0, 1) and reason


@given(st.booleans(), st.text(max_size=200))
def test_promote_round_trips_with_and_without_a_fence_reason(sync, reason):
    assert cp.decode_promote(cp.encode_promote(sync, reason)) == (sync, reason)
    assert cp.encode_promote(sync) == (b"\x01" if sync else b"\x00")  # the one-byte form, as before


@given(st.binary(max_size=64))
def test_promote_decoder_raises_only_its_protocol_error(payload):
    try:
        cp.decode_promote(payload)
    except wire.ProtocolError as error:
        assert str(error).startswith("PROMOTE payload")


def test_fence_refuses_a_bad_flag_and_an_empty_reason():
    with pytest.raises(wire.ProtocolError, match="one byte"):
        cp.decode_fence(b"\x02" + cp.Writer().text("x").bytes())
    with pytest.raises(wire.ProtocolError, match="1..1024"):
        cp.decode_fence(b"\x01" + cp.Writer().text("").bytes())


def test_unknown_kinds_and_oversize_frames_are_refused():
    decoder = cp.FrameDecoder(frame_size_max=100, responses=False)
    decoder.receive_data(cp.FRAME_HEADER.pack(10, 10, 1))
    with pytest.raises(wire.ProtocolError, match="unknown frame kind 10"):
        decoder.next_frame()
    decoder = cp.FrameDecoder(frame_size_max=100, responses=False)
    decoder.receive_data(cp.FRAME_HEADER.pack(101, cp.SEND, 1))
    with pytest.raises(wire.ProtocolError, match="outside 5..100"):
        decoder.next_frame()
    with pytest.raises(wire.ProtocolError, match="0 messages"):
        cp.decode_send(cp.Writer().text("T").pack(">iiqI", 0, 0, 0, 0).bytes())


def _split_outcome(split, payload, position, count):
    try:
        return split(payload, position, count)
    except wire.ProtocolError as error:
        return str(error)


@pytest.mark.skipif(native.split_messages is None, reason="native module not built")
@given(
    st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=300)), max_size=8),
    st.integers(0, 12), st.integers(0, 10), st.binary(max_size=6),
)  # fmt: skip
def test_native_and_python_split_messages_agree_including_on_damage(messages, prefix, cut, trailer):
    """The C splitter a broker uses and the Python twin: same lists and end, or the same error,
    for well-formed runs, runs cut short, counts that claim more messages, and trailing bytes."""
    body = b"".join(len(p).to_bytes(2, "big") + p + len(b).to_bytes(4, "big") + b for p, b in messages)
    payload = bytes(prefix) + body + trailer
    for data in (payload, payload[: max(0, len(payload) - cut)]):
        for count in (len(messages), len(messages) + 1):
            assert _split_outcome(cp._split_messages_native, data, prefix, count) == _split_outcome(
                cp.split_messages_python, data, prefix, count
            )
    if messages:
        properties, bodies, end = cp._split_messages_native(payload, prefix, len(messages))
        assert properties == [p for p, _ in messages] and bodies == [b for _, b in messages] and end == prefix + len(body)


@pytest.mark.skipif(native.pack_offset_pairs is None, reason="native module not built")
@given(st.lists(st.tuples(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(-(1 << 63), (1 << 63) - 1)), max_size=40),
       st.integers(0, 2))  # fmt: skip
def test_native_and_python_offset_pairs_agree_byte_for_byte(pairs, extra):
    """The C packer of a SEND response's offset pairs and its Python twin: the same bytes, and the
    same refusal when the two lists differ in length."""
    offsets = tuple(offset for offset, _ in pairs)
    queue_offsets = [queue_offset for _, queue_offset in pairs] + [0] * extra

    def outcome(function):
        try:
            return function(offsets, queue_offsets)
        except ValueError as error:
            return str(error)

    assert outcome(native.pack_offset_pairs) == outcome(cp.pack_offset_pairs_python)
    if not extra:
        response = cp.encode_send_response_fields("PUT_OK", "", 3, list(offsets), queue_offsets)
        if len(pairs) != 1:
            decoded = cp.decode_send_response(response) if len(pairs) <= cp.SEND_MESSAGES_MAX else None
            assert decoded is None or (decoded.offsets, decoded.queue_offsets) == (list(offsets), queue_offsets)


def _decode_send_with_reader(payload, idempotent):
    """decode_send as it read the topic and head before they were read in place (a Reader)."""
    reader = cp.Reader(payload)
    producer_id, first_sequence = "", -1
    if idempotent:
        producer_id = reader.text()
        (first_sequence,) = reader.unpack(">q")
        if not producer_id or len(producer_id.encode()) > cp.PRODUCER_ID_SIZE_MAX or "\x01" in producer_id or "\x02" in producer_id:
            raise wire.ProtocolError(f"producer id must be 1..{cp.PRODUCER_ID_SIZE_MAX} bytes without \\x01 or \\x02")
        if first_sequence < 0:
            raise wire.ProtocolError(f"first sequence {first_sequence} is negative")
    topic = reader.text()
    queue_id, flag, born_timestamp, count = reader.unpack_struct(cp.SEND_HEAD)
    if count == 0 or count > cp.SEND_MESSAGES_MAX:
        raise wire.ProtocolError(f"SEND with {count} messages, outside 1..{cp.SEND_MESSAGES_MAX}")
    properties, bodies, position = cp.split_messages(payload, reader.position, count)
    if position != len(payload):
        raise wire.ProtocolError(f"{len(payload) - position} unexpected bytes at the end of the payload")
    return cp.SendRequest(topic, queue_id, bodies, properties, flag, born_timestamp, producer_id, first_sequence)


def _decode_outcome(decode, payload, idempotent):
    try:
        return decode(payload, idempotent=idempotent)
    except wire.ProtocolError as error:
        return str(error)


@given(
    st.one_of(st.text(max_size=6), st.just("é" * 200)),
    st.lists(st.tuples(st.binary(max_size=8), st.binary(max_size=20)), min_size=1, max_size=4),
    st.integers(0, 40), st.binary(max_size=3), st.booleans(), st.sampled_from([bytes, memoryview]),
    st.binary(min_size=2, max_size=2),
)  # fmt: skip
def test_decode_send_reads_topic_and_head_in_place_as_the_reader_did(topic, messages, cut, trailer, idempotent, kind, bad_topic):
    """The in-place read of a SEND's topic and head (cached topic text) decodes what the Reader
    decoded and refuses what it refused, with the same reason: whole, cut short, with trailing
    bytes, a topic that is not UTF-8, a long topic past the cache's limit."""
    request = cp.SendRequest(topic, 1, [b for _, b in messages], [p for p, _ in messages], 2, 3,
                             "p" if idempotent else "", 4 if idempotent else -1)  # fmt: skip
    payload = cp.encode_send(request)
    broken = payload.replace(len(topic.encode()).to_bytes(2, "big") + topic.encode(), b"\x00\x02" + b"\xff" + bad_topic[:1], 1)
    for data in (payload, payload[: max(0, len(payload) - cut)], payload + trailer, broken):
        for flag in (idempotent, not idempotent):
            assert _decode_outcome(cp.decode_send, kind(data), flag) == _decode_outcome(_decode_send_with_reader, kind(data), flag)


def test_reports_beyond_the_read_buffer_are_a_protocol_error():
    decoder = ha.ReportDecoder()
    decoder.receive_data(ha.REPORT.pack(1) * (ha.REPORTS_BUFFERED_MAX // ha.REPORT.size))
    assert decoder.next_report() == 1  # one taken: room for one more
    decoder.receive_data(ha.REPORT.pack(2))
    with pytest.raises(wire.ProtocolError, match="buffered"):
        decoder.receive_data(b"\x00")
