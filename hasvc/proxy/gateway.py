"""The gateway's trio side: sends, receives, acks and consumer progress against a hasvc pair.

Theory of operation
-------------------
All state lives in one trio loop (its own thread, see ``hasvc/proxy/server.py``) and every broker
request goes through one :class:`hasvc.client.FailoverClient`, which follows the master.

* **Send**: each message is a SEND_IDEMPOTENT keyed by (a producer id derived from the client id,
  the counter in the message id) — ``hasvc/proxy/convert.py`` — into a queue chosen from the message
  id, so a retry lands where the first attempt did. Two attempts of one message that overlap in
  the proxy are serialised, so the broker always sees the second as a retry.
* **Receive**: per (group, topic, queue) under a lock: expired in-flight messages first (read one by
  one at their offsets), then new ones from ``next_new``; messages a TAG filter rejects are
  acknowledged for the group. The deliveries are events, applied to the
  :class:`~hasvc.proxy.progress.ProgressTable` and queued for the progress topic as the
  messages are handed out (not waiting for them to be stored: a delivery a restart forgets is
  only delivered again). With nothing to deliver the receive waits (long polling) until a send
  through this proxy wakes it, ``receive_recheck_seconds`` pass (messages other clients wrote, or a
  deadline that passed), or its time is up.
* **Ack / ChangeInvisibleDuration**: the receipt handle must name the current delivery (its nonce);
  the event is appended and the answer waits until it is stored.
* **Progress topic** (``hasvc/proxy/progress_log.py``): one writer appends events in the order
  they were applied (a batch per record, queue 0) and, every ``snapshot_every_events``, the whole
  table (queue 1) with the queue-0 offset replay starts from. On start the gateway loads the last
  snapshot and replays the events after it. The events waiting for the writer are bounded
  (``progress_events_queued_max``): a receive, ack, invisible-time change or dead-letter forward
  that finds no room is refused ``TOO_MANY_REQUESTS`` before it changes anything.
* **Per-name state** (the locks of group queues, the events receives wait on) lives only while a
  receive uses it, so names clients make up cost nothing once their calls are over.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import secrets
import time
import zlib
from collections import OrderedDict

import trio

from commitlog import record as rec
from hasvc import client as hc
from hasvc.protocol import client as cp
from hasvc.state.dedupe import PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQ
from hasvc.proxy import convert
from hasvc.proxy.convert import Refused
from hasvc.proxy.limits import PROGRESS_EVENTS_QUEUED_MAX_DEFAULT
from hasvc.proxy.pb import Code
from hasvc.proxy.progress import ProgressTable, QueueProgress
from hasvc.proxy.progress_log import (  # noqa: F401 -- SNAPSHOT_QUEUE, PROGRESS_TOPIC: the progress topic's, named here too
    PROGRESS_RECORD_INTERVAL_SECONDS, PROGRESS_TOPIC, PROGRESS_TOPIC_PREFIX, SNAPSHOT_EVENTS_DEFAULT, SNAPSHOT_QUEUE, ProgressLog,
)

log = logging.getLogger("hasvc.proxy")

DLQ_PREFIX = "%DLQ%"  # RocketMQ's MixAll.DLQ_GROUP_TOPIC_PREFIX: a group's dead-letter topic
DLQ_ORIGIN_PROPERTY = "HASVC_DLQ_ORIGIN"  # topic/queue/offset the message was consumed from
# RocketMQ: a producer creates topics with 4 queues (DefaultMQProducer.defaultTopicQueueNums).
QUEUES_PER_TOPIC_DEFAULT = 4
# RocketMQ's proxy: invisible time 10 s .. 12 h for a receive (minInvisibleTimeMillsForRecv,
# maxInvisibleTimeMills); long polling at most 20 s (grpcClientConsumerMaxLongPollingTimeoutMillis),
# answered 100 ms before the client's deadline (longPollingReserveTimeInMillis). We reserve 500 ms:
# the answer crosses two event loops and the GIL, and 100 ms was too little on a loaded 2-core machine.
INVISIBLE_MIN_SECONDS_DEFAULT = 10.0
INVISIBLE_MAX_SECONDS = 12 * 3600.0
LONG_POLLING_MAX_SECONDS = 20.0
LONG_POLLING_RESERVE_SECONDS = 0.5
# RocketMQ's proxy answers at most 32 messages per receive (grpcClientConsumerLongPollingBatchSize).
RECEIVE_BATCH_MAX = 32
# Messages other clients write reach a waiting receive within this (RocketMQ's broker re-checks
# held pulls every 1 s with short polling; sends through this proxy wake it at once).
RECEIVE_RECHECK_SECONDS = 0.5
# A message id that is not a v1 id (not one of the official clients') is keyed by the proxy: it
# remembers this many such ids (a retry of an id it forgot is stored again).
FOREIGN_IDS_MAX = 65536


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    queues: int = QUEUES_PER_TOPIC_DEFAULT
    body_size_max: int = convert.BODY_SIZE_MAX_DEFAULT
    topics: frozenset[str] | None = None  # None: any legal name (RocketMQ's autoCreateTopicEnable)
    invisible_min_seconds: float = INVISIBLE_MIN_SECONDS_DEFAULT
    start_at_end: bool = False  # a new group starts at the end of each queue, not at the oldest message
    receive_recheck_seconds: float = RECEIVE_RECHECK_SECONDS
    snapshot_every_events: int = SNAPSHOT_EVENTS_DEFAULT
    null_sends: bool = False  # benchmark only: answer checked sends OK without storing them
    send_lane: bool = True  # sends straight from the gRPC loop (hasvc/proxy/lane.py); off: all through trio
    # at least this long from one progress event record's start to the next's (0: none)
    progress_record_interval_seconds: float = PROGRESS_RECORD_INTERVAL_SECONDS
    progress_events_queued_max: int = PROGRESS_EVENTS_QUEUED_MAX_DEFAULT  # hasvc/proxy/limits.py


@dataclasses.dataclass(frozen=True, slots=True)
class SendOutcome:
    code: int
    message: str
    message_id: str = ""
    queue_offset: int = -1


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedSend:
    """A message checked for sending: where it goes and its idempotence key (producer id, sequence)."""

    topic: str
    checked: convert.Outgoing
    key: tuple[str, int]
    queue_id: int

    def request(self) -> cp.SendRequest:
        """The SEND_IDEMPOTENT request that stores it (``hasvc/protocol/client.py``)."""
        checked = self.checked
        encoded = hc.message_properties(checked.tags, checked.keys, checked.properties)
        return cp.SendRequest(self.topic, self.queue_id, [checked.body], [encoded], 0, now_ms(), self.key[0], self.key[1])


def send_outcome(message_id: str, result: hc.SendResult) -> SendOutcome:
    """The gRPC answer to a stored (or refused) message: the broker's status mapped."""
    code = convert.send_status_code(result.status)
    if code == Code.OK:
        return SendOutcome(code, "OK", message_id, result.queue_offset)
    detail = f"send message failed, status {result.status}" + (f": {result.reason}" if result.reason else "")
    return SendOutcome(code, detail, message_id, result.queue_offset)


@dataclasses.dataclass(frozen=True, slots=True)
class Delivery:
    record: rec.Record
    receipt_handle: str
    attempt: int
    invisible_ms: int


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# Delivery nonces only need to differ between deliveries of one offset (also across restarts, so
# a handle from before a restart is stale after it): 63 bits from a generator seeded from the OS at
# start, not a system call per delivery (``secrets`` made one getrandom() per message).
_NONCES = random.Random()


def new_nonce() -> int:
    return _NONCES.getrandbits(63)


class Gateway:
    def __init__(self, cluster: hc.FailoverClient, config: GatewayConfig):
        self.cluster = cluster
        self.config = config
        self.stats = {"sent": 0, "delivered": 0, "acked": 0, "events": 0, "records": 0, "replayed": 0, "progress_refused": 0}
        self.progress = ProgressLog(cluster, config, self.stats)  # the progress topic: events stored, replayed
        self._locks: dict[tuple, trio.Lock] = {}  # (group, topic, queue) -> its lock, while held or waited for
        self._arrivals: dict[str, trio.Event] = {}  # topic -> what its receives wait on, while one is in progress
        self._receiving: dict[str, int] = {}  # topic -> receives in progress
        self._sending: dict[tuple[str, int], trio.Event] = {}
        self._foreign_ids: OrderedDict[str, int] = OrderedDict()
        self._foreign_producer = "rmq-proxy-" + secrets.token_hex(8)
        self._foreign_next = 0

    @property
    def table(self) -> ProgressTable:
        """Consumer progress (the progress log's: a replay may replace it)."""
        return self.progress.table

    async def writer(self) -> None:
        """The progress topic's writer task (``ProgressLog.run``)."""
        await self.progress.run()

    async def replay(self) -> None:
        """Load consumer progress from the progress topic (before serving)."""
        await self.progress.replay()

    # --- topics ---

    def check_topic(self, topic: str, group: str | None = None) -> Refused | None:
        refused = convert.check_topic(topic, PROGRESS_TOPIC_PREFIX)
        if refused is None and self.config.topics is not None and topic not in self.config.topics:
            return Refused(Code.TOPIC_NOT_FOUND, f"topic {topic!r} is not served by this proxy (--topic)")
        if refused is None and group is not None:
            return convert.check_group(group)
        return refused

    # --- send ---

    def _idempotence_key(self, client_id: str, message_id: str) -> tuple[str, int]:
        sequence = convert.message_id_sequence(message_id)
        if sequence is not None and client_id:
            return convert.producer_id_for(client_id), sequence
        known = self._foreign_ids.get(message_id)
        if known is None:
            known = self._foreign_ids[message_id] = self._foreign_next
            self._foreign_next += 1
            while len(self._foreign_ids) > FOREIGN_IDS_MAX:
                self._foreign_ids.popitem(last=False)
        return self._foreign_producer, known

    def prepare_send(self, client_id: str, message) -> SendOutcome | PreparedSend:
        """Check one ``apache.rocketmq.v2.Message`` for sending and key it for idempotence; a
        refusal (or, with ``null_sends``, the answer) is a SendOutcome. No I/O and no trio: the
        gRPC handlers call it in their own thread (one thread only: it keeps ``_foreign_ids``)."""
        topic = message.topic.name
        refused = self.check_topic(topic)
        checked = refused or convert.outgoing(message, body_size_max=self.config.body_size_max)
        if isinstance(checked, Refused):
            return SendOutcome(checked.code, checked.message, message.system_properties.message_id)
        if self.config.null_sends:
            return SendOutcome(Code.OK, "OK (not stored: --null-sends)", checked.message_id, 0)
        key = self._idempotence_key(client_id, checked.message_id)
        queue_id = zlib.crc32(checked.message_id.encode()) % self.config.queues
        return PreparedSend(topic, checked, key, queue_id)

    async def send(self, client_id: str, message) -> SendOutcome:
        """Send one ``apache.rocketmq.v2.Message``; the outcome carries the gRPC code."""
        prepared = self.prepare_send(client_id, message)
        if isinstance(prepared, SendOutcome):
            return prepared
        while (busy := self._sending.get(prepared.key)) is not None:
            await busy.wait()  # an earlier attempt of this message is still out: ours is its retry
        self._sending[prepared.key] = done = trio.Event()
        try:
            outcome = await self.send_prepared(prepared)
        finally:
            del self._sending[prepared.key]
            done.set()
        if outcome.code == Code.OK:
            self.stats["sent"] += 1
        return outcome

    async def send_prepared(self, prepared: PreparedSend) -> SendOutcome:
        """Store a prepared message through the failover client (retried on the new master after a
        failover: the broker answers a repeat of the key with the first offsets). The caller keeps
        two attempts of one key from overlapping."""
        checked = prepared.checked
        try:
            results = await self.cluster.send_idempotent(
                prepared.topic, [checked.body], producer_id=prepared.key[0], first_sequence=prepared.key[1], retry=True,
                tags=checked.tags, keys=checked.keys, properties=checked.properties, queue_id=prepared.queue_id)  # fmt: skip
        except hc.ClientError as error:
            return SendOutcome(Code.PROXY_TIMEOUT, f"hasvc did not answer: {error}", checked.message_id)
        if results[0].offset >= 0:
            self.wake(prepared.topic)
        return send_outcome(checked.message_id, results[0])

    def waiting_topics(self):
        """The topics a long-polling receive waits on (membership may be read from the gRPC
        thread: a receive registers before it pulls, so a send stored before the check is either
        seen by that pull or finds the registration)."""
        return self._arrivals

    def wake(self, topic: str) -> None:
        event = self._arrivals.pop(topic, None)
        if event is not None:
            event.set()

    # --- receive ---

    def _lock(self, key: tuple) -> trio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = trio.Lock()
        return lock

    def _unlocked(self, key: tuple, lock: trio.Lock) -> None:
        """Forget ``key``'s lock once nobody holds or waits for it (a release hands it to the next
        waiter at once, and a task that took it from ``_locks`` acquires it before its next checkpoint)."""
        if not lock.locked() and self._locks.get(key) is lock:
            del self._locks[key]

    def _progress_refused(self) -> Refused:
        """The answer to a call whose progress events would not fit (``progress_events_queued_max``)."""
        self.stats["progress_refused"] += 1
        progress = self.progress
        return Refused(Code.TOO_MANY_REQUESTS, f"consumer progress is not stored fast enough: {progress.events_queued} events "
                       f"wait for the brokers (progress_events_queued_max {self.config.progress_events_queued_max}); retry later")  # fmt: skip

    async def receive(self, group: str, topic: str, queue_hint: int, tags: frozenset[str] | None, batch: int,
                      invisible_ms: int, wait_seconds: float) -> list[Delivery] | Refused:  # fmt: skip
        """Up to ``batch`` messages for ``group``, waiting up to ``wait_seconds`` for the first."""
        refused = self.check_topic(topic, group)
        if refused is not None:
            return refused
        if not (self.config.invisible_min_seconds * 1000 <= invisible_ms <= INVISIBLE_MAX_SECONDS * 1000):
            return Refused(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms / 1000:g} s is outside "
                           f"[{self.config.invisible_min_seconds:g} s, {INVISIBLE_MAX_SECONDS:g} s]")  # fmt: skip
        batch = max(1, min(batch, RECEIVE_BATCH_MAX))
        deadline = trio.current_time() + max(0.0, wait_seconds)
        self._receiving[topic] = self._receiving.get(topic, 0) + 1
        try:
            return await self._receive(group, topic, queue_hint, tags, batch, invisible_ms, deadline)
        finally:
            self._receiving[topic] -= 1
            if not self._receiving[topic]:
                del self._receiving[topic]
                self._arrivals.pop(topic, None)  # nobody waits on it any more

    async def _receive(self, group: str, topic: str, queue_hint: int, tags, batch: int, invisible_ms: int,
                       deadline: float) -> list[Delivery] | Refused:  # fmt: skip
        while True:
            arrival = self._arrivals.setdefault(topic, trio.Event())
            deliveries: list[Delivery] = []
            for index in range(self.config.queues):
                queue_id = (queue_hint + index) % self.config.queues
                collected = await self._collect(group, topic, queue_id, tags, batch - len(deliveries), invisible_ms)
                if collected is None:  # no room for its progress events: what we have, or the refusal
                    return deliveries or self._progress_refused()
                deliveries += collected
                if len(deliveries) >= batch:
                    break
            now = trio.current_time()
            if deliveries or now >= deadline:
                return deliveries
            with trio.move_on_after(min(deadline - now, self.config.receive_recheck_seconds)):
                await arrival.wait()
            if trio.current_time() >= deadline:
                return []  # time is up: answer now rather than pull once more

    async def _collect(self, group: str, topic: str, queue_id: int, tags, count: int, invisible_ms: int) -> list[Delivery] | None:
        """Up to ``count`` deliveries from one queue; None when the progress queue has no room for
        the events it could make: a delivery or filtered ack each, an expired message gone, a start
        and a skip (reserved before the pulls, released as they are enqueued)."""
        key = (group, topic, queue_id)
        events: list[list] = []
        deliveries: list[Delivery] = []
        reserved = 2 * count + 2
        if not self.progress.reserve(reserved):
            return None
        try:
            await self._collect_locked(key, tags, count, invisible_ms, events, deliveries)
        finally:
            self.progress.release(reserved)
            # Applied events are queued for the writer, even when the receive was abandoned
            # half-way, and the messages go out without waiting for them: a delivery that is
            # never stored is only forgotten by a restart (and delivered again), and an ack of it
            # is queued after it, so the log never holds the ack without the delivery.
            if events:
                self.progress.enqueue(events)
        deliveries = [d for d in deliveries if d is not None]
        self.stats["delivered"] += len(deliveries)
        return deliveries

    async def _collect_locked(self, key: tuple, tags, count: int, invisible_ms: int, events: list, deliveries: list) -> None:
        lock = self._lock(key)
        try:
            async with lock:
                await self._collect_queue(key, tags, count, invisible_ms, events, deliveries)
        finally:
            self._unlocked(key, lock)

    async def _collect_queue(self, key: tuple, tags, count: int, invisible_ms: int, events: list, deliveries: list) -> None:
        group, topic, queue_id = key
        if key not in self.table.queues and self.config.start_at_end:
            await self._start_at_end(key, events)
        # a queue this group never touched gets an entry only once something happens on it
        progress = self.table.queues.get(key) or QueueProgress()
        now = now_ms()
        for offset in progress.expired(now)[:count]:
            pulled = await self.cluster.pull(topic, queue_id, offset, count_max=1)
            if not pulled.records or pulled.records[0].queue_offset != offset:
                self._event(events, ["a", group, topic, queue_id, offset])  # gone (retention)
                continue
            deliveries.append(self._deliver(events, key, pulled.records[0], invisible_ms, now, tags))
        room = min(count - len(deliveries), progress.room())
        if room > 0:
            pulled = await self.cluster.pull(topic, queue_id, progress.next_new, count_max=room)
            if pulled.records and pulled.records[0].queue_offset > progress.next_new:
                self._event(events, ["s", group, topic, queue_id, pulled.records[0].queue_offset])  # retention
            for record in pulled.records:
                deliveries.append(self._deliver(events, key, record, invisible_ms, now, tags))

    async def _start_at_end(self, key: tuple, events: list) -> None:
        group, topic, queue_id = key
        pulled = await self.cluster.pull(topic, queue_id, 0, count_max=1)
        self._event(events, ["s", group, topic, queue_id, max(0, pulled.max_queue_offset)])

    def _deliver(self, events: list, key: tuple, record: rec.Record, invisible_ms: int, now: int, tags) -> Delivery | None:
        group, topic, queue_id = key
        offset = record.queue_offset
        if tags is not None and record.tags not in tags:
            self._event(events, ["a", group, topic, queue_id, offset])  # filtered out for this group
            return None
        previous = self.table.get(key).inflight.get(offset)
        attempt = previous.attempt + 1 if previous else 1
        nonce = new_nonce()
        self._event(events, ["d", group, topic, queue_id, offset, nonce, now + invisible_ms, attempt])
        return Delivery(record, convert.encode_receipt_handle(queue_id, offset, nonce), attempt, invisible_ms)

    def _event(self, events: list, event: list) -> None:
        self.table.apply(event)
        events.append(event)

    # --- ack / change invisible duration ---

    def _current_delivery(self, group: str, topic: str, handle: str):
        decoded = convert.decode_receipt_handle(handle)
        if decoded is None:
            return Refused(Code.INVALID_RECEIPT_HANDLE, f"malformed receipt handle {handle[:100]!r}")
        queue_id, offset, nonce = decoded
        progress = self.table.queues.get((group, topic, queue_id))
        if progress is None:
            return Refused(Code.INVALID_RECEIPT_HANDLE, f"group {group!r} has received nothing from {topic}/{queue_id}")
        if progress.done(offset):
            return "done", queue_id, offset
        current = progress.inflight.get(offset)
        if current is None or current.nonce != nonce:
            return Refused(Code.INVALID_RECEIPT_HANDLE, "stale receipt handle: the message was delivered again "
                                                        "or its invisible duration changed since")  # fmt: skip
        return "current", queue_id, offset

    def ack_soon(self, group: str, topic: str, handles: list[str], answer) -> None:
        """Acknowledge ``handles`` (the entries of one AckMessage); ``answer`` gets one (code, text)
        per handle, at once when none needs storing, else when the one record holding them all is
        stored. Synchronous (no task per ack): called in the trio thread by the bridge."""
        refused = self.check_topic(topic, group)
        if refused is None and not self.progress.has_room(len(handles)):
            refused = self._progress_refused()
        if refused is not None:
            answer([(refused.code, refused.message)] * len(handles))
            return
        answers: list = []
        events: list[list] = []
        waiting: list[int] = []
        for handle in handles:
            found = self._current_delivery(group, topic, handle)
            if isinstance(found, Refused):
                answers.append((found.code, found.message))
                continue
            state, queue_id, offset = found
            if state == "done":
                answers.append((Code.OK, "OK (already acknowledged)"))
                continue
            self._event(events, ["a", group, topic, queue_id, offset])
            self.stats["acked"] += 1
            waiting.append(len(answers))
            answers.append(None)
        if not events:
            answer(answers)
            return

        def stored(status: str) -> None:
            code = self._persist_code(status)
            for index in waiting:
                answers[index] = code
            answer(answers)

        self.progress.enqueue(events, answers=True).callbacks.append(stored)

    async def ack(self, group: str, topic: str, handle: str) -> tuple[int, str]:
        answered = trio.Event()
        box: list = []

        def answer(answers: list) -> None:
            box.extend(answers)
            answered.set()

        self.ack_soon(group, topic, [handle], answer)
        await answered.wait()
        return box[0]

    async def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> tuple[int, str, str]:
        refused = self.check_topic(topic, group)
        if refused is not None:
            return refused.code, refused.message, ""
        if not (0 <= invisible_ms <= INVISIBLE_MAX_SECONDS * 1000):
            return Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms / 1000:g} s is outside [0, {INVISIBLE_MAX_SECONDS:g} s]", ""
        found = self._current_delivery(group, topic, handle)
        if isinstance(found, Refused):
            return found.code, found.message, ""
        state, queue_id, offset = found
        if state == "done":
            return Code.INVALID_RECEIPT_HANDLE, "the message is already acknowledged", ""
        if not self.progress.has_room(1):
            refused = self._progress_refused()
            return refused.code, refused.message, ""
        nonce = new_nonce()
        events: list[list] = []
        self._event(events, ["c", group, topic, queue_id, offset, nonce, now_ms() + invisible_ms])
        code, message = self._persist_code(await self.progress.persist(events))
        return code, message, convert.encode_receipt_handle(queue_id, offset, nonce)

    async def dead_letter(self, group: str, topic: str, handle: str) -> tuple[int, str]:
        """A consumer gave up on a message after its last attempt: copy it to ``%DLQ%<group>``
        (RocketMQ's dead-letter topic, queue 0), then acknowledge it for the group. A retry of a
        forward that was copied but not yet acknowledged copies it again (at least once)."""
        refused = self.check_topic(topic, group)
        if refused is None and not self.progress.has_room(1):  # before the copy: its ack would be refused
            refused = self._progress_refused()
        found = refused or self._current_delivery(group, topic, handle)
        if isinstance(found, Refused):
            return found.code, found.message
        state, queue_id, offset = found
        if state == "done":
            return Code.OK, "OK (already acknowledged)"
        pulled = await self.cluster.pull(topic, queue_id, offset, count_max=1)
        if pulled.records and pulled.records[0].queue_offset == offset:
            record = pulled.records[0]
            # tags and keys travel as such; the original producer's idempotence key does not
            dropped = (rec.PROPERTY_TAGS, rec.PROPERTY_KEYS, PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQ)
            properties = {k: v for k, v in record.properties.items() if k not in dropped}
            properties[DLQ_ORIGIN_PROPERTY] = f"{topic}/{queue_id}/{offset}"
            try:
                result = await self.cluster.send(DLQ_PREFIX + group, bytes(record.body), tags=record.tags, keys=record.keys,
                                                 properties=properties, retry=True)  # fmt: skip
            except hc.ClientError as error:
                return Code.PROXY_TIMEOUT, f"dead-letter copy not stored: {error}"
            if not result.ok:
                return convert.send_status_code(result.status), f"dead-letter copy not stored safely: {result.status} {result.reason}"
        return await self.ack(group, topic, handle)

    @staticmethod
    def _persist_code(status: str) -> tuple[int, str]:
        code = convert.send_status_code(status) if not status.startswith("ERROR") else Code.PROXY_TIMEOUT
        return code, "OK" if code == Code.OK else f"progress not stored safely: {status}"

    def summary(self) -> dict:
        return {**self.stats, "group_queues": len(self.table.queues)}


def wrap_topic(resource) -> str:
    """A RocketMQ resource (namespace, name) as a hasvc topic: ``namespace%name`` as RocketMQ's
    NamespaceUtil wraps it, or the bare name."""
    return f"{resource.resource_namespace}%{resource.name}" if resource.resource_namespace else resource.name

