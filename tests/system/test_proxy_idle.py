"""A connection that finishes its HTTP/2 handshake and then makes no call is closed by the proxy
after ``connection_idle_seconds`` (grpc's ``grpc.max_connection_idle_ms``, a proxy setting): a
real proxy process, a raw socket speaking just enough HTTP/2. The handshake timeout's own test is
in test_hostile_clients.py. No timings are asserted; the wait is bounded by the socket timeout."""

from __future__ import annotations

import os
import socket
import struct
import sys

import pytest

from tests.cluster import BrokerProcess, Cluster

pytest.importorskip("hasvc.proxy.pb")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = struct.Struct(">3sBBI")  # length (24 bits), type, flags, stream id (RFC 9113 §4.1)
assert FRAME_HEADER.size == 9
SETTINGS, PING, GOAWAY = 0x4, 0x6, 0x7
ACK = 0x1
IDLE_SECONDS = 1  # the proxy's connection_idle_seconds here (300 by default)
WAIT_SECONDS = 60  # what the socket waits for the proxy to close it


def frame(kind: int, flags: int, payload: bytes = b"") -> bytes:
    return FRAME_HEADER.pack(len(payload).to_bytes(3, "big"), kind, flags, 0) + payload


def frames_until_closed(sock: socket.socket) -> list[int]:
    """The types of the frames the proxy sends until it closes the connection (settings acknowledged)."""
    data, kinds = b"", []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return kinds
        data += chunk
        while len(data) >= FRAME_HEADER.size:
            length, kind, flags, _ = FRAME_HEADER.unpack_from(data)
            size = FRAME_HEADER.size + int.from_bytes(length, "big")
            if len(data) < size:
                break
            kinds.append(kind)
            if kind == SETTINGS and not flags & ACK:
                sock.sendall(frame(SETTINGS, ACK))
            data = data[size:]


def test_a_connection_with_no_call_is_closed_after_connection_idle_seconds(tmp_path) -> None:
    cluster = Cluster(tmp_path)
    try:
        master = cluster.start_master(role="async")
        command = [sys.executable, "-m", "hasvc.cli", "proxy", "--listen", "127.0.0.1:0", "--brokers", master.address,
                   "--set", f"connection_idle_seconds={IDLE_SECONDS}"]  # fmt: skip
        proxy = BrokerProcess("proxy", command, os.path.join(cluster.root, "proxy.log"))
        cluster.brokers.append(proxy)
        host, port = proxy.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=WAIT_SECONDS) as sock:
            sock.sendall(PREFACE + frame(SETTINGS, 0))  # a finished handshake, then nothing
            kinds = frames_until_closed(sock)  # socket.timeout here: the proxy kept it open
        assert SETTINGS in kinds and GOAWAY in kinds, kinds
        assert proxy.alive
    finally:
        cluster.close()
