"""DLedger groups of real ``hasvc node`` processes on loopback, for the system tests
(test_dledger_system and the tests beside it): a member's status, the one leader, numbered
messages sent and read back, and the retention group (small data files, short reserve time)
with one member taken down once every member has every entry."""

from __future__ import annotations

import trio

from hasvc import client as hc
from hasvc.tools.drill_dledger import ETCD_LIKE_SETTINGS, Node
from hasvc.tools.partition import LOOPBACK, free_port
from tests.cluster import wait_until


def member_status(node: Node) -> dict:
    with hc.BlockingClient(node.client_address) as client:
        return client.status()


def sole_leader(nodes: dict[str, Node]) -> str:
    found = []

    def one() -> bool:
        found[:] = [m for m, n in nodes.items() if n.alive and member_status(n)["role"] == "SYNC_MASTER"]
        return len(found) == 1

    wait_until(one, timeout=60, message="one member playing SYNC_MASTER")
    return found[0]


async def send_numbered(addresses: list[str], count: int, tag: str) -> dict[int, int]:
    """``count`` numbered messages through the failover client; number -> acknowledged offset."""
    acked: dict[int, int] = {}
    async with hc.connect_cluster(addresses, retry_sends=True) as client:
        for number in range(count):
            result = await client.send("DL", f"{tag}{number}".encode(), queue_id=number % 4)
            assert result.status == "PUT_OK", result
            acked[number] = result.offset
    return acked


def read_back(node: Node, acked: dict[int, int], tag: str) -> None:
    async def check() -> None:
        async with hc.connect(node.client_address) as client:
            for number, offset in acked.items():
                record = await client.read_record(offset)
                assert bytes(record.body) == f"{tag}{number}".encode(), (number, offset)

    trio.run(check)


RETENTION_SEGMENT_SIZE = 16384
RETENTION_SETTINGS = (f"commitlog_segment_size={RETENTION_SEGMENT_SIZE}", "file_reserved_time_hours=0.0001",  # 0.36 s
                      "dledger_clean_interval_seconds=0.3")  # fmt: skip


def start_retention_group(tmp_path, extra_settings: tuple[str, ...] = ()) -> dict[str, Node]:
    members = ["n0", "n1", "n2"]
    raft_ports = {member: free_port() for member in members}
    peers = ";".join(f"{member}-{LOOPBACK}:{port}" for member, port in raft_ports.items())
    nodes = {}
    for member in members:
        args = ["--store", str(tmp_path / member), "--listen", f"{LOOPBACK}:{free_port()}", "--group", "sys",
                "--peers", peers, "--self", member, "--set", "disk_max_used_space_ratio=1.0"]  # not the CI disk's fill  # fmt: skip
        for setting in (*ETCD_LIKE_SETTINGS, *RETENTION_SETTINGS, *extra_settings):
            args += ["--set", setting]
        nodes[member] = Node(str(tmp_path), member, args)
        nodes[member].start()
    return nodes


def passes_after(node: Node, count: int) -> None:
    start = member_status(node)["retention_passes"]
    wait_until(lambda: member_status(node)["retention_passes"] >= start + count, message=f"{count} retention passes")


def all_caught_up(nodes: dict[str, Node], leader: str) -> bool:
    status = member_status(nodes[leader])
    end = status["ledger_end_index"]
    return (all(member_status(n)["committed_index"] >= end and member_status(n)["dispatched_index"] >= end for n in nodes.values())
            and not any(p["behind_log_start"] for p in status["peers"].values()))  # fmt: skip


def one_member_down(nodes: dict[str, Node]) -> tuple[list[str], str, str, int]:
    """(the client addresses, the leader, the member taken down, its last entry's index): 200
    messages tagged "a" sent and held by every member, then a follower SIGKILLed."""
    addresses = [node.client_address for node in nodes.values()]
    trio.run(send_numbered, addresses, 200, "a")
    leader = sole_leader(nodes)
    wait_until(lambda: all_caught_up(nodes, leader), message="every member has every entry")
    down = next(m for m in nodes if m != leader)
    down_end = member_status(nodes[down])["ledger_end_index"]
    nodes[down].kill()
    return addresses, leader, down, down_end
