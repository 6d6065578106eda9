"""Well-formed peers that behave badly, against real processes on loopback: a client that sends
READs and never reads the answers, idle and stalled connections held on the Raft and HA ports
while members restart and slaves attach, a flood of connections. Each asserts what a user sees:
the broker's memory stays bounded (VmRSS from /proc), legitimate clients and peers are served
meanwhile. No timings are asserted; waits are bounded by the harness."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import struct
import threading
import time

import trio

from hasvc import client as hc
from hasvc.protocol import client as cp
from hasvc.protocol import wire
from hasvc.tools.partition import LOOPBACK
from tests.cluster import Cluster, send_many, start_dledger_group, status, wait_until

RSS_BOUND_BYTES = 512 * 1024 * 1024  # the master's memory during the READ flood (it reached 11.8 GB)
READ_FLOOD = 1000  # READ frames of 4 MiB each one connection sends and never reads the answers of
READ_SIZE = 4 * 1024 * 1024
READ_REQUEST = struct.Struct(">IBIqI")  # length, kind, request id, offset, size max


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as file:
        for line in file:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "closed during the preface"
        data += chunk
    return data


def preface(sock: socket.socket, port_kind: int) -> None:
    """The connection preface of a port without a secret (docs/PROTOCOL.md §1)."""
    _version, kind, auth_required, nonce = wire.decode_hello(_receive(sock, wire.HELLO.size))
    assert kind == port_kind and not auth_required
    sock.sendall(wire.encode_auth(secret=None, server_nonce=nonce, client_nonce=wire.new_nonce()))
    assert wire.AUTH_OK.unpack(_receive(sock, wire.AUTH_OK.size))[0] == wire.AUTH_STATUS_OK


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def read_flooder(address: str) -> socket.socket:
    """A client that sends READ_FLOOD READs of 4 MiB from offset 0 and never reads an answer."""
    sock = socket.create_connection(_host_port(address), timeout=10)
    preface(sock, wire.PORT_KIND_CLIENT)
    sock.sendall(b"".join(READ_REQUEST.pack(17, cp.READ, i, 0, READ_SIZE) for i in range(READ_FLOOD)))  # 17 KB
    return sock


class RssWatch:
    """The largest VmRSS of ``pid`` seen while it runs (sampled every 50 ms in a thread)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.largest, self._stop = pid, rss_bytes(pid), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.largest = max(self.largest, rss_bytes(self.pid))

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


def _send_one(address: str) -> str:
    async def send() -> str:
        async with hc.connect(address) as client:
            return (await client.send("Legit", b"served meanwhile")).status

    return trio.run(send)


def test_a_client_that_never_reads_its_answers_is_muted_and_the_master_stays_small(tmp_path) -> None:
    cluster = Cluster(tmp_path, segment_size=8 * 1024 * 1024)  # a READ's answer is 4 MiB whole
    try:
        master = cluster.start_master(role="async")
        trio.run(functools.partial(send_many, master.address, 1300, 32, size=4000))  # 5 MiB of log to read
        before = rss_bytes(master.pid)
        with RssWatch(master.pid) as watch, contextlib.closing(read_flooder(master.address)):
            shown = wait_until(lambda: (s := status(master))["client_connections_muted"] == 1 and s, message="the flooder muted")
            assert shown["client_bytes_queued"] <= 16 * 1024 * 1024 + 2 * READ_SIZE  # its budget and the answer that passed it
            assert _send_one(master.address) == "PUT_OK"  # a legitimate client is served meanwhile
            time.sleep(1.0)  # the flood goes on: the master's memory stays where the budget holds it
            during = watch.largest
        print(f"master VmRSS: {before / 2**20:.0f} MiB before, at most {during / 2**20:.0f} MiB during the READ flood")
        assert during < RSS_BOUND_BYTES
        # The flooder gone, what it left queued leaves the process's total.
        wait_until(lambda: (s := status(master))["client_bytes_queued"] == 0 and s["client_connections_muted"] == 0,
                   message="the flooder's answers released")  # fmt: skip
    finally:
        cluster.close()


def test_the_process_budget_refuses_reads_and_a_muted_client_is_closed(tmp_path) -> None:
    cluster = Cluster(tmp_path, segment_size=8 * 1024 * 1024)
    try:
        master = cluster.start_master(role="async", client_answer_bytes_max=8 * 1024 * 1024,
                                      client_answer_bytes_total_max=6 * 1024 * 1024, client_muted_timeout_seconds=1.5)  # fmt: skip
        trio.run(functools.partial(send_many, master.address, 1300, 32, size=4000))
        with contextlib.closing(read_flooder(master.address)), contextlib.closing(read_flooder(master.address)):
            # One flooder's answers spend the process's budget: the other's READs are refused
            # (retryable) instead of read; the muted one is closed after its timeout.
            wait_until(lambda: status(master)["client_answers_refused"] > 0, message="READs refused on the process budget")
            wait_until(lambda: status(master)["client_connections_closed_muted"] >= 1, message="a muted flooder closed")
            assert _send_one(master.address) == "PUT_OK"
    finally:
        cluster.close()
