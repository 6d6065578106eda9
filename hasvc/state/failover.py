"""The failover client's decisions: which broker is the master, and what to do after a send.

Theory of operation
-------------------
``hasvc.client.FailoverClient`` sends to the current master among several addresses. When a
request fails (the connection is lost) or the broker answers SERVICE_NOT_AVAILABLE (a slave, or a
fenced master), it asks every address for its status and moves to ``choose_master``'s answer:
among brokers that are masters and not fenced, the one with the newest epoch (a deposed master
that has not yet learnt it was replaced has an older epoch). No master yet: it asks again after
``Backoff`` (doubling from ``min_seconds`` to ``max_seconds``) until the failover deadline, when it
raises.

``after_send`` says what follows a send: return its results, raise its error, or find the master
and send again. A send is sent again only when the caller asked for retries (the broker's
producer table answers a repeat with the original offsets) and only before the deadline.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping

# What makes a client look for another master: the broker is a slave or fenced.
FAILOVER_STATUSES = frozenset({"SERVICE_NOT_AVAILABLE"})


def choose_master(statuses: Iterable[tuple[str, Mapping | None]]) -> tuple[str, Mapping] | None:
    """(address, status) of the master with the newest epoch, or None. ``statuses``: each
    address with its status, None where it did not answer."""
    found = [
        (status.get("epoch", 0), address, status)
        for address, status in statuses
        if status is not None and status.get("role") != "SLAVE" and not status.get("fenced_by")
    ]
    if not found:
        return None
    _, address, status = max(found, key=lambda entry: entry[:2])
    return address, status


def named_leaders(statuses: Iterable[tuple[str, Mapping | None]], *, known: Iterable[str]) -> list[str]:
    """Client addresses of leaders that DLedger members named (STATUS ``leader_client_address``)
    and that are not among ``known``: a client given one member's address finds the leader so."""
    seen = set(known)
    named = []
    for _address, status in statuses:
        leader = status.get("leader_client_address") if status is not None else None
        if leader and leader not in seen:
            seen.add(leader)
            named.append(leader)
    return named


@dataclasses.dataclass(slots=True)
class Backoff:
    """The pauses between rounds of asking for the master: ``min_seconds``, doubling, at most
    ``max_seconds``."""

    min_seconds: float
    max_seconds: float
    current: float = 0.0

    def __post_init__(self) -> None:
        assert 0 < self.min_seconds <= self.max_seconds
        self.current = self.min_seconds

    def next_pause(self, *, now: float, deadline: float) -> float | None:
        """The pause before the next round, or None when it would end past ``deadline``."""
        pause = self.current
        if now + pause > deadline:
            return None
        self.current = min(pause * 2, self.max_seconds)
        return pause


class SendOutcome(enum.Enum):
    STORED = "STORED"  # answered with a status that is not a reason to fail over
    NOT_MASTER = "NOT_MASTER"  # answered SERVICE_NOT_AVAILABLE: a slave or fenced master
    FAILED = "FAILED"  # no answer: the connection failed


class Next(enum.Enum):
    RETURN = "RETURN"  # hand the results to the caller
    RAISE = "RAISE"  # hand the error to the caller
    FIND_MASTER = "FIND_MASTER"  # find the master and send again


def outcome_of(status: str) -> SendOutcome:
    return SendOutcome.NOT_MASTER if status in FAILOVER_STATUSES else SendOutcome.STORED


def after_send(outcome: SendOutcome, *, retry: bool, now: float, deadline: float) -> Next:
    """What follows a send that ended in ``outcome``."""
    if outcome is SendOutcome.STORED:
        return Next.RETURN
    if not retry or now > deadline:
        return Next.RAISE if outcome is SendOutcome.FAILED else Next.RETURN
    return Next.FIND_MASTER
