"""The put path: SENDs appended, their waits registered, their answers sent.

Theory of operation
-------------------
A put (SEND) on a master, in this order — the order is the contract:

1. refuse at once if this broker is a slave (SERVICE_NOT_AVAILABLE naming the master) or, with
   ``min_in_sync_replicas``, if too few slaves are in sync (IN_SYNC_REPLICAS_NOT_ENOUGH, nothing
   stored): ``PutTracker.refusal``;
2. append to the log, synchronously in the connection's receive loop (so one connection's sends
   land in the order they were sent), then tell the replicator (classic HA pushes the new
   records to idle slaves from here) and do the store's follow-up (dispatch, warm-up);
3. register the waits, both at once so they overlap (``PutTracker.plan``): a flush waiter under
   SYNC_FLUSH (group commit: one ``fdatasync`` releases every waiter it covers) and, under
   SYNC_MASTER, an ack waiter released when the replicator's offset passes the records — unless
   no slave is close enough to try (SLAVE_NOT_AVAILABLE at once);
4. answer PUT_OK, or FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE
   (``final_status``) — in all three the records are stored on the master, and the status says
   exactly that.

Waiters are released by the event that covers them (a flush finishing: ``flushed``; the
replicated offset moving: the replicator's subscription) and expired by one timer task
(``waiter_timer_task``): no polling.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
import time
from collections.abc import Callable
from itertools import chain, repeat
from typing import ClassVar, Protocol

import trio

from commitlog import entry_pass, pass_encode
from commitlog import record as rec
from commitlog.commit_log import AppendResult
from commitlog.config import StoreConfig
from commitlog.dledger import entry_codec
from commitlog.store import MessageStore
from commitlog.waiters import OffsetWaiters, WaitersFull
from hasvc.broker.outbox import Outbox, error_response
from hasvc.broker.put_answers import Appended, WaiterTimer, _PassAnswer, _StoredAnswer, _Wait, answer_pass
from hasvc.config import BrokerConfig, FlushDiskType
from hasvc.protocol import client as cp
from hasvc.replicator import Replicator
from hasvc.state.dedupe import PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQ, ProducerTable, Stored, Verdict
from hasvc.state.puts import PutTracker, final_status
from hasvc.state.role import RoleState

WAITER_TIMER_MAX_SECONDS = 0.1  # the timer task re-checks deadlines at least this often


# SENDs read together are appended together up to this many body bytes (well under the 4 MiB
# max_message_size a batch's bodies share).
COALESCE_BYTES_MAX = 1024 * 1024


def coalesce(sends: list[tuple[cp.Frame, cp.SendRequest]], *, bytes_max: int) -> list[list]:
    """SENDs read together, grouped by topic, queue and flag, each group at most ``bytes_max``
    body bytes (a single larger SEND stands alone). Groups come in the order of their first
    request and keep their requests' order, so each queue keeps the connection's order; requests
    for different queues read together may be stored in either order (no promise is made across
    queues). Producers spread over queues interleave, so grouping consecutive SENDs only found
    groups of 1.2 requests at 64 producers on 4 queues."""
    groups: list[list] = []
    open_groups: dict[tuple, tuple[list, int]] = {}
    for frame, request in sends:
        request_size = sum(map(len, request.bodies))
        key = (request.topic, request.queue_id, request.flag)
        current = open_groups.get(key)
        if current is not None and current[1] + request_size <= bytes_max:
            current[0].append((frame, request))
            open_groups[key] = (current[0], current[1] + request_size)
        else:
            group = [(frame, request)]
            groups.append(group)
            open_groups[key] = (group, request_size)
    return groups


def split_appended(appended: Appended, counts: list[int]) -> list[Appended]:
    """One Appended per request of a coalesced batch, each with its own offsets."""
    result = appended.result
    pieces = []
    start = 0
    for count in counts:
        end = start + count
        next_offset = result.offsets[end] if end < len(result.offsets) else result.next_offset
        # Built directly: dataclasses.replace, twice per request, was a tenth of a busy master.
        piece = AppendResult(
            result.status, result.offsets[start], next_offset - result.offsets[start], result.store_timestamp,
            result.offsets[start:end], result.queue_offsets[start:end], result.reason,
        )  # fmt: skip
        pieces.append(Appended(appended.status, appended.reason, piece, appended.queue_id))
        start = end
    return pieces


# The statuses of a batch refused for what it holds: its requests are then appended one by one
# (``_append_group``), so that one bad message fails alone.
_CONTENT_REFUSALS = (rec.PutMessageStatus.MESSAGE_ILLEGAL, rec.PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)


def _merged(requests: list[cp.SendRequest]) -> cp.SendRequest:
    """SENDs of one group (same topic, queue and flag) as one, in their order."""
    if len(requests) == 1:
        return requests[0]
    first = requests[0]
    return cp.SendRequest(  # lists joined by C loops, not a Python step per message
        first.topic, first.queue_id, list(chain.from_iterable([r.bodies for r in requests])),
        list(chain.from_iterable([r.properties for r in requests])), first.flag, first.born_timestamp,
    )  # fmt: skip


def _batch_of(request: cp.SendRequest) -> rec.MessageBatch:
    """A SEND's messages as the store's batch (one properties map when all share it)."""
    properties = request.properties
    shared = properties.count(properties[0]) == len(properties)  # compared in C
    return rec.MessageBatch(
        request.topic, request.bodies, queue_id=request.queue_id, properties=properties[0] if shared else properties,
        flag=request.flag, born_timestamp=request.born_timestamp,
    )  # fmt: skip


class PutSink(Protocol):
    """What ``PutService`` appends to: the classic store (``StoreSink``) or a Raft member's log
    (``hasvc.broker.raft.replicator.RaftLog``: its appends propose). ``config``: the store's (flush
    type, waits). ``append_batches``: several batches (a pass's groups over several queues) in one
    call, one result for them all, cut per group by the caller (a Raft member: one proposal); None:
    a call per group."""

    config: StoreConfig
    append_batches: Callable[[list[rec.MessageBatch]], AppendResult] | None

    def append_batch(self, batch: rec.MessageBatch) -> AppendResult: ...


class StoreSink:
    """The classic store as a ``PutSink``: ``append_batch`` is the store's own (bound here, so a
    put calls ``MessageStore.append_batch`` with no layer between); a call per group, where a
    group's append costs no more than its share of one (no ``append_batches``)."""

    __slots__ = ("config", "append_batch", "store")
    append_batches: ClassVar[None] = None

    def __init__(self, store: MessageStore) -> None:
        self.config = store.config
        self.append_batch = store.append_batch
        self.store = store  # the whole store: a pass of plain SENDs appended in one call (``commitlog.pass_encode``)


class PutService:
    """Drives the put path of one broker (see the module): what it needs is passed in, the store
    (open), the role (who may write), the replicator (how far records are replicated), the
    producer table (idempotent sends) and ``after_appends``, the store's follow-up to a pass of
    appends. ``metrics`` is set when the broker serves them."""

    def __init__(self, *, config: BrokerConfig, store: PutSink, role: RoleState, replicator: Replicator,
                 producers: ProducerTable, after_appends: Callable[[], None]) -> None:  # fmt: skip
        store_config = store.config
        self.config = config
        self.store = store
        self.role = role
        self.replicator = replicator
        self.producers = producers
        self.after_appends = after_appends
        self._append_batches = store.append_batches  # None: a call per group (``PutSink``)
        # The classic log with the native module: a pass of plain SENDs is appended by one call
        # (``_put_pass``); without it the batch path below stays (the pure twins write a batch per
        # request: they are the reference the tests compare with, not a faster path).
        self._pass_store = store.store if pass_encode.NATIVE and isinstance(store, StoreSink) else None
        # A Raft member's log: a pass of plain SENDs is one proposal planned by one call (``RaftLog.append_pass``).
        self._pass_log = getattr(store, "append_pass", None) if entry_pass.NATIVE else None
        # The client port leaves SENDs and SEND_IDEMPOTENTs undecoded (None): the pass reads them natively.
        self.decodes_sends = self._pass_store is not None or self._pass_log is not None
        self.tracker = PutTracker(
            sync_flush=store_config.flush_disk_type is FlushDiskType.SYNC_FLUSH, in_sync_replicas=config.in_sync_replicas,
            min_in_sync_replicas=config.min_in_sync_replicas, flush_timeout_seconds=store_config.sync_flush_timeout_seconds,
            ack_timeout_seconds=config.slave_timeout_seconds,
        )  # fmt: skip
        self._flush_waiters: OffsetWaiters[_Wait] = OffsetWaiters(waiters_max=store_config.group_commit_waiters_max)
        self._ack_waiters: OffsetWaiters[_Wait] = OffsetWaiters(waiters_max=store_config.group_commit_waiters_max)
        self._flush_requested = trio.Event()
        self.timer = WaiterTimer()  # when waiter_timer_task next expires waits
        self.metrics = None
        self.duplicate_sends = 0  # SEND_IDEMPOTENT retries answered from the producer table
        self._after_appends_pending = False
        replicator.subscribe(self._release_acked)

    def put_items(self, items: list[tuple[Outbox, cp.Frame, cp.SendRequest]]) -> None:
        """Append a pass of SENDs, send them to the idle slaves, then register the waits and
        answer the refusals: the slave works on the frame while the master does the rest (it
        is only read after this step, so no ack can come before its waits exist)."""
        if self._pass_store is not None or self._pass_log is not None:
            if self._put_pass(items):
                return
            items = _decoded(items)
            if not items:
                return
        if len(items) == 1 and items[0][1].kind == cp.SEND:  # a lone producer's put: nothing to group
            outbox, frame, request = items[0]
            answered = [[((outbox, frame), self.append(request))]]
        else:
            answered = []
            plain: list = []
            for outbox, frame, request in items:
                if frame.kind == cp.SEND:
                    plain.append(((outbox, frame), request))
                    continue
                answered.append(self._append_sends(plain))
                plain = []
                answered.append(self._append_idempotent((outbox, frame), request))
            answered.append(self._append_sends(plain))
        self.replicator.appended()
        self._after_appends_pending = True
        waiting = False
        for each in answered:
            if each:
                waiting |= self._respond_when_safe(each)
        if not waiting:
            self.run_after_appends()

    def _put_pass(self, items: list[tuple[Outbox, cp.Frame, cp.SendRequest]]) -> bool:
        """``put_items`` for a pass of plain SENDs on the classic log: every request appended by
        one call (``pass_encode.append_pass``: the records in the order read, each request's
        answer offsets packed there; a Raft member's log proposes them as one proposal,
        ``RaftLog.append_pass``), the refused ones answered at once, the rest answered
        together once the pass's end is as safe as configured. False, with nothing done, when
        the pass is the batch path's: a refusal of the put itself (role, replicas) or of the
        store (see ``append_pass``). A SEND_IDEMPOTENT is written with the pass, tagged with its
        producer id and sequences (natively, from its payload), when the producer table finds it
        new (``_IdempotentPass``); a retry is answered with its original offsets, a refusal at
        once."""
        if self.tracker.refusal(self.role, self.replicator.in_sync_count) is not None:  # _write_refusal, without its Appended
            return False
        requests = [frame.payload if request is None else request for _, frame, request in items]
        kinds = idempotent = decide = None
        every_kind = [frame.kind for _, frame, _ in items]  # one call a pass (any() over a generator was one a put)
        if cp.SEND_IDEMPOTENT in every_kind:
            kinds = bytes(every_kind)
            idempotent = _IdempotentPass(self.producers, items)
            decide = idempotent.decide
        if self._pass_log is not None:
            appended = self._pass_log(requests, messages_max=cp.SEND_MESSAGES_MAX, decode=_decode_or_none, decide=decide, kinds=kinds)
        else:
            appended = pass_encode.append_pass(self._pass_store, requests, messages_max=cp.SEND_MESSAGES_MAX, decode=_decode_or_none,
                                               decide=decide, kinds=kinds)  # fmt: skip
        if appended is None:
            return False
        duplicates = idempotent.stored(self, appended) if idempotent is not None else []
        for number in appended.malformed:  # the client port's answer to a SEND it cannot decode
            outbox, frame, _ = items[number]
            outbox.respond(frame, error_response(frame, _protocol_error(frame)))
            outbox.flush()
        started = time.perf_counter()
        self.replicator.appended()
        self._after_appends_pending = True
        result = appended.result
        if result is not None and self.metrics:
            self.metrics.appended(result)
        waiting = self._respond_when_safe(duplicates) if duplicates else False
        for number, refusal in appended.refusals.items():  # answered at once, as the batch path does
            outbox, frame, _ = items[number]
            if self.metrics:
                self.metrics.put_done(refusal.status.name, time.perf_counter() - started)
            outbox.respond(frame, cp.encode_send_response_fields(refusal.status.name, refusal.reason, -1, [], []))
            outbox.flush()
        if result is not None:
            if self.tracker.must_wait(self.role):
                if _PassAnswer(self, items, appended, started).registered:
                    return True
            else:
                kept = len(items) - len(appended.refusals) - len(appended.left_out)
                answer_pass(self, items, appended.answers, kept, "PUT_OK", "", started)
        if not waiting:
            self.run_after_appends()
        return True

    def run_after_appends(self) -> None:
        """``after_appends`` (the consume queue units, the warm-up's look) for the passes appended
        since it last ran. A pass whose answers wait for a slave or a flush runs it once they are
        sent (``_StoredAnswer``), not before: the slave's report used to wait behind it, and a lone
        SYNC_MASTER writer's p50 with it (4 alternating pairs, ``scripts/dev/cpu_per_put.py TREE 1 1 4``:
        223-227 -> 206-213 us). A client that reads what it was answered still finds it: the
        units are written in the step that sent the answers, before any request is read again.
        While answers wait long (no slave acknowledges), the dispatch task's look every
        0.1 s writes the units meanwhile."""
        if self._after_appends_pending:
            self._after_appends_pending = False
            self.after_appends()

    def _append_sends(self, sends: list) -> list:
        """``sends``: ((outbox, frame), SendRequest) pairs, appended by topic/queue group; each
        reply with its Appended."""
        groups = coalesce(sends, bytes_max=COALESCE_BYTES_MAX)
        if len(groups) > 1 and self._append_batches is not None:
            answered = self._append_groups_together(groups)
            if answered is not None:
                return answered
        answered = []
        for group in groups:
            answered += self._append_group(group)
        return answered

    def _append_groups_together(self, groups: list) -> list | None:
        """Append a pass's groups (several queues, in their order) by one ``append_batches`` of
        the store: one result for them all, cut per group and then per request (the offsets
        and queue offsets the groups appended one after the other would get). A refusal of the
        put (role, replicas) or of the store answers every request with it; None when the store
        refused the batches for their content, so the caller appends group by group and one bad
        message fails alone. Each reply with its Appended."""
        refusal = self.tracker.refusal(self.role, self.replicator.in_sync_count)
        if refusal is not None:
            return [(reply, Appended(refusal.status, refusal.reason)) for group in groups for reply, _ in group]
        requests = [_merged([request for _, request in group]) for group in groups]
        result = self._append_batches([_batch_of(request) for request in requests])
        put_ok = rec.PutMessageStatus.PUT_OK
        if result.status is not put_ok:
            if result.status in _CONTENT_REFUSALS:
                return None
            return [(reply, Appended(result.status, result.reason, None, request.queue_id))
                    for group, request in zip(groups, requests) for reply, _ in group]  # fmt: skip
        answered: list = []
        per_group = split_appended(Appended(put_ok, "", result), [len(request.bodies) for request in requests])
        for group, request, appended in zip(groups, requests, per_group, strict=True):
            appended.queue_id = request.queue_id
            if self.metrics:
                self.metrics.appended(appended.result)
            if len(group) == 1:
                answered.append((group[0][0], appended))
            else:
                pieces = split_appended(appended, [len(each.bodies) for _, each in group])
                answered += [(reply, each) for (reply, _), each in zip(group, pieces, strict=True)]
        return answered

    def _append_idempotent(self, reply: tuple[Outbox, cp.Frame], request: cp.SendRequest) -> list:
        """A SEND_IDEMPOTENT: a retry is answered with the original offsets once they are as safe
        as a new put would be; a new one is tagged with its producer id and sequences and put.
        The reply with its Appended (none if refused here)."""
        if self._write_refusal() is None:
            lookup = self.producers.lookup(request.producer_id, request.first_sequence, len(request.bodies))
            if lookup.verdict is Verdict.REFUSED:
                outbox, frame = reply
                outbox.respond(frame, error_response(frame, lookup.reason))
                outbox.flush()
                return []
            if lookup.verdict is Verdict.DUPLICATE:
                stored = lookup.stored
                end = max(each.offset + each.size for each in stored)
                result = AppendResult(
                    rec.PutMessageStatus.PUT_OK, wrote_offset=stored[0].offset, wrote_bytes=end - stored[0].offset,
                    offsets=tuple(each.offset for each in stored), queue_offsets=tuple(each.queue_offset for each in stored),
                )  # fmt: skip
                appended = Appended(rec.PutMessageStatus.PUT_OK, "", result, stored[0].queue_id)
                self.duplicate_sends += 1
                return [(reply, appended)]
        properties = [tag_properties(p, request.producer_id, request.first_sequence + i) for i, p in enumerate(request.properties)]
        tagged = dataclasses.replace(request, properties=properties)
        return self._append_group([(reply, tagged)])

    def _append_group(self, group: list) -> list:
        """Append a group of SENDs (same topic, queue and flag, read together) as one batch, in
        the order they arrived; a group refused for its content is retried one request at a
        time so one bad message fails alone. Each request with its Appended."""
        appended = self.append_many([request for _, request in group])
        if appended is None:
            return [(frame, self.append(request)) for frame, request in group]
        return [(frame, each) for (frame, _), each in zip(group, appended, strict=True)]

    def _respond_when_safe(self, answered: list) -> bool:
        """Answer puts appended together (``answered``: ((outbox, frame), Appended) pairs).
        Refusals at once; the stored ones from a single task once the highest of them is
        replicated and flushed as configured (its waits cover every lower offset): one wait per
        pass, however many connections, requests and queues it held."""
        started = time.perf_counter()
        put_ok = rec.PutMessageStatus.PUT_OK
        must_wait = self.tracker.must_wait(self.role)  # once for the pass (``_must_wait`` of a stored put)
        stored = [(reply, each) for reply, each in answered if each.status is put_ok] if must_wait else []
        if len(stored) < len(answered):
            outboxes = set()
            for (outbox, frame), each in answered:
                if each.status is not put_ok or not must_wait:
                    outbox.respond(frame, cp.encode_send_response(self._finish_put(each, started)))
                    outboxes.add(outbox)
            for outbox in outboxes:
                outbox.flush()
        if stored:
            return _StoredAnswer(self, stored, started).registered
        return False

    def append_many(self, requests: list[cp.SendRequest]) -> list[Appended] | None:
        """Append several SENDs as one batch; one Appended each. None when the batch was refused
        for its content (the caller retries them one by one so one bad message fails alone)."""
        if len(requests) == 1:
            return [self.append(requests[0])]
        appended = self.append(_merged(requests))
        if appended.result is None:
            if appended.status in _CONTENT_REFUSALS:
                return None
            return [dataclasses.replace(appended) for _ in requests]
        return split_appended(appended, [len(r.bodies) for r in requests])

    def _write_refusal(self) -> Appended | None:
        refusal = self.tracker.refusal(self.role, self.replicator.in_sync_count)
        return None if refusal is None else Appended(refusal.status, refusal.reason)

    def append(self, request: cp.SendRequest) -> Appended:
        """Steps 1 and 2 of a put: refuse, or append."""
        refusal = self.tracker.refusal(self.role, self.replicator.in_sync_count)  # _write_refusal, once a put
        if refusal is not None:
            return Appended(refusal.status, refusal.reason)
        result = self.store.append_batch(_batch_of(request))
        if result.status is rec.PutMessageStatus.PUT_OK:  # after_appends follows the pass
            if request.producer_id:
                self.producers.remember(request.producer_id, request.first_sequence, stored_messages(result, request.queue_id))
            if self.metrics:
                self.metrics.appended(result)
        stored = result if result.status is rec.PutMessageStatus.PUT_OK else None
        return Appended(result.status, result.reason, stored, request.queue_id)

    def _must_wait(self, appended: Appended) -> bool:
        """Whether the put waits for a flush or for slaves (else it is answered at once)."""
        return appended.status is rec.PutMessageStatus.PUT_OK and self.tracker.must_wait(self.role)

    async def complete_put(self, appended: Appended) -> cp.SendResponse:
        """Steps 3 and 4: wait for flush and replicas as configured; the final status."""
        started = time.perf_counter()
        return self._finish_put(await self._wait_safe(appended), started)

    async def _wait_safe(self, appended: Appended) -> Appended:
        """Wait for flush and replicas as ``appended`` needs; it with its final status."""
        if not self._must_wait(appended):
            return appended
        status, reason, flush_wait, ack_wait = self._begin_wait(appended)
        for wait in (flush_wait, ack_wait):
            if wait is not None:
                await wait.event.wait()
        status, reason = self._final_status(status, reason, flush_wait, ack_wait)
        return dataclasses.replace(appended, status=status, reason=reason)

    def _begin_wait(self, appended: Appended, callback=None) -> tuple:
        """Register the waits ``appended`` needs (each calls ``callback`` when it ends):
        (status so far, reason, flush wait or None, ack wait or None)."""
        next_offset = appended.result.next_offset
        replicator = self.replicator
        plan = self.tracker.plan(next_offset, role=self.role, replicated_to=replicator.replicated_offset(),
                                 admit=lambda: replicator.admit(next_offset), shortfall=lambda: replicator.shortfall(next_offset))  # fmt: skip
        now = trio.current_time()
        flush_wait = ack_wait = None
        if plan.flush:
            flush_wait = self.add_flush_wait(next_offset, self.tracker.flush_deadline(now), callback)
            self._flush_requested.set()
        if plan.ack:
            ack_wait = self._wait_for(self._ack_waiters, next_offset, self.tracker.ack_deadline(now), callback)
        if plan.status is rec.PutMessageStatus.PUT_OK:
            return appended.status, appended.reason, flush_wait, ack_wait
        return plan.status, plan.reason, flush_wait, ack_wait

    @staticmethod
    def _final_status(status, reason: str, flush_wait: _Wait | None, ack_wait: _Wait | None) -> tuple:
        """A put's status once its waits have ended."""
        return final_status(status, reason, flushed=None if flush_wait is None else flush_wait.ok,
                            acked=None if ack_wait is None else ack_wait.ok)  # fmt: skip

    def _finish_put(self, appended: Appended, started: float) -> cp.SendResponse:
        if self.metrics:
            self.metrics.put_done(appended.status.name, time.perf_counter() - started)
        result = appended.result
        if result is None:  # nothing stored: queue id -1 and no offsets, whatever the status
            return cp.SendResponse(appended.status.name, appended.reason, -1, [], [])
        return cp.SendResponse(appended.status.name, appended.reason, appended.queue_id, list(result.offsets), list(result.queue_offsets))

    def _wait_for(self, waiters: OffsetWaiters, offset: int, deadline: float, callback=None) -> _Wait:
        wait = _Wait(callback)
        try:
            waiters.add(offset, deadline, wait)
        except WaitersFull:
            wait.done = True  # ok stays False: reported as a timeout (its event, if looked at, is set)
            return wait
        self.timer.due(deadline)
        return wait

    def add_flush_wait(self, offset: int, deadline: float, callback=None) -> _Wait:
        """A wait until the log is flushed to ``offset``, failed at ``deadline`` (trio time)."""
        return self._wait_for(self._flush_waiters, offset, deadline, callback)

    def add_ack_wait(self, offset: int, deadline: float, callback=None) -> _Wait:
        """A wait until the slaves have ``offset``, failed at ``deadline`` (trio time)."""
        return self._wait_for(self._ack_waiters, offset, deadline, callback)

    def _release_acked(self, replicated_offset: int) -> None:
        """The replicated offset may have moved: release the SYNC_MASTER puts it covers."""
        for wait in self._ack_waiters.release(replicated_offset):
            wait.finish(True)

    # -- the waits' releases --------------------------------------------------------------

    async def wait_flush_requested(self) -> None:
        """Until a put waits for a flush (the group commit task's cue)."""
        await self._flush_requested.wait()
        self._flush_requested = trio.Event()

    def flushed(self, offset: int) -> None:
        """The log is flushed up to ``offset``: release the puts it covers; if some still wait,
        ask for the next flush at once."""
        for wait in self._flush_waiters.release(offset):
            wait.finish(True)
        if len(self._flush_waiters):
            self._flush_requested.set()

    def fail_flush_waits(self) -> None:
        """End every flush wait as not flushed (the log's sync failed: ``StoreTasks``); those
        puts are answered FLUSH_DISK_TIMEOUT, never PUT_OK."""
        for wait in self._flush_waiters.drain():
            wait.finish(False)

    def fail_ack_waits(self) -> None:
        """End every ack wait as not replicated (a master demoted)."""
        for wait in self._ack_waiters.drain():
            wait.finish(False)

    def fail_all_waits(self) -> None:
        """End every wait as failed (the broker is stopping)."""
        for wait in self._flush_waiters.drain() + self._ack_waiters.drain():
            wait.finish(False)

    async def waiter_timer_task(self) -> None:
        """Expire flush and ack waiters at their deadlines."""
        while True:
            deadlines = [d for d in (self._flush_waiters.next_deadline(), self._ack_waiters.next_deadline()) if d is not None]
            await self.timer.sleep_until(min([trio.current_time() + WAITER_TIMER_MAX_SECONDS, *deadlines]))
            now = trio.current_time()
            for wait in self._flush_waiters.expire(now) + self._ack_waiters.expire(now):
                wait.finish(False)
        raise AssertionError("unreachable")


class _IdempotentPass:
    """The SEND_IDEMPOTENT requests of a pass (``PutService._put_pass``; the pass reads their
    producer ids and sequences and tags their messages as the batch path would); ``decide`` (the
    pass's hook, once it is planned, given the plan's ``idempotent``: numbers, producer ids,
    first sequences, messages, sizes) asks the producer table for every one's verdict
    (``ProducerTable.lookup_pass``: a retry of a request earlier in the same pass is a retry too)
    and leaves out the retries and the refused; ``stored`` then remembers what the pass stored,
    answers the refused and returns the retries with their original offsets. A malformed one is
    not judged (the client port's answer, as when it decoded them)."""

    __slots__ = ("producers", "items", "numbers", "producer_ids", "firsts", "verdicts", "left_out")

    def __init__(self, producers: ProducerTable, items: list) -> None:
        self.producers = producers
        self.items = items
        self.numbers: list[int] = []
        self.producer_ids: list[str] = []
        self.firsts: list[int] = []
        self.verdicts: list = []
        self.left_out: list[int] = []

    def decide(self, unwritable: set[int], idempotent: tuple) -> list[int]:
        numbers, producer_ids, firsts, messages, _ = idempotent
        self.numbers, self.producer_ids, self.firsts = numbers, producer_ids, firsts
        writable = [number not in unwritable for number in numbers] if unwritable else repeat(True)
        self.verdicts = self.producers.lookup_pass(list(zip(producer_ids, firsts, messages, writable)))
        new = Verdict.NEW
        self.left_out = [number for number, lookup in zip(numbers, self.verdicts, strict=True) if lookup.verdict is not new]
        return self.left_out

    def stored(self, puts: PutService, appended: pass_encode.PassAppend) -> list:
        """After the pass: the new ones remembered, the refused answered; the retries, each
        ((outbox, frame), Appended) with its original offsets."""
        result = appended.result
        offsets = () if result is None else result.offsets
        written: dict[int, list[Stored]] = {}  # a frame's number in ``numbers``: where its messages went
        answers, remember, new = appended.answers, self.producers.remember, Verdict.NEW
        head, pair, head_size = pass_encode._ANSWER_HEAD, pass_encode._ANSWER_PAIR, pass_encode._ANSWER_HEAD.size
        producer_ids, firsts = self.producer_ids, self.firsts
        for frame_number, (number, lookup) in enumerate(zip(self.numbers, self.verdicts, strict=True)):
            answer = answers[number]
            if answer is None or lookup.verdict is not new:
                continue
            queue_id, count = head.unpack_from(answer)
            pairs = list(pair.iter_unpack(answer[head_size:]))
            # Sizes as ``stored_messages`` gives them to the batch path: to the next message of
            # the request, the last one's to its record's end.
            mine = []
            for index, (offset, queue_offset) in enumerate(pairs):
                if index + 1 < count:
                    end = pairs[index + 1][0]
                elif appended.entry_sizes is not None:  # a DLedger entry: its record is its body
                    end = offset + appended.entry_sizes[bisect.bisect_left(offsets, offset)] - entry_codec.BODY_OFFSET
                else:
                    after = bisect.bisect_right(offsets, offset)
                    end = offsets[after] if after < len(offsets) else result.next_offset
                mine.append(Stored(offset, end - offset, queue_id, queue_offset))
            written[frame_number] = mine
            remember(producer_ids[frame_number], firsts[frame_number], mine)
        duplicates: list = []
        if not self.left_out:
            return duplicates
        for number, lookup in zip(self.numbers, self.verdicts, strict=True):
            outbox, frame, _ = self.items[number]
            if lookup.verdict is Verdict.REFUSED:
                outbox.respond(frame, error_response(frame, lookup.reason))
                outbox.flush()
            elif lookup.verdict is Verdict.DUPLICATE:
                stored = [each if isinstance(each, Stored) else written[each[0]][each[1]] for each in lookup.stored]
                end = max(each.offset + each.size for each in stored)
                duplicate = AppendResult(
                    rec.PutMessageStatus.PUT_OK, wrote_offset=stored[0].offset, wrote_bytes=end - stored[0].offset,
                    offsets=tuple(each.offset for each in stored), queue_offsets=tuple(each.queue_offset for each in stored),
                )  # fmt: skip
                duplicates.append(((outbox, frame), Appended(rec.PutMessageStatus.PUT_OK, "", duplicate, stored[0].queue_id)))
                puts.duplicate_sends += 1
        return duplicates


def _decode_or_none(payload, idempotent: bool = False) -> cp.SendRequest | None:
    """A SEND's (or SEND_IDEMPOTENT's) payload decoded, None when malformed (the pure twins' decoder)."""
    try:
        return cp.decode_send(payload, idempotent=idempotent)
    except cp.ProtocolError:
        return None


def _protocol_error(frame: cp.Frame) -> str:
    try:
        cp.decode_send(frame.payload, idempotent=frame.kind == cp.SEND_IDEMPOTENT)
    except cp.ProtocolError as error:
        return str(error)
    raise AssertionError("a SEND the pass found malformed decodes")


def _decoded(items: list) -> list:
    """A pass's SENDs left undecoded by the client port (``PutService.decodes_sends``) decoded
    for the batch path; a malformed one answered MESSAGE_ILLEGAL, as the port answers it."""
    if all(request is not None for _, _, request in items):
        return items
    kept = []
    for outbox, frame, request in items:
        if request is None:
            try:
                request = cp.decode_send(frame.payload, idempotent=frame.kind == cp.SEND_IDEMPOTENT)
            except cp.ProtocolError as error:
                outbox.respond(frame, error_response(frame, str(error)))
                outbox.flush()
                continue
        kept.append((outbox, frame, request))
    return kept


# The pass reads a SEND_IDEMPOTENT and tags its messages natively (commitlog/pass_encode.py, _scan.c) with these.
assert (pass_encode.KIND_SEND_IDEMPOTENT, pass_encode.PRODUCER_ID_SIZE_MAX, pass_encode.PROPERTY_PRODUCER_ID,
        pass_encode.PROPERTY_PRODUCER_SEQ) == (cp.SEND_IDEMPOTENT, cp.PRODUCER_ID_SIZE_MAX, PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQ)


def tag_properties(properties: bytes, producer_id: str, sequence: int) -> bytes:
    """A message's properties with its producer id and sequence added (hasvc/state/dedupe.py)."""
    separator = b"" if not properties or properties.endswith(b"\x02") else b"\x02"
    return properties + separator + f"{PROPERTY_PRODUCER_ID}\x01{producer_id}\x02{PROPERTY_PRODUCER_SEQ}\x01{sequence}\x02".encode()


def stored_messages(result: AppendResult, queue_id: int) -> list[Stored]:
    ends = [*result.offsets[1:], result.next_offset]
    return [Stored(offset, end - offset, queue_id, queue_offset)
            for offset, end, queue_offset in zip(result.offsets, ends, result.queue_offsets, strict=True)]  # fmt: skip


# The two properties SEND_IDEMPOTENT appends, last in a record (tag_properties).
PRODUCER_TAG = re.compile(
    f"{PROPERTY_PRODUCER_ID}\x01([^\x01\x02]{{1,{cp.PRODUCER_ID_SIZE_MAX}}})\x02{PROPERTY_PRODUCER_SEQ}\x01([0-9]{{1,19}})\x02".encode()
)


def rebuild_producer_table(store: MessageStore, table: ProducerTable, *, span_bytes: int) -> int:
    """Fill ``table`` from the records in the last ``span_bytes`` of the log (a broker becoming
    master); the number of producer sequences found."""
    table.clear()
    by_producer = producer_sequences(store, span_bytes=span_bytes)
    for producer_id, entries in by_producer.items():
        table.load(producer_id, entries)
    return sum(len(entries) for entries in by_producer.values())


def producer_sequences(store: MessageStore, *, span_bytes: int = 0, start_offset: int | None = None,
                       end_offset: int | None = None) -> dict[str, list[tuple[int, Stored]]]:  # fmt: skip
    """The producer sequences tagged in the last ``span_bytes`` of the log, or between the
    record boundaries ``start_offset`` and ``end_offset``: by producer, in log order."""
    by_producer: dict[bytes, list] = {}
    # offsets only when given: a DLedger member's store searches its last span_bytes alone
    bounds = {} if start_offset is None and end_offset is None else {"start_offset": start_offset, "end_offset": end_offset}
    for match, place in store.find_at_record_ends(span_bytes, PRODUCER_TAG, **bounds):
        producer_id, sequence = match.groups()
        by_producer.setdefault(producer_id, []).append((int(sequence), Stored(place.offset, place.size, place.queue_id, place.queue_offset)))
    return {producer_id.decode(errors="replace"): entries for producer_id, entries in by_producer.items()}
