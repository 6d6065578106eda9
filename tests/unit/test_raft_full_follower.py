"""A follower that cannot append (its disk full) costs its leader a bounded number of pushes.

The driver's ``_append_failed`` (and the simulator's twin) rebuilds a follower's core from its
stored log when the Ready's entries find no room; the rebuilt core no longer knows it answered
OUT_OF_ORDER for its end. Before probing (``hasvc.state.raft.tracker``: one batch after an
OUT_OF_ORDER, a repeat of the same end ignored while that batch's timer runs), every such answer
restarted the leader's whole window, and each window brought another answer: a storm of pushes
that grew with the window (raft_sim seed 5925, 3 nodes, livelocked at a million events). Here the
cores are driven by hand, as the driver does, with n2 down: the leader n0 holds a window of
entries in flight for n1, whose every append fails."""

import collections
import dataclasses
import random

from hasvc.state.raft import ETCD_LIKE, HardState, RaftNode, Role
from hasvc.state.raft.messages import Push, PushResponse
from hasvc.testing.log import SimLog
from hasvc.testing.raft_cluster import with_stored_runs
from tests.unit.test_raft_replication import MEMBERS, carry_out, elect, make_node

# One entry per push (a body is more than 1 byte), a window far larger than what the leader holds.
CONFIG = dataclasses.replace(ETCD_LIKE, heartbeat_interval_seconds=0.075, election_timeout_min_seconds=0.3,
                             election_timeout_max_seconds=0.6, push_timeout_seconds=0.1, push_batch_size_max=1,
                             push_in_flight_max=1000, quorum_ack_timeout_seconds=10.0)  # fmt: skip
DELAY = 0.001  # one way, every message (FIFO)
STEP = 0.0005  # the clock's step


class FullFollower:
    """n1 as its driver runs it on a full disk: a Ready with entries to store is dropped (its
    messages too) and the core rebuilt from the log, which never changes."""

    def __init__(self, now: float) -> None:
        self.full = True
        self.log = SimLog()
        self.log.save_hard_state(HardState(1, None, -1))
        self.rebuilds = 0
        self.node = self._core(now)

    def _core(self, now: float) -> RaftNode:
        node = RaftNode(self_id="n1", members=MEMBERS, log=self.log, config=CONFIG, rng=random.Random(self.rebuilds),
                        now=now)  # fmt: skip
        node.disk_full = self.full
        return node

    def drain(self, now: float) -> list:
        ready = self.node.ready()
        if ready.hard_state is not None:
            self.log.save_hard_state(ready.hard_state)
        if self.full and (ready.entries or ready.runs):  # no room: the driver's _append_failed
            self.rebuilds += 1
            self.node = self._core(now)
            return []
        for run in ready.runs:
            self.log.append_run(run)
        if ready.runs:
            self.node.persisted(self.log.flush(), now)  # flushed at once
            return list(ready.messages) + list(self.node.ready().messages)
        return list(ready.messages)


def pushes_in(seconds: float, *, count_from: float, room_at: float = float("inf")):
    """Run the pair for ``seconds`` from t=10 (n1's disk has room from ``room_at`` on); return
    what each sent from ``count_from`` on (by kind), the follower's rebuilds, the leader and the follower."""
    leader, leader_log = make_node([1] * 5, term=1, config=CONFIG)
    elect(leader, leader_log, 10.0)
    now = 10.0
    for n in range(20):  # entries in flight for n1 (nobody acknowledges them: n2 is down)
        leader.propose([b"body-%02d" % n], now)
    follower = FullFollower(now)
    wire: collections.deque = collections.deque()  # (due, message), FIFO: every message takes DELAY
    sent: collections.Counter = collections.Counter()

    def send(messages, at):
        for message in messages:
            for wire_message in with_stored_runs(message, leader_log):
                if wire_message.target == "n2":
                    continue  # down
                if at >= count_from:
                    kind = wire_message.type.name if isinstance(wire_message, (Push, PushResponse)) else ""
                    result = wire_message.result.name if isinstance(wire_message, PushResponse) else ""
                    sent[(wire_message.source, type(wire_message).__name__, kind, result)] += 1
                wire.append((at + DELAY, wire_message))

    send(carry_out(leader, leader_log).messages, now)
    end = now + seconds
    while now < end:
        now += STEP
        if now >= room_at and follower.full:
            follower.full = follower.node.disk_full = False
        while wire and wire[0][0] <= now:
            _, message = wire.popleft()
            if message.target == "n1":
                follower.node.step(message, now)
                send(follower.drain(now), now)
            else:
                leader.step(message, now)
                send(carry_out(leader, leader_log).messages, now)
        if now >= leader.deadline():
            leader.tick(now)
            send(carry_out(leader, leader_log).messages, now)
        if now >= follower.node.deadline():
            follower.node.tick(now)
            send(follower.drain(now), now)
    return sent, follower.rebuilds, leader, follower


def test_a_full_follower_costs_its_leader_one_push_per_push_timeout():
    seconds = 1.0
    sent, rebuilds, leader, _follower = pushes_in(1.0 + seconds, count_from=11.0)
    assert leader.role is Role.LEADER and leader.match_index("n1") == -1  # it stayed full throughout
    assert rebuilds > 0  # its appends failed, and its core started over each time
    appends = sent[("n0", "Push", "APPEND", "")]
    out_of_order = sent[("n1", "PushResponse", "APPEND", "OUT_OF_ORDER")]
    # The one batch a push timeout (each push timeout, plus one re-probe a heartbeat may bring):
    # 20 entries in flight re-pushed on every answer would be thousands.
    bound = 2 * seconds / CONFIG.push_timeout_seconds + 2
    assert 0 < appends <= bound, sent
    assert out_of_order <= bound, sent


def test_a_full_follower_is_caught_up_once_it_has_room_again():
    """Probing only slows the pushes: once the disk has room, the next probe is appended and
    acknowledged, and the whole window follows."""
    _sent, _rebuilds, leader, follower = pushes_in(2.0, count_from=10.0, room_at=11.0)
    assert follower.log.last_index() == leader.last_index == leader.match_index("n1")
