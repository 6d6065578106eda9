"""Busy polling: an event loop that finds nothing ready polls again for a while before it sleeps.

A broker's trio loop waits in ``epoll_wait`` whenever no task can run. On this project's VMs
(and on any host where an idle CPU halts) the wake-up that ends such a wait is the largest
part of a lone put's latency: the writer's ``write`` has to wake the halted virtual CPU the
peer sleeps on, and the peer then runs with cold caches. A SYNC_MASTER put makes four such
hops (client -> master -> slave -> master -> client). A trio relay that does nothing but those
hops (``scripts/bench_peers.py``'s relay floor) answered at p50 ~190 us on this machine, and at
~36-48 us when its two processes polled before sleeping (docs/design/put-path.md): three
quarters of the floor is waking up.

With ``busy_poll_us`` set, a wait that would sleep first polls (``epoll_wait`` with a zero
timeout) for up to that many microseconds, and sleeps only if nothing became ready meanwhile;
how long it polls adapts to how soon its events come (``BusyPoll``):
Linux's ``net.core.busy_poll`` done in user space (the kernel's own busy polling needs a NAPI
device; loopback has none), or Aeron's spinning idle strategy. The price is CPU: a process
spends up to ``busy_poll_us`` on the CPU after each burst of work, even when nothing follows.
Off by default (0), as the kernel's setting is. On this VM a lone SYNC_MASTER writer's answer
comes back ~60-100 us after the master's send, so ``50`` (the kernel documentation's
suggestion for its own setting) rarely catches it and ``200`` does (docs/design/put-path.md:
one writer 3,079 -> 4,377 acked/s, p50 274 -> 204 us on a busy machine). Where the cores are
saturated (64 writers, a connection each, on 2 cores) polling takes CPU the other processes
need and lowers throughput: it is for brokers with cores to spare.

Trio has no public hook for its I/O wait, so ``install`` replaces the epoll I/O manager's
``get_events`` (a private method, the same since trio 0.12) for the whole process; it checks
the shape it replaces and declines (returns False) when trio's internals differ. The polling
itself is ``BusyPoll``, a plain object of the poll call and a clock, tested apart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

BUSY_POLL_US_MAX = 1_000_000  # a second of spinning per wait is a mistake, not a setting


class BusyPoll:
    """How long to poll before sleeping, adapted as Linux's guest halt-polling adapts its window
    (drivers/cpuidle/governors/haltpoll.c): a wait that ended while polling keeps the budget; one
    that slept and was woken within ``limit`` grows it (doubling, from a quarter of ``limit``);
    one that slept longer, or timed out, halves it (under a microsecond: no polling). So a
    loop whose answers come back within ``limit`` (a lone put's slave acknowledgement, its
    writer's next request) polls for them, and one whose events come further apart (a slave
    receiving from 64 writers, an idle broker's timers) soon stops spending CPU on it."""

    __slots__ = ("limit", "budget")

    def __init__(self, limit_seconds: float):
        self.limit = limit_seconds
        self.budget = limit_seconds

    def wait(self, poll: Callable[[float, int], Any], timeout: float, max_events: int,
             clock: Callable[[], float] = time.perf_counter, yield_cpu: Callable[[], Any] = os.sched_yield) -> Any:  # fmt: skip
        """``poll(timeout, max_events)`` (as ``select.epoll.poll``), but when ``timeout`` is
        positive first ``poll(0, ...)`` repeatedly for up to the budget (never past ``timeout``),
        returning the first events found; then one poll for what is left of ``timeout``. Returns
        what the last poll returned: empty only when ``timeout`` passed with nothing ready
        (trio's contract for ``get_events``)."""
        if timeout <= 0:
            return poll(timeout, max_events)
        spin = min(self.budget, timeout)
        started = clock()
        if spin > 0:
            end = started + spin
            while True:
                events = poll(0, max_events)
                if events:
                    return events
                if clock() >= end:
                    break
                yield_cpu()  # another runnable process on this CPU goes first: polling must not delay it
        events = poll(max(0.0, timeout - spin), max_events)
        self.woken_after(clock() - started if events else None)
        return events

    def woken_after(self, seconds: float | None) -> None:
        """Adapt the budget to a wait that slept: woken ``seconds`` after it began, or None
        (timed out)."""
        if seconds is not None and seconds <= self.limit:
            self.budget = min(self.limit, max(2 * self.budget, self.limit / 4))
        else:
            self.budget = self.budget / 2 if self.budget >= 2e-6 else 0.0


def install(busy_poll_us: int) -> bool:
    """Make this process's trio loops poll for ``busy_poll_us`` before each sleep (0: leave trio
    as it is). True if installed; False if this trio's I/O manager is not the epoll one this
    module knows (then nothing changes)."""
    if not 0 <= busy_poll_us <= BUSY_POLL_US_MAX:
        raise ValueError(f"busy_poll_us must be 0..{BUSY_POLL_US_MAX}, got {busy_poll_us}")
    if busy_poll_us == 0:
        return False
    try:
        from trio._core._io_epoll import EpollIOManager
    except ImportError:  # not Linux, or trio moved it
        return False
    original = EpollIOManager.get_events
    if getattr(original, "busy_poll_original", None) is not None:
        original = original.busy_poll_original  # installed before: replace the spin, keep one layer
    if original.__code__.co_varnames[:2] != ("self", "timeout"):
        return False
    busy = BusyPoll(busy_poll_us / 1e6)  # one loop a process: the brokers' main thread

    def get_events(self, timeout: float):
        # As trio's own: max_events must be > 0; _registered read unlocked is fine (trio's note).
        return busy.wait(self._epoll.poll, timeout, max(1, len(self._registered)))

    get_events.busy_poll_original = original  # type: ignore[attr-defined]
    EpollIOManager.get_events = get_events
    return True
