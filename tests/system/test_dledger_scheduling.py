"""A DLedger member's scheduling policy follows its role (``raft_follower_batch_scheduling``,
``hasvc.broker.raft.scheduling``): real ``hasvc node`` processes, their threads' policies read
from the kernel, through a leadership transfer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import trio

from hasvc.broker.raft import scheduling
from tests.cluster import start_dledger_group, wait_until
from tests.system.dledger_nodes import send_numbered, sole_leader

pytestmark = pytest.mark.skipif(not scheduling.SUPPORTED, reason="Linux scheduling policies")

NAMES = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_BATCH: "SCHED_BATCH"} if scheduling.SUPPORTED else {}


def policies(node) -> set[str]:
    """The policies the member's threads run under."""
    found = set()
    pid = node.process.pid
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            found.add(NAMES.get(os.sched_getscheduler(int(name)), "other"))
        except ProcessLookupError:
            continue
    return found


def test_followers_run_batch_and_the_leader_does_not_and_they_swap_on_a_transfer(tmp_path) -> None:
    nodes = start_dledger_group(tmp_path, 3, group="sched")
    try:
        addresses = [node.client_address for node in nodes.values()]
        trio.run(send_numbered, addresses, 10, "s")  # commits reach every member
        leader = sole_leader(nodes)
        followers = [member for member in nodes if member != leader]
        assert policies(nodes[leader]) == {"SCHED_OTHER"}
        for member in followers:
            wait_until(lambda member=member: policies(nodes[member]) == {"SCHED_BATCH"}, message=f"{member} runs SCHED_BATCH")
        target = followers[0]
        done = subprocess.run([sys.executable, "-m", "hasvc.cli", "transfer-leader", nodes[leader].client_address, "--to",
                               target, "--json"], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0 and json.loads(done.stdout)["leader_id"] == target, done.stdout + done.stderr
        wait_until(lambda: policies(nodes[target]) == {"SCHED_OTHER"}, message="the new leader runs SCHED_OTHER")
        trio.run(send_numbered, addresses, 5, "t")
        wait_until(lambda: policies(nodes[leader]) == {"SCHED_BATCH"}, message="the old leader, following, runs SCHED_BATCH")
    finally:
        for node in nodes.values():
            node.kill()


def test_switched_off_every_member_keeps_the_policy_it_started_with(tmp_path) -> None:
    nodes = start_dledger_group(tmp_path, 3, group="sched", extra_args=("--set", "raft_follower_batch_scheduling=false"))
    try:
        trio.run(send_numbered, [node.client_address for node in nodes.values()], 10, "s")
        sole_leader(nodes)
        for node in nodes.values():
            assert policies(node) == {"SCHED_OTHER"}
    finally:
        for node in nodes.values():
            node.kill()
