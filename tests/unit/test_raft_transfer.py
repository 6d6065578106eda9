"""Leadership transfer (DLedger LEADERSHIP_TRANSFER, preferred leader): to a caught-up follower
only, refused with a reason otherwise; proposals wait meanwhile (DLedger LeaderElectorTest)."""

import dataclasses

from hasvc.state.raft import ETCD_LIKE, ProposalStatus, RefusalStatus, Refused, Role, TransferAborted
from hasvc.testing.network import NetworkConfig
from hasvc.testing.raft_cluster import SimCluster

MEMBERS = ("n0", "n1", "n2")
QUIET = NetworkConfig(delay_min_seconds=0.001, delay_max_seconds=0.005, fifo=True)  # as over TCP


def test_leadership_moves_to_a_caught_up_follower_at_once():
    cluster = SimCluster(seed=21, config=ETCD_LIKE, network=QUIET)
    old = cluster.run_until_leader(timeout=10)
    assert cluster.propose_and_wait(old, [b"a"], timeout=2) is ProposalStatus.SUCCESS
    target = next(m for m in MEMBERS if m != old)
    term = cluster.node(old).term
    assert cluster.transfer_leadership(old, target) is None
    refused = cluster.propose(old, [b"during"])
    assert isinstance(refused, Refused) and refused.status is RefusalStatus.LEADER_TRANSFERRING
    started = cluster.now
    assert cluster.run_until_leader(timeout=5) == target
    assert cluster.now - started < ETCD_LIKE.election_timeout_min_seconds  # no election timeout waited
    assert cluster.node(target).term == term + 1
    assert cluster.node(old).role is Role.FOLLOWER and cluster.node(old).leader_id == target
    assert cluster.propose_and_wait(target, [b"b"], timeout=2) is ProposalStatus.SUCCESS


def test_transfer_refusals_say_why():
    config = dataclasses.replace(ETCD_LIKE, leadership_transfer_wait_index_max=10)
    cluster = SimCluster(seed=22, config=config, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    follower, other = [m for m in MEMBERS if m != leader]
    refused = cluster.transfer_leadership(follower, other)
    assert refused.status is RefusalStatus.NOT_LEADER and refused.leader_id == leader
    assert cluster.transfer_leadership(leader, "n7").status is RefusalStatus.UNKNOWN_MEMBER
    assert cluster.transfer_leadership(leader, leader).status is RefusalStatus.ALREADY_LEADER
    cluster.crash(follower)
    for i in range(11):
        assert cluster.propose_and_wait(leader, [b"%d" % i], timeout=2) is ProposalStatus.SUCCESS
    refused = cluster.transfer_leadership(leader, follower)
    assert refused.status is RefusalStatus.FOLLOWER_FALL_BEHIND_TOO_MUCH and "entries behind" in refused.reason
    assert cluster.transfer_leadership(leader, other) is None
    assert cluster.transfer_leadership(leader, other).status is RefusalStatus.TRANSFER_IN_PROGRESS


def test_a_transfer_to_a_member_that_dies_is_aborted_and_the_leader_serves_again():
    cluster = SimCluster(seed=23, config=ETCD_LIKE, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    target = next(m for m in MEMBERS if m != leader)
    cluster.network.partition([target])  # TimeoutNow never arrives
    assert cluster.transfer_leadership(leader, target) is None
    aborted = []
    node = cluster.node(leader)
    original_ready = node.ready

    def spy():
        ready = original_ready()
        aborted.extend(ready.transfers_aborted)
        return ready

    node.ready = spy
    cluster.run_until(cluster.now + ETCD_LIKE.election_timeout_min_seconds + 0.2)
    assert aborted == [TransferAborted(target)]
    assert cluster.leader() == leader
    assert cluster.propose_and_wait(leader, [b"again"], timeout=2) is ProposalStatus.SUCCESS


def test_the_preferred_leader_takes_leadership_back_after_a_restart():
    cluster = SimCluster(seed=24, config=ETCD_LIKE, network=QUIET)
    first = cluster.run_until_leader(timeout=10)
    preferred = next(m for m in MEMBERS if m != first)
    config = dataclasses.replace(ETCD_LIKE, preferred_leader_id=preferred)
    cluster = SimCluster(seed=24, config=config, network=QUIET)
    cluster.run_until(cluster.now + 5)
    assert cluster.leader() == preferred
    cluster.crash(preferred)
    other = cluster.run_until_leader(timeout=10)
    assert other != preferred
    cluster.start(preferred)
    cluster.run_until(cluster.now + 3)
    assert cluster.leader() == preferred
    assert cluster.propose_and_wait(preferred, [b"x"], timeout=2) is ProposalStatus.SUCCESS
