"""The proxy's progress topic: consumer progress events stored in order, snapshots, replay.

Theory of operation
-------------------
The gateway applies deliveries, acks and invisible-time changes to its
:class:`~hasvc.proxy.progress.ProgressTable` as they happen and hands them here as events
(``enqueue``; ``persist`` when the caller waits for them to be stored). One writer task
(``run``) appends them in the order they were applied -- a batch per record on queue 0 of
``PROGRESS_TOPIC`` -- and, every ``snapshot_every_events`` (or ``SNAPSHOT_INTERVAL_SECONDS``),
the whole table on queue 1 with the queue-0 offset replay starts from. On start ``replay`` loads
the last snapshot and applies the events after it. ``events_queued`` is what waits for the
writer (the proxy's metrics show it).

The queue is bounded: while the brokers are slow or unreachable the writer stops draining it, and
a call that would make events (a receive, an ack) first asks ``reserve`` for room under
``progress_events_queued_max`` (``hasvc/proxy/limits.py``); the gateway refuses it when there is
none. A receive reserves before its pulls and enqueues after them, so the events it will add
count from the start; any count fits an empty queue, so what waits is at most the limit, or one
call's events.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import collections

import trio

from commitlog import record as rec
from hasvc import client as hc
from hasvc.proxy.progress import ProgressError, ProgressTable

log = logging.getLogger("hasvc.proxy")

PROGRESS_TOPIC_PREFIX = "%HASVC_PROXY"  # reserved: clients cannot send to or consume these topics
PROGRESS_TOPIC = f"{PROGRESS_TOPIC_PREFIX}_PROGRESS"
EVENTS_QUEUE, SNAPSHOT_QUEUE = 0, 1
EVENTS_PER_RECORD_MAX = 4096  # ~60 bytes an event: well under the 4 MiB body limit
SNAPSHOT_EVENTS_DEFAULT = 10_000
# Event records start at most this often (ProgressLog.run). Each record is a replicated put (the
# master's and the slave's CPU, and a round trip of the trio side); at 16 senders' consumption
# records went out every ~2 ms with 2.4 consumed messages each, and holding the next one to 5 ms
# after the last gave ~10 messages a record and ~140 µs less CPU a consumed message over the
# proxy, master and slave (docs/PROXY.md). An ack waits at most this much longer, and only while
# records answer several calls and not all of their callers are back (ProgressLog.run).
PROGRESS_RECORD_INTERVAL_SECONDS = 0.005
# ... and at least this often while events come: the progress topic ages out with the brokers'
# retention (72 h) like any topic, so the last snapshot must always be far younger than that.
SNAPSHOT_INTERVAL_SECONDS = 3600.0
PULL_PAGE = 1024  # the broker's PULL_COUNT_MAX


@dataclasses.dataclass(slots=True)
class _Write:
    """Events waiting for the progress writer, and who waits for their put status: tasks on
    ``done``, or callbacks (acks answered without a task of their own, see ``hasvc.proxy.gateway.Gateway.ack_soon``)."""

    events: list
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    status: str = ""
    callbacks: list = dataclasses.field(default_factory=list)
    answers: bool = False  # a call (an AckMessage, a ChangeInvisibleDuration) waits for it

    def finish(self, status: str) -> None:
        self.status = status
        self.done.set()
        for callback in self.callbacks:
            callback(status)


class ProgressLog:
    """The progress topic of one gateway: ``table`` (replaced by ``replay`` when a snapshot is
    unreadable), ``stats`` (the gateway's counters: events, records, replayed), the events queued
    for the writer task. ``config`` is the gateway's (snapshot_every_events,
    progress_record_interval_seconds, progress_events_queued_max)."""

    def __init__(self, cluster: hc.FailoverClient, config, stats: dict[str, int]) -> None:
        self.cluster = cluster
        self.config = config
        self.stats = stats
        self.table = ProgressTable()
        self._writes: collections.deque[_Write] = collections.deque()
        self._write_wakeup = trio.Event()
        self.events_queued = 0  # events in self._writes (read by the metrics thread)
        self.events_reserved = 0  # events calls in progress will enqueue (reserve, release)
        self._events_since_snapshot = 0
        self._last_snapshot = trio.current_time() if trio.lowlevel.in_trio_run() else 0.0
        self._last_record_at = -float("inf")  # when the writer last started an event record (trio's clock)
        self._answers_queued = 0  # writes in self._writes that a call waits for
        self._answers_wanted = 0  # ... that the writer's hold waits for (0: it does not)
        self._answers_enough = trio.Event()  # set once _answers_queued reaches _answers_wanted

    def has_room(self, count: int) -> bool:
        """Whether ``count`` more events fit beside those queued and reserved (any count fits an
        empty queue). For a caller that enqueues them before its next checkpoint."""
        taken = self.events_queued + self.events_reserved
        return not taken or taken + count <= self.config.progress_events_queued_max

    def reserve(self, count: int) -> bool:
        """``has_room``, and the room taken: True when taken, to be given back with ``release``
        once the events are enqueued (for a caller that waits in between)."""
        if not self.has_room(count):
            return False
        self.events_reserved += count
        return True

    def release(self, count: int) -> None:
        self.events_reserved -= count
        assert self.events_reserved >= 0, self.events_reserved

    def enqueue(self, events: list[list], answers: bool = False) -> _Write:
        write = _Write(events, answers=answers)
        self._writes.append(write)
        self.events_queued += len(events)
        self._write_wakeup.set()
        if answers:
            self._answers_queued += 1
            if self._answers_wanted and self._answers_queued >= self._answers_wanted:
                self._answers_enough.set()
        return write

    async def persist(self, events: list[list]) -> str:
        """Queue ``events`` for the writer and wait until they are stored; the put status."""
        write = self.enqueue(events, answers=True)
        await write.done.wait()
        return write.status

    async def run(self) -> None:
        """The one task that appends events, in the order they were applied.

        Group commit: after a record that answered N >= 2 calls, the next one waits until N
        calls wait for it again (the callers the last record answered are back) or until
        ``progress_record_interval_seconds`` after the last record started, whichever is first,
        so that the acks (and deliveries) arriving meanwhile ride in one record: each record is a
        put the master and the slave pay for, and the official clients send one ack per
        AckMessage. The first record after a pause goes at once, and so does the one after a
        record that answered a single call: a consumer that acknowledges one message at a time
        is never held, and a few concurrent ones only until each is back."""
        interval = self.config.progress_record_interval_seconds
        answered = 0  # calls the last record answered
        while True:
            await self._write_wakeup.wait()
            self._write_wakeup = trio.Event()
            while self._writes:
                wait = self._last_record_at + interval - trio.current_time()
                if wait > 0 and answered >= 2 and self._answers_queued < answered:
                    self._answers_wanted, self._answers_enough = answered, trio.Event()
                    with trio.move_on_after(wait):
                        await self._answers_enough.wait()
                    self._answers_wanted = 0
                self._last_record_at = trio.current_time()
                batch, count = [], 0
                while self._writes and count < EVENTS_PER_RECORD_MAX:
                    batch.append(self._writes.popleft())
                    count += len(batch[-1].events)
                self.events_queued -= count
                answered = sum(write.answers for write in batch)
                self._answers_queued -= answered
                status, queue_offset = await self._append([e for write in batch for e in write.events], EVENTS_QUEUE)
                for write in batch:
                    write.finish(status)
                self.stats["events"] += count
                self.stats["records"] += 1
                self._events_since_snapshot += count
                due = (self._events_since_snapshot >= self.config.snapshot_every_events
                       or trio.current_time() - self._last_snapshot >= SNAPSHOT_INTERVAL_SECONDS)  # fmt: skip
                if queue_offset >= 0 and due:
                    await self._snapshot(queue_offset + 1)

    async def _append(self, payload, queue_id: int) -> tuple[str, int]:
        body = json.dumps(payload, separators=(",", ":")).encode()
        try:
            result = await self.cluster.send(PROGRESS_TOPIC, body, queue_id=queue_id, retry=True)
        except hc.ClientError as error:
            log.warning("progress not stored: %s", error)
            return f"ERROR {error}", -1
        if not result.ok:
            log.warning("progress stored with status %s %s", result.status, result.reason)
        return result.status, result.queue_offset if result.offset >= 0 else -1

    async def _snapshot(self, events_next: int) -> None:
        status, _ = await self._append({"events_next": events_next, "table": self.table.snapshot()}, SNAPSHOT_QUEUE)
        self._events_since_snapshot = 0  # on failure too: the next try comes after as many events again
        self._last_snapshot = trio.current_time()
        if status == "PUT_OK":
            log.info("progress snapshot stored: %d queues, replay from event record %d", len(self.table.queues), events_next)
        else:
            log.error("progress snapshot not stored (%s): a restart replays from the previous one", status)

    async def replay(self) -> None:
        """Load the last snapshot and the events after it (before serving)."""
        start = 0
        last = await self.cluster.pull(PROGRESS_TOPIC, SNAPSHOT_QUEUE, 0, count_max=1)
        if last.max_queue_offset > 0:
            snapshot = await self.cluster.pull(PROGRESS_TOPIC, SNAPSHOT_QUEUE, last.max_queue_offset - 1, count_max=1)
            if snapshot.records:
                try:
                    data = json.loads(bytes(snapshot.records[0].body))
                    self.table.load(data["table"])
                    start = int(data["events_next"])
                except (ValueError, KeyError, TypeError, ProgressError) as error:
                    log.error("progress snapshot at %d unreadable (%s): replaying every event", last.max_queue_offset - 1, error)
                    self.table = ProgressTable()
        offset = start
        while True:
            try:
                pulled = await self.cluster.pull(PROGRESS_TOPIC, EVENTS_QUEUE, offset, count_max=PULL_PAGE)
            except hc.DamagedRecordError:
                try:  # the page held a damaged record: is it the first one?
                    pulled = await self.cluster.pull(PROGRESS_TOPIC, EVENTS_QUEUE, offset, count_max=1)
                except hc.DamagedRecordError as error:  # skipped as a garbage record is
                    log.error("progress event record at queue offset %d skipped: %s", offset, error)
                    offset += 1
                    continue
            if not pulled.records:
                break
            for record in pulled.records:
                self.replay_record(record)
            offset = pulled.next_queue_offset
        log.info("progress replayed: snapshot then event records [%d, %d), %d events; %d group queues",
                 start, offset, self.stats["replayed"], len(self.table.queues))  # fmt: skip

    def replay_record(self, record: rec.Record) -> None:
        try:
            events = json.loads(bytes(record.body))
            if not isinstance(events, list):
                raise ValueError("not a list of events")
        except ValueError as error:
            log.error("progress event record at queue offset %d skipped: %s", record.queue_offset, error)
            return
        for event in events:
            try:
                self.table.apply(event)
            except ProgressError as error:
                log.error("progress event in the record at queue offset %d skipped: %s", record.queue_offset, error)
                continue
            self.stats["replayed"] += 1
