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
import sys
import threading
import time

import pytest
import trio

from hasvc import client as hc
from hasvc.protocol import client as cp
from hasvc.protocol import wire
from hasvc.tools.partition import LOOPBACK
from tests.cluster import BrokerProcess, Cluster, send_many, start_dledger_group, status, wait_until

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


def read_flooder(address: str, count: int = READ_FLOOD) -> socket.socket:
    """A client that sends ``count`` READs of 4 MiB from offset 0 and never reads an answer."""
    sock = socket.create_connection(_host_port(address), timeout=10)
    preface(sock, wire.PORT_KIND_CLIENT)
    sock.sendall(b"".join(READ_REQUEST.pack(17, cp.READ, i, 0, READ_SIZE) for i in range(count)))  # 17 KB
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
        # Muted by the last READ it sent, then silent: closed all the same (its reader never comes back for it).
        settled = wait_until(lambda: (s := status(master))["client_connections_muted"] == 0 and s["client_bytes_queued"] == 0 and s,
                             message="both flooders gone")  # fmt: skip
        closed = settled["client_connections_closed_muted"]
        with contextlib.closing(read_flooder(master.address, count=2)):  # the second answer passes 8 MiB
            wait_until(lambda: status(master)["client_connections_closed_muted"] > closed, message="the silent flooder closed")
    finally:
        cluster.close()


class Swarm:
    """Strangers held on ports, as an attacker keeps them: ``idle`` connections per port that
    send nothing, ``prefaced`` that finish the preface (no secret) and then say nothing, each
    reopened as soon as the port closes it; and, with ``flood``, connections opened and closed
    as fast as one thread can. Runs in a thread until closed; ``held()`` is how many are open."""

    def __init__(self, ports: list[int], port_kind: int, *, idle: int, prefaced: int, flood: bool) -> None:
        self.ports, self.port_kind, self.idle, self.prefaced, self.flood = ports, port_kind, idle, prefaced, flood
        self._sockets: dict[socket.socket, bool] = {}  # -> prefaced
        self._stop = threading.Event()
        self.opened = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Swarm:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self._sockets:
            sock.close()

    def held(self) -> int:
        return len(self._sockets)

    def _open(self, port: int, prefaced: bool) -> None:
        try:
            sock = socket.create_connection((LOOPBACK, port), timeout=2)
            if prefaced:
                preface(sock, self.port_kind)
        except (OSError, AssertionError):  # the member is down, or closed us during the preface
            return
        sock.setblocking(False)
        self._sockets[sock] = prefaced
        self.opened += 1

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for sock in list(self._sockets):  # drop what the ports closed (a greeting is read and ignored)
                try:
                    if sock.recv(4096):
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                del self._sockets[sock]
                sock.close()
            for port in self.ports:
                counts = [0, 0]
                for sock, prefaced in self._sockets.items():
                    if sock.getpeername()[1] == port:
                        counts[prefaced] += 1
                for _ in range(self.idle - counts[0]):
                    self._open(port, False)
                for _ in range(self.prefaced - counts[1]):
                    self._open(port, True)
                if self.flood:
                    for _ in range(20):
                        with contextlib.suppress(OSError):
                            socket.create_connection((LOOPBACK, port), timeout=2).close()


def _member_status(node, secret: bytes | None = None) -> dict:
    with hc.BlockingClient(node.client_address, secret) as client:
        return client.status()


def _group_caught_up(nodes: dict, secret: bytes | None = None) -> str | None:
    """The leader's id once every member follows it with its whole log matched, else None."""
    for member, node in nodes.items():
        shown = _member_status(node, secret)
        if shown["raft_role"] != "LEADER":
            continue
        end = shown["ledger_end_index"]
        if all(peer["connected"] and peer["match_index"] >= end for peer in shown["peers"].values()) and all(
            _member_status(other, secret)["raft_role"] == "FOLLOWER" for name, other in nodes.items() if name != member
        ):
            return member
    return None


async def _send_through_group(nodes: dict, count: int, secret: bytes | None = None) -> None:
    async with hc.connect_cluster([node.client_address for node in nodes.values()], secret, retry_sends=True) as client:
        for number in range(count):
            assert (await client.send("DL", b"m%d" % number)).status == "PUT_OK"


def test_a_leader_restarted_while_strangers_hold_every_raft_port_rejoins(tmp_path) -> None:
    nodes = start_dledger_group(tmp_path, 3, group="hostile")
    try:
        trio.run(_send_through_group, nodes, 20)
        leader = wait_until(lambda: _group_caught_up(nodes), message="a leader and two followers")
        ports = [int(node.ready["raft_listen"].rsplit(":", 1)[1]) for node in nodes.values()]
        # 300 strangers on each Raft port (250 idle, 50 past the preface without a HELLO: 64
        # finished prefaces used to lock a port for good), and a flood of connect/close.
        with Swarm(ports, wire.PORT_KIND_RAFT, idle=250, prefaced=50, flood=True) as swarm:
            wait_until(lambda: swarm.opened >= 900, message="the strangers connected")
            nodes[leader].kill()
            trio.run(_send_through_group, nodes, 10)  # the two others elect a leader, strangers or not
            restarted = time.monotonic()
            nodes[leader].start()  # same store, same ports: the strangers find it again
            wait_until(lambda: _group_caught_up(nodes), message="the restarted member following, caught up")
            print(f"restarted member rejoined and caught up {time.monotonic() - restarted:.2f} s after its start "
                  f"({swarm.opened} stranger connections opened so far)")  # fmt: skip
            shown = _member_status(nodes[leader])
            assert shown["raft_strangers_evicted"] + shown["raft_strangers_timed_out"] > 0  # the strangers were there
        trio.run(_send_through_group, nodes, 10)
    finally:
        for node in nodes.values():
            node.kill()


def test_with_a_secret_a_member_restarted_while_500_strangers_hold_every_raft_port_rejoins(tmp_path) -> None:
    """The issue's own scenario: with a secret, 500 idle connections held on each Raft port (none
    can finish the preface) and a member SIGKILLed and restarted: it rejoins, follows and catches up
    while they are held (they used to keep it a candidate for as long as the attack lasted)."""
    secret = b"raft-lockout-secret"
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(secret)
    nodes = start_dledger_group(tmp_path, 3, group="hostile-secret", extra_args=["--secret-file", str(secret_file)])
    try:
        trio.run(_send_through_group, nodes, 20, secret)
        leader = wait_until(lambda: _group_caught_up(nodes, secret), message="a leader and two followers")
        ports = [int(node.ready["raft_listen"].rsplit(":", 1)[1]) for node in nodes.values()]
        with Swarm(ports, wire.PORT_KIND_RAFT, idle=500, prefaced=0, flood=False) as swarm:
            wait_until(lambda: swarm.held() >= 1200, message="the strangers holding the Raft ports")
            nodes[leader].kill()
            trio.run(_send_through_group, nodes, 10, secret)
            restarted = time.monotonic()
            nodes[leader].start()
            wait_until(lambda: _group_caught_up(nodes, secret), message="the restarted member following, caught up")
            print(f"restarted member rejoined and caught up {time.monotonic() - restarted:.2f} s after its start, "
                  f"{swarm.held()} strangers held")  # fmt: skip
            shown = _member_status(nodes[leader], secret)
            assert shown["raft_strangers_evicted"] + shown["raft_strangers_timed_out"] > 0  # the strangers were there
        trio.run(_send_through_group, nodes, 10, secret)
    finally:
        for node in nodes.values():
            node.kill()


def test_a_slave_attaches_while_strangers_hold_the_ha_port(cluster) -> None:
    # connections_max caps the client port; it used to cap the HA port too, strangers included.
    master = cluster.start_master(role="sync", connections_max=200)
    ha_port = _host_port(master.ha_address)[1]
    with Swarm([ha_port], wire.PORT_KIND_HA, idle=250, prefaced=50, flood=True) as swarm:
        wait_until(lambda: swarm.opened >= 300, message="the strangers connected")
        slave = cluster.start_slave(master.ha_address)
        wait_until(lambda: status(master)["slaves"] and status(master)["slaves"][0]["ack_offset"] >= 0, message="the slave attached")
        assert _send_one(master.address) == "PUT_OK"  # SYNC_MASTER: stored on the slave too
        shown = status(master)
        assert shown["ha_connections_known"] == 1
        assert shown["ha_strangers_evicted"] + shown["ha_strangers_timed_out"] > 0
        wait_until(lambda: status(slave)["max_offset"] == shown["max_offset"], message="the slave caught up")


def _open_count(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` the peer has not closed (closed ones are dropped from the list)."""
    for sock in list(sockets):
        try:
            if sock.recv(4096):
                continue
        except BlockingIOError:
            continue
        except OSError:
            pass
        sockets.remove(sock)
        sock.close()
    return len(sockets)


def test_the_proxy_closes_connections_that_never_finish_their_handshake(cluster) -> None:
    pb = pytest.importorskip("hasvc.proxy.pb")
    import grpc

    master = cluster.start_master(role="async")
    command = [sys.executable, "-m", "hasvc.cli", "proxy", "--listen", "127.0.0.1:0", "--brokers", master.address]
    proxy = BrokerProcess("proxy", command, os.path.join(cluster.root, "proxy.log"))
    cluster.brokers.append(proxy)
    sockets = []
    for _ in range(300):  # one byte of an HTTP/2 preface each, then nothing (grpc core used to keep them 120 s)
        sock = socket.create_connection(_host_port(proxy.address), timeout=10)
        sock.sendall(b"P")
        sock.setblocking(False)
        sockets.append(sock)
    try:
        with grpc.insecure_channel(proxy.address) as channel:  # a legitimate client is served meanwhile
            route = pb.service_grpc.MessagingServiceStub(channel).QueryRoute(
                pb.service.QueryRouteRequest(topic=pb.definition.Resource(name="T")), metadata=(("x-mq-client-id", "hostile-test"),), timeout=10)
        assert route.status.code == pb.Code.OK
        wait_until(lambda: _open_count(sockets) == 0, interval=0.2, message="the proxy closed the stalled connections")
    finally:
        for sock in sockets:
            sock.close()


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as file:
        return next(int(line.split()[1]) for line in file if line.startswith("Threads:"))


def test_stalled_connections_on_the_metrics_port_hold_no_thread_each_and_a_scrape_is_served(cluster) -> None:
    import urllib.request

    from hasvc.tools.partition import free_port

    port = free_port()
    master = cluster.start_master(role="async", metrics_listen=f"{LOOPBACK}:{port}")
    before = _threads(master.pid)
    sockets = []
    try:
        for _ in range(200):  # a request begun and never finished (prometheus-client's server kept a thread each)
            sock = socket.create_connection((LOOPBACK, port), timeout=10)
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            sockets.append(sock)
        text = urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=10).read().decode()
        assert "hasvc_client_bytes_queued 0.0" in text and "hasvc_ha_connections_known 0.0" in text
        assert _threads(master.pid) <= before + 8 + 2  # METRICS_CONNECTIONS_MAX, and threads on their way out
    finally:
        for sock in sockets:
            sock.close()


def test_stalled_connections_on_the_client_port_do_not_keep_clients_out(cluster) -> None:
    master = cluster.start_master(role="async", connections_max=200)
    port = _host_port(master.address)[1]
    with Swarm([port], wire.PORT_KIND_CLIENT, idle=300, prefaced=0, flood=True) as swarm:
        wait_until(lambda: swarm.opened >= 300, message="the strangers connected")
        assert _send_one(master.address) == "PUT_OK"  # connections_max counts clients past the preface only
        shown = status(master)
        assert shown["client_connections_known"] == 1  # this STATUS request's
        assert shown["client_connections_strangers"] + shown["client_strangers_timed_out"] > 0
