"""Who may hold a connection on a port whose peers are few and known: the Raft port (the group's
members) and the HA port (slaves).

Theory of operation
-------------------
A port that counted every connection against one cap (the Raft port's 64) let strangers lock the
members out: 500 idle TCP connections, or 64 finished prefaces without a secret, and a restarted
member could not connect back. Kafka exempts inter-broker listeners from ``max.connections``; here
a connection's slot depends on what it has proved:

* a **stranger** has not finished the preface and said who it is (a Raft member's HELLO, a
  slave's handshake). Strangers are capped apart (``strangers_max``) and must identify themselves
  within ``stranger_timeout_seconds`` of the accept, or they are closed. When a new connection
  arrives and the strangers are at their cap, the oldest stranger is closed to make room -- first
  one still in its preface (with a secret an attacker never leaves it), else one past the preface
  -- so a member's connection, which needs a slot for a round trip or two, always gets one: it is
  never the oldest while others wait idle.
* a **known** peer (authenticated by the preface when there is a secret, and with the group's
  HELLO or a slave's handshake) has no deadline and counts against ``known_max`` alone, which no
  stranger can fill.

``Admission`` is the bookkeeping (no I/O; ``now`` comes from the driver through the scopes'
deadlines); ``serve_admitted`` the trio accept loop that applies it. Both connection stages are
counted for STATUS (``statistics``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable

import trio

LOGGER = logging.getLogger(__name__)
ACCEPT_RETRY_SECONDS = 0.1  # after a failed accept (EMFILE and friends)


@dataclasses.dataclass(frozen=True)
class AdmissionLimits:
    strangers_max: int  # connections not yet identified, at once
    stranger_timeout_seconds: float  # from the accept to the identification
    known_max: int  # identified connections at once

    def __post_init__(self) -> None:
        if self.strangers_max <= 0 or self.known_max <= 0 or not self.stranger_timeout_seconds > 0:
            raise ValueError(f"admission limits must be positive: {self}")


class Ticket:
    """One accepted connection's place: ``stage`` is "greeting" (in the preface), "authenticated"
    (past it, not identified yet) or "known"; ``evicted`` when a newer stranger took its slot."""

    __slots__ = ("scope", "stage", "evicted")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.stage = "greeting"
        self.evicted = False


class Admission:
    """The connections of one port by stage (see the module)."""

    def __init__(self, limits: AdmissionLimits, what: str) -> None:
        self.limits = limits
        self.what = what  # "raft", "ha": the STATUS fields' prefix
        # Insertion order is age: the first is the oldest (dicts keep it).
        self._greeting: dict[Ticket, None] = {}
        self._authenticated: dict[Ticket, None] = {}
        self.known = 0
        self.evicted = 0  # strangers closed to make room for a newer connection
        self.timed_out = 0  # strangers closed at their deadline
        self.refused = 0  # identified connections refused: known_max reached

    @property
    def strangers(self) -> int:
        return len(self._greeting) + len(self._authenticated)

    def arrive(self, scope: trio.CancelScope, *, now: float) -> Ticket:
        """A new connection, a stranger with a deadline; the oldest stranger is evicted (its
        scope cancelled) if the strangers are at their cap."""
        while self.strangers >= self.limits.strangers_max:
            stage = self._greeting if self._greeting else self._authenticated
            oldest = next(iter(stage))
            del stage[oldest]
            oldest.evicted = True
            oldest.stage = "gone"
            oldest.scope.cancel()
            self.evicted += 1
        ticket = Ticket(scope)
        scope.deadline = now + self.limits.stranger_timeout_seconds
        self._greeting[ticket] = None
        return ticket

    def authenticated(self, ticket: Ticket | None) -> None:
        """The connection passed the preface: evicted after those still in theirs."""
        if ticket is not None and ticket.stage == "greeting":
            del self._greeting[ticket]
            self._authenticated[ticket] = None
            ticket.stage = "authenticated"

    def identified(self, ticket: Ticket | None) -> bool:
        """The connection said who it is (and the port accepted it): known, without a deadline.
        False (the caller closes it) when ``known_max`` connections are known already."""
        if ticket is None:
            return True
        if ticket.stage == "known":
            return True
        self._forget_stranger(ticket)
        if self.known >= self.limits.known_max:
            self.refused += 1
            ticket.stage = "gone"
            return False
        self.known += 1
        ticket.stage = "known"
        ticket.scope.deadline = math.inf
        return True

    def leave(self, ticket: Ticket) -> None:
        if ticket.stage == "known":
            self.known -= 1
        else:
            self._forget_stranger(ticket)
        ticket.stage = "gone"
        assert self.known >= 0

    def _forget_stranger(self, ticket: Ticket) -> None:
        self._greeting.pop(ticket, None)
        self._authenticated.pop(ticket, None)

    def statistics(self) -> dict[str, int]:
        """STATUS fields (``<what>_``: raft, ha)."""
        p = self.what
        return {f"{p}_connections_known": self.known, f"{p}_connections_strangers": self.strangers,
                f"{p}_strangers_evicted": self.evicted, f"{p}_strangers_timed_out": self.timed_out,
                f"{p}_connections_refused_full": self.refused}  # fmt: skip


async def serve_admitted(listener, handler: Callable[[trio.abc.Stream, Ticket], Awaitable[None]], admission: Admission) -> None:
    """Accept forever; each connection runs ``handler(stream, ticket)`` under its ticket's scope
    (the stranger deadline, the eviction). The handler calls ``admission.authenticated`` after
    the preface and ``admission.identified`` once the peer said who it is. Never blocks the
    accept on a full port: a new connection evicts the oldest stranger instead."""
    async with trio.open_nursery() as nursery:
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:  # EMFILE and friends: wait and go on accepting
                LOGGER.warning("%s port: accept failed: %s", admission.what, error)
                await trio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            nursery.start_soon(_run_admitted, handler, stream, admission)
    raise AssertionError("unreachable")


async def _run_admitted(handler, stream, admission: Admission) -> None:
    scope = trio.CancelScope()
    ticket = admission.arrive(scope, now=trio.current_time())
    try:
        with scope:
            await handler(stream, ticket)
    finally:
        stage = ticket.stage
        admission.leave(ticket)
        await trio.aclose_forcefully(stream)  # the handler closed it, unless cancelled before it could
    if scope.cancelled_caught and stage != "known":
        if ticket.evicted:
            LOGGER.debug("%s port: a stranger closed to make room for a newer connection", admission.what)
        else:
            admission.timed_out += 1
            LOGGER.debug("%s port: a connection closed: not identified within %g s", admission.what,
                        admission.limits.stranger_timeout_seconds)  # fmt: skip
