"""Where a member's retention may delete from: a pure function of what the Raft core knows.

Theory of operation
-------------------
Retention (DLedger's CleanSpaceService) deletes head data files whose entries lie below
``keep_from_index``; the store adds its own limits (the committed, flushed and dispatched index,
the file being written). ``RaftNode.retention_floor`` is what no member may still need: a leader's
own committed index and every follower's match index, a follower's the floor its leader last
announced. Below the disk's ``disk_clean_ratio`` that floor is the answer, whatever the files' age.

Above the ratio (disk pressure) the age of the files no longer counts, and the floor is set aside
only where it says nothing: a follower whose match index the leader does not know (-1: down
since before this term, or not answered yet) holds the floor at -1, keeping everything, while
what it needs is unknown. So:

* a leader keeps from the lowest match index it knows -- a member that is down, by its last known
  match; a lagging live one, by its own -- and leaves out only the followers whose match it does
  not know (they are RESET to its first index when they come back, ``behind_log_start`` until
  they answered); when it knows none, the floor stands. Never "regardless": whether a silent
  member is down or merely slow is not known for an election timeout after it went, and a member
  whose match is known can always be caught up by APPEND if its entries stay;
* a follower keeps its floor (the one its leader last announced): it cannot tell who is down or
  lagging, and it may lead next, when they will need from it what the leader kept.

Nothing here reads a clock or a disk: the driver passes the ratio's verdict and the core's view.
"""

from __future__ import annotations

from collections.abc import Iterable

from hasvc.state.raft.ready import Role


def retention_keep_from(*, floor: int, over_ratio: bool, leading: bool, matches: Iterable[int]) -> int:
    """The index from which retention keeps every entry (see the module). ``floor``: the core's
    ``retention_floor()``; ``matches``: a leader's match index of each follower (-1: not known)."""
    if not over_ratio or not leading:
        return floor
    known = [match for match in matches if match >= 0]
    return min(known) if known else floor


def node_keep_from(node, *, over_ratio: bool, now: float) -> int:
    """``retention_keep_from`` with a ``RaftNode``'s view at ``now`` (the driver's one call): its
    floor, its role, each follower's match index."""
    status = node.status(now)
    return retention_keep_from(floor=node.retention_floor(), over_ratio=over_ratio, leading=status.role is Role.LEADER,
                               matches=[seen.match_index for seen in status.peers.values()])  # fmt: skip


__all__ = ["node_keep_from", "retention_keep_from"]
