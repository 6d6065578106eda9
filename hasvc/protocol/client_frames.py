"""A read's client frames split, and a pass's SEND answers encoded, in one call each.

Theory of operation
-------------------
A broker serving 64 writers on one connection reads dozens of frames a receive. Taken one
``FrameDecoder.next_frame`` (and a ``Buffer.skip``) at a time and answered one ``Outbox.respond``
at a time, each frame cost Python calls of its own on the way in and on the way out. Here both
ends are one call a pass, native when the optional module is built (``commitlog/_scan.c``
``split_frames`` and ``encode_answers``; the functions below are their twins: the same frames,
errors and bytes, compared by tests/unit/test_client_frames.py):

* ``split_frames``: the whole frames at the front of one received piece (the decoder hands it
  its first chunk; a frame that spans two receives is joined by the decoder's ``next_frame``),
  as ``Frame`` tuples whose payloads are views on the piece, and how many bytes they took. It
  stops before the first frame that is not whole, or that the decoder refuses: its error is the
  decoder's one line (``FrameDecoder._check``), returned for the caller to raise once it has
  handled the frames before it. It also stops after the first frame of a kind the caller does
  not call plain (the broker: anything but a SEND), which the caller answers before it takes
  more (a READ's answer may mute the connection: no request after it is taken then).
* ``encode_answers``: a pass's answers (``answers[i]`` for ``items[i] = (outbox, frame, ...)``,
  None for a request answered elsewhere) as response frames, joined per outbox in the order of
  the pass, each ``header | prefix | answer``: an outbox takes its share in one piece.

Nothing is decided here: which kinds are legal, the frame size limit and which requests are
answered with what are the caller's.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from commitlog import native

FRAME_HEADER = struct.Struct(">IBI")  # length (of what follows), kind, request id (hasvc.protocol.client's)
LENGTH = struct.Struct(">I")
RESPONSE_BIT = 0x80

KIND_REFUSED = 0
KIND_ALLOWED = 1
KIND_PLAIN = 2  # allowed, and of the kinds the caller takes without looking (``split_frames``' ``plain``)

_NEW_TUPLE = tuple.__new__


def kind_table(allowed, plain=frozenset()) -> bytes:
    """The 256-byte table ``split_frames`` reads a kind's verdict from."""
    table = bytearray(256)
    for kind in allowed:
        table[kind] = KIND_PLAIN if kind in plain else KIND_ALLOWED
    return bytes(table)


def split_frames_python(buffer, frame_size_max: int, kinds: bytes, count_max: int, frame_type) -> tuple:
    """(frames, consumed, error, plain): see the module and ``commitlog/_scan.c`` ``split_frames``."""
    frames: list = []
    size, position, error, plain = len(buffer), 0, None, True
    while len(frames) < count_max:
        left = size - position
        if left < 4:
            break
        (length,) = LENGTH.unpack_from(buffer, position)
        if length < 5 or length > frame_size_max:
            error = f"frame of {length} bytes, outside 5..{frame_size_max}"
            break
        if left < 5:
            break
        kind = buffer[position + 4]
        if not kinds[kind]:
            error = f"unknown frame kind {kind}"
            break
        if left < 4 + length:
            break
        (request_id,) = LENGTH.unpack_from(buffer, position + 5)
        frames.append(_NEW_TUPLE(frame_type, (kind, request_id, buffer[position + 9 : position + 4 + length])))
        position += 4 + length
        if kinds[kind] != KIND_PLAIN:
            plain = False
            break
    return frames, position, error, plain


def encode_answers_python(items: list, answers: list, prefix: bytes) -> list:
    """[(owner, data, count), ...]: see the module and ``commitlog/_scan.c`` ``encode_answers``."""
    if len(items) != len(answers):
        raise ValueError("items and answers differ in length")
    groups: dict = {}
    for item, answer in zip(items, answers):
        if answer is None:
            continue
        owner, frame = item[0], item[1]
        parts = groups.get(owner)
        if parts is None:
            parts = groups[owner] = []
        parts.append(FRAME_HEADER.pack(5 + len(prefix) + len(answer), frame[0] | RESPONSE_BIT, frame[1]))
        parts.append(prefix)
        parts.append(answer)
    return [(owner, b"".join(parts), len(parts) // 3) for owner, parts in groups.items()]


class Answer(NamedTuple):
    """A response frame read back (``answers_of``): its request's kind and id, and its payload."""

    kind: int
    request_id: int
    payload: bytes


_ANY_KIND = bytes([KIND_PLAIN]) * 256


def answers_of(data: bytes) -> list[Answer]:
    """The response frames joined in ``data`` (as ``encode_answers`` joins them), read back: for an
    outbox that takes its answers one by one (a test's, a tool's)."""
    frames, consumed, error, _ = split_frames_python(memoryview(data), len(data), _ANY_KIND, len(data), Answer)
    if error is not None or consumed != len(data):
        raise ValueError(f"not whole response frames: {error or f'{len(data) - consumed} bytes left over'}")
    return [Answer(kind & ~RESPONSE_BIT, request_id, bytes(payload)) for kind, request_id, payload in frames]


split_frames = native.split_frames or split_frames_python
encode_answers = native.encode_answers or encode_answers_python
