"""Replication at the core level: quorum append, DLedger's COMPARE/TRUNCATE/APPEND, a follower far
behind, a divergent follower, the Raft commit rule, flush_sync acknowledgements, pending limits
(rocketmq-notes §8.6; DLedger AppendAndPushTest, BatchPushTest)."""

import dataclasses
import random

from hasvc.state.raft import (
    DLEDGER_DEFAULTS,
    ETCD_LIKE,
    Entry,
    HardState,
    ProposalStatus,
    RaftConfig,
    RaftNode,
    Ready,
    RefusalStatus,
    Refused,
    Role,
)
from hasvc.state.raft.messages import (
    Heartbeat,
    Push,
    PushResponse,
    PushResult,
    PushType,
    ResetPush,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from hasvc.state.raft.storage import LogReset
from hasvc.testing.log import SimLog
from hasvc.testing.network import NetworkConfig
from hasvc.testing.raft_cluster import SimCluster

MEMBERS = ("n0", "n1", "n2")
QUIET = NetworkConfig(delay_min_seconds=0.001, delay_max_seconds=0.005, fifo=True)  # as over TCP


def carry_out(node: RaftNode, log: SimLog) -> Ready:
    ready = node.ready()
    if ready.hard_state is not None:
        log.save_hard_state(ready.hard_state)
    if ready.reset is not None:
        log.reset(ready.reset)
    if ready.truncate_after is not None:
        log.truncate(after_index=ready.truncate_after)
    log.append(ready.entries)
    for run in ready.runs:
        log.append_run(run)
    return ready


def append(log: SimLog, term: int, index: int, prev_term: int, commit: int, entries) -> Push:
    """An APPEND from n0 to n1 carrying ``entries`` as stored bytes (positions as in ``log``)."""
    return Push("n0", "n1", term, PushType.APPEND, index, prev_term, commit, log.run_of(entries))


def make_node(terms, *, term, config=DLEDGER_DEFAULTS, self_id="n0"):
    log = SimLog()
    log.append([Entry(i, t, b"e%d" % i) for i, t in enumerate(terms)])
    log.flush()
    log.save_hard_state(HardState(term, None, -1))
    return RaftNode(self_id=self_id, members=MEMBERS, log=log, config=config, rng=random.Random(7), now=0.0), log


def elect(node: RaftNode, log: SimLog, now: float) -> Ready:
    """Make `node` leader: its timeout, a pre-vote and a vote granted by n1."""
    node.tick(now)
    carry_out(node, log)
    node.step(VoteResponse("n1", "n0", node.term + 1, VoteResult.ACCEPT, pre_vote=True), now)
    carry_out(node, log)
    node.step(VoteResponse("n1", "n0", node.term, VoteResult.ACCEPT), now)
    ready = carry_out(node, log)
    assert node.role is Role.LEADER
    return ready


def test_only_entries_of_the_current_term_commit_by_counting():
    # The leader's log holds an entry of an older term; a quorum having it does not commit it
    # (Raft §5.4.2, the "figure 8" case). The no-op of the new term commits it along.
    node, log = make_node([1, 2], term=2)
    ready = elect(node, log, now=10.0)
    assert node.term == 3 and [e.term for e in log.entries] == [1, 2, 3]  # the no-op
    compare = next(m for m in ready.messages if isinstance(m, Push) and m.target == "n1")
    assert (compare.type, compare.index) == (PushType.COMPARE, 1)  # DLedger: from the leader's old end
    node.step(PushResponse("n1", "n0", 3, PushType.COMPARE, PushResult.SUCCESS, 1, 1, 0, 1), 10.1)
    ready = carry_out(node, log)
    assert node.committed_index == -1  # index 1 is on a quorum but of term 2
    append = next(m for m in ready.messages if isinstance(m, Push) and m.target == "n1")
    assert (append.type, append.index, append.prev_term) == (PushType.APPEND, 2, 2)
    node.step(PushResponse("n1", "n0", 3, PushType.APPEND, PushResult.SUCCESS, 2, 2, 0, 2), 10.2)
    carry_out(node, log)
    assert node.committed_index == 2


def test_a_flush_sync_follower_acknowledges_only_what_it_flushed():
    config = RaftConfig(flush_sync=True)
    node, log = make_node([], term=1, config=config, self_id="n1")
    node.step(append(log, 1, 0, -1, -1, (Entry(0, 1, b"a"), Entry(1, 1, b"b"))), 0.0)
    # Appended, nothing flushed: no response yet (it would acknowledge nothing new).
    assert not carry_out(node, log).messages
    node.persisted(log.flush(), 0.01)
    (ack,) = carry_out(node, log).messages
    assert isinstance(ack, PushResponse) and ack.result is PushResult.SUCCESS and ack.ack_index == 1
    assert ack.end_index == 1


def test_a_flush_sync_follower_answers_a_push_of_entries_it_has_at_once():
    """A re-push of entries it holds appends nothing: answered at once (the leader may be
    waiting for it after a timeout), acknowledging what is flushed."""
    config = RaftConfig(flush_sync=True)
    node, log = make_node([], term=1, config=config, self_id="n1")
    push = append(log, 1, 0, -1, -1, (Entry(0, 1, b"a"),))
    node.step(push, 0.0)
    carry_out(node, log)
    node.persisted(log.flush(), 0.01)
    carry_out(node, log)
    node.step(push, 0.02)
    (again,) = carry_out(node, log).messages
    assert again.result is PushResult.SUCCESS and again.ack_index == 0


def test_a_flush_sync_leader_counts_itself_only_after_its_flush():
    node, log = make_node([], term=0, config=RaftConfig(flush_sync=True))
    elect(node, log, now=10.0)
    node.step(PushResponse("n1", "n0", 1, PushType.COMPARE, PushResult.SUCCESS, -1, -1, 0, -1), 10.1)
    carry_out(node, log)
    node.step(PushResponse("n1", "n0", 1, PushType.APPEND, PushResult.SUCCESS, 0, 0, 0, 0), 10.2)
    carry_out(node, log)
    assert node.committed_index == -1  # n1 has the no-op durably, the leader not yet
    node.persisted(log.flush(), 10.3)
    carry_out(node, log)
    assert node.committed_index == 0


def test_a_flush_sync_leader_commits_on_two_followers_durable_acks_before_its_own_flush():
    """The leader's own flush is not on the commit's path (etcd's rule): two followers that
    acknowledged an entry (each only after its own flush) are a quorum of three without the
    leader; one follower's acknowledgement alone is not, while the leader has not flushed."""
    node, log = make_node([], term=0, config=RaftConfig(flush_sync=True))
    elect(node, log, now=10.0)
    node.persisted(log.flush(), 10.05)  # the no-op
    for peer in ("n1", "n2"):
        node.step(PushResponse(peer, "n0", 1, PushType.COMPARE, PushResult.SUCCESS, -1, -1, 0, -1), 10.1)
        carry_out(node, log)
        node.step(PushResponse(peer, "n0", 1, PushType.APPEND, PushResult.SUCCESS, 0, 0, 0, 0), 10.1)
        carry_out(node, log)
    assert node.committed_index == 0
    node.propose([b"put"], 10.2)
    carry_out(node, log)
    assert node.flushed_index == 0 and log.flushed_index() == 0  # the leader has not flushed entry 1
    node.step(PushResponse("n1", "n0", 1, PushType.APPEND, PushResult.SUCCESS, 1, 1, 0, 1), 10.3)
    ready = carry_out(node, log)
    assert node.committed_index == 0 and not ready.proposals  # n1's durable copy and the leader's volatile one: not a quorum
    node.step(PushResponse("n2", "n0", 1, PushType.APPEND, PushResult.SUCCESS, 1, 1, 0, 1), 10.4)
    ready = carry_out(node, log)
    assert node.committed_index == 1 and [p.status for p in ready.proposals] == [ProposalStatus.SUCCESS]
    assert log.flushed_index() == 0  # committed and answerable with the leader's copy still volatile


def test_a_push_beyond_the_end_is_answered_out_of_order_once():
    node, log = make_node([1], term=1, self_id="n1")
    answers = []
    for index in (3, 4, 5):
        node.step(append(log, 1, index, 1, -1, (Entry(index, 1, b"x"),)), 0.0)
        answers.extend(carry_out(node, log).messages)
    assert [(a.result, a.end_index) for a in answers] == [(PushResult.OUT_OF_ORDER, 0)]
    assert log.last_index() == 0


def test_truncate_never_drops_an_entry_equal_to_the_leaders():
    # A stale TRUNCATE (the leader thinks index 2 differs; it no longer does) is refused.
    node, log = make_node([1, 1, 1], term=1, self_id="n1")
    node.step(Push("n0", "n1", 1, PushType.TRUNCATE, 1, -1, -1, (Entry(1, 1, b"e1"), Entry(2, 1, b"e2"))), 0.0)
    (answer,) = carry_out(node, log).messages
    assert answer.result is PushResult.INCONSISTENT_STATE and log.last_index() == 2


def test_append_with_a_quorum_and_identical_logs():
    cluster = SimCluster(seed=11, config=ETCD_LIKE, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    for i in range(20):
        assert cluster.propose_and_wait(leader, [b"m%d" % i, b"n%d" % i], timeout=2) is ProposalStatus.SUCCESS
    cluster.run_until(cluster.now + 1)
    logs = [cluster.logs[m].entries for m in MEMBERS]
    assert logs[0] == logs[1] == logs[2] and len(logs[0]) == 41  # 40 and the no-op
    assert all(cluster.node(m).committed_index == 40 for m in MEMBERS)
    status = cluster.node(leader).status(cluster.now)
    assert (status.role, status.leader_id, status.ledger_end_index, status.committed_index) == (
        Role.LEADER,
        leader,
        40,
        40,
    )
    assert {p.lag_entries for p in status.peers.values()} == {0} and set(status.peers) == set(MEMBERS) - {leader}
    assert cluster.node(next(iter(status.peers))).status(cluster.now).peers == {}


def test_without_a_quorum_proposals_time_out_then_the_leader_is_full():
    # DLedger AppendAndPushTest: network offline => WAIT_QUORUM_ACK_TIMEOUT, then LEADER_PENDING_FULL.
    # DLedger's timing: the 2.5 s ack timeout passes long before check-quorum (6.3 s) steps down.
    config = dataclasses.replace(DLEDGER_DEFAULTS, pending_max=5)
    cluster = SimCluster(seed=12, config=config, network=QUIET)
    leader = cluster.run_until_leader(timeout=30)
    for member in MEMBERS:
        if member != leader:
            cluster.crash(member)
    started = cluster.now
    assert cluster.propose_and_wait(leader, [b"a"], timeout=5) is ProposalStatus.WAIT_QUORUM_ACK_TIMEOUT
    assert 2.5 <= cluster.now - started < 2.6
    for i in range(5):
        assert not isinstance(cluster.propose(leader, [b"p%d" % i]), Refused)
    refused = cluster.propose(leader, [b"one too many"])
    assert isinstance(refused, Refused) and refused.status is RefusalStatus.LEADER_PENDING_FULL


def test_a_follower_far_behind_catches_up_in_batches():
    config = dataclasses.replace(ETCD_LIKE, push_batch_size_max=64, push_in_flight_max=50)
    cluster = SimCluster(seed=13, config=config, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    behind = next(m for m in MEMBERS if m != leader)
    cluster.crash(behind)
    for i in range(300):
        assert (
            cluster.propose_and_wait(leader, [b"%05d" % (10 * i + j) for j in range(10)], timeout=2)
            is ProposalStatus.SUCCESS
        )
    pushes_before = cluster.network.statistics.sent
    cluster.start(behind)
    cluster.run_until(cluster.now + 3)
    assert cluster.logs[behind].entries == cluster.logs[leader].entries
    assert cluster.node(behind).committed_index == cluster.node(leader).committed_index == 3000
    # 3000 entries of 5 bytes, 12 per push (64-byte batches): 250 pushes and their responses, and
    # 3 s of heartbeats (120 messages with their responses) -- not 3000 one-entry pushes.
    assert cluster.network.statistics.sent - pushes_before <= 250 * 2 + 120


def test_a_divergent_follower_is_truncated_to_the_leaders_log():
    cluster = SimCluster(seed=14, config=ETCD_LIKE, network=QUIET)
    old = cluster.run_until_leader(timeout=10)
    assert cluster.propose_and_wait(old, [b"shared"], timeout=2) is ProposalStatus.SUCCESS
    cluster.network.partition([old])
    for i in range(30):
        cluster.propose(old, [b"divergent-%d" % i])  # appended on the old leader alone
    new = cluster.run_until_leader(timeout=10, among=[m for m in MEMBERS if m != old])
    for i in range(5):
        assert cluster.propose_and_wait(new, [b"new-%d" % i], timeout=2) is ProposalStatus.SUCCESS
    assert len(cluster.logs[old].entries) > len(cluster.logs[new].entries)  # longer, but older terms
    cluster.network.heal()
    cluster.run_until(cluster.now + 3)
    assert cluster.logs[old].entries == cluster.logs[new].entries
    assert not any(e.body.startswith(b"divergent") for e in cluster.logs[old].entries)


def test_propose_on_a_follower_names_the_leader():
    cluster = SimCluster(seed=15, config=ETCD_LIKE, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    follower = next(m for m in MEMBERS if m != leader)
    refused = cluster.propose(follower, [b"x"])
    assert isinstance(refused, Refused) and refused.status is RefusalStatus.NOT_LEADER and refused.leader_id == leader


def test_a_vote_request_for_a_candidate_with_an_older_log_does_not_change_the_leader():
    cluster = SimCluster(seed=16, config=ETCD_LIKE, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    assert cluster.propose_and_wait(leader, [b"x"], timeout=2) is ProposalStatus.SUCCESS
    node = cluster.node(leader)
    candidate = next(m for m in MEMBERS if m != leader)
    node.step(VoteRequest(candidate, leader, node.term + 5, 0, 0), cluster.now)
    ready = node.ready()
    (answer,) = [m for m in ready.messages if isinstance(m, VoteResponse)]
    assert answer.result is VoteResult.REJECT_EXPIRED_LEDGER_TERM and node.role is Role.LEADER


def test_an_append_whose_previous_entry_differs_is_refused_not_applied():
    node, log = make_node([1, 1], term=2, self_id="n1")
    node.step(append(log, 2, 2, 2, -1, (Entry(2, 2, b"x"),)), 0.0)  # we have term 1 at 1
    (answer,) = carry_out(node, log).messages
    assert answer.result is PushResult.INCONSISTENT_STATE and log.last_index() == 1


def test_an_append_that_overlaps_differently_is_refused_not_applied():
    node, log = make_node([1, 1, 1], term=2, self_id="n1")
    node.step(
        append(log, 2, 1, 1, -1, (Entry(1, 1, b"e1"), Entry(2, 2, b"y"), Entry(3, 2, b"z"))), 0.0
    )
    (answer,) = carry_out(node, log).messages
    assert answer.result is PushResult.INCONSISTENT_STATE and [e.term for e in log.entries] == [1, 1, 1]


def test_an_overlapping_append_of_equal_entries_appends_only_the_new_ones():
    node, log = make_node([1, 1], term=1, self_id="n1")
    node.step(append(log, 1, 1, 1, 1, (Entry(1, 1, b"e1"), Entry(2, 1, b"new"))), 0.0)
    (answer,) = carry_out(node, log).messages
    assert answer.result is PushResult.SUCCESS and answer.ack_index == 2
    assert [e.body for e in log.entries] == [b"e0", b"e1", b"new"] and node.committed_index == 1


def test_raft_figure_8_an_old_entry_on_a_majority_is_not_committed_and_may_be_overwritten():
    """The Raft paper's figure 8, played out: without the current-term rule the third leader would
    commit "bb" by counting, and the returning x would then overwrite a committed entry."""
    members = ("n0", "n1", "n2", "n3", "n4")
    config = dataclasses.replace(ETCD_LIKE, push_batch_size_max=1, push_in_flight_max=1)  # one entry per push
    cluster = SimCluster(seed=0, members=members, config=config, network=QUIET)

    def run_until(condition):
        for _ in range(10_000):
            if condition():
                return
            cluster.run_until(cluster.now + 0.001)
        raise AssertionError(cluster.describe())

    p = cluster.run_until_leader(timeout=10)
    assert cluster.propose_and_wait(p, [b"a"], timeout=2) is ProposalStatus.SUCCESS
    cluster.run_until(cluster.now + 0.5)
    q = next(m for m in members if m != p)
    cluster.network.partition([p, q])  # "bb" (term 1) reaches q only
    b = cluster.propose(p, [b"bb"]).first_index
    run_until(lambda: cluster.logs[q].last_index() == b)
    cluster.crash(p)
    cluster.crash(q)
    cluster.network.heal()
    run_until(lambda: cluster.leader() is not None)
    x = cluster.leader()  # its no-op (term 2) at b stays on x alone
    cluster.network.partition([x])
    y, z = [m for m in members if m not in (p, q, x)]
    # p or q leads term 3 and pushes "bb" everywhere, but its own no-op never leaves it.
    cluster.network.drop_if = lambda source, target, m: isinstance(m, Push) and (
        m.entries.last_index > b if m.type is PushType.APPEND else any(e.index > b for e in m.entries))
    cluster.start(p)
    cluster.start(q)
    run_until(lambda: cluster.leader() in (p, q))
    third = cluster.leader()
    cluster.run_until(cluster.now + 2)
    holders = [m for m in members if cluster.logs[m].last_index() >= b and cluster.logs[m].entries[b].body == b"bb"]
    assert len(holders) >= 3 and x not in holders
    assert cluster.node(third).committed_index < b  # on a majority, but of an older term
    # The third leader and its partner go; x returns (y and z kept from campaigning) and wins.
    cluster.network.partition([p, q])
    cluster.network.drop_if = lambda source, target, m: isinstance(m, VoteRequest) and source in (y, z)
    cluster.run_until(cluster.now + 5)
    assert cluster.leader() == x
    assert all(e.body != b"bb" for m in (x, y, z) for e in cluster.logs[m].entries)  # legitimately overwritten


def test_entries_a_follower_holds_but_has_not_acknowledged_are_pushed_again_after_the_timeout():
    # flush_sync: COMPARE finds n1 has index 1 but acknowledges nothing flushed; with one entry in
    # flight allowed the leader pushes nothing more -- if that acknowledgement after n1's flush is
    # lost, only the push timeout brings the follower back (seed 6851 of the simulator found it).
    config = RaftConfig(flush_sync=True, push_in_flight_max=1)
    node, log = make_node([1, 1], term=1, config=config)
    elect(node, log, now=10.0)
    node.step(PushResponse("n1", "n0", 2, PushType.COMPARE, PushResult.SUCCESS, 1, -1, 0, 1), 10.1)
    assert not [m for m in carry_out(node, log).messages if isinstance(m, Push) and m.target == "n1"]
    assert node.deadline() <= 10.1 + config.push_timeout_seconds
    node.tick(10.1 + config.push_timeout_seconds)
    (push,) = [m for m in carry_out(node, log).messages if isinstance(m, Push) and m.target == "n1"]
    assert (push.type, push.index) == (PushType.APPEND, 0)


# -- retention: the floor and a follower behind the leader's first index ---------------------


def test_the_retention_floor_is_every_members_match_index_and_followers_learn_it():
    cluster = SimCluster(seed="retention-floor", config=ETCD_LIKE, network=QUIET)
    leader = cluster.run_until_leader(timeout=5.0)
    for i in range(5):
        assert cluster.propose_and_wait(leader, [b"a%d" % i], timeout=2.0) is ProposalStatus.SUCCESS
    cluster.run_until(cluster.now + 0.5)  # heartbeats carry the floor
    node = cluster.node(leader)
    assert node.retention_floor() == node.committed_index == 5
    followers = [m for m in MEMBERS if m != leader]
    assert all(cluster.node(m).retention_floor() == 5 for m in followers)
    down = followers[0]
    cluster.crash(down)  # a member that is down holds retention back at what it had
    for i in range(5):
        assert cluster.propose_and_wait(leader, [b"b%d" % i], timeout=2.0) is ProposalStatus.SUCCESS
    cluster.run_until(cluster.now + 0.5)
    assert node.committed_index == 10 and node.retention_floor() == 5
    assert cluster.compact(leader) == 5 and cluster.compact(followers[1]) == 5
    cluster.start(down)  # it rejoins and is caught up from entry 6 on
    cluster.run_until(cluster.now + 1.0)
    assert cluster.logs[down].last_index() == node.last_index
    assert node.retention_floor() == 10 and cluster.compact(leader) == 10


def test_a_flush_sync_leaders_retention_floor_stays_within_what_it_flushed():
    """With flush_sync a power loss takes what a member has not flushed, the leader's log
    included. Followers that flushed entries commit them without the leader's flush, but the
    floor it announces must not let anyone delete them: back from a crash without them, the
    leader would find them deleted everywhere (the simulator's seed 722485, 3 nodes)."""
    node, log = make_node([], term=0, config=RaftConfig(flush_sync=True))
    elect(node, log, now=10.0)
    for peer in ("n1", "n2"):
        node.step(PushResponse(peer, "n0", 1, PushType.COMPARE, PushResult.SUCCESS, -1, -1, 0, -1), 10.1)
    carry_out(node, log)
    node.persisted(log.flush(), 10.15)  # the leader's no-op (index 0)
    for peer in ("n1", "n2"):
        node.step(PushResponse(peer, "n0", 1, PushType.APPEND, PushResult.SUCCESS, 0, 0, 0, 0), 10.2)
    carry_out(node, log)
    assert node.committed_index == 0 and node.retention_floor() == 0
    node.propose([b"a", b"b", b"c"], 10.3)
    carry_out(node, log)  # appended, not flushed
    for peer in ("n1", "n2"):
        node.step(PushResponse(peer, "n0", 1, PushType.APPEND, PushResult.SUCCESS, 1, 3, 0, 3), 10.4)
    carry_out(node, log)
    assert node.committed_index == 3  # n1 and n2 flushed 0..3: a quorum without the leader
    assert node.retention_floor() == 0  # what the leader itself has flushed
    node.persisted(log.flush(), 10.5)
    assert node.retention_floor() == 3


def _stranded_leader():
    """n0 leads term 2 over entries 0..19 of term 1 (all committed) and a forced clean deleted
    0..14; n2's log ends at 3: COMPARE walks to 3, which the leader no longer holds."""
    node, log = make_node([1] * 20, term=1)
    log.save_hard_state(HardState(1, None, 19))
    node = RaftNode(self_id="n0", members=MEMBERS, log=log, config=DLEDGER_DEFAULTS, rng=random.Random(7), now=0.0)
    assert log.compact(keep_from_index=15, committed_index=19) == 15  # forced: n2 was not asked
    ready = elect(node, log, now=10.0)
    compare = next(m for m in ready.messages if isinstance(m, Push) and m.target == "n2")
    assert (compare.type, compare.index) == (PushType.COMPARE, 19)
    return node, log


def _pushes_to(ready: Ready, member: str) -> list:
    return [m for m in ready.messages if isinstance(m, Push | ResetPush) and m.target == member]


def test_a_stranded_follower_gets_a_reset_to_the_leaders_first_index_then_appends():
    node, log = _stranded_leader()
    node.step(PushResponse("n2", "n0", 2, PushType.COMPARE, PushResult.MISMATCH, 19, -1, 0, 3, -1), 10.1)
    ready = carry_out(node, log)
    assert log.first_offset() == 10 * (48 + 2) + 5 * (48 + 3)  # entries e0..e14 laid out from offset 0
    assert _pushes_to(ready, "n2") == [ResetPush("n0", "n2", 2, 15, 1, 1, log.first_offset(), node.committed_index)]
    assert node.status(10.1).peers["n2"].behind_log_start  # until it answers
    assert not node.status(10.1).peers["n1"].behind_log_start
    node.tick(10.5)  # within push_timeout_seconds: not sent again
    assert not _pushes_to(carry_out(node, log), "n2")
    node.tick(12.0)  # past it: sent again (a lost RESET is retried as a lost COMPARE is)
    assert [type(m) for m in _pushes_to(carry_out(node, log), "n2")] == [ResetPush]
    # n2 reset: its log is empty at 15, it acknowledges 14
    node.step(PushResponse("n2", "n0", 2, PushType.RESET, PushResult.SUCCESS, 15, 14, 15, 14), 12.1)
    ready = carry_out(node, log)
    appends = _pushes_to(ready, "n2")
    assert [(m.type, m.index, m.prev_term) for m in appends] == [(PushType.APPEND, 15, -1)]
    assert (appends[0].entries.first_index, appends[0].entries.last_index) == (15, 20)  # a reference run
    assert not node.status(12.1).peers["n2"].behind_log_start and node.match_index("n2") == 14
    node.step(PushResponse("n2", "n0", 2, PushType.APPEND, PushResult.SUCCESS, 15, 20, 15, 20), 12.2)
    carry_out(node, log)
    assert node.match_index("n2") == 20


def test_a_re_push_after_a_timeout_below_the_first_index_becomes_a_reset():
    node, log = make_node([1] * 20, term=1)
    log.save_hard_state(HardState(1, None, 19))  # all committed: retention may delete up to 19
    node = RaftNode(self_id="n0", members=MEMBERS, log=log, config=DLEDGER_DEFAULTS, rng=random.Random(7), now=0.0)
    elect(node, log, now=10.0)
    # n2 matches up to 3: the leader pushes from 4 and waits for an acknowledgement
    node.step(PushResponse("n2", "n0", node.term, PushType.COMPARE, PushResult.MISMATCH, 19, -1, 0, 3, -1), 10.1)
    node.step(PushResponse("n2", "n0", node.term, PushType.COMPARE, PushResult.SUCCESS, 3, 3, 0, 3), 10.1)
    ready = carry_out(node, log)
    append = [m for m in ready.messages if isinstance(m, Push) and m.target == "n2"][-1]
    assert (append.type, append.index) == (PushType.APPEND, 4)
    assert log.compact(keep_from_index=15, committed_index=19) == 15  # a forced clean meanwhile
    node.tick(12.0)  # past push_timeout_seconds: the re-push would start at 4, which is gone
    ready = carry_out(node, log)
    assert [(type(m), m.index) for m in _pushes_to(ready, "n2")] == [(ResetPush, 15)]
    assert node.status(12.0).peers["n2"].behind_log_start and node.deadline() > 12.0


def test_a_run_whose_bytes_fail_the_check_is_refused_whole_and_named():
    node, log = make_node([1, 1], term=1, self_id="n1")
    good = append(log, 1, 2, 1, -1, (Entry(2, 1, b"x"), Entry(3, 1, b"yy")))
    data = bytearray(good.entries.data)
    data[-1] ^= 0x20  # the second entry's body: its bodyCrc no longer matches
    bad = dataclasses.replace(good, entries=dataclasses.replace(good.entries, data=bytes(data)))
    node.step(bad, 0.0)
    ready = carry_out(node, log)
    (answer,) = ready.messages
    assert answer.result is PushResult.INCONSISTENT_STATE and log.last_index() == 1  # nothing of it appended
    assert ready.refused_runs == ("from n0: entries 2..3: entry 3 (number 1 of 2): bodyCrc mismatch",)
    node.step(good, 0.1)  # the leader's next push, sent again after its COMPARE
    ready = carry_out(node, log)
    assert ready.messages[0].result is PushResult.SUCCESS and [e.body for e in log.entries[2:]] == [b"x", b"yy"]
    assert not ready.refused_runs


def test_a_leader_answered_inconsistent_state_compares_again():
    node, log = make_node([1], term=1)
    elect(node, log, now=10.0)
    node.step(PushResponse("n1", "n0", 2, PushType.COMPARE, PushResult.SUCCESS, 0, 0, 0, 0), 10.1)
    ready = carry_out(node, log)
    (append_push,) = [m for m in ready.messages if isinstance(m, Push) and m.target == "n1"]
    assert append_push.type is PushType.APPEND and append_push.entries.data is None  # a reference: the driver reads it
    node.step(PushResponse("n1", "n0", 2, PushType.APPEND, PushResult.INCONSISTENT_STATE, 1, -1, 0, 0), 10.2)
    ready = carry_out(node, log)
    (compare,) = [m for m in ready.messages if isinstance(m, Push) and m.target == "n1"]
    assert compare.type is PushType.COMPARE and compare.index == 0
def test_a_leader_that_does_not_know_the_term_before_its_first_entry_sends_nothing():
    node, log = _stranded_leader()
    log._term_before_first = -1  # a store from before the term was recorded
    node.step(PushResponse("n2", "n0", 2, PushType.COMPARE, PushResult.MISMATCH, 19, -1, 0, 3, -1), 10.1)
    assert not _pushes_to(carry_out(node, log), "n2")
    assert node.status(10.1).peers["n2"].behind_log_start and node.deadline() > 10.1  # no busy loop


def _follower(terms, *, committed, term=2):
    log = SimLog()
    log.append([Entry(i, t, b"e%d" % i) for i, t in enumerate(terms)])
    log.flush()
    log.save_hard_state(HardState(term, None, committed))
    node = RaftNode(self_id="n2", members=MEMBERS, log=log, config=DLEDGER_DEFAULTS, rng=random.Random(7), now=0.0)
    return node, log


def _answer(ready: Ready) -> PushResponse:
    (response,) = [m for m in ready.messages if isinstance(m, PushResponse)]
    return response


def test_a_follower_resets_discarding_its_log_and_then_takes_the_append():
    node, log = _follower([1, 1, 1, 1], committed=2)
    node.step(ResetPush("n0", "n2", 2, 15, 1, 2, 15, 19), 1.0)
    ready = carry_out(node, log)
    assert ready.reset == LogReset(15, 1, 15)
    response = _answer(ready)
    assert (response.type, response.result, response.request_index) == (PushType.RESET, PushResult.SUCCESS, 15)
    assert (response.ack_index, response.begin_index, response.end_index) == (14, 15, 14)
    assert (log.first_index(), log.last_index(), log.last_term(), log.flushed_index()) == (15, 14, 1, 14)
    assert node.committed_index == 14 and ready.committed_index == 14
    node.step(Push("n0", "n2", 2, PushType.APPEND, 15, -1, 19, log.run_of([Entry(i, 2, b"x") for i in range(15, 20)])), 1.1)
    ready = carry_out(node, log)
    assert _answer(ready).result is PushResult.SUCCESS and log.last_index() == 19
    assert node.committed_index == 19
    # A delayed copy of the RESET now finds the leader's entry 15 here: refused, nothing dropped
    node.step(ResetPush("n0", "n2", 2, 15, 1, 2, 15, 19), 1.2)
    ready = carry_out(node, log)
    assert ready.reset is None and _answer(ready).result is PushResult.INCONSISTENT_STATE
    assert (log.first_index(), log.last_index()) == (15, 19)
    # A restart keeps it: the log starts at 15, entries below count as committed
    restarted = RaftNode(self_id="n2", members=MEMBERS, log=log, config=DLEDGER_DEFAULTS, rng=random.Random(8), now=2.0)
    assert restarted.committed_index >= 14 and restarted.last_term == 2


def test_a_reset_from_a_stale_term_or_from_a_member_that_does_not_lead_is_refused():
    node, log = _follower([1, 1, 1, 1], committed=2, term=3)
    node.step(ResetPush("n0", "n2", 2, 15, 1, 2, 15, 19), 1.0)  # term 2 < 3
    ready = carry_out(node, log)
    assert ready.reset is None and _answer(ready).result is PushResult.EXPIRED_TERM
    node.step(Heartbeat("n1", "n2", 3, 2), 1.1)  # n1 leads term 3
    carry_out(node, log)
    node.step(ResetPush("n0", "n2", 3, 15, 1, 2, 15, 19), 1.2)  # n0 claims term 3 too
    ready = carry_out(node, log)
    assert ready.reset is None and _answer(ready).result is PushResult.INCONSISTENT_LEADER
    assert (log.first_index(), log.last_index()) == (0, 3)


def test_a_follower_whose_log_passes_the_reset_index_keeps_what_it_must():
    # It holds the leader's entry 15 (term 2): its log up to 15 is the leader's; refused, kept.
    node, log = _follower([1] * 15 + [2] * 6, committed=5)
    node.step(ResetPush("n0", "n2", 2, 15, 1, 2, 15, 19), 1.0)
    ready = carry_out(node, log)
    assert ready.reset is None and _answer(ready).result is PushResult.INCONSISTENT_STATE
    assert (log.first_index(), log.last_index()) == (0, 20)
    # It committed 16 (so 15 is committed here): refused even though its entry 15 differs.
    node, log = _follower([1] * 21, committed=16)
    node.step(ResetPush("n0", "n2", 2, 15, 1, 2, 15, 19), 1.0)
    ready = carry_out(node, log)
    assert ready.reset is None and _answer(ready).result is PushResult.INCONSISTENT_STATE
    assert (log.first_index(), log.last_index()) == (0, 20)
    # Its entries from 15 on are of term 1, the leader's of term 2: none is committed; all go.
    node, log = _follower([1] * 21, committed=5)
    node.step(ResetPush("n0", "n2", 2, 15, 1, 2, 15, 19), 1.0)
    ready = carry_out(node, log)
    assert ready.reset == LogReset(15, 1, 15) and _answer(ready).result is PushResult.SUCCESS
    assert (log.first_index(), log.last_index(), log.last_term()) == (15, 14, 1)


def test_a_leader_refused_a_reset_goes_back_to_compare():
    node, log = _stranded_leader()
    node.step(PushResponse("n2", "n0", 2, PushType.COMPARE, PushResult.MISMATCH, 19, -1, 0, 3, -1), 10.1)
    carry_out(node, log)
    node.step(PushResponse("n2", "n0", 2, PushType.RESET, PushResult.INCONSISTENT_STATE, 15, -1, 0, 20), 10.2)
    ready = carry_out(node, log)
    assert [(m.type, m.index) for m in _pushes_to(ready, "n2")] == [(PushType.COMPARE, 20)]


def test_a_stranded_member_is_reset_and_converges_in_a_cluster():
    cluster = SimCluster(seed="strand", config=ETCD_LIKE, network=QUIET)
    leader = cluster.run_until_leader(timeout=5.0)
    down = next(m for m in MEMBERS if m != leader)
    cluster.crash(down)
    for i in range(10):
        assert cluster.propose_and_wait(leader, [b"s%d" % i], timeout=2.0) is ProposalStatus.SUCCESS
    cluster.run_until(cluster.now + 0.5)
    other = next(m for m in MEMBERS if m not in (leader, down))
    assert cluster.compact(leader, forced=True) <= cluster.logs[down].last_index() + 1  # it knows what down needs
    # A leader that never heard from down (a new term) does not: its forced clean strands it.
    assert cluster.transfer_leadership(leader, other) is None
    assert cluster.run_until_leader(timeout=5.0) == other
    leader = other
    assert cluster.propose_and_wait(leader, [b"t"], timeout=2.0) is ProposalStatus.SUCCESS
    cluster.run_until(cluster.now + 0.5)
    first = cluster.compact(leader, forced=True)
    assert first > cluster.logs[down].last_index() + 1  # down needs entries the leader deleted
    cluster.start(down)
    cluster.run_until(cluster.now + 1.0)
    assert cluster.resets == 1 and cluster.logs[down].first_index() == first
    node = cluster.node(leader)
    assert cluster.logs[down].last_index() == node.last_index and cluster.node(down).committed_index == node.committed_index
    assert [cluster.logs[down].entry_at(i) for i in range(first, node.last_index + 1)] == [
        cluster.logs[leader].entry_at(i) for i in range(first, node.last_index + 1)
    ]


def test_a_reset_inside_a_push_frame_is_refused_as_a_bad_message():
    node, log = _follower([1, 1, 1, 1], committed=2)
    try:
        node.step(Push("n0", "n2", 2, PushType.RESET, 15, -1, 19), 1.0)
    except ValueError as error:
        assert "ResetPush" in str(error)
    else:
        raise AssertionError("a PUSH of type RESET was taken")
    assert (log.first_index(), log.last_index()) == (0, 3)


def test_acknowledgements_stepped_before_one_ready_commit_as_one_at_a_time():
    """The driver steps the acknowledgements read together and carries their Ready out once:
    the core takes them so (they change no log), committing and pushing as when each had a
    Ready of its own."""

    def leader_with_a_proposal():
        node, log = make_node([1], term=1)
        elect(node, log, now=10.0)
        for peer in ("n1", "n2"):
            node.step(PushResponse(peer, "n0", 2, PushType.COMPARE, PushResult.SUCCESS, 0, 0, 0, 0), 10.1)
        carry_out(node, log)
        node.propose([b"a", b"b"], 10.2)
        carry_out(node, log)
        return node, log

    acks = [PushResponse(peer, "n0", 2, PushType.APPEND, PushResult.SUCCESS, 2, 3, 0, 3) for peer in ("n1", "n2")]
    one_by_one, log = leader_with_a_proposal()
    readies = []
    for ack in acks:
        one_by_one.step(ack, 10.3)
        readies.append(carry_out(one_by_one, log))
    together, log = leader_with_a_proposal()
    for ack in acks:
        together.step(ack, 10.3)
    ready = carry_out(together, log)
    assert together.committed_index == one_by_one.committed_index == 3
    assert ready.committed_index == 3 and ready.entries == () and ready.runs == ()
    assert [p.status for p in ready.proposals] == [p.status for r in readies for p in r.proposals] == [ProposalStatus.SUCCESS]
    assert ready.messages == tuple(m for r in readies for m in r.messages)


def test_proposals_before_one_ready_go_to_each_follower_in_one_push():
    """A proposal's entries are pushed when the Ready is taken: the proposals of one pass of
    puts reach each follower in one APPEND (within push_batch_size_max), each still its own
    proposal; a proposal followed by its Ready pushes as before."""
    node, log = make_node([1], term=1)
    elect(node, log, now=10.0)
    for peer in ("n1", "n2"):
        node.step(PushResponse(peer, "n0", 2, PushType.COMPARE, PushResult.SUCCESS, 0, 0, 0, 0), 10.1)
    carry_out(node, log)
    first = node.propose([b"a", b"b"], 10.2)
    second = node.propose([b"c"], 10.2)
    assert (first.first_index, first.last_index, second.first_index) == (2, 3, 4)
    ready = carry_out(node, log)
    pushes = [m for m in ready.messages if isinstance(m, Push)]
    assert sorted(m.target for m in pushes) == ["n1", "n2"]
    assert all((m.index, m.entries.count, m.entries.last_term) == (2, 3, 2) for m in pushes)
    third = node.propose([b"d"], 10.3)
    (push, _) = [m for m in carry_out(node, log).messages if isinstance(m, Push)]
    assert (push.index, push.entries.count) == (third.first_index, 1)
    for peer in ("n1", "n2"):
        node.step(PushResponse(peer, "n0", 2, PushType.APPEND, PushResult.SUCCESS, 2, 5, 0, 5), 10.4)
    ready = carry_out(node, log)
    assert node.committed_index == 5 and len(ready.proposals) == 3


def test_a_pass_of_64_producers_x_32_messages_goes_to_each_follower_in_one_push():
    """By default a push carries up to 1 MiB of bodies: the 256 KiB a leader reads from a client
    in one pass (here 7 requests of 32 x ~1.1 KiB records) reach each follower in one APPEND, not
    four 64 KiB ones -- a follower's step, append, Ready and answer per push, and the leader's
    step of each answer, were what a pass cost beyond its messages."""
    node, log = make_node([1], term=1)
    elect(node, log, now=10.0)
    for peer in ("n1", "n2"):
        node.step(PushResponse(peer, "n0", 2, PushType.COMPARE, PushResult.SUCCESS, 0, 0, 0, 0), 10.1)
    carry_out(node, log)
    for _ in range(7):
        node.propose([bytes(1100)] * 32, 10.2)
    pushes = [m for m in carry_out(node, log).messages if isinstance(m, Push)]
    assert sorted(m.target for m in pushes) == ["n1", "n2"]
    assert all((m.index, m.entries.count) == (2, 7 * 32) for m in pushes)


def test_a_proposal_makes_its_entries_without_a_python_call_per_entry():
    """A leader proposes a message per entry: the entries of a proposal are made and counted
    without a Python call each (a frozen dataclass's ``__init__`` per entry was 7 % of a leader's
    main thread at 64 producers x 32-message batches); they are the same entries."""
    import sys

    def python_calls(bodies):
        node, log = make_node([1], term=1)
        elect(node, log, now=10.0)
        carry_out(node, log)
        calls = []
        sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_name) if event == "call" else None)
        try:
            proposed = node.propose(bodies, 10.2)
        finally:
            sys.setprofile(None)
        ready = carry_out(node, log)
        first = proposed.first_index
        assert list(ready.entries) == [Entry(first + i, 2, body) for i, body in enumerate(bodies)]
        assert all(entry.body is body for entry, body in zip(ready.entries, bodies))  # kept, not copied
        assert (node.last_index, node.last_term) == (first + len(bodies) - 1, 2)
        return len(calls)

    assert python_calls([b"%d" % i for i in range(32)]) == python_calls([b"only"])
