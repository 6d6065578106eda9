"""Consumer-group progress: what each group has acknowledged and has in flight, per queue.

Theory of operation
-------------------
For every (group, topic, queue) a :class:`QueueProgress` keeps the **committed** offset (every
queue offset below it is acknowledged), the **in-flight** deliveries above it (offset -> nonce,
visibility deadline, delivery attempt) and the offsets acknowledged out of order. ``next_new`` is
the lowest offset never delivered; the broker is asked for messages from there.

Every change is an **event** (a short list: kind, group, topic, queue, then the fields). The
gateway applies an event here, then appends it to its own hasvc topic (replicated like any other
message) and answers the client only once it is stored; on start it replays the events, so the
progress survives a restart of the proxy and a failover of the brokers. Events set absolute values
(the attempt number, the deadline, the nonce), and applying one that is already reflected changes
nothing, so replaying from a snapshot older than some of the events it reflects is safe.

Cost: applying an event is O(1) (plus O(log n) for a deadline) and checks the invariants it can
break in O(1) (the count of offsets between committed and next_new); ``check_all`` walks a whole
queue and runs when a snapshot is loaded and in the tests. "Is anything expired?", asked by every
receive of every queue, is answered from a heap of deadlines (stale entries dropped lazily, the
heap rebuilt when it grows past ``DEADLINES_SLACK`` times what is in flight), so a queue with
thousands in flight costs no more per event or per receive than an empty one.

Pure: time (ms since the epoch, since deadlines must survive a restart) and nonces are arguments.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterator

# RocketMQ's pop has no per-queue cap; this one bounds the gateway's memory and snapshot size
# (a consumer that never acks stops getting new messages from a queue with this many in flight).
INFLIGHT_PER_QUEUE_MAX = 4096

# The deadline heap is rebuilt from the in-flight table once it holds this many times as many
# entries (plus DEADLINES_SLACK_MIN): stale entries (acknowledged, delivered again, changed) whose
# deadline lies behind a live one cannot be dropped from the top; rebuilding is O(n), amortised O(1).
DEADLINES_SLACK = 2
DEADLINES_SLACK_MIN = 64

Key = tuple[str, str, int]  # group, topic, queue id


class ProgressError(ValueError):
    """A malformed event (from the progress topic)."""


@dataclasses.dataclass(slots=True)
class InFlight:
    nonce: int
    deadline_ms: int
    attempt: int


@dataclasses.dataclass(slots=True)
class QueueProgress:
    committed: int = 0
    next_new: int = 0
    inflight: dict[int, InFlight] = dataclasses.field(default_factory=dict)
    acked: set[int] = dataclasses.field(default_factory=set)
    # (deadline_ms, offset) of deliveries and changes, lowest first; an entry whose offset is no
    # longer in flight with that deadline is stale (see ``expired``)
    deadlines: list[tuple[int, int]] = dataclasses.field(default_factory=list, repr=False, compare=False)

    def check(self) -> None:
        """The invariants in O(1): after every event."""
        assert 0 <= self.committed <= self.next_new, (self.committed, self.next_new)
        # every offset below next_new not yet committed is either in flight or acknowledged
        assert len(self.inflight) + len(self.acked) == self.next_new - self.committed, (self.committed, self.next_new)

    def check_all(self) -> None:
        """Every invariant, walking the queue: on load and in tests."""
        self.check()
        assert self.committed not in self.acked
        for offset in self.inflight:
            assert self.committed <= offset < self.next_new and offset not in self.acked, offset
        for offset in self.acked:
            assert self.committed < offset < self.next_new, offset
        assert len(self.deadlines) <= DEADLINES_SLACK * len(self.inflight) + DEADLINES_SLACK_MIN
        tracked = set(self.deadlines)
        for offset, each in self.inflight.items():
            assert (each.deadline_ms, offset) in tracked, offset

    def done(self, offset: int) -> bool:
        return offset < self.committed or offset in self.acked

    def expired(self, now_ms: int) -> list[int]:
        """In-flight offsets whose visibility deadline has passed, lowest first (O(1) when none)."""
        deadlines, inflight = self.deadlines, self.inflight
        while deadlines:
            deadline_ms, offset = deadlines[0]
            current = inflight.get(offset)
            if current is not None and current.deadline_ms == deadline_ms:
                break
            heapq.heappop(deadlines)  # stale: acknowledged, delivered again or changed since
        if not deadlines or deadlines[0][0] > now_ms:
            return []
        return sorted(offset for offset, each in inflight.items() if each.deadline_ms <= now_ms)

    def _track(self, offset: int, deadline_ms: int) -> None:
        heapq.heappush(self.deadlines, (deadline_ms, offset))
        if len(self.deadlines) > DEADLINES_SLACK * len(self.inflight) + DEADLINES_SLACK_MIN:
            self.deadlines = [(each.deadline_ms, o) for o, each in self.inflight.items()]
            heapq.heapify(self.deadlines)

    def next_deadline(self) -> int | None:
        return min((each.deadline_ms for each in self.inflight.values()), default=None)

    def room(self) -> int:
        return max(0, INFLIGHT_PER_QUEUE_MAX - len(self.inflight))

    # Mutations: each is what applying its event does.

    def _contiguous(self, offset: int) -> None:
        if offset > self.next_new:
            raise ProgressError(f"offset {offset} leaves a gap after {self.next_new}, the next undelivered offset")

    def deliver(self, offset: int, nonce: int, deadline_ms: int, attempt: int) -> None:
        if self.done(offset):
            return
        self._contiguous(offset)
        assert offset >= self.committed, (offset, self.committed)
        self.inflight[offset] = InFlight(nonce, deadline_ms, attempt)
        self._track(offset, deadline_ms)
        self.next_new = max(self.next_new, offset + 1)

    def ack(self, offset: int) -> None:
        """Acknowledge ``offset``: delivered, or the next undelivered one (filtered out, gone)."""
        if self.done(offset):
            return
        self._contiguous(offset)
        self.inflight.pop(offset, None)
        self.next_new = max(self.next_new, offset + 1)
        self.acked.add(offset)
        while self.committed in self.acked:
            self.acked.remove(self.committed)
            self.committed += 1

    def change(self, offset: int, nonce: int, deadline_ms: int) -> None:
        current = self.inflight.get(offset)
        if current is not None:
            self.inflight[offset] = InFlight(nonce, deadline_ms, current.attempt)
            self._track(offset, deadline_ms)

    def skip_to(self, offset: int) -> None:
        """Nothing below ``offset`` is left to deliver (retention removed it, or a group that
        starts at the end): drop what is in flight or acked below it."""
        if offset <= self.committed:
            return
        self.committed = offset
        self.next_new = max(self.next_new, offset)
        self.inflight = {o: each for o, each in self.inflight.items() if o >= offset}
        self.deadlines = [(each.deadline_ms, o) for o, each in self.inflight.items()]
        heapq.heapify(self.deadlines)
        self.acked = {o for o in self.acked if o >= offset}
        while self.committed in self.acked:
            self.acked.remove(self.committed)
            self.committed += 1


class ProgressTable:
    """Every group's progress; events in, queries out."""

    def __init__(self) -> None:
        self.queues: dict[Key, QueueProgress] = {}

    def get(self, key: Key) -> QueueProgress:
        progress = self.queues.get(key)
        if progress is None:
            progress = self.queues[key] = QueueProgress()
        return progress

    def apply(self, event: list) -> None:
        """Apply one event: ``[kind, group, topic, queue, *fields]``."""
        try:
            kind, group, topic, queue_id, *fields = event
            key = (str(group), str(topic), int(queue_id))
            progress = self.queues.get(key) or QueueProgress()  # kept only if the event applies
            if kind == "d":
                offset, nonce, deadline_ms, attempt = (int(f) for f in fields)
                progress.deliver(offset, nonce, deadline_ms, attempt)
            elif kind == "a":
                (offset,) = (int(f) for f in fields)
                progress.ack(offset)
            elif kind == "c":
                offset, nonce, deadline_ms = (int(f) for f in fields)
                progress.change(offset, nonce, deadline_ms)
            elif kind == "s":
                (offset,) = (int(f) for f in fields)
                progress.skip_to(offset)
            else:
                raise ProgressError(f"unknown event kind {kind!r}")
        except ProgressError:
            raise
        except (TypeError, ValueError) as error:
            raise ProgressError(f"malformed progress event {event!r}: {error}") from None
        progress.check()
        self.queues[key] = progress

    def snapshot(self) -> list:
        """Everything, as JSON-able lists: one ``[group, topic, queue, committed, next_new,
        [[offset, nonce, deadline_ms, attempt]...], [acked...]]`` per queue."""
        return [[g, t, q, p.committed, p.next_new, [[o, f.nonce, f.deadline_ms, f.attempt] for o, f in sorted(p.inflight.items())],
                 sorted(p.acked)] for (g, t, q), p in sorted(self.queues.items())]  # fmt: skip

    def load(self, snapshot: list) -> None:
        self.queues.clear()
        try:
            for group, topic, queue_id, committed, next_new, inflight, acked in snapshot:
                progress = self.get((str(group), str(topic), int(queue_id)))
                progress.committed, progress.next_new = int(committed), int(next_new)
                progress.inflight = {int(o): InFlight(int(n), int(d), int(a)) for o, n, d, a in inflight}
                progress.deadlines = sorted((each.deadline_ms, o) for o, each in progress.inflight.items())  # a heap
                progress.acked = {int(o) for o in acked}
                progress.check_all()
        except (TypeError, ValueError, AssertionError) as error:
            raise ProgressError(f"malformed progress snapshot: {error}") from None

    def groups(self) -> Iterator[Key]:
        return iter(self.queues)
