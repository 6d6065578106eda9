"""Retention above the disk's clean ratio (every pass forced here: disk_clean_ratio=0.01) never
deletes what a member that is down still needs: the members that run keep from its last known
match index, and it comes back to be caught up by APPEND, not RESET. Real ``hasvc node``
processes on loopback."""

from __future__ import annotations

import trio

from tests.cluster import wait_until
from tests.system.dledger_nodes import (RETENTION_SEGMENT_SIZE, all_caught_up, member_status, one_member_down, passes_after,
                                        read_back, send_numbered, sole_leader, start_retention_group)  # fmt: skip


def test_a_forced_clean_keeps_what_a_member_that_is_down_needs(tmp_path) -> None:
    nodes = start_retention_group(tmp_path, ("disk_clean_ratio=0.01",))
    try:
        addresses, leader, down, down_end = one_member_down(nodes)
        second = trio.run(send_numbered, addresses, 400, "b")  # about 4 data files more
        for member in nodes:
            if member != down:
                passes_after(nodes[member], 3)
                status = member_status(nodes[member])
                assert status["ledger_begin_index"] <= down_end + 1, (member, status, down_end)
        nodes[down].start()
        leader = sole_leader(nodes)
        wait_until(lambda: all_caught_up(nodes, leader), timeout=60, message="the member that was down caught up")
        with open(nodes[down].log_path) as log:
            assert "reset by the leader" not in log.read()
        last_file = max(second.values()) // RETENTION_SEGMENT_SIZE  # forced cleans go on: the newest file stays
        read_back(nodes[down], {n: o for n, o in second.items() if o // RETENTION_SEGMENT_SIZE == last_file}, "b")
    finally:
        for node in nodes.values():
            node.kill()
