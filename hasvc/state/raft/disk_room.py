"""When a leader whose disk is full hands leadership over: a pure function of what it knows.

Theory of operation
-------------------
A leader that cannot append (its disk above ``disk_max_used_space_ratio``, or no room for the files
its next entries need) answers every put DISK_FULL; the group takes no writes while it leads. Were
another member to lead, with room on its disk, writes would go on. But a leader that steps down
whatever the others' disks say hands the group from one full member to the next -- each new
leader steps down in turn, and the group ends with no leader at all (the failure this module
exists for: a leader exited on a full disk, then the next one 70 ms later).

So members say whether they have room: each follower's HEARTBEAT_RESPONSE carries a flag,
DISK_FULL, set while it cannot append (docs/PROTOCOL.md §4, kind 4); the leader keeps the last
one heard from each follower in this term (``Progress.disk_full``: None until one answered). A
leader steps down for its disk (``disk_step_down_target``) only

* when its own disk is full;
* to a follower that said it has room in a heartbeat response of this term heard after the leader
  found its own disk full (an older one may be stale: the follower's disk may have filled since,
  as the leader's did) and within ``contact_window_seconds`` (a follower silent longer may be
  down); so it waits for one round of heartbeats once full;
* when it has led for at least ``hold_seconds`` (an election timeout): a leader that another one
  handed over to a moment ago -- on a room report that was stale by the time it took over --
  does not hand over again at once: never two step-downs in a cascade;
* when no transfer is under way (it hands over as ``transfer_leadership`` does: TimeoutNow once
  the target holds every entry; a full leader appends nothing, so the target catches up).

Among the followers with room it picks the one with the highest match index (then the lowest
id): the one that needs the least before TimeoutNow can be sent. None of them: it stays, and
answers DISK_FULL; retention or an operator frees space, and writes resume by themselves.

Nothing here reads a clock or a disk: the core passes what it heard and the times.
"""

from __future__ import annotations

from collections.abc import Mapping


def disk_step_down_target(*, full_seconds: float | None, led_seconds: float, hold_seconds: float, transferring: bool,
                          followers: Mapping[str, tuple[bool | None, int, float]],
                          contact_window_seconds: float) -> str | None:  # fmt: skip
    """The follower to hand leadership to for a full disk (see the module), None: stay.
    ``full_seconds``: how long the leader has seen its own disk full (None: it has room);
    ``followers``: each follower's (disk full as its last heartbeat response of this term said,
    None: none yet; match index; seconds since that response)."""
    if full_seconds is None or transferring or led_seconds < hold_seconds:
        return None
    candidates = [(-match, peer) for peer, (full, match, said) in followers.items()
                  if full is False and said < contact_window_seconds and said <= full_seconds]  # fmt: skip
    return min(candidates)[1] if candidates else None


__all__ = ["disk_step_down_target"]
