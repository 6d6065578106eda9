"""``hasvc.state.raft.retention``: where a member's retention may delete from. Below the disk's
clean ratio the core's floor; above it a leader keeps from the lowest match index it knows (a
member that is down by its last known match; one whose match is unknown is left out), and a
follower keeps its floor."""

from hasvc.state.raft.ready import PeerStatus, RaftStatus, Role
from hasvc.state.raft.retention import node_keep_from, retention_keep_from


def keep(*, floor=5, over_ratio=True, leading=True, matches=()):
    return retention_keep_from(floor=floor, over_ratio=over_ratio, leading=leading, matches=matches)


def test_below_the_clean_ratio_the_floor_is_the_answer_whatever_the_members_do():
    assert keep(over_ratio=False, floor=7, matches=[40, 7]) == 7
    assert keep(over_ratio=False, leading=False, floor=3) == 3
    assert keep(over_ratio=False, floor=-1, matches=[-1, 30]) == -1  # an unknown member keeps everything


def test_above_the_ratio_a_leader_keeps_from_the_last_known_match_of_a_member_that_is_down():
    # n2 went down at 7; the forced clean used to delete regardless, stranding it
    assert keep(floor=7, matches=[40, 7]) == 7


def test_above_the_ratio_a_leader_keeps_from_the_lowest_match_it_knows():
    # n2 is down and its match unknown (down since before this term): a lagging n1 still holds it back
    assert keep(floor=-1, matches=[12, -1, 50]) == 12
    assert keep(floor=3, matches=[3, 30]) == 3
    # nothing known at all: the floor stands (-1 keeps everything)
    assert keep(floor=-1, matches=[-1, -1]) == -1
    # a group of one: its own floor (its committed index)
    assert keep(floor=90, matches=[]) == 90


def test_above_the_ratio_a_follower_keeps_its_floor():
    assert keep(leading=False, floor=9, matches=[]) == 9
    assert keep(leading=False, floor=-1) == -1


class _Node:
    """What ``node_keep_from`` reads of a RaftNode."""

    def __init__(self, role, matches, floor):
        self._floor = floor
        peers = {f"n{i + 1}": PeerStatus(match, 100 - match, 0.5) for i, match in enumerate(matches)}
        self._status = RaftStatus("n0", role, 3, "n0", 100, 90, 100, 0, peers)

    def status(self, now):
        return self._status

    def retention_floor(self):
        return self._floor


def test_node_keep_from_reads_the_core_s_view():
    assert node_keep_from(_Node(Role.LEADER, [40, -1], -1), over_ratio=True, now=0.0) == 40
    assert node_keep_from(_Node(Role.LEADER, [40, -1], -1), over_ratio=False, now=0.0) == -1
    assert node_keep_from(_Node(Role.FOLLOWER, [], 20), over_ratio=True, now=0.0) == 20
