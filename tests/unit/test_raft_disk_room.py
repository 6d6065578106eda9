"""``hasvc.state.raft.disk_room``: a leader whose disk is full hands leadership over only to a
follower that said it has room, and never twice in a cascade; the follower's flag on the wire
(HEARTBEAT_RESPONSE's optional flags byte) and the core's use of it."""

import random

import pytest

from hasvc.protocol import raft as wire
from hasvc.state.raft.disk_room import disk_step_down_target
from hasvc.state.raft.messages import HeartbeatResponse, HeartbeatResult

HOLD, WINDOW = 2.0, 1.0


def target(*, full=True, led=10.0, transferring=False, followers, full_seconds=5.0):
    return disk_step_down_target(full_seconds=full_seconds if full else None, led_seconds=led, hold_seconds=HOLD, transferring=transferring,
                                 followers=followers, contact_window_seconds=WINDOW)  # fmt: skip


def test_a_leader_with_room_stays():
    assert target(full=False, followers={"n1": (False, 9, 0.1)}) is None


def test_a_full_leader_hands_over_only_to_a_follower_that_said_it_has_room():
    assert target(followers={"n1": (True, 9, 0.1), "n2": (False, 7, 0.1)}) == "n2"
    assert target(followers={"n1": (True, 9, 0.1), "n2": (True, 9, 0.1)}) is None  # every member full: stay
    assert target(followers={"n1": (None, 9, 0.1)}) is None  # not said yet (an older member, or no answer)
    assert target(followers={"n1": (False, 9, 1.5)}) is None  # silent: maybe down, its flag stale
    assert target(followers={}) is None  # a group of one


def test_only_a_report_heard_since_the_leader_found_its_disk_full_counts():
    assert target(full_seconds=0.05, followers={"n1": (False, 9, 0.1)}) is None  # said before: maybe stale
    assert target(full_seconds=0.15, followers={"n1": (False, 9, 0.1)}) == "n1"


def test_the_follower_with_room_that_needs_least_is_chosen():
    assert target(followers={"n1": (False, 7, 0.1), "n2": (False, 9, 0.1), "n3": (False, 9, 0.2)}) == "n2"


def test_never_two_in_a_cascade():
    # the new leader (handed over to a moment ago, on a room report stale by then) does not hand over again
    assert target(led=0.5, followers={"n2": (False, 9, 0.1)}) is None
    assert target(transferring=True, followers={"n2": (False, 9, 0.1)}) is None


@pytest.mark.parametrize("full", [False, True])
def test_the_flag_on_the_wire(full):
    message = HeartbeatResponse("n1", "n0", 5, HeartbeatResult.SUCCESS, full)
    frame = wire.encode(message)
    assert len(frame) == 5 + 9 + (1 if full else 0)  # sent only when set: a 9-byte body as before otherwise
    assert _decode(frame) == message


def _decode(frame: bytes):
    decoder = wire.RaftDecoder()
    decoder.receive_data(wire.encode_hello(wire.Hello("g1", "n1", "n0")) + frame)
    decoder.next_event()  # the HELLO
    return decoder.next_event()


def test_unknown_flag_bits_are_a_protocol_error():
    frame = bytearray(wire.encode(HeartbeatResponse("n1", "n0", 5, HeartbeatResult.SUCCESS, True)))
    frame[-1] = 0x02
    with pytest.raises(wire.ProtocolError, match="unknown bits"):
        _decode(bytes(frame))


# -- the core, in the simulated cluster (real RaftNodes, a simulated network and clock) -----------

from hasvc.state.raft import ETCD_LIKE, ProposalStatus  # noqa: E402
from hasvc.testing.network import NetworkConfig  # noqa: E402
from hasvc.testing.raft_cluster import SimCluster  # noqa: E402

MEMBERS = ("n0", "n1", "n2")
QUIET = NetworkConfig(delay_min_seconds=0.001, delay_max_seconds=0.005, fifo=True)


def _leaders(cluster, *, seconds: float, step: float = 0.05) -> list[str]:
    """The leader seen every ``step`` over ``seconds`` of simulated time, repeats dropped."""
    seen: list[str] = []
    end = cluster.now + seconds
    while cluster.now < end:
        cluster.run_until(cluster.now + step)
        leader = cluster.leader()
        if leader is not None and (not seen or seen[-1] != leader):
            seen.append(leader)
    return seen


def _started(seed: int):
    cluster = SimCluster(seed=seed, config=ETCD_LIKE, network=QUIET)
    leader = cluster.run_until_leader(timeout=10)
    assert cluster.propose_and_wait(leader, [b"a"], timeout=2) is ProposalStatus.SUCCESS
    cluster.run_until(cluster.now + 2 * ETCD_LIKE.election_timeout_max_seconds)  # led past the hold
    return cluster, leader


def test_a_full_leader_hands_over_to_the_follower_with_room_which_keeps_it():
    cluster, leader = _started(41)
    full, roomy = [m for m in MEMBERS if m != leader]
    cluster.node(full).disk_full = True
    cluster.node(leader).disk_full = True
    assert _leaders(cluster, seconds=20) == [leader, roomy]  # one hand-over, then it stays
    assert cluster.propose_and_wait(roomy, [b"b"], timeout=2) is ProposalStatus.SUCCESS


def test_when_every_member_is_full_the_leader_stays():
    cluster, leader = _started(42)
    term = cluster.node(leader).term
    for member in MEMBERS:
        cluster.node(member).disk_full = True
    assert _leaders(cluster, seconds=20) == [leader]
    assert cluster.node(leader).term == term


def test_a_leader_handed_over_to_on_a_stale_report_does_not_hand_over_again_at_once():
    cluster, leader = _started(43)
    cluster.node(leader).disk_full = True  # both followers have room: it hands over to one
    for _ in range(1000):
        cluster.run_until(cluster.now + 0.01)
        if cluster.leader() not in (None, leader):
            break
    new = cluster.leader()
    assert new not in (None, leader)
    cluster.node(new).disk_full = True  # full by the time it leads; the old leader's disk frees
    cluster.node(leader).disk_full = False
    took_over = cluster.now
    hold = ETCD_LIKE.election_timeout_max_seconds
    assert _leaders(cluster, seconds=hold * 0.9, step=0.01) == [new]  # not within the hold
    later = _leaders(cluster, seconds=20)
    assert later == [new, leader] and cluster.now - took_over > hold, later  # then to the member with room


def test_a_preferred_leader_whose_disk_is_full_is_not_handed_leadership_back():
    import dataclasses

    config = dataclasses.replace(ETCD_LIKE, preferred_leader_id="n0")
    cluster = SimCluster(seed=44, config=config, network=QUIET)
    for _ in range(100):
        if cluster.run_until_leader(timeout=10) == "n0":
            break
        cluster.run_until(cluster.now + 1)
    assert cluster.leader() == "n0"
    cluster.run_until(cluster.now + 2 * config.election_timeout_max_seconds)
    cluster.node("n0").disk_full = True
    seen = _leaders(cluster, seconds=20)
    assert seen[0] == "n0" and len(seen) == 2, seen  # handed over once, never back while n0 is full
    cluster.node("n0").disk_full = False  # space freed: the preferred leader gets it back
    assert _leaders(cluster, seconds=20)[-1] == "n0"


@pytest.mark.parametrize("seed", range(20))
def test_random_disks_filling_and_freeing_never_cascade(seed):
    """Disks fill and free at random moments (no crash, no partition: only the disks move the
    leadership): two hand-overs are always at least the hold apart."""
    rng = random.Random(f"disk-{seed}")
    cluster, _leader = _started(1000 + seed)
    full = {member: False for member in MEMBERS}
    hold = ETCD_LIKE.election_timeout_max_seconds
    changes: list[tuple[float, str]] = []
    current = cluster.leader()
    next_flip = cluster.now + rng.uniform(0.2, 3.0)
    end = cluster.now + 60
    while cluster.now < end:
        cluster.run_until(cluster.now + 0.01)
        if cluster.now >= next_flip:
            member = rng.choice(MEMBERS)
            full[member] = not full[member]
            next_flip = cluster.now + rng.uniform(0.2, 3.0)
        for member in MEMBERS:
            cluster.node(member).disk_full = full[member]
        leader = cluster.leader()
        if leader is not None and leader != current:
            changes.append((cluster.now, leader))
            current = leader
    times = [at for at, _ in changes]  # seen at most one poll (0.01 s) after they happened
    assert all(b - a >= hold - 0.01 for a, b in zip(times, times[1:])), changes  # never two in a cascade
