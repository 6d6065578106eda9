"""Shared wire pieces: the connection preface (version + HMAC-SHA256 challenge–response), a
length-prefixed byte buffer, and the protocol error.

Theory of operation
-------------------
Both ports (client and HA) start the same way, before a single log byte moves:

    server -> client  HELLO     "HSVC" | u8 version | u8 port kind | u8 auth required | 32-byte server nonce
    client -> server  AUTH      "HSVC" | u8 version | 32-byte client nonce | 32-byte client proof
    server -> client  AUTH_OK   u8 status (0 ok, 1 bad proof, 3 version; 2 is never sent) | 32-byte server proof

    client proof = HMAC-SHA256(secret, "hasvc-client" | server nonce | client nonce)
    server proof = HMAC-SHA256(secret, "hasvc-server" | client nonce | server nonce)

The secret is the server's and the client's own: a server without one sends ``auth required`` 0
and a zero proof, and expects a zero proof; a server with one refuses a client without it. A
client with a secret refuses a server whose HELLO requires none (before sending AUTH) and checks
the server proof (a fake master cannot feed a slave). The client checks the port kind in HELLO
itself (AUTH carries none). A refusal is the AUTH_OK frame with a nonzero status, then the
server closes.

Everything here is sans-IO: ``Buffer`` collects bytes fed to it and hands out exact-size pieces.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import struct
from typing import Final

PROTOCOL_VERSION: Final = 1
MAGIC: Final = b"HSVC"
NONCE_SIZE: Final = 32
PROOF_SIZE: Final = 32

PORT_KIND_CLIENT: Final = 1
PORT_KIND_HA: Final = 2
PORT_KIND_RAFT: Final = 3  # a DLedger member's Raft port (docs/PROTOCOL.md, the Raft port)
PORT_KIND_CONTROLLER: Final = 4  # a controller's port (docs/PROTOCOL.md, the controller port)

AUTH_STATUS_OK: Final = 0
AUTH_STATUS_BAD_PROOF: Final = 1
# Never sent: AUTH carries no port kind, the client checks HELLO's. Kept reserved (and its text
# for the client's own message) so no later status reuses the value.
AUTH_STATUS_WRONG_PORT: Final = 2
AUTH_STATUS_VERSION: Final = 3
AUTH_STATUS_TEXT: Final = {
    AUTH_STATUS_OK: "ok",
    AUTH_STATUS_BAD_PROOF: "authentication failed (wrong or missing secret)",
    AUTH_STATUS_WRONG_PORT: "wrong port: a client connected to the HA port or a slave to the client port",
    AUTH_STATUS_VERSION: "unsupported protocol version",
}

HELLO = struct.Struct(">4sBBB32s")  # magic, version, port kind, auth required, server nonce
assert HELLO.size == 39
AUTH = struct.Struct(">4sB32s32s")  # magic, version, client nonce, client proof
assert AUTH.size == 69
AUTH_OK = struct.Struct(">B32s")  # status, server proof
assert AUTH_OK.size == 33

ZERO_PROOF: Final = bytes(PROOF_SIZE)


class ProtocolError(Exception):
    """The peer sent something this protocol does not allow; the connection is closed."""


def new_nonce() -> bytes:
    return os.urandom(NONCE_SIZE)


def client_proof(secret: bytes | None, server_nonce: bytes, client_nonce: bytes) -> bytes:
    if secret is None:
        return ZERO_PROOF
    return hmac.new(secret, b"hasvc-client" + server_nonce + client_nonce, hashlib.sha256).digest()


def server_proof(secret: bytes | None, client_nonce: bytes, server_nonce: bytes) -> bytes:
    if secret is None:
        return ZERO_PROOF
    return hmac.new(secret, b"hasvc-server" + client_nonce + server_nonce, hashlib.sha256).digest()


def encode_hello(*, port_kind: int, auth_required: bool, server_nonce: bytes) -> bytes:
    return HELLO.pack(MAGIC, PROTOCOL_VERSION, port_kind, int(auth_required), server_nonce)


def decode_hello(data: bytes) -> tuple[int, int, bool, bytes]:
    """(version, port kind, auth required, server nonce)."""
    magic, version, port_kind, auth_required, nonce = HELLO.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"not a hasvc server (greeting {magic!r})")
    return version, port_kind, bool(auth_required), nonce


def encode_auth(*, secret: bytes | None, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return AUTH.pack(MAGIC, PROTOCOL_VERSION, client_nonce, client_proof(secret, server_nonce, client_nonce))


def check_auth(data: bytes, *, secret: bytes | None, server_nonce: bytes) -> tuple[int, bytes]:
    """(AUTH_OK status, client nonce) for an AUTH frame."""
    magic, version, client_nonce, proof = AUTH.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"not a hasvc client (preface {magic!r})")
    if version != PROTOCOL_VERSION:
        return AUTH_STATUS_VERSION, client_nonce
    expected = client_proof(secret, server_nonce, client_nonce)
    if not hmac.compare_digest(proof, expected):
        return AUTH_STATUS_BAD_PROOF, client_nonce
    return AUTH_STATUS_OK, client_nonce


class Buffer:
    """Bytes received and not yet consumed, with a bound on how much may pile up.

    Each receive is kept as the ``bytes`` it came in, behind a zero-copy ``memoryview``; a take
    copies its bytes out once. Only a frame split across receives is joined (its own bytes, not
    the rest of the receive). Appending every receive to one ``bytearray`` copied each up to
    256 KiB receive once more just to hand out frames from it: with 64 producers on one
    connection most receives end inside a frame, and feeding plus taking was ~8 % of a busy
    master's main thread."""

    def __init__(self, size_max: int):
        self.size_max = size_max
        self._chunks: collections.deque[memoryview] = collections.deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._size + len(data) > self.size_max:
            raise ProtocolError(f"more than {self.size_max} bytes buffered from the peer")
        if len(data):
            view = memoryview(data if type(data) is bytes else bytes(data))
            self._chunks.append(view)
            self._size += len(view)

    def _front(self, size: int) -> memoryview:
        """The first chunk, joined with what follows until it holds ``size`` bytes (held)."""
        chunks = self._chunks
        first = chunks[0]
        if len(first) >= size:
            return first
        parts, have = [chunks.popleft()], len(first)
        while have < size:
            following = chunks.popleft()
            need = size - have
            if len(following) > need:
                parts.append(following[:need])
                chunks.appendleft(following[need:])
                have = size
            else:
                parts.append(following)
                have += len(following)
        first = memoryview(b"".join(parts))
        chunks.appendleft(first)
        return first

    def _consume(self, size: int) -> None:
        chunks = self._chunks
        self._size -= size
        while size:
            first = chunks[0]
            if len(first) > size:
                chunks[0] = first[size:]
                return
            size -= len(first)
            chunks.popleft()

    def first_chunk(self) -> memoryview | None:
        """The oldest received piece not yet taken, as it is (None when nothing is buffered): a
        decoder whose next frame lies whole in it takes the frame with one ``skip``."""
        chunks = self._chunks
        return chunks[0] if chunks else None

    def peek(self, size: int) -> memoryview | None:
        if self._size < size:
            return None
        return self._front(size)[:size] if size else memoryview(b"")

    def unpack(self, layout: struct.Struct) -> tuple | None:
        """``layout`` unpacked from the front, not consumed; None when too few bytes."""
        if self._size < layout.size:
            return None
        return layout.unpack_from(self._front(layout.size))

    def skip(self, size: int) -> None:
        assert size <= self._size
        chunks = self._chunks
        if chunks and len(chunks[0]) >= size:  # within the first chunk (a frame per receive): _consume written out
            first = chunks[0]
            self._size -= size
            if len(first) > size:
                chunks[0] = first[size:]
            else:
                chunks.popleft()
            return
        self._consume(size)

    def take(self, size: int) -> bytes | None:
        view = self.take_view(size)
        if view is None:
            return None
        whole = view.obj  # all of a received (or joined) bytes object is handed out as it is
        return whole if len(view) == len(whole) else bytes(view)

    def take_view(self, size: int) -> memoryview | None:
        """``size`` bytes as a read-only view, copied only where they span two receives (the
        bytes under it never change)."""
        if self._size < size:
            return None
        if not size:
            return memoryview(b"")
        piece = self._front(size)[:size]
        self._consume(size)
        return piece

    def take_all(self) -> bytes:
        return self.take(self._size)
