"""A member whose log came back shorter than what it acknowledged (a damaged entry cut by recovery,
an unflushed tail lost at a crash): the leader notices and compares again from the member's end,
and the member's catch-up mark keeps its vote from electing a log that lacks what it had
(``hasvc.state.raft.node``, "Lost entries")."""

import random

from hasvc.state.raft import DLEDGER_DEFAULTS, Entry, HardState, RaftNode, Role
from hasvc.state.raft.messages import (
    Heartbeat,
    Push,
    PushResponse,
    PushResult,
    PushType,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from hasvc.testing.log import SimLog
from hasvc.testing.network import NetworkConfig
from hasvc.testing.raft_cluster import SimCluster
from tests.unit.test_raft_replication import MEMBERS, append, carry_out, elect, make_node

QUIET = NetworkConfig(delay_min_seconds=0.001, delay_max_seconds=0.005, fifo=True)


def pushes_to(ready, target):
    return [m for m in ready.messages if isinstance(m, Push) and m.target == target]


def test_out_of_order_below_the_match_index_lowers_it_and_compares_from_the_members_end():
    node, log = make_node([1, 1, 1, 1, 1], term=1)
    elect(node, log, 10.0)  # the no-op of term 2 at index 5
    node.step(PushResponse("n1", "n0", 2, PushType.COMPARE, PushResult.SUCCESS, 4, 4, 0, 4), 10.1)
    carry_out(node, log)
    node.step(PushResponse("n1", "n0", 2, PushType.APPEND, PushResult.SUCCESS, 5, 5, 0, 5), 10.2)
    carry_out(node, log)
    assert node.match_index("n1") == 5
    # n1 restarted with entries 0..2 only: a push of 6 is beyond its end.
    node.propose([b"x"], 10.3)
    carry_out(node, log)
    node.step(PushResponse("n1", "n0", 2, PushType.APPEND, PushResult.OUT_OF_ORDER, 6, -1, 0, 2), 10.4)
    ready = carry_out(node, log)
    assert node.match_index("n1") == 2
    assert node.status(10.4).peers["n1"].match_index == 2
    assert [(p.type, p.index) for p in pushes_to(ready, "n1")] == [(PushType.COMPARE, 2)]
    node.step(PushResponse("n1", "n0", 2, PushType.COMPARE, PushResult.SUCCESS, 2, 2, 0, 2), 10.5)
    ready = carry_out(node, log)
    assert [(p.type, p.index) for p in pushes_to(ready, "n1")] == [(PushType.APPEND, 3)]
    assert pushes_to(ready, "n1")[0].entries.last_index == 6


def test_a_follower_told_a_commit_beyond_its_end_says_where_its_log_ends():
    node, log = make_node([1, 1, 1], term=1, self_id="n1")
    node.step(Heartbeat("n0", "n1", 1, 5), 0.0)  # the leader's match for us is 5: we lost 3..5
    answers = [m for m in carry_out(node, log).messages if isinstance(m, PushResponse)]
    assert [(a.result, a.end_index, a.ack_index) for a in answers] == [(PushResult.OUT_OF_ORDER, 2, -1)]
    node.step(Heartbeat("n0", "n1", 1, 2), 0.1)  # a caught-up view: nothing to say
    assert not [m for m in carry_out(node, log).messages if isinstance(m, PushResponse)]


def test_out_of_order_is_answered_again_after_a_heartbeat():
    node, log = make_node([1], term=1, self_id="n1")
    answers = []
    for at, index in ((0.0, 3), (0.1, 3)):
        node.step(append(log, 1, index, 1, -1, (Entry(index, 1, b"x"),)), at)
        answers.extend(carry_out(node, log).messages)
    node.step(Heartbeat("n0", "n1", 1, -1), 0.2)
    carry_out(node, log)
    node.step(append(log, 1, 3, 1, -1, (Entry(3, 1, b"x"),)), 0.3)
    answers.extend(carry_out(node, log).messages)
    assert [(a.result, a.end_index) for a in answers] == [(PushResult.OUT_OF_ORDER, 0)] * 2


def marked_node(terms, *, term, mark):
    log = SimLog()
    log.append([Entry(i, t, b"e%d" % i) for i, t in enumerate(terms)])
    log.flush()
    log.save_hard_state(HardState(term, None, -1, mark[0], mark[1]))
    node = RaftNode(self_id="n1", members=MEMBERS, log=log, config=DLEDGER_DEFAULTS, rng=random.Random(7), now=0.0)
    return node, log


def vote(node, log, source, term, end_term, end_index, *, pre_vote=False, at=100.0):
    node.step(VoteRequest(source, "n1", term, end_index, end_term, pre_vote), at)
    (answer,) = [m for m in carry_out(node, log).messages if isinstance(m, VoteResponse)]
    return answer.result


def test_a_member_below_its_catch_up_mark_votes_as_if_its_log_ended_there():
    node, log = marked_node([1, 1, 1], term=1, mark=(1, 5))  # it held 0..5 of term 1, recovery kept 0..2
    assert node.status(0.0).catch_up_index == 5
    # Longer than what it holds now, shorter than what it had: refused, pre-vote and vote.
    assert vote(node, log, "n2", 2, 1, 3, pre_vote=True) is VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    assert vote(node, log, "n2", 2, 1, 4) is VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    assert vote(node, log, "n2", 3, 0, 9) is VoteResult.REJECT_EXPIRED_LEDGER_TERM
    # At least what it had: granted.
    assert vote(node, log, "n0", 4, 1, 5) is VoteResult.ACCEPT


def test_a_member_below_its_catch_up_mark_stands_for_no_election_until_caught_up():
    node, log = marked_node([1, 1, 1], term=1, mark=(1, 5))
    for at in (10.0, 20.0, 30.0):
        node.tick(at)
        ready = carry_out(node, log)
        assert node.role is Role.FOLLOWER
        assert not [m for m in ready.messages if isinstance(m, VoteRequest)]
    # A leader catches it up to 5 (appended, then flushed): the mark is cleared, durably.
    source = SimLog()
    source.append([Entry(i, 1, b"e%d" % i) for i in range(6)])
    node.step(Push("n0", "n1", 2, PushType.APPEND, 3, 1, 5, source.run_of([source.entry_at(i) for i in (3, 4, 5)])), 31.0)
    ready = carry_out(node, log)
    assert node.status(31.0).catch_up_index == 5  # in the log, not flushed yet
    node.persisted(log.flush(), 31.1)
    ready = carry_out(node, log)
    assert node.status(31.1).catch_up_index == -1
    assert (ready.hard_state.catch_up_term, ready.hard_state.catch_up_index) == (-1, -1)
    assert log.load_hard_state().catch_up_index == -1
    assert vote(node, log, "n2", 3, 1, 5, at=100.0) is VoteResult.ACCEPT


def test_a_follower_that_lost_acknowledged_entries_is_caught_up_within_the_leaders_term():
    cluster = SimCluster(seed="lost-tail", config=DLEDGER_DEFAULTS, network=QUIET)
    leader = cluster.run_until_leader(timeout=30.0)
    for n in range(5):
        assert cluster.propose_and_wait(leader, [b"m%d" % n], timeout=10.0).value == "SUCCESS"
    follower = next(m for m in cluster.members if m != leader)
    term, end = cluster.node(leader).term, cluster.logs[follower].last_index()
    assert cluster.node(leader).match_index(follower) == end
    cluster.crash(follower)
    cluster.logs[follower]._cut(end - 3)  # its tail is gone (acknowledged, committed)
    cluster.start(follower)
    cluster.run_until(cluster.now + 5.0)  # heartbeats only: nothing new is proposed
    assert cluster.node(leader).term == term and cluster.leader() == leader
    assert cluster.logs[follower].last_index() == end
    assert cluster.node(leader).match_index(follower) == end


def test_a_member_that_lost_committed_entries_does_not_elect_a_log_without_them():
    """Alagappan et al.'s case: n0 and n1 commit entries n2 lacks; n1 loses them; n0 goes down.
    Without the mark n1 would vote for n2, whose term would overwrite them (the checker raises)."""
    cluster = SimCluster(seed="par", config=DLEDGER_DEFAULTS, network=QUIET)
    cluster.run_until_leader(timeout=30.0)
    while cluster.leader() != "n0":  # make n0 lead
        cluster.run_until(cluster.now + 0.5)
        current = cluster.leader()
        if current not in (None, "n0"):
            cluster.transfer_leadership(current, "n0")
    leader = cluster.run_until_leader(timeout=30.0)
    assert leader == "n0"
    cluster.network.partition(["n2"])
    for n in range(5):
        assert cluster.propose_and_wait("n0", [b"m%d" % n], timeout=10.0).value == "SUCCESS"
    committed = cluster.node("n0").committed_index
    old_end_term, old_end = cluster.logs["n1"].last_term(), cluster.logs["n1"].last_index()
    assert cluster.logs["n2"].last_index() < committed
    cluster.crash("n1")
    lost_from = cluster.logs["n2"].last_index() + 1
    cluster.logs["n1"]._cut(lost_from - 1)  # damaged: cut by recovery, the mark recorded
    saved = cluster.logs["n1"].load_hard_state()
    cluster.logs["n1"].save_hard_state(HardState(saved.term, saved.voted_for, -1, old_end_term, old_end))
    cluster.crash("n0")
    cluster.network.heal()
    cluster.start("n1")
    cluster.run_until(cluster.now + 30.0)
    assert cluster.leader() is None  # n2 cannot win without n1, n1 stands for nothing
    cluster.start("n0")
    leader = cluster.run_until_leader(timeout=30.0)
    assert cluster.propose_and_wait(leader, [b"after"], timeout=10.0).value == "SUCCESS"
    cluster.run_until(cluster.now + 2.0)
    end = cluster.node(leader).last_index
    logs = [[cluster.logs[m].entry_at(i) for i in range(end + 1)] for m in cluster.members]
    assert logs[0] == logs[1] == logs[2]
    assert cluster.node("n1").status(cluster.now).catch_up_index == -1
