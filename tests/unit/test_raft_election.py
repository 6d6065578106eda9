"""Election at the core level: DLedger's vote checks in order, votes saved before they are sent,
pre-vote, the leader lease and check-quorum (rocketmq-notes §8.5; DLedger LeaderElectorTest and
VoteRequestTest)."""

import dataclasses
import random

import pytest

from hasvc.state.raft import DLEDGER_DEFAULTS, ETCD_LIKE, Entry, HardState, RaftConfig, RaftNode, Ready, Role
from hasvc.state.raft.messages import Heartbeat, VoteRequest, VoteResponse, VoteResult
from hasvc.testing.log import SimLog
from hasvc.testing.network import NetworkConfig
from hasvc.testing.raft_cluster import SimCluster

MEMBERS = ("n0", "n1", "n2")
QUIET = NetworkConfig(delay_min_seconds=0.001, delay_max_seconds=0.005, fifo=True)  # as over TCP


def make_node(*, terms=(1, 1, 2), term=3, voted_for=None, config=DLEDGER_DEFAULTS, self_id="n0"):
    log = SimLog()
    log.append([Entry(i, t, b"e%d" % i) for i, t in enumerate(terms)])
    log.flush()
    log.save_hard_state(HardState(term, voted_for, -1))
    node = RaftNode(self_id=self_id, members=MEMBERS, log=log, config=config, rng=random.Random(1), now=0.0)
    return node, log


def carry_out(node: RaftNode, log: SimLog) -> Ready:
    ready = node.ready()
    if ready.hard_state is not None:
        log.save_hard_state(ready.hard_state)
    if ready.truncate_after is not None:
        log.truncate(after_index=ready.truncate_after)
    log.append(ready.entries)
    return ready


def vote(node, log, *, source="n1", term=4, end_index=2, end_term=2, pre_vote=False, transfer=False, now=0.0):
    node.step(VoteRequest(source, "n0", term, end_index, end_term, pre_vote, transfer), now)
    ready = carry_out(node, log)
    (response,) = [m for m in ready.messages if isinstance(m, VoteResponse)]
    return response, ready


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        # Each case breaks the named rule and every later one: the earlier check answers.
        ({"source": "n9", "term": 1, "end_term": 0}, VoteResult.REJECT_UNKNOWN_LEADER),
        ({"source": "n0", "term": 1, "end_term": 0}, VoteResult.REJECT_UNEXPECTED_LEADER),
        ({"term": 1, "end_term": 1, "end_index": 10}, VoteResult.REJECT_EXPIRED_LEDGER_TERM),
        ({"term": 1, "end_term": 2, "end_index": 1}, VoteResult.REJECT_SMALL_LEDGER_END_INDEX),
        ({"term": 2}, VoteResult.REJECT_EXPIRED_VOTE_TERM),
        ({"term": 4}, VoteResult.ACCEPT),
    ],
)
def test_vote_checks_come_in_dledger_order(request_fields, expected):
    node, log = make_node()
    response, _ = vote(node, log, **request_fields)
    assert response.result is expected


def test_a_vote_is_saved_in_the_same_ready_before_the_response_and_given_once_per_term():
    node, log = make_node()
    response, ready = vote(node, log, source="n1", term=4)
    assert response.result is VoteResult.ACCEPT and response.term == 4
    assert ready.hard_state == HardState(4, "n1", -1)  # the driver fsyncs this before sending
    again, ready = vote(node, log, source="n1", term=4)  # a duplicated request
    assert again.result is VoteResult.ACCEPT and ready.hard_state is None
    other, _ = vote(node, log, source="n2", term=4, end_index=7)
    assert other.result is VoteResult.REJECT_ALREADY_VOTED


def test_a_restarted_member_remembers_its_vote():
    node, log = make_node()
    vote(node, log, source="n1", term=4)
    restarted = RaftNode(self_id="n0", members=MEMBERS, log=log, config=RaftConfig(), rng=random.Random(2), now=5.0)
    assert (restarted.term, restarted.voted_for) == (4, "n1")
    response, _ = vote(restarted, log, source="n2", term=4, end_index=9, now=5.0)
    assert response.result is VoteResult.REJECT_ALREADY_VOTED


def test_pre_vote_changes_no_term_and_saves_nothing():
    node, log = make_node()
    response, ready = vote(node, log, source="n1", term=4, pre_vote=True)
    assert response.result is VoteResult.ACCEPT and response.pre_vote and response.term == 4
    assert ready.hard_state is None and node.term == 3 and node.voted_for is None


def test_a_member_that_hears_a_leader_refuses_newcomers_unless_the_leader_hands_over():
    node, log = make_node()
    node.step(Heartbeat("n1", "n0", 3, -1), 0.0)
    carry_out(node, log)
    assert (node.role, node.leader_id) == (Role.FOLLOWER, "n1")
    response, _ = vote(node, log, source="n2", term=4, now=0.5)
    assert response.result is VoteResult.REJECT_LEADER_LEASE and node.term == 3
    response, _ = vote(node, log, source="n2", term=4, transfer=True, now=0.5)
    assert response.result is VoteResult.ACCEPT and node.term == 4


def test_without_check_quorum_there_is_no_lease():
    node, log = make_node(config=RaftConfig(check_quorum=False))
    node.step(Heartbeat("n1", "n0", 3, -1), 0.0)
    carry_out(node, log)
    response, _ = vote(node, log, source="n2", term=4, now=0.5)
    assert response.result is VoteResult.ACCEPT


def test_a_single_member_leads_and_keeps_its_term_across_restarts():
    cluster = SimCluster(seed=1, members=("n0",), config=ETCD_LIKE, network=QUIET)
    assert cluster.run_until_leader(timeout=5) == "n0"
    term = cluster.node("n0").term
    assert term == 1
    assert cluster.propose_and_wait("n0", [b"a"], timeout=1).value == "SUCCESS"
    cluster.crash("n0")
    cluster.start("n0")
    assert cluster.node("n0").term == term and cluster.node("n0").role is Role.FOLLOWER
    cluster.run_until_leader(timeout=5)
    assert cluster.node("n0").term == term + 1


def test_three_members_elect_one_leader_that_the_others_follow():
    cluster = SimCluster(seed=2, config=ETCD_LIKE, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    term = cluster.node(leader).term
    cluster.run_until(cluster.now + 5)  # a healthy group stays put
    assert cluster.leader() == leader and cluster.node(leader).term == term
    assert all(cluster.node(m).leader_id == leader for m in MEMBERS)


def test_after_the_leader_dies_another_takes_over_and_the_old_one_rejoins_as_follower():
    cluster = SimCluster(seed=3, config=ETCD_LIKE, network=QUIET)
    old = cluster.run_until_leader(timeout=10)
    old_term = cluster.node(old).term
    cluster.crash(old)
    started = cluster.now
    new = cluster.run_until_leader(timeout=10)
    assert new != old and cluster.node(new).term > old_term
    # Detection (election timeout, at most 2 s here) plus a pre-vote and a vote round.
    assert cluster.now - started < ETCD_LIKE.election_timeout_max_seconds + 1.0
    cluster.start(old)
    assert cluster.run_until_leader(timeout=5) == new
    assert cluster.node(old).leader_id == new


def test_a_restarted_follower_leaves_leader_and_term_alone():
    cluster = SimCluster(seed=4, config=ETCD_LIKE, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    term = cluster.node(leader).term
    follower = next(m for m in MEMBERS if m != leader)
    cluster.crash(follower)
    cluster.run_until(cluster.now + 3)
    cluster.start(follower)
    cluster.run_until(cluster.now + 3)
    assert cluster.leader() == leader and cluster.node(leader).term == term
    assert cluster.node(follower).leader_id == leader


def partition_a_follower_and_heal(config: RaftConfig) -> tuple[str, int, str, int]:
    cluster = SimCluster(seed=5, config=config, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    term = cluster.node(leader).term
    follower = next(m for m in MEMBERS if m != leader)
    cluster.network.partition([follower])
    cluster.run_until(cluster.now + 10)  # the lonely follower times out again and again
    cluster.network.heal()
    cluster.run_until(cluster.now + 5)
    new_leader = cluster.run_until_leader(timeout=10)
    return leader, term, new_leader, cluster.node(new_leader).term


def test_a_follower_partitioned_away_and_back_does_not_depose_a_healthy_leader():
    leader, term, new_leader, new_term = partition_a_follower_and_heal(ETCD_LIKE)
    assert (new_leader, new_term) == (leader, term)


def test_without_pre_vote_and_check_quorum_the_returning_follower_disrupts_the_group():
    import dataclasses

    leader, term, _, new_term = partition_a_follower_and_heal(
        dataclasses.replace(ETCD_LIKE, pre_vote=False, check_quorum=False)
    )
    assert new_term > term  # what pre-vote and the lease prevent


def test_a_partitioned_leader_steps_down_and_rejoins_with_its_uncommitted_tail_cut():
    cluster = SimCluster(seed=6, config=ETCD_LIKE, network=QUIET)
    old = cluster.run_until_leader(timeout=10)
    assert cluster.propose_and_wait(old, [b"before"], timeout=2).value == "SUCCESS"
    cluster.network.partition([old])
    stranded = cluster.propose(old, [b"stranded-1", b"stranded-2"])  # no quorum: never acknowledged
    cluster.run_until(cluster.now + ETCD_LIKE.election_timeout_min_seconds + 2 * ETCD_LIKE.heartbeat_interval_seconds)
    assert cluster.node(old).role is Role.FOLLOWER  # check-quorum
    assert cluster.results[(old, stranded.first_index)].value == "TERM_CHANGED"
    new = cluster.run_until_leader(timeout=10, among=[m for m in MEMBERS if m != old])
    assert cluster.propose_and_wait(new, [b"after"], timeout=2).value == "SUCCESS"
    cluster.network.heal()
    assert cluster.run_until_leader(timeout=10) == new
    cluster.run_until(cluster.now + 1)
    bodies = [e.body for e in cluster.logs[old].entries]
    assert b"stranded-1" not in bodies and b"after" in bodies
    assert cluster.logs[old].entries == cluster.logs[new].entries


def test_followers_that_see_the_leaders_connection_end_elect_at_once():
    """A killed leader's kernel closes its connections: its followers need not wait out an
    election timeout (1-2 s here), only leader_lost_election_delay_max_seconds and two rounds."""
    cluster = SimCluster(seed=11, config=ETCD_LIKE, network=QUIET)
    old = cluster.run_until_leader(timeout=10)
    cluster.run_until(cluster.now + 1.0)
    cluster.crash(old)  # sends each follower a ConnectionEnded
    started = cluster.now
    new = cluster.run_until_leader(timeout=10, step=0.001)
    assert new != old
    assert cluster.now - started < ETCD_LIKE.leader_lost_election_delay_max_seconds + 0.05
    assert cluster.now - started < ETCD_LIKE.election_timeout_min_seconds / 4


@pytest.mark.parametrize("members", [3, 5])
def test_followers_of_a_dead_leader_do_not_split_the_vote(members):
    """Every seed: a killed leader's successor is elected within the leader-lost delay and two
    round trips, never after an election timeout. With a random moment each, two followers that
    drew moments a few milliseconds apart both passed the pre-vote and split the vote."""
    slow = _slow_failovers(members, QUIET, seeds=200, limit=ETCD_LIKE.leader_lost_election_delay_max_seconds + 0.05)
    assert not slow, f"elections after a leader's death that waited out a timeout (seed, seconds): {slow}"


def _slow_failovers(members: int, network: NetworkConfig, *, seeds: int, limit: float) -> list[tuple[int, float]]:
    """(seed, seconds) of the seeds whose group, its leader crashed, took longer than ``limit``
    to elect another."""
    slow = []
    for seed in range(seeds):
        cluster = SimCluster(seed=seed, config=ETCD_LIKE, network=network, members=tuple(f"n{i}" for i in range(members)))
        old = cluster.run_until_leader(timeout=10)
        cluster.run_until(cluster.now + 0.5)
        cluster.crash(old)
        started = cluster.now
        cluster.run_until_leader(timeout=10, step=0.001, among=[m for m in cluster.members if m != old])
        if cluster.now - started > limit:
            slow.append((seed, round(cluster.now - started, 3)))
    return slow


# Links of 2-30 ms (a loaded host): a pre-vote round trip can outlast a survivor's slot (25 ms with
# 3 members), so the survivors' pre-votes cross.
SLOW = NetworkConfig(delay_min_seconds=0.002, delay_max_seconds=0.030, fifo=True)


@pytest.mark.parametrize("members", [3, 5])
def test_followers_of_a_dead_leader_over_slow_links_do_not_split_the_vote(members):
    """Every seed: over slow links a killed leader's successor is elected well within an election
    timeout. Before survivors gave way to a pre-vote they granted (pre_vote_granted_hold_seconds),
    two whose pre-votes crossed both went on to the real vote and split it: 79 seeds of these 300
    waited out an election timeout with 3 members, 86 with 5."""
    slow = _slow_failovers(members, SLOW, seeds=300, limit=ETCD_LIKE.election_timeout_min_seconds / 2)
    assert not slow, f"elections after a leader's death that waited out a timeout (seed, seconds): {slow}"


def _pre_candidate(config, self_id="n1"):
    """A member whose election timeout passed: it asks for pre-votes (its term unchanged)."""
    node, log = make_node(config=config, self_id=self_id)
    node.tick(100.0)
    ready = carry_out(node, log)
    assert node.role is Role.CANDIDATE and node.term == 3
    assert {m.target for m in ready.messages if isinstance(m, VoteRequest) and m.pre_vote} == {"n0", "n2"}
    return node, log


@pytest.mark.parametrize(
    ("source", "end_index", "gives_way"),
    [("n0", 2, True), ("n2", 2, False), ("n2", 3, True)],  # a lower id, a higher id, a newer log
)
def test_a_pre_candidate_that_grants_a_crossing_pre_vote_gives_way_to_a_newer_log_or_a_lower_id(
    source, end_index, gives_way
):
    """Of two pre-candidates whose pre-votes crossed exactly one goes on: the one with the newer
    log, or with logs as new the lower id. The one that gives way holds its own election for
    pre_vote_granted_hold_seconds; with the hold off both go on (and split the real vote)."""
    for config, expected in ((ETCD_LIKE, gives_way), (dataclasses.replace(ETCD_LIKE, pre_vote_granted_hold_seconds=0.0), False)):
        node, log = _pre_candidate(config)
        node.step(VoteRequest(source, "n1", 4, end_index, 2, True, False), 100.0)
        ready = carry_out(node, log)
        (response,) = [m for m in ready.messages if isinstance(m, VoteResponse)]
        assert response.result is VoteResult.ACCEPT and response.pre_vote
        assert (node.role is Role.FOLLOWER) is expected, (config.pre_vote_granted_hold_seconds, node.role)
        assert node.term == 3 and node.voted_for is None  # a pre-vote changes neither
        if expected:
            hold = config.pre_vote_granted_hold_seconds
            node.tick(100.0 + hold * 0.9)
            assert node.role is Role.FOLLOWER
            node.tick(100.0 + hold * 1.1)  # the other did not win meanwhile: this member tries again
            assert node.role is Role.CANDIDATE


def test_a_follower_that_grants_a_pre_vote_starts_no_election_of_its_own_during_the_hold():
    """n1, the leader, died; n0's slot comes before n2's. n2 granted n0's pre-vote: its own slot
    passes without a campaign of its own (n0's vote request is on its way), unless the hold is off."""
    for hold, campaigns in ((ETCD_LIKE.pre_vote_granted_hold_seconds, False), (0.0, True)):
        node, log = make_node(config=dataclasses.replace(ETCD_LIKE, pre_vote_granted_hold_seconds=hold), self_id="n2")
        node.step(Heartbeat("n1", "n2", 3, -1), 0.0)
        carry_out(node, log)
        node.peer_unreachable("n1", 0.5)  # its slot: 0.575-0.581 s
        carry_out(node, log)
        node.step(VoteRequest("n0", "n2", 4, 2, 2, True, False), 0.55)
        (response,) = [m for m in carry_out(node, log).messages if isinstance(m, VoteResponse)]
        assert response.result is VoteResult.ACCEPT
        node.tick(0.65)
        carry_out(node, log)
        assert (node.role is Role.CANDIDATE) is campaigns, (hold, node.role)


def test_a_followers_broken_connection_alone_does_not_depose_a_healthy_leader():
    cluster = SimCluster(seed=12, config=ETCD_LIKE, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    term = cluster.node(leader).term
    follower = next(m for m in MEMBERS if m != leader)
    for _ in range(5):
        cluster.reset_connection(leader, follower)  # it campaigns; the other follower's lease refuses it
        cluster.run_until(cluster.now + 1.0)
    assert cluster.leader() == leader and cluster.node(leader).term == term
    assert cluster.node(follower).leader_id == leader


def test_the_connection_of_a_non_leader_ending_changes_nothing():
    node, log = make_node(config=ETCD_LIKE)
    before = node.deadline()
    node.peer_unreachable("n1", now=0.5)  # n1 is no leader of n0's
    assert node.deadline() == before and not node.ready().messages


def test_without_pre_vote_a_broken_connection_is_ignored():
    config = RaftConfig(heartbeat_interval_seconds=0.1, election_timeout_min_seconds=1.0,
                        election_timeout_max_seconds=2.0, pre_vote=False)  # fmt: skip
    cluster = SimCluster(seed=13, config=config, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    term = cluster.node(leader).term
    follower = next(m for m in MEMBERS if m != leader)
    cluster.reset_connection(leader, follower)  # without pre-vote a campaign would bump the term
    cluster.run_until(cluster.now + 0.5)
    assert cluster.leader() == leader and cluster.node(leader).term == term


def test_a_vote_refused_for_the_log_still_adopts_the_candidates_term():
    """Raft §5.1 (DLedger does not): else a voter with a newer log stays a term behind, and
    campaigns in a term that members with older logs already spent voting for each other
    (raft_sim seed 7784, 5 nodes, no pre-vote: no leader for 20 s after healing)."""
    node, log = make_node()  # term 3, log ends (2, 2); no leader known
    response, ready = vote(node, log, term=6, end_index=0, end_term=1)
    assert response.result is VoteResult.REJECT_EXPIRED_LEDGER_TERM
    assert node.term == response.term == 6 and node.role is Role.FOLLOWER and node.voted_for is None
    assert ready.hard_state == HardState(6, None, -1)  # saved before the refusal goes out
    assert vote(node, log, term=6, end_index=2, end_term=2, source="n2")[0].result is VoteResult.ACCEPT
    pre, _ = vote(node, log, term=9, end_index=0, end_term=1, pre_vote=True)
    assert pre.result is VoteResult.REJECT_EXPIRED_LEDGER_TERM and node.term == 6  # a pre-vote changes no term


def test_a_vote_refused_for_the_log_within_a_leaders_lease_keeps_the_term():
    config = dataclasses.replace(DLEDGER_DEFAULTS, check_quorum=True)
    node, log = make_node(config=config)
    node.step(Heartbeat("n2", "n0", 3, -1), 0.0)  # n2 leads term 3: its lease runs
    carry_out(node, log)
    response, _ = vote(node, log, term=6, end_index=0, end_term=1, now=0.1)
    assert response.result is VoteResult.REJECT_EXPIRED_LEDGER_TERM
    assert (node.term, node.leader_id) == (3, "n2")
