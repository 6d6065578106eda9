"""A Raft peer written from docs/PROTOCOL.md §1 and §4 alone -- sockets and ``struct``, not
hasvc's codec -- plays the leader n1 of a three-member group against a real ``hasvc node`` n0
(n2 is never up). Every answer n0 gives is checked field by field against what the doc says:
HELLO from the dialling side only, a HEARTBEAT of 16 and of 24 bytes, APPEND and its refusals
(OUT_OF_ORDER once per end index, INCONSISTENT_STATE for a wrong previous term or pos), COMPARE
and MISMATCH, TRUNCATE, the vote checks' results and the term each refusal carries, a stale
term, a HELLO with another data-file size refused, a frame length refused before its body."""

from __future__ import annotations

import os
import socket
import struct

from hasvc import client as hc
from hasvc.testing.launch import ReadyProcess, hasvc_command
from hasvc.tools.partition import LOOPBACK, free_port

READ_TIMEOUT_SECONDS = 30.0  # a bound for a failing run, not a measurement
DATA_FILE_SIZE = 1024 * 1024  # --set commitlog_segment_size: small files for a test

# §1: the preface.
PREFACE_HELLO = struct.Struct(">4sBBB32s")  # magic, version, port kind, auth required, nonce
AUTH_OK = struct.Struct(">B32s")
# §4: the frame and the bodies.
FRAME = struct.Struct(">IB")
HEARTBEAT = struct.Struct(">qq")
HEARTBEAT_RESPONSE = struct.Struct(">qB")
VOTE_REQUEST = struct.Struct(">qqqB")
VOTE_RESPONSE = struct.Struct(">qBB")
PUSH = struct.Struct(">qBqqqI")
PUSH_ENTRY = struct.Struct(">qqI")
APPEND = struct.Struct(">qqqqIq")
STORED_ENTRY = struct.Struct(">iiqqqiiii")  # magic, size, index, term, pos, channel, chainCrc, bodyCrc, bodySize
PUSH_RESPONSE = struct.Struct(">qBBqqqqq")
HELLO, VOTE_REQUEST_KIND, VOTE_RESPONSE_KIND, HEARTBEAT_KIND, HEARTBEAT_RESPONSE_KIND = 0, 1, 2, 3, 4
PUSH_KIND, PUSH_RESPONSE_KIND, APPEND_KIND = 5, 6, 8
COMPARE, TRUNCATE, APPEND_TYPE = 1, 2, 3
SUCCESS, EXPIRED_TERM, INCONSISTENT_STATE, OUT_OF_ORDER, MISMATCH = 0, 1, 3, 4, 5


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"closed after {len(data)} of {size} bytes"
        data += chunk
    return data


def _client_preface(sock: socket.socket) -> None:
    magic, version, kind, auth_required, nonce = PREFACE_HELLO.unpack(_receive(sock, PREFACE_HELLO.size))
    assert (magic, version, kind, auth_required) == (b"HSVC", 1, 3, 0)
    sock.sendall(b"HSVC" + bytes([1]) + os.urandom(32) + bytes(32))  # no secret: the zero proof
    status, proof = AUTH_OK.unpack(_receive(sock, AUTH_OK.size))
    assert (status, proof) == (0, bytes(32))


def _server_preface(sock: socket.socket) -> None:
    sock.sendall(PREFACE_HELLO.pack(b"HSVC", 1, 3, 0, os.urandom(32)))
    auth = _receive(sock, 69)
    assert auth[:5] == b"HSVC\x01" and auth[37:] == bytes(32)
    sock.sendall(AUTH_OK.pack(0, bytes(32)))


def _text(value: str) -> bytes:
    return bytes([len(value.encode())]) + value.encode()


def _hello(source: str, target: str, *, data_file_size: int) -> bytes:
    body = bytes([2]) + _text("g") + _text(source) + _text(target) + _text("") + struct.pack(">qq", 0, data_file_size)
    return FRAME.pack(len(body) + 1, HELLO) + body


def _frame(kind: int, body: bytes) -> bytes:
    return FRAME.pack(len(body) + 1, kind) + body


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    length, kind = FRAME.unpack(_receive(sock, FRAME.size))
    return kind, _receive(sock, length - 1)


def _expect(sock: socket.socket, kind: int) -> bytes:
    """The next frame, of ``kind`` (n0's own vote requests, if its election timeout passes, skipped)."""
    while True:
        got, body = _read_frame(sock)
        if got != VOTE_REQUEST_KIND:
            assert got == kind, (got, body)
            return body


def _entry(index: int, term: int, pos: int) -> bytes:
    """A stored no-op entry (FORMAT.md: 48-byte header, empty body, bodyCrc 0)."""
    return STORED_ENTRY.pack(1, 48, index, term, pos, 0, 0, 0, 0)


def _append(term: int, index: int, prev_term: int, commit: int, entries: list[tuple[int, int]]) -> bytes:
    """An APPEND of no-op entries given as (term, pos), from ``index``."""
    run = b"".join(_entry(index + i, t, pos) for i, (t, pos) in enumerate(entries))
    return _frame(APPEND_KIND, APPEND.pack(term, index, prev_term, commit, len(entries), entries[-1][0]) + run)


def _push(kind: int, term: int, index: int, commit: int, entries: list[tuple[int, int]]) -> bytes:
    body = PUSH.pack(term, kind, index, -1, commit, len(entries))
    return _frame(PUSH_KIND, body + b"".join(PUSH_ENTRY.pack(i, t, 0) for i, t in entries))


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_peer_written_from_the_doc_leads_a_hasvc_member(tmp_path) -> None:
    inbound_listener = socket.create_server((LOOPBACK, 0))
    n1_port = inbound_listener.getsockname()[1]
    n0_port, n2_port = free_port(), free_port()
    peers = f"n0-{LOOPBACK}:{n0_port};n1-{LOOPBACK}:{n1_port};n2-{LOOPBACK}:{n2_port}"
    node = ReadyProcess("n0", hasvc_command("node", "--store", str(tmp_path / "n0"), "--listen", f"{LOOPBACK}:0",
                                            "--group", "g", "--peers", peers, "--self", "n0",
                                            "--set", f"commitlog_segment_size={DATA_FILE_SIZE}"),
                        str(tmp_path / "n0.log"))  # fmt: skip
    sockets = [inbound_listener]
    try:
        # n0 dials n1 (us): the preface with n0 as the client, then n0's HELLO, the only one on it.
        inbound_listener.settimeout(READ_TIMEOUT_SECONDS)
        inbound, _ = inbound_listener.accept()
        sockets.append(inbound)
        inbound.settimeout(READ_TIMEOUT_SECONDS)
        _server_preface(inbound)
        body = _expect(inbound, HELLO)
        client = node.ready["listen"].encode()
        assert body == (bytes([2, 1]) + b"g" + b"\x02n0" + b"\x02n1" + bytes([len(client)]) + client
                        + struct.pack(">qq", 0, DATA_FILE_SIZE))  # fmt: skip

        # We dial n0: preface, HELLO, then frames without waiting; n0 answers on its own connection.
        out = socket.create_connection((LOOPBACK, n0_port), timeout=READ_TIMEOUT_SECONDS)
        sockets.append(out)
        _client_preface(out)
        out.sendall(_hello("n1", "n0", data_file_size=DATA_FILE_SIZE) + _frame(HEARTBEAT_KIND, HEARTBEAT.pack(1, -1)))
        assert HEARTBEAT_RESPONSE.unpack(_expect(inbound, HEARTBEAT_RESPONSE_KIND)) == (1, SUCCESS)

        def answer(frame: bytes) -> tuple:
            out.sendall(frame)
            return PUSH_RESPONSE.unpack(_expect(inbound, PUSH_RESPONSE_KIND))

        # APPEND of entry 0 (pos 0) to an empty log: begin 0, end 0, ack 0.
        assert answer(_append(1, 0, -1, -1, [(1, 0)])) == (1, APPEND_TYPE, SUCCESS, 0, 0, 0, 0, -1)
        # Past its end + 1: OUT_OF_ORDER once per end index (the repeat gets no answer: the next
        # answer is the COMPARE's).
        assert answer(_append(1, 2, 1, -1, [(1, 96)])) == (1, APPEND_TYPE, OUT_OF_ORDER, 2, -1, 0, 0, -1)
        out.sendall(_append(1, 2, 1, -1, [(1, 96)]))
        assert answer(_push(COMPARE, 1, 0, -1, [(0, 1)])) == (1, COMPARE, SUCCESS, 0, 0, 0, 0, -1)
        assert answer(_push(COMPARE, 1, 1, -1, [(1, 1)])) == (1, COMPARE, MISMATCH, 1, -1, 0, 0, -1)  # no entry 1
        # A wrong previous term, then a wrong pos (entry 1 lies at 48): INCONSISTENT_STATE, nothing written.
        assert answer(_append(1, 1, 0, -1, [(1, 48)])) == (1, APPEND_TYPE, INCONSISTENT_STATE, 1, -1, 0, 0, -1)
        assert answer(_append(1, 1, 1, -1, [(1, 96)])) == (1, APPEND_TYPE, INCONSISTENT_STATE, 1, -1, 0, 0, -1)
        assert answer(_append(1, 1, 1, 0, [(1, 48)])) == (1, APPEND_TYPE, SUCCESS, 1, 1, 0, 1, -1)
        # TRUNCATE keeping 1, its last (nothing to drop): SUCCESS acknowledging 1; one whose entry
        # at the index is not n0's: INCONSISTENT_STATE.
        assert answer(_push(TRUNCATE, 1, 1, 0, [(1, 1)])) == (1, TRUNCATE, SUCCESS, 1, 1, 0, 1, -1)
        assert answer(_push(TRUNCATE, 1, 1, 0, [(1, 0)])) == (1, TRUNCATE, INCONSISTENT_STATE, 1, -1, 0, 1, -1)

        # HEARTBEAT of 24 bytes commits 1; one whose commit index passes n0's end gets an
        # OUT_OF_ORDER (type 3, request -1) before its HEARTBEAT_RESPONSE.
        out.sendall(_frame(HEARTBEAT_KIND, HEARTBEAT.pack(1, 1) + struct.pack(">q", 0)))
        assert HEARTBEAT_RESPONSE.unpack(_expect(inbound, HEARTBEAT_RESPONSE_KIND)) == (1, SUCCESS)
        out.sendall(_frame(HEARTBEAT_KIND, HEARTBEAT.pack(1, 5)))
        assert PUSH_RESPONSE.unpack(_expect(inbound, PUSH_RESPONSE_KIND)) == (1, APPEND_TYPE, OUT_OF_ORDER, -1, -1, 0, 1, -1)
        assert HEARTBEAT_RESPONSE.unpack(_expect(inbound, HEARTBEAT_RESPONSE_KIND)) == (1, SUCCESS)

        # A stale term: EXPIRED_TERM with n0's term, for a HEARTBEAT and a push alike.
        out.sendall(_frame(HEARTBEAT_KIND, HEARTBEAT.pack(0, -1)))
        assert HEARTBEAT_RESPONSE.unpack(_expect(inbound, HEARTBEAT_RESPONSE_KIND)) == (1, EXPIRED_TERM)
        assert answer(_append(0, 2, 1, -1, [(1, 96)])) == (1, APPEND_TYPE, EXPIRED_TERM, 2, -1, 0, 1, -1)

        def vote(term: int, end_index: int, end_term: int, flags: int) -> tuple:
            out.sendall(_frame(VOTE_REQUEST_KIND, VOTE_REQUEST.pack(term, end_index, end_term, flags)))
            return VOTE_RESPONSE.unpack(_expect(inbound, VOTE_RESPONSE_KIND))

        # The vote checks in their order: a stale log is refused 3 before the lease is looked at,
        # with n0's term (1), not the one asked for; a current log in a new term meets the lease
        # (9); the transfer bit skips the lease: a pre-vote ACCEPT carries the term asked for.
        assert vote(3, 0, 0, 0) == (1, 3, 0)
        assert vote(2, 1, 1, 1) == (1, 9, 1)
        assert vote(2, 1, 1, 1 | 2) == (2, 0, 1)
        with hc.BlockingClient(node.ready["listen"]) as status_client:
            status = status_client.status()
        assert (status["term"], status["leader_id"], status["committed_index"]) == (1, "n1", 1)

        # A HELLO with another data-file size is refused (closed), and so is a frame whose length
        # is over 16 MiB, as soon as its 5 bytes of length and kind are in (no body sent).
        other = socket.create_connection((LOOPBACK, n0_port), timeout=READ_TIMEOUT_SECONDS)
        sockets.append(other)
        _client_preface(other)
        other.sendall(_hello("n1", "n0", data_file_size=2 * DATA_FILE_SIZE))
        assert _closed(other)
        big = socket.create_connection((LOOPBACK, n0_port), timeout=READ_TIMEOUT_SECONDS)
        sockets.append(big)
        _client_preface(big)
        big.sendall(_hello("n2", "n0", data_file_size=DATA_FILE_SIZE) + FRAME.pack(16 * 1024 * 1024 + 1, HEARTBEAT_KIND))
        assert _closed(big)
        assert "n1's data files are 2097152 bytes, this member's 1048576" in node.log()
        # Our own connection was not replaced by the refused one: n0 still answers on it.
        out.sendall(_frame(HEARTBEAT_KIND, HEARTBEAT.pack(1, 1)))
        assert HEARTBEAT_RESPONSE.unpack(_expect(inbound, HEARTBEAT_RESPONSE_KIND)) == (1, SUCCESS)
    finally:
        for sock in sockets:
            sock.close()
        node.stop()
