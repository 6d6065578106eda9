"""A member that accepts its Raft connection and never reads it: a 3-member group whose n2 is a
fake written from docs/PROTOCOL.md §1 and §4 (sockets, and test_raft_peer_from_doc's framing).
The leader's sender to it waits for a socket that takes nothing; after
``raft_send_stalled_timeout_seconds`` (short here) it closes that connection, counts it (STATUS
``raft_connections_closed_stalled``, ``peers.n2.closed_stalled``; the same in the metrics), logs
it, and dials n2 again, while the group commits with n0 and n1 and the leader's memory stays
bounded (51 -> 85 MiB VmRSS in a run: the 8 MiB of puts in its page cache and mappings).

What fills the fake's socket: a leader pushes APPENDs to a member it has heard nothing from
(optimistically, as to any follower), and, none being answered, pushes the unacknowledged window
again (up to ``push_in_flight_max`` entries, in pushes of ``push_batch_size_max``) after every
push timeout; so the puts go into a socket no one reads, far faster than heartbeats (~40 bytes
each) could fill it (~2.8 MB on loopback before a write waits). No forged answer is needed."""

from __future__ import annotations

import pathlib
import os
import socket
import threading
import urllib.request

import trio

from hasvc import client as hc
from hasvc.tools.drill_dledger import ETCD_LIKE_SETTINGS, Node
from hasvc.tools.partition import LOOPBACK, free_port
from tests.cluster import wait_until
from tests.system.test_raft_peer_from_doc import DATA_FILE_SIZE, HELLO, _read_frame, _server_preface

STALLED_TIMEOUT_SECONDS = 2.0  # raft_send_stalled_timeout_seconds, short for the test
MESSAGE_SIZE = 128 * 1024
MESSAGES = 64  # 8 MiB through the leader: far more than the fake's socket takes
RSS_GROWTH_MAX = 256 * 1024 * 1024  # the leader's VmRSS may not grow more than this during it
WAIT_SECONDS = 60.0  # a bound for a failing run, not a measurement


def _texts(body: bytes, start: int, count: int) -> list[str]:
    texts = []
    for _ in range(count):
        size = body[start]
        texts.append(body[start + 1 : start + 1 + size].decode())
        start += 1 + size
    return texts


class FakeMember:
    """n2: accepts the members' connections, takes the preface and the HELLO (§1, §4), and reads
    nothing more on any of them."""

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before listen: every accepted socket
        self.listener.bind((LOOPBACK, 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.silent: dict[str, int] = {}  # member -> its connections taken and left unread
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return  # closed at the end of the test
            self.sockets.append(sock)
            threading.Thread(target=self._handshake, args=(sock,), daemon=True).start()

    def _handshake(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(WAIT_SECONDS)
            _server_preface(sock)
            kind, body = _read_frame(sock)
        except (OSError, AssertionError):
            return  # a connection closed early: the member dials again
        assert kind == HELLO
        group, source, target = _texts(body, 1, 3)
        assert (group, target) == ("g", "n2")
        with self.lock:
            self.silent[source] = self.silent.get(source, 0) + 1
        # reads nothing more; the socket stays open until the test ends

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()


def _status(node: Node) -> dict:
    with hc.BlockingClient(node.client_address) as client:
        return client.status()


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as file:
        line = next(line for line in file if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def _send(addresses: list[str], count: int, tag: str) -> None:
    async with hc.connect_cluster(addresses, retry_sends=True) as client:
        for number in range(count):
            result = await client.send("ST", f"{tag}{number}:".encode() + os.urandom(MESSAGE_SIZE), queue_id=number % 4)
            assert result.status == "PUT_OK", result


def test_a_member_that_never_reads_is_closed_after_the_stall_timeout_and_the_group_commits_on(tmp_path) -> None:
    ports = {"n0": free_port(), "n1": free_port()}
    fake = FakeMember()
    peers = f"n0-{LOOPBACK}:{ports['n0']};n1-{LOOPBACK}:{ports['n1']};n2-{LOOPBACK}:{fake.port}"
    nodes = {}
    for member in ("n0", "n1"):
        args = ["--store", str(tmp_path / member), "--listen", f"{LOOPBACK}:0", "--group", "g", "--peers", peers,
                "--self", member, "--set", f"commitlog_segment_size={DATA_FILE_SIZE}",
                "--set", "disk_max_used_space_ratio=1.0", "--metrics-listen", f"{LOOPBACK}:0",
                "--set", f"raft_send_stalled_timeout_seconds={STALLED_TIMEOUT_SECONDS}"]  # fmt: skip
        for setting in ETCD_LIKE_SETTINGS:
            args += ["--set", setting]
        nodes[member] = Node(str(tmp_path), member, args)
    try:
        for node in nodes.values():
            node.start()

        def leader() -> str | None:
            leaders = [m for m, n in nodes.items() if _status(n)["raft_role"] == "LEADER"]
            return leaders[0] if len(leaders) == 1 else None

        member = wait_until(leader, timeout=WAIT_SECONDS, message="a leader")
        node = nodes[member]
        wait_until(lambda: fake.silent.get(member), timeout=WAIT_SECONDS, message="the leader's HELLO to the fake n2")
        rss_before = _rss(node.pid)
        addresses = [n.client_address for n in nodes.values()]
        trio.run(_send, addresses, MESSAGES, "a")  # the group commits with n0 and n1 meanwhile
        shown = _status(node)
        assert shown["raft_role"] == "LEADER", shown  # (a lost leadership would make the rest meaningless)
        assert shown["peers"]["n2"]["bytes_queued"] > 0 or shown["peers"]["n2"]["closed_stalled"] > 0, shown["peers"]

        wait_until(lambda: _status(node)["raft_connections_closed_stalled"] >= 1, timeout=WAIT_SECONDS,
                   message="the stalled connection to n2 closed")  # fmt: skip
        wait_until(lambda: fake.silent.get(member, 0) >= 2, timeout=WAIT_SECONDS, message="the leader dialling n2 again")
        shown = _status(node)
        assert shown["peers"]["n2"]["closed_stalled"] == shown["raft_connections_closed_stalled"] >= 1
        assert shown["peers"][[m for m in nodes if m != member][0]]["closed_stalled"] == 0  # the real follower reads

        trio.run(_send, addresses, 4, "b")  # still committing on n0 and n1
        ends = {m: _status(n)["committed_index"] for m, n in nodes.items()}
        wait_until(lambda: len({_status(n)["committed_index"] for n in nodes.values()}) == 1, timeout=WAIT_SECONDS,
                   message=f"n0 and n1 agreeing on the committed index ({ends})")  # fmt: skip
        rss_after = _rss(node.pid)
        assert rss_after - rss_before < RSS_GROWTH_MAX

        metrics = urllib.request.urlopen(f"http://{node.ready['metrics_listen']}/metrics", timeout=10).read().decode()
        closed = [line for line in metrics.splitlines() if line.startswith("hasvc_raft_connections_closed_stalled ")]
        assert closed and float(closed[0].split()[1]) >= 1, closed
        assert 'hasvc_peer_closed_stalled{peer="n2"}' in metrics
        log = pathlib.Path(node.log_path).read_text()
        assert "raft_send_stalled_timeout_seconds" in log and "closed" in log
    finally:
        for node in nodes.values():
            if node.alive:
                node.kill()
        fake.close()
