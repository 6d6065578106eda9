"""Commands that take the whole cluster (``--endpoints A,B,C`` or a comma list as the address),
against a real classic pair and a real 3-member DLedger group: they find the master or leader
themselves, also after a failover nobody told them about; ``hasvc status A,B,C`` is one table."""

from __future__ import annotations

import json
import subprocess
import sys

from hasvc import client as hc
from tests.cluster import slave_acking, start_dledger_group, wait_until


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hasvc.cli", *args], capture_output=True, text=True, timeout=120)


def _ok(*args: str) -> str:
    done = _cli(*args)
    assert done.returncode == 0, f"hasvc {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


def _status(address: str) -> dict:
    with hc.BlockingClient(address) as client:
        return client.status()


def _table(text: str) -> dict[str, str]:
    """The status table's rows by member address (the header dropped)."""
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["MEMBER", "ROLE", "EPOCH/TERM"], text
    return {line.split()[0]: line for line in lines[1:]}  # a DLedger member's address is followed by its id


def test_a_classic_pair_taken_whole_before_and_after_a_failover(cluster):
    master = cluster.start_master()
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="the slave's first report")
    both = f"{slave.address},{master.address}"  # the slave first: the commands must find the master
    sent = json.loads(_ok("send", "--endpoints", both, "--topic", "T", "one", "--json"))
    assert sent["status"] == "PUT_OK"
    rows = _table(_ok("status", both))
    assert "SYNC_MASTER" in rows[master.address] and " up" in rows[master.address]
    assert "SLAVE" in rows[slave.address] and "replicating" in rows[slave.address]
    listed = json.loads(_ok("status", "--endpoints", both, "--json"))
    assert [item["address"] for item in listed] == [slave.address, master.address] and all(item["up"] for item in listed)
    assert "one" in _ok("read", both, "--topic", "T")

    master.kill()  # the master is lost; nobody says where the new one will be
    promoted = _ok("promote", "--endpoints", both, "--role", "async")  # the only slave that answers; alone, ASYNC
    assert slave.address in promoted and "ASYNC_MASTER" in promoted
    after = json.loads(_ok("send", both, "--topic", "T", "two", "--json"))
    assert after["status"] == "PUT_OK" and after["offset"] > sent["offset"]
    rows = _table(_ok("status", both))
    assert "down" in rows[master.address] and "ASYNC_MASTER" in rows[slave.address]
    assert [line.split()[-1] for line in _ok("read", "--endpoints", both, "--topic", "T").splitlines()] == ["one", "two"]


def test_a_dledger_group_taken_whole_before_and_after_the_leader_dies(tmp_path):
    nodes = start_dledger_group(tmp_path, 3, group="cmd")
    try:
        for node in nodes.values():
            assert {"pid", "store", "role"} <= set(node.ready), node.ready  # the READY line, as a master's
            assert node.ready["pid"] == node.pid and node.ready["store"] == node.store
        everyone = ",".join(node.client_address for node in nodes.values())
        sent = json.loads(_ok("send", "--endpoints", everyone, "--topic", "D", "one", "--json"))
        assert sent["status"] == "PUT_OK"
        leader = next(m for m, n in nodes.items() if _status(n.client_address)["raft_role"] == "LEADER")
        rows = _table(_ok("status", everyone))
        assert sum("LEADER" in row for row in rows.values()) == 1 and "LEADER" in rows[nodes[leader].client_address]
        assert all(" up" in row for row in rows.values())
        assert all(f"({member})" in rows[node.client_address] for member, node in nodes.items())
        # to the member that leads: nothing to do, exit 0
        same = _cli("transfer-leader", everyone, "--to", leader)
        assert same.returncode == 0 and "nothing to do" in same.stdout, same.stdout + same.stderr

        nodes[leader].kill()
        after = json.loads(_ok("send", "--endpoints", everyone, "--topic", "D", "two", "--json"))
        assert after["status"] == "PUT_OK" and after["offset"] > sent["offset"]
        rows = _table(_ok("status", everyone))
        assert "down" in rows[nodes[leader].client_address]
        new_leader = next(m for m, n in nodes.items() if m != leader and _status(n.client_address)["raft_role"] == "LEADER")
        shown = _ok("status", nodes[new_leader].client_address)  # the leader's text STATUS: the dead peer is down
        assert f"peer         {leader} DOWN" in shown, shown
        assert [line.split()[-1] for line in _ok("read", everyone, "--topic", "D").splitlines()] == ["one", "two"]
        # transfer-leader given only a follower's address finds the leader itself
        follower = next(m for m in nodes if m not in (leader, new_leader))
        moved = json.loads(_ok("transfer-leader", nodes[follower].client_address, "--to", follower, "--json"))
        assert moved["status"] == "OK" and moved["leader_id"] == follower, moved
    finally:
        for node in nodes.values():
            node.kill()


def test_demote_given_the_cluster_puts_every_older_master_under_the_newest(cluster):
    master = cluster.start_master(role="async")
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="the slave's first report")
    _ok("send", master.address, "--topic", "T", "one")
    wait_until(lambda: _status(slave.address)["max_offset"] == _status(master.address)["max_offset"], message="the slave caught up")
    _ok("promote", slave.address, "--role", "async")  # by hand, the master still running: two masters
    both = f"{master.address},{slave.address}"
    demoted = _ok("demote", "--endpoints", both)
    assert f"{master.address}: SLAVE of {_status(slave.address)['ha_listen']}" in demoted, demoted
    assert _status(master.address)["role"] == "SLAVE" and _status(slave.address)["role"] == "ASYNC_MASTER"
    assert "nothing to demote" in _ok("demote", "--endpoints", both)
