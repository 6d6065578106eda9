"""Who takes over from a dead master, and when a restarting master opens a new epoch.

Theory of operation
-------------------
Classic HA has no election: an operator (or a drill, or the cluster simulator) decides. Two
decisions keep every acknowledged write, and both are pure functions of what ``hasvc status``
shows of the brokers:

* ``choose_successor``: a write was acknowledged to its client once a slave held it, so the
  *confirmed* position (the end of the highest write acknowledged to a client: what the clients,
  or a drill, were told) says how far a successor's log must reach. Not the master's current
  slave-ack watermark: a slave that lost its unflushed tail in a power loss and reconnected
  lowers that watermark below what was acknowledged (classic simulation, seed 129). A successor must also know the newest epoch of the group:
  a log that ends far enough but in an older epoch holds bytes the newest master may not have
  written. Among the brokers that qualify, the dead master itself (restarted as master) or the
  most advanced slave by (epoch, log end) takes over. When none qualifies (a power loss took
  unflushed copies: no log holds every acknowledged byte any more) the most advanced log of all
  wins: it loses the least. Promoting a slave that is merely the most advanced *slave* is not
  enough: a slave that restarted and has not caught up yet is behind writes that only the dead
  master holds (found by the classic simulation, seed 93: such a slave was promoted and a write
  acknowledged before its restart was gone).
* ``epoch_on_start``: a master that starts after an abnormal exit (a kill or a power loss:
  ``abort`` was present) may have lost bytes that a slave still holds, past its recovered end,
  in the same epoch; the bytes it now writes there would differ from the slave's while both
  logs claim one history. Opening a new epoch at the recovered end makes every slave cut back to
  it on the next handshake (found by the classic simulation, seed 22).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """A broker as ``hasvc status`` shows it: the newest epoch its log reaches and where its log
    ends (``of``: from its epoch table)."""

    name: str
    last_epoch: int
    max_offset: int

    @property
    def position(self) -> tuple[int, int]:
        return (self.last_epoch, self.max_offset)

    @classmethod
    def of(cls, name: str, epochs: Sequence[tuple[int, int]], max_offset: int) -> Candidate:
        """The candidate whose epoch table is ``epochs`` ((epoch, start offset) pairs, oldest
        first) and whose log ends at ``max_offset``: its epoch is the newest one starting at or
        below that end. A slave adopts its master's whole table at the handshake, before it has
        caught up: entries past its end name epochs of which it holds no byte, and ranking it by
        them would put a log that stops in epoch 1 above one that holds epoch 3 (the classic
        simulation found that when a slave that lost most of its log rejoined just before its
        master died)."""
        reached = [epoch for epoch, start in epochs if start <= max_offset]
        return cls(name, reached[-1] if reached else 0, max_offset)


@dataclasses.dataclass(frozen=True, slots=True)
class Succession:
    """``restart``: bring ``name`` (the dead master) back as master; else promote slave ``name``.
    ``keeps_all``: False when no candidate held every confirmed byte (something is lost)."""

    name: str
    restart: bool
    keeps_all: bool


def qualifies(candidate: Candidate, *, confirmed_offset: int, newest_epoch: int) -> bool:
    return candidate.last_epoch >= newest_epoch and candidate.max_offset >= confirmed_offset


def choose_successor(dead_master: Candidate | None, slaves: Sequence[Candidate], *, confirmed_offset: int,
                     prefer_restart: bool, opens_epoch: bool = True) -> Succession:  # fmt: skip
    """The broker to take over (see the module). ``dead_master`` None: it cannot come back.
    ``prefer_restart``: restart the old master when it qualifies, even if a slave does too.
    ``opens_epoch``: the dead master opens a new epoch as it starts (``epoch_on_start``); when it
    would not (a clean stop, then its log lost bytes: a loss accepted) and a slave holds more of
    its epoch, it is not restarted: it would write other bytes at offsets that slave holds in
    the same epoch, and that slave refuses to follow it (``handshake.reconcile``)."""
    candidates = ([dead_master] if dead_master is not None else []) + list(slaves)
    if not candidates:
        raise ValueError("no broker can take over: the dead master cannot restart and no slave runs")
    newest = max(c.last_epoch for c in candidates)
    good = [c for c in slaves if qualifies(c, confirmed_offset=confirmed_offset, newest_epoch=newest)]
    master_good = dead_master is not None and qualifies(dead_master, confirmed_offset=confirmed_offset, newest_epoch=newest)
    if master_good and not opens_epoch:
        master_good = not any(s.last_epoch == dead_master.last_epoch and s.max_offset > dead_master.max_offset
                              for s in slaves)  # fmt: skip
    if master_good and (prefer_restart or not good):
        return Succession(dead_master.name, restart=True, keeps_all=True)
    if good:
        return Succession(max(good, key=lambda c: c.position).name, restart=False, keeps_all=True)
    best = max(candidates, key=lambda c: c.position)
    return Succession(best.name, restart=best is dead_master, keeps_all=False)


def epoch_on_start(last_epoch: int | None, *, clean_exit: bool) -> int | None:
    """The epoch a master opens at its log's end as it starts, or None to keep its last one.
    ``last_epoch`` None: a new store (the caller draws the first epoch)."""
    if last_epoch is None or clean_exit:
        return None
    return last_epoch + 1
