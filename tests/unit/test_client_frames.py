"""A read's client frames split and a pass's SEND answers encoded in one call each
(hasvc/protocol/client_frames.py): the native functions against their pure-Python twins on random
streams cut anywhere (every refusal: sizes out of range, unknown kinds, garbage), and
``FrameDecoder.take_frames`` against the one-frame-at-a-time ``next_frame`` it stands in for."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import native
from hasvc.protocol import client as cp
from hasvc.protocol import client_frames as cf
from hasvc.protocol.wire import ProtocolError

FRAME_SIZE_MAX = 64  # small: oversize frames are easy to generate
KINDS = cf.kind_table(cp.REQUEST_KINDS, cp.SEND_KINDS)

# A frame as a peer may send it: a legal one of any request kind, or one the decoder refuses.
legal_frames = st.builds(lambda kind, request_id, payload: cp.encode_frame(kind, request_id, payload),
                         st.sampled_from(sorted(cp.REQUEST_KINDS)), st.integers(0, 0xFFFFFFFF),
                         st.binary(max_size=FRAME_SIZE_MAX - 5))  # fmt: skip
sends = st.builds(lambda request_id, payload: cp.encode_frame(cp.SEND, request_id, payload),
                  st.integers(0, 0xFFFFFFFF), st.binary(max_size=FRAME_SIZE_MAX - 5))  # fmt: skip
refused_frames = st.one_of(
    st.builds(lambda length, rest: struct.pack(">I", length) + rest,  # a length outside 5..FRAME_SIZE_MAX
              st.one_of(st.integers(0, 4), st.integers(FRAME_SIZE_MAX + 1, 0xFFFFFFFF)), st.binary(max_size=12)),  # fmt: skip
    st.builds(lambda kind, payload: struct.pack(">IBI", len(payload) + 5, kind, 1) + payload,  # an unknown kind
              st.integers(0, 255).filter(lambda kind: kind not in cp.REQUEST_KINDS), st.binary(max_size=8)),  # fmt: skip
    st.binary(min_size=1, max_size=24),  # garbage
)
streams = st.lists(st.one_of(legal_frames, sends, sends, refused_frames), max_size=12).map(b"".join)


def _outcome(split, data: bytes, count_max: int):
    frames, consumed, error, plain = split(memoryview(data), FRAME_SIZE_MAX, KINDS, count_max, cp.Frame)
    assert all(type(frame) is cp.Frame and isinstance(frame.payload, memoryview) for frame in frames)
    return [(f.kind, f.request_id, bytes(f.payload)) for f in frames], consumed, error, plain


@pytest.mark.skipif(native.split_frames is None, reason="native module not built")
@given(streams, st.integers(0, 60), st.integers(0, 16))
@settings(max_examples=500)
def test_native_and_python_split_frames_agree_on_any_piece_of_any_stream(stream, cut, count_max):
    """Any prefix of a stream of legal, refused and garbage frames: the same frames (payloads as
    views on the piece), bytes taken, one-line error and plain flag."""
    piece = stream[:cut] if cut < len(stream) else stream
    assert _outcome(native.split_frames, piece, count_max) == _outcome(cf.split_frames_python, piece, count_max)


def _next_frame_outcome(stream: bytes, cuts: list[int]):
    """The frames ``next_frame`` hands out of ``stream`` received in pieces cut at ``cuts``, and
    the error it stops at (None when it runs out of bytes)."""
    decoder = cp.FrameDecoder(frame_size_max=FRAME_SIZE_MAX, responses=False)
    frames = []
    for piece in _pieces(stream, cuts):
        try:
            decoder.receive_data(piece)  # refused when more than two frames' worth is buffered
            while (frame := decoder.next_frame()) is not None:
                frames.append((frame.kind, frame.request_id, bytes(frame.payload)))
        except ProtocolError as error:
            return frames, str(error)
    return frames, None


def _take_frames_outcome(stream: bytes, cuts: list[int], count_max: int):
    """The same by ``take_frames(count_max)``, called until it takes nothing more a receive;
    checks what each call promises (at most ``count_max`` frames, ending at the first frame
    that is not a SEND, ``plain`` when all are)."""
    decoder = cp.FrameDecoder(frame_size_max=FRAME_SIZE_MAX, responses=False)
    frames = []
    for piece in _pieces(stream, cuts):
        try:
            decoder.receive_data(piece)
        except ProtocolError as error:
            return frames, str(error)
        while True:
            taken, plain, error = decoder.take_frames(count_max)
            assert len(taken) <= count_max
            kinds = [frame.kind for frame in taken]
            assert plain == all(kind in cp.SEND_KINDS for kind in kinds)
            assert all(kind in cp.SEND_KINDS for kind in kinds[:-1])
            frames += [(frame.kind, frame.request_id, bytes(frame.payload)) for frame in taken]
            if error is not None:
                with pytest.raises(ProtocolError) as raised:  # the decoder refuses it again: nothing was skipped
                    decoder.next_frame()
                assert str(raised.value) == error
                return frames, error
            if not taken:
                break
    return frames, None


def _pieces(stream: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(cut % (len(stream) + 1) for cut in cuts), len(stream)]
    return [stream[start:end] for start, end in zip(edges, edges[1:])]


@pytest.mark.parametrize("split", ["native", "python"])
@given(stream=streams, cuts=st.lists(st.integers(0, 1000), max_size=6), count_max=st.integers(1, 5))
@settings(max_examples=300)
def test_take_frames_gives_what_next_frame_gives_in_any_cut_of_any_stream(monkeypatch, split, stream, cuts, count_max):
    """The stream received in random pieces: ``take_frames`` hands out the frames ``next_frame``
    would, in order, and stops at the frame it refuses with its error (every frame before it
    handed out first), with the native split and its pure twin."""
    if split == "native" and native.split_frames is None:
        pytest.skip("native module not built")
    monkeypatch.setattr(cp, "_split_frames", native.split_frames if split == "native" else cf.split_frames_python)
    assert _take_frames_outcome(stream, cuts, count_max) == _next_frame_outcome(stream, cuts)


def test_take_frames_stops_after_a_request_that_is_not_a_send():
    """A READ's answer may mute the connection: what follows it is taken only after it is answered."""
    decoder = cp.FrameDecoder(frame_size_max=FRAME_SIZE_MAX, responses=False)
    decoder.receive_data(cp.encode_frame(cp.SEND, 1, b"a") + cp.encode_frame(cp.STATUS, 2, b"") + cp.encode_frame(cp.SEND, 3, b"b"))
    first, plain, error = decoder.take_frames(8)
    assert [frame.request_id for frame in first] == [1, 2] and not plain and error is None
    second, plain, error = decoder.take_frames(8)
    assert [frame.request_id for frame in second] == [3] and plain and error is None


def test_take_frames_hands_out_the_frames_before_a_refused_one_then_its_error():
    decoder = cp.FrameDecoder(frame_size_max=FRAME_SIZE_MAX, responses=False)
    decoder.receive_data(cp.encode_frame(cp.SEND, 1, b"a") + struct.pack(">IBI", 10, 99, 2) + b"x" * 5)
    frames, plain, error = decoder.take_frames(8)
    assert [frame.request_id for frame in frames] == [1] and plain
    assert error == "unknown frame kind 99"
    assert decoder.take_frames(8) == ([], True, "unknown frame kind 99")


class _Owner:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


OWNERS = [_Owner("a"), _Owner("b"), _Owner("c")]
passes = st.lists(st.tuples(st.sampled_from(OWNERS), st.sampled_from(sorted(cp.SEND_KINDS)), st.integers(0, 0xFFFFFFFF),
                            st.one_of(st.none(), st.binary(max_size=40))), max_size=20)  # fmt: skip


def _items(pass_):
    return ([(owner, cp.Frame(kind, request_id, b""), None) for owner, kind, request_id, _ in pass_],
            [answer for *_, answer in pass_])  # fmt: skip


@pytest.mark.skipif(native.encode_answers is None, reason="native module not built")
@given(passes, st.binary(max_size=30))
@settings(max_examples=300)
def test_native_and_python_encode_answers_agree_byte_for_byte(pass_, prefix):
    items, answers = _items(pass_)
    assert native.encode_answers(items, answers, prefix) == cf.encode_answers_python(items, answers, prefix)


@given(passes, st.binary(max_size=30))
def test_each_owner_gets_its_answers_framed_in_the_order_of_the_pass(pass_, prefix):
    """Read back, an owner's piece is ``respond``'s frames for its answered requests, in order;
    owners come in the order first answered."""
    items, answers = _items(pass_)
    joined = cf.encode_answers(items, answers, prefix)
    answered = [(owner, kind, request_id, answer) for owner, kind, request_id, answer in pass_ if answer is not None]
    assert [owner for owner, _, _ in joined] == list(dict.fromkeys(owner for owner, *_ in answered))
    for owner, data, count in joined:
        mine = [(kind, request_id, prefix + answer) for each, kind, request_id, answer in answered if each is owner]
        assert data == b"".join(cp.FRAME_HEADER.pack(len(payload) + 5, kind | cp.RESPONSE_BIT, request_id) + payload
                                for kind, request_id, payload in mine)  # fmt: skip
        assert count == len(mine)
        assert [tuple(answer) for answer in cf.answers_of(data)] == mine


def test_encode_answers_refuses_lists_of_different_lengths():
    items, answers = _items([(OWNERS[0], cp.SEND, 1, b"x")])
    for encode in filter(None, (native.encode_answers, cf.encode_answers_python)):
        with pytest.raises(ValueError, match="differ in length"):
            encode(items, answers + [None], b"")
