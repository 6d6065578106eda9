"""A DLedger leader whose disk is full hands leadership to a member that has room, which keeps it:
real ``hasvc node`` processes on loopback. Two members refuse puts DISK_FULL from the start (their
``disk_max_used_space_ratio`` is below what the disk holds); one of them leads; the third, with
room, joins and is handed leadership, and the group takes writes again."""

from __future__ import annotations

import trio

from hasvc import client as hc
from hasvc.tools.drill_dledger import ETCD_LIKE_SETTINGS, Node
from hasvc.tools.partition import LOOPBACK, free_port
from tests.cluster import wait_until
from tests.system.dledger_nodes import member_status, send_numbered, sole_leader

FULL = "disk_max_used_space_ratio=0.001"  # above it whatever the test machine's disk holds: puts answer DISK_FULL


async def _put_status(address: str) -> str:
    async with hc.connect(address) as client:
        return (await client.send("DL", b"x", queue_id=0)).status


def test_a_full_leader_hands_over_to_the_member_with_room(tmp_path) -> None:
    members = ["n0", "n1", "n2"]
    peers = ";".join(f"{member}-{LOOPBACK}:{free_port()}" for member in members)
    nodes = {}
    for member in members:
        args = ["--store", str(tmp_path / member), "--listen", f"{LOOPBACK}:{free_port()}", "--group", "room",
                "--peers", peers, "--self", member, "--set", FULL if member != "n2" else "disk_max_used_space_ratio=1.0"]  # fmt: skip
        for setting in ETCD_LIKE_SETTINGS:
            args += ["--set", setting]
        nodes[member] = Node(str(tmp_path), member, args)
    try:
        nodes["n0"].start()
        nodes["n1"].start()
        full_leader = sole_leader({m: nodes[m] for m in ("n0", "n1")})
        assert trio.run(_put_status, nodes[full_leader].client_address) == "DISK_FULL"
        nodes["n2"].start()
        wait_until(lambda: member_status(nodes["n2"])["role"] == "SYNC_MASTER", timeout=60,
                   message="the member with room was handed leadership")  # fmt: skip
        term = member_status(nodes["n2"])["term"]
        acked = trio.run(send_numbered, [node.client_address for node in nodes.values()], 20, "r")
        assert len(acked) == 20
        assert sole_leader(nodes) == "n2" and member_status(nodes["n2"])["term"] == term  # it kept it: no hand-back
        with open(nodes[full_leader].log_path) as log:
            assert "Traceback" not in log.read()
    finally:
        for node in nodes.values():
            node.kill()
