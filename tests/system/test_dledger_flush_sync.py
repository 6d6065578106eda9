"""A DLedger group with ``--flush sync`` (an entry counts toward the quorum once fsynced, etcd's
promise) of real ``hasvc node`` processes: puts one at a time (each member flushes in its loop and
a follower acknowledges before it applies the commit a push carried), then every member SIGKILLed
at once and restarted from its store: every acknowledged put is read back from every member. (A
SIGKILL keeps the page cache: that the acknowledgement follows a quorum's fsync is shown by the
core's and the driver's tests, tests/unit/test_raft_replication.py and
tests/driver/test_raft_follower_ack_order.py.)"""

from __future__ import annotations

import trio

from tests.cluster import start_dledger_group, wait_until
from tests.system.dledger_nodes import member_status, read_back, send_numbered, sole_leader

PUTS = 60


def test_a_flush_sync_group_killed_whole_after_its_acknowledgements_keeps_every_one(tmp_path) -> None:
    nodes = start_dledger_group(tmp_path, 3, group="fs", extra_args=("--flush", "sync"))
    try:
        addresses = [node.client_address for node in nodes.values()]
        acked = trio.run(send_numbered, addresses, PUTS, "f")
        for node in nodes.values():
            node.kill()
        for node in nodes.values():
            node.start()  # same store, same ports
        new_leader = sole_leader(nodes)
        end = member_status(nodes[new_leader])["ledger_end_index"]
        wait_until(lambda: all(member_status(n)["committed_index"] >= end for n in nodes.values()), message="everyone caught up")
        for node in nodes.values():
            read_back(node, acked, "f")
    finally:
        for node in nodes.values():
            node.kill()
