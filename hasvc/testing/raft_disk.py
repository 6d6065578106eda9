"""Disk faults for ``SimCluster``: a full disk (ENOSPC) and a failed fsync (EIO), as the Raft
driver meets them (``hasvc.broker.raft.driver``, ``hasvc.broker.raft.sync``).

* A full disk on a member (``fill``, until ``free``). The core is told before each event
  (``RaftNode.disk_full``: a follower says so in its heartbeat responses, a leader hands over only
  to a member that said it has room, ``hasvc.state.raft.disk_room``). A leader's proposals are
  refused DISK_FULL before the core sees them (the driver's ``_room_refusal``: the scenario asks
  ``full``). A Ready whose entries cannot be stored (a follower's APPEND, a new leader's no-op)
  is carried out up to the append -- hard state, reset, truncation -- then the core starts over
  from what the log holds, its messages dropped, its connections kept (the driver's
  ``_append_failed``): the cluster's ``restart_in_place``.
* A failed fsync (``arm_fsync_failure``): the member's next flush fails. It is never retried
  and believed: the member does not report it persisted (no acknowledgement rests on it) and
  stops, as the driver's sync failure ends the member; the pages whose write-back failed may be
  gone (PostgreSQL's "fsyncgate"), so it comes back without its unflushed tail, its catch-up
  mark saved, when another member holds every committed entry it loses (else a process kill:
  the page cache kept).

The checker's rule for full disks (``on_handover``): a leader that hands over for its disk does
so only after leading ``hold_seconds`` -- so a leader that took over from a full one never hands
over again at once: never two step-downs in a cascade. Transfers the scenario ordered and those
to the preferred leader are not disk step-downs.
"""

from __future__ import annotations

from collections.abc import Sequence

from hasvc.testing.checker import SafetyViolation


class DiskFaults:
    def __init__(self, members: Sequence[str], *, hold_seconds: float, preferred: str | None) -> None:
        self.full = {member: False for member in members}
        self.fsync_armed = {member: False for member in members}
        self.hold_seconds = hold_seconds
        self.preferred = preferred
        self._led_since: dict[str, tuple[int, float]] = {}  # member -> (term, when it became leader)
        self._ordered: set[tuple[str, int]] = set()  # (member, term): a transfer the scenario ordered
        self.fills = 0  # disks that filled
        self.refused = 0  # proposals refused DISK_FULL
        self.append_failures = 0  # Readies whose append failed: the core started over in place
        self.fsync_failures = 0  # flushes that failed: the member stopped
        self.handovers = 0  # leaders that handed over for their disk

    def any_full(self) -> bool:
        return any(self.full.values())

    def fill(self, member: str) -> None:
        if not self.full[member]:
            self.full[member] = True
            self.fills += 1

    def free(self, member: str) -> None:
        self.full[member] = False

    def free_all(self) -> None:
        for member in self.full:
            self.full[member] = False

    def arm_fsync_failure(self, member: str) -> None:
        self.fsync_armed[member] = True

    def take_fsync_failure(self, member: str) -> bool:
        """Whether this flush of ``member`` fails (once per arming)."""
        armed, self.fsync_armed[member] = self.fsync_armed[member], False
        if armed:
            self.fsync_failures += 1
        return armed

    def on_leader(self, member: str, term: int, now: float) -> None:
        self._led_since[member] = (term, now)

    def on_ordered_transfer(self, member: str, term: int) -> None:
        self._ordered.add((member, term))

    def on_handover(self, member: str, term: int, target: str, now: float) -> None:
        """``member`` (leading ``term``) sent TimeoutNow to ``target``: if its disk is full and
        nobody ordered it, it is a step-down for the disk, which needs ``hold_seconds`` of lead."""
        if not self.full[member] or (member, term) in self._ordered or target == self.preferred:
            return
        self.handovers += 1
        led_term, since = self._led_since.get(member, (-1, now))
        if led_term == term and now - since < self.hold_seconds:
            raise SafetyViolation(f"{member} hands over to {target} for its full disk {now - since:.3f} s after it "
                                  f"took the lead in term {term}: a leader holds {self.hold_seconds} s, "
                                  "never two step-downs in a cascade")  # fmt: skip
