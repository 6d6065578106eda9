"""What a drill saw over time: every acknowledged write, the fault windows and the failover gaps.

A drill's producers call ``Timeline.ack(started, answered)`` for every PUT_OK (``time.monotonic()``
when the send started and when it was answered: the latency includes a failover client's retries,
so a send caught by a failover shows the whole gap as its latency). The drill calls ``fault`` when
it injects a fault and ``Fault.close`` when the fault is over (the killed member is back, the
partition healed, the disk freed), ``gap`` for each failover (fault -> first PUT_OK of a send
started after it: the figure the drill reports), and ``pause``/``resume`` around the stretches
when its producers stand still while it checks the stores (no writes there is not an outage).

``summary()`` is plain JSON (the drill's ``--report`` carries it under ``timeline``): writes
acknowledged per bucket and their latency p50/p99/max, the fault windows, the gaps and the pauses,
all in seconds from the first thing recorded. ``hasvc.tools.timeline_plot`` draws it. Pure: no
trio, no matplotlib.
"""

from __future__ import annotations

import array
import dataclasses
import math
import time

# Bucket widths the summary chooses from: the smallest that keeps a drill under MAX_BUCKETS, so a
# one-round drill of a few seconds still shows its failover (at 1 s buckets it would be 3 points)
# and a long one stays a readable line and a small report.
BUCKET_CHOICES_SECONDS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
MAX_BUCKETS = 400


@dataclasses.dataclass
class Fault:
    label: str
    start: float  # time.monotonic()
    end: float | None = None  # None: still on when the drill ended (drawn to the end)

    def close(self, at: float | None = None) -> None:
        self.end = time.monotonic() if at is None else at


@dataclasses.dataclass
class Gap:
    label: str
    start: float  # the fault's moment, time.monotonic()
    seconds: float  # to the first PUT_OK of a send started after it


class Timeline:
    def __init__(self) -> None:
        self.answered = array.array("d")  # time.monotonic() of each PUT_OK
        self.latency = array.array("d")  # its send's seconds from start to answer
        self.faults: list[Fault] = []
        self.gaps: list[Gap] = []
        self.pauses: list[tuple[float, float]] = []
        self._paused_since: float | None = None

    def ack(self, started: float, answered: float) -> None:
        self.answered.append(answered)
        self.latency.append(answered - started)

    def fault(self, label: str, start: float | None = None) -> Fault:
        fault = Fault(label, time.monotonic() if start is None else start)
        self.faults.append(fault)
        return fault

    def gap(self, label: str, start: float, seconds: float) -> None:
        self.gaps.append(Gap(label, start, seconds))

    def gap_from_acks(self, label: str, moment: float, *, sent_after: float | None = None) -> float | None:
        """Records and returns the gap from ``moment`` to the first PUT_OK of a send started after
        ``sent_after`` (default: the moment), from the acknowledgements recorded; None if none was."""
        after = moment if sent_after is None else sent_after
        answered = [done for done, latency in zip(self.answered, self.latency) if done - latency >= after]
        if not answered:
            return None
        self.gap(label, moment, min(answered) - moment)
        return min(answered) - moment

    def pause(self, at: float | None = None) -> None:
        """The producers stand still from now (the drill checks the stores)."""
        if self._paused_since is None:
            self._paused_since = time.monotonic() if at is None else at

    def resume(self, at: float | None = None) -> None:
        if self._paused_since is not None:
            self.pauses.append((self._paused_since, time.monotonic() if at is None else at))
            self._paused_since = None

    def summary(self) -> dict:
        """Plain JSON: see the module's docstring (times in seconds from the first thing recorded)."""
        starts = [done - latency for done, latency in zip(self.answered, self.latency)]
        moments = starts + [f.start for f in self.faults]
        ends = list(self.answered) + [f.end for f in self.faults if f.end is not None] + [g.start + g.seconds for g in self.gaps]
        if not moments:
            return {"bucket_seconds": 1.0, "seconds": 0.0, "acked": [], "p50_ms": [], "p99_ms": [], "max_ms": [],
                    "faults": [], "gaps": [], "paused": []}  # fmt: skip
        origin = min(moments)
        duration = max(ends + moments) - origin
        bucket = next((b for b in BUCKET_CHOICES_SECONDS if duration / b <= MAX_BUCKETS), BUCKET_CHOICES_SECONDS[-1])
        count = max(1, math.ceil(duration / bucket))
        latencies: list[list[float]] = [[] for _ in range(count)]
        for done, latency in zip(self.answered, self.latency):
            latencies[min(count - 1, int((done - origin) / bucket))].append(latency * 1000)
        ordered = [sorted(values) for values in latencies]

        def at(q: float) -> list[float | None]:
            return [round(values[min(len(values) - 1, int(q * len(values)))], 3) if values else None for values in ordered]

        def since(moment: float) -> float:
            return round(moment - origin, 3)

        return {
            "bucket_seconds": bucket,
            "seconds": round(duration, 3),
            "acked": [len(values) for values in ordered],
            "p50_ms": at(0.5),
            "p99_ms": at(0.99),
            "max_ms": [round(values[-1], 3) if values else None for values in ordered],
            "faults": [{"label": f.label, "from": since(f.start), "to": since(f.end) if f.end is not None else round(duration, 3)}
                       for f in self.faults],  # fmt: skip
            "gaps": [{"label": g.label, "at": since(g.start), "seconds": round(g.seconds, 3)} for g in self.gaps],
            # The checks after the last write (until the drill ends) are not drawn: nothing follows them.
            "paused": [{"from": since(start), "to": min(since(end), round(duration, 3))} for start, end in self.pauses
                       if start - origin < duration],  # fmt: skip
        }
