"""A DLedger member's CPU scheduling policy by role (Linux): a follower's threads run
``SCHED_BATCH``, a leader's and a candidate's ``SCHED_OTHER`` (``raft_follower_batch_scheduling``).

Why: a leader writes one push per follower, one ``writev`` each, and the kernel wakes the
follower a push reaches with TCP's synchronous wake-up hint, which places it on the writer's
core. Where members share cores (a benchmark on one machine, members packed on a host) the
woken follower then preempts the leader before it has written its push to the other follower,
and that push waits for the first follower's whole turn: ~1 preemption a pass at 64 writers on
two cores, the leader's main thread waiting for a core 20-24 % of the time. A ``SCHED_BATCH``
thread is never scheduled ahead of a running one when it wakes (its time is still shared
fairly, and a core that is free runs it at once), so the leader writes both pushes and the
followers run after. Measured: 64 writers x 1 KiB, quorum in memory, three members on two cores,
eight alternating pairs of fresh groups with the setting off and on (5 s each, as
``python scripts/dev/dledger_cpu.py . 64 5 1 --set page_cache_keep_size=268435456 --set
raft_follower_batch_scheduling=false`` and the same with ``=true``): higher in 8 of 8 pairs, by 1.1-10.7 % (medians 64.7k -> 66.6k acked/s, p50 917 -> 899 us);
the leader preempted 0.2-0.4 times a pass instead of 0.9-1.0 (``chrt`` on the followers, six
pairs). The classic pair with its slave so was unchanged (one replica, one push). On members that
do not share cores it changes nothing.

Switching between the two policies needs no privilege. Threads started later inherit the
policy of the thread that starts them (trio's worker threads: the event loop's), so each change
is applied to every thread of the process once.
"""

from __future__ import annotations

import logging
import os

LOGGER = logging.getLogger(__name__)

SUPPORTED = hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH") and os.path.isdir("/proc/self/task")


def set_process_policy(batch: bool) -> None:
    """``SCHED_BATCH`` (batch) or ``SCHED_OTHER`` for every thread of this process; OSError when
    the system refuses one (a thread that ended meanwhile is skipped)."""
    policy = os.SCHED_BATCH if batch else os.SCHED_OTHER
    param = os.sched_param(0)
    for name in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(name), policy, param)
        except ProcessLookupError:
            continue


def process_policies() -> set[int]:
    """The policies (``os.SCHED_*``) this process's threads run under now."""
    found = set()
    for name in os.listdir("/proc/self/task"):
        try:
            found.add(os.sched_getscheduler(int(name)))
        except ProcessLookupError:
            continue
    return found


class RolePolicy:
    """Applies the policy a role calls for when the role changes (``follow``); off (``enabled``
    False), unsupported, or a process started under another policy than ``SCHED_OTHER`` (an
    operator's ``chrt``: real-time, idle): never touches the policy. A refusal is logged once and
    stops it."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled and SUPPORTED
        if self.enabled and os.sched_getscheduler(0) != os.SCHED_OTHER:
            LOGGER.info("the process runs under scheduling policy %d, not SCHED_OTHER: kept "
                        "(raft_follower_batch_scheduling leaves it)", os.sched_getscheduler(0))  # fmt: skip
            self.enabled = False
        self.batch: bool | None = None  # the policy applied last; None: none yet

    def follow(self, following: bool) -> None:
        if not self.enabled or following == self.batch:
            return
        try:
            set_process_policy(following)
        except OSError as error:
            LOGGER.warning("cannot set the scheduling policy (raft_follower_batch_scheduling is off from now): %s", error)
            self.enabled = False
            return
        self.batch = following
