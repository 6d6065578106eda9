"""A broker process: one store, a client port, an HA port (master) or an HA client (slave), and
the store's background work as trio tasks.

Theory of operation
-------------------
Everything runs in one trio loop. The store is synchronous and fast for appends and reads, so
those run inline; ``fdatasync``, consume-queue flushes, segment creation and page warm-up run in
worker threads (``trio.to_thread``), which release the GIL while the kernel works.

A put (SEND) on a master, in this order — the order is the contract:

1. refuse at once if this broker is a slave (SERVICE_NOT_AVAILABLE naming the master) or, with
   ``min_in_sync_replicas``, if too few slaves are in sync (IN_SYNC_REPLICAS_NOT_ENOUGH, nothing
   stored);
2. append to the log, synchronously in the connection's receive loop (so one connection's sends
   land in the order they were sent), then wake the HA writers and the dispatcher;
3. register the waits, both at once so they overlap: a flush waiter under SYNC_FLUSH (group
   commit: one ``fdatasync`` releases every waiter it covers) and, under SYNC_MASTER, an ack
   waiter released when ``in_sync_replicas`` slaves have reported an offset past the records —
   unless no slave is close enough to try (SLAVE_NOT_AVAILABLE at once);
4. answer PUT_OK, or FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE — in all
   three the records are stored on the master, and the status says exactly that.

Waiters are released by the event that covers them (a flush finishing, an ack arriving) and
expired by one timer task: no polling.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import re
import secrets
import time

import trio

from commitlog import record as rec
from commitlog.commit_log import AppendResult, ReadError
from commitlog.store import MessageStore
from commitlog.waiters import OffsetWaiters, WaitersFull
from hasvc import transport
from hasvc.dedupe import PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQ, ProducerTable, Stored, Verdict
from hasvc.config import BrokerConfig, BrokerRole, format_address, parse_address
from hasvc.protocol import client as cp
from hasvc.protocol import wire
from hasvc.replication import Admission, ReplicaSet

LOGGER = logging.getLogger(__name__)

# Background task periods (RocketMQ: reput every 1 ms, checkpoint and CQ flush every 1 s,
# retention every 10 s; warm-up is ours).
DISPATCH_INTERVAL_SECONDS = 0.001
HOUSEKEEPING_INTERVAL_SECONDS = 1.0
CLEAN_INTERVAL_SECONDS = 10.0
WARM_INTERVAL_SECONDS = 0.002
WARM_IDLE_SECONDS = 1.0
WAITER_TIMER_MAX_SECONDS = 0.1  # the timer task re-checks deadlines at least this often
PULL_COUNT_MAX = 1024  # records in one PULL response
# Record bytes in one PULL response (past the first record): with 1024 records of up to 4 MiB
# bodies a response could pass a client's 16 MiB frame_size_max and be refused whole.
PULL_BYTES_MAX = 4 * 1024 * 1024
# What ends one client connection (logged, that connection closed); anything else is our bug.
CLIENT_CONNECTION_ERRORS = (
    transport.AuthenticationError, wire.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError,
    EOFError, trio.TooSlowError, OSError,
)
READ_SIZE_MAX = 4 * 1024 * 1024  # bytes in one READ response


@dataclasses.dataclass(slots=True)  # not frozen: built for every put, and frozen __init__ costs 4x
class Appended:
    """What step 2 of a put produced: the status so far and, when stored, the append result."""

    status: rec.PutMessageStatus
    reason: str = ""
    result: object = None  # the AppendResult, only when the records were stored
    queue_id: int = -1


class Outbox:
    """A connection's responses: tasks queue them, and they go out in one ``send`` (a response
    per syscall was a fifth of a busy master's CPU). Every request holds one of
    ``in_flight_max`` places from when it is read until its response is handed to the kernel;
    beyond, the connection stops reading. A plain counter: a CapacityLimiter token per request
    cost a dict entry and two method calls on every put.

    Who sends: whoever queued responses (``respond``) calls ``flush`` when done, which writes
    them to the socket at once when nothing else is being sent and the kernel takes them all
    (plain TCP), and otherwise wakes the writer task to send the rest. Answering from the
    writer task alone put a scheduler pass, behind every other task woken by the same put
    (dispatch, replication), between a put's completion and its response; waking it for every
    response, sent or not, cost one more."""

    def __init__(self, connection, in_flight_max: int):
        assert in_flight_max > 0
        self.connection = connection
        self.in_flight_max = in_flight_max
        self.in_flight = 0
        self._parts: list[bytes] = []
        self._queued = 0  # responses in _parts
        self._sending = False  # the writer task is in send_all
        self._wakeup = trio.Event()
        self._room = trio.Event()

    @property
    def full(self) -> bool:
        return self.in_flight >= self.in_flight_max

    async def reserve(self) -> None:
        # No checkpoint while there is room: a yield per frame let the rest of the read's frames
        # wait behind every other task and cost a scheduler pass per message.
        while self.full:
            await self._room.wait()
        self.in_flight += 1

    def respond(self, frame: cp.Frame, payload: bytes) -> None:
        self._parts.append(cp.FRAME_HEADER.pack(len(payload) + 5, frame.kind | cp.RESPONSE_BIT, frame.request_id))
        self._parts.append(payload)
        self._queued += 1

    def flush(self) -> None:
        """Send the queued responses now if the socket takes them all without waiting; what it
        does not take is left to the writer task (in order: nothing else is sent meanwhile).
        Every ``respond`` is followed by a ``flush``: nothing else wakes the writer task."""
        if not self._parts:
            return
        # The descriptor is looked up now, never kept: once the connection is closed its
        # number may already belong to a newly accepted one (a greeting would follow our bytes).
        fd = self.connection.raw_fileno
        if self._sending or fd < 0:
            self._wakeup.set()  # the task sends them (after what it is sending)
            return
        data = b"".join(self._parts)
        try:
            sent = os.write(fd, data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._wakeup.set()  # the task's send meets the error and ends the connection
            return
        if sent < len(data):
            self._parts = [data[sent:]]
            self._wakeup.set()
            return
        self._parts = []
        self._released(self._queued)
        self._queued = 0

    def _released(self, count: int) -> None:
        self.in_flight -= count
        self._room.set()
        self._room = trio.Event()

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            if not self._parts:
                continue  # flushed by the caller after all
            parts, self._parts = self._parts, []
            count, self._queued = self._queued, 0
            self._sending = True
            try:
                await self.connection.send_all(b"".join(parts))
            finally:
                self._sending = False
                self._released(count)


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


class _Wait:
    """One wait for a watermark (flush or slave ack). ``finish`` ends it once: from the task
    that moved the watermark, the timer, or a drain. A waiting task awaits ``event``; puts
    answered by callback (``_StoredAnswer``) are answered right there, with no task of their own."""

    __slots__ = ("event", "ok", "callback", "done")

    def __init__(self, callback=None) -> None:
        self.event = trio.Event()
        self.ok = False
        self.callback = callback
        self.done = False

    def finish(self, ok: bool) -> None:
        if self.done:
            return
        self.done, self.ok = True, ok
        self.event.set()
        if self.callback is not None:
            self.callback()


class _StoredAnswer:
    """The answers to puts appended together, sent when the highest of them is as safe as
    configured (its waits cover every lower offset). Answered from whichever task ends the last
    wait (the one reading the slave's report, the group commit, the timer): a task per pass had
    cost a spawn and two scheduler passes between the ack and the answers."""

    __slots__ = ("broker", "stored", "status", "reason", "flush_wait", "ack_wait", "started", "registered")

    def __init__(self, broker: Broker, stored: list, started: float) -> None:
        self.broker = broker
        self.stored = stored
        self.started = started
        self.registered = False
        highest = stored[0][1] if len(stored) == 1 else max(stored, key=lambda pair: pair[1].result.next_offset)[1]
        self.status, self.reason, self.flush_wait, self.ack_wait = broker._begin_wait(highest, self._one_done)
        self.registered = True
        self._one_done()

    def _one_done(self) -> None:
        if not self.registered:
            return  # a wait ended while the others were being registered
        flush_wait, ack_wait = self.flush_wait, self.ack_wait
        if (flush_wait is not None and not flush_wait.done) or (ack_wait is not None and not ack_wait.done):
            return
        self.registered = False  # answered once
        broker = self.broker
        status, reason = broker._final_status(self.status, self.reason, flush_wait, ack_wait)
        name = status.name
        if broker.metrics:
            broker.metrics.put_done_many(name, time.perf_counter() - self.started, len(self.stored))
        prefix = cp.send_response_prefix(name, reason)
        outboxes = set()
        for (outbox, frame), each in self.stored:
            result = each.result
            outbox.respond(frame, prefix + cp.encode_send_response_rest(each.queue_id, result.offsets, result.queue_offsets))
            outboxes.add(outbox)
        for outbox in outboxes:
            outbox.flush()


class Broker:
    def __init__(self, config: BrokerConfig):
        self.config = config.validate()
        self.role = config.role
        self.store: MessageStore | None = None
        self.replicas = ReplicaSet()
        self.new_data = transport.Notifier()
        store_config = config.store_config()
        self._flush_waiters: OffsetWaiters[_Wait] = OffsetWaiters(waiters_max=store_config.group_commit_waiters_max)
        self._ack_waiters: OffsetWaiters[_Wait] = OffsetWaiters(waiters_max=store_config.group_commit_waiters_max)
        self._flush_requested = trio.Event()
        self._timer_wakeup = trio.Event()
        self._timer_at = math.inf  # when the waiter timer task next wakes by itself
        self._warm_wanted = trio.Event()  # set by after_appends when the write area needs warming
        self._warm_ahead_size = store_config.warm_ahead_size
        self._sync_flush_timeout_ms = store_config.sync_flush_timeout_ms
        self._connection_ids = itertools.count(1)
        self.listen_address: tuple[str, int] | None = None
        self.ha_address: tuple[str, int] | None = None
        self.master_connected = False
        self.master_ha = config.master_ha
        self.fenced_by: str | None = None  # set when a peer shows a newer epoch: no more writes
        # Held around background work that touches the store from worker threads, and around
        # truncation (a rejoining slave) so the two never overlap.
        self.maintenance = trio.Lock()
        # The warm-up's own lock: it runs beside flushes and housekeeping, only never beside a
        # truncation (which holds both). Behind ``maintenance`` it waited out every flush's
        # msync, and a writer at 200 MB/s ran past its 16 MiB of warmed pages and faulted them
        # in itself: the kernel's page zeroing was 9 % of a busy master's main thread.
        self.warming = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._peer_epoch = 0  # the newest epoch a peer has shown us
        self._ha_client_scope: trio.CancelScope | None = None
        self._ha_service_scope: trio.CancelScope | None = None
        self.ha_service = None  # a master's HAService, for pushing appends to its slaves
        self.started_at = time.time()
        self.metrics = None
        self.duplicate_sends = 0  # SEND_IDEMPOTENT retries answered from the producer table
        self.producers = ProducerTable(window=config.producer_sequence_window, producers_max=config.producers_max)
        # SENDs read by every connection, for _append_task: (outbox, frame, request).
        self._sends: list[tuple[Outbox, cp.Frame, cp.SendRequest]] = []
        self._sends_ready = trio.Event()
        self._client_connections = 0

    # -- lifetime -------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Open the store, serve until cancelled, then close the store cleanly."""
        self.store = await trio.to_thread.run_sync(MessageStore.open, self.config.store, self.config.store_config())
        LOGGER.info("store %s: %s", self.config.store, self.store.recovery.describe())
        try:
            if self.role is not BrokerRole.SLAVE:
                await self._rebuild_producer_table()  # before the client port opens
            async with trio.open_nursery() as nursery:
                ssl_context = self._server_ssl()
                client_listener, client_socket = await transport.open_listener(self.config.listen, ssl_context=ssl_context)
                self.listen_address = transport.listener_address(client_socket)
                nursery.start_soon(self._serve_listener, client_listener, self._serve_client)
                self._nursery = nursery
                if self.role is not BrokerRole.SLAVE:
                    if self.store.epochs.last is None:
                        self.store.epochs.append(first_epoch(), self.store.commit_log.max_offset)
                    await self._start_ha_service(nursery, ssl_context)
                else:
                    nursery.start_soon(self._run_ha_client)
                for task in (self._append_task, self._dispatch_task, self._warm_task, self._housekeeping_task, self._waiter_timer_task):
                    nursery.start_soon(task)
                nursery.start_soon(self._group_commit_task if self.store.sync_flush else self._async_flush_task)
                if self.config.metrics_listen is not None:
                    from hasvc.metrics import serve_metrics

                    await nursery.start(serve_metrics, self)
                task_status.started(self.addresses())
                LOGGER.info("ready: %s", json.dumps(self.addresses()))
        finally:
            for wait in self._flush_waiters.drain() + self._ack_waiters.drain():
                wait.finish(False)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.store.close)
            LOGGER.info("store closed cleanly")

    async def _run_ha_client(self) -> None:
        from hasvc.ha_slave import HAClient

        self._ha_client_scope = trio.CancelScope()
        with self._ha_client_scope:
            await HAClient(self).run()

    async def promote(self, role: BrokerRole) -> None:
        """Slave -> master: stop replicating, cut a partial last record, open a new epoch at the
        log's end and persist it before taking any write, then serve producers and slaves."""
        if self.role is not BrokerRole.SLAVE:
            raise ValueError(f"already {self.role.value}")
        if self._ha_client_scope is not None:
            self._ha_client_scope.cancel()
        self.master_connected = False
        async with self.maintenance, self.warming:
            end = await trio.to_thread.run_sync(self.store.last_record_end)
            if end < self.store.commit_log.max_wrote_offset:
                LOGGER.warning("promote: cutting a partial record [%d, %d)", end, self.store.commit_log.max_wrote_offset)
                await trio.to_thread.run_sync(self.store.truncate, end)
            epoch = max(self.store.epochs.last_epoch, self.highest_epoch_seen) + 1
            await trio.to_thread.run_sync(self.store.resume_queue_offsets)
            self.store.epochs.append(epoch, self.store.commit_log.max_offset)
            await self._rebuild_producer_table()
        self.role = role
        self.master_ha = None
        self.fenced_by = None
        await self._start_ha_service(self._nursery, self._server_ssl())
        LOGGER.warning("promoted to %s: epoch %d from offset %d", role.value, epoch, self.store.commit_log.max_offset)

    async def _rebuild_producer_table(self) -> None:
        """Before taking writes as master: learn the producer sequences at the log's end."""
        started = time.monotonic()
        span = self.config.producer_table_rebuild_bytes
        found = await trio.to_thread.run_sync(lambda: rebuild_producer_table(self.store, self.producers, span_bytes=span))
        LOGGER.info("producer table: %d producer(s), %d sequence(s) from the last %d bytes of the log in %.3f s",
                    len(self.producers), found, min(span, self.store.commit_log.max_offset), time.monotonic() - started)  # fmt: skip

    @property
    def highest_epoch_seen(self) -> int:
        return max(self.store.epochs.last_epoch, self._peer_epoch)

    def fence(self, reason: str) -> None:
        if self.fenced_by is None:
            LOGGER.warning("fenced, refusing writes: %s", reason)
        self.fenced_by = reason

    async def _start_ha_service(self, nursery: trio.Nursery, ssl_context) -> None:
        from hasvc.ha_master import HAService

        ha_listener, ha_socket = await transport.open_listener(self.config.effective_ha_listen, ssl_context=ssl_context)
        self.ha_address = transport.listener_address(ha_socket)
        self._ha_service_scope = trio.CancelScope()
        self.ha_service = HAService(self)
        nursery.start_soon(self._serve_ha, ha_listener, self.ha_service.handle, self._ha_service_scope)

    async def _serve_ha(self, listener, handler, scope: trio.CancelScope) -> None:
        try:
            with scope:
                await self._serve_listener(listener, handler)
        finally:
            await listener.aclose()

    async def demote(self, master_ha) -> None:
        """Master -> slave of ``master_ha``: close the HA port and every slave connection, answer
        waiting SYNC_MASTER puts (FLUSH_SLAVE_TIMEOUT: they are stored here, not known replicated),
        then replicate from the new master, which first cuts what this log has beyond the two
        histories' consistent point."""
        if self.role is BrokerRole.SLAVE:
            raise ValueError("already a slave")
        self.role = BrokerRole.SLAVE
        self.master_ha = master_ha
        self.fenced_by = None
        self.producers.clear()  # rebuilt from the log if this broker is promoted again
        if self._ha_service_scope is not None:
            self._ha_service_scope.cancel()
        self.ha_service = None
        self.ha_address = None
        for wait in self._ack_waiters.drain():
            wait.finish(False)
        self._nursery.start_soon(self._run_ha_client)
        LOGGER.warning("demoted: now a slave of %s", format_address(master_ha))

    def _server_ssl(self):
        if self.config.tls_cert is None:
            return None
        return transport.server_ssl_context(cert=self.config.tls_cert, key=self.config.tls_key)

    def addresses(self) -> dict:
        return {
            "role": self.role.value,
            "listen": format_address(self.listen_address),
            "ha_listen": format_address(self.ha_address) if self.ha_address else format_address(self.config.effective_ha_listen),
            "pid": os.getpid(),
            "store": self.config.store,
        }

    async def _serve_listener(self, listener, handler) -> None:
        """Accept forever, at most ``connections_max`` connections at once."""
        limiter = trio.CapacityLimiter(self.config.connections_max)
        async with trio.open_nursery() as nursery:
            while True:
                token = object()
                await limiter.acquire_on_behalf_of(token)
                try:
                    stream = await listener.accept()
                except OSError as error:  # EMFILE and friends: wait and go on accepting
                    limiter.release_on_behalf_of(token)
                    LOGGER.warning("accept failed: %s", error)
                    await trio.sleep(0.1)
                    continue
                nursery.start_soon(self._run_connection, handler, stream, limiter, token)
        raise AssertionError("unreachable")

    @staticmethod
    async def _run_connection(handler, stream, limiter, token) -> None:
        try:
            await handler(stream)
        finally:
            limiter.release_on_behalf_of(token)

    # -- client connections ---------------------------------------------------------------

    async def _serve_client(self, stream) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        self._client_connections += 1
        try:
            await transport.server_preface(connection, port_kind=wire.PORT_KIND_CLIENT, secret=self.config.secret)
            decoder = cp.FrameDecoder(frame_size_max=self.config.frame_size_max, responses=False)
            outbox = Outbox(connection, self.config.requests_in_flight_max)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(outbox.run)
                while True:
                    data = await connection.receive_some()
                    if not data:
                        nursery.cancel_scope.cancel()
                        return
                    decoder.receive_data(data)
                    while (frame := decoder.next_frame()) is not None:
                        if outbox.full:
                            # The room comes from responses: the SENDs read so far must be put
                            # before this connection waits for it.
                            self._submit_sends()
                        await outbox.reserve()
                        if frame.kind in (cp.PROMOTE, cp.DEMOTE):
                            nursery.start_soon(self._role_request, outbox, frame)
                            continue
                        if frame.kind not in cp.SEND_KINDS:
                            outbox.respond(frame, self._answer(frame))
                            continue
                        try:
                            request = cp.decode_send(frame.payload, idempotent=frame.kind == cp.SEND_IDEMPOTENT)
                        except wire.ProtocolError as error:
                            outbox.respond(frame, self._error(frame, str(error)))
                            continue
                        self._sends.append((outbox, frame, request))
                    self._submit_sends()
                    outbox.flush()  # answers to requests other than SENDs
        except BaseException as error:
            if not transport.is_expected(error, CLIENT_CONNECTION_ERRORS):
                raise
            if isinstance(transport.first_leaf(error), transport.AuthenticationError | wire.ProtocolError):
                LOGGER.warning("client %s: %s; connection closed", connection.peer, transport.describe(error))
            else:
                LOGGER.info("client %s closed: %s", connection.peer, transport.describe(error))
        finally:
            self._client_connections -= 1
            await connection.aclose()

    def _submit_sends(self) -> None:
        """Hand the queued SENDs to the append task or, with a single client connection, put
        them now: nobody to batch with, and the task's scheduler pass cost ~10 % of a lone
        producer's latency. Everything queued is then this connection's, in its order."""
        if not self._sends:
            return
        if self._client_connections == 1:
            items, self._sends = self._sends, []
            self._put_items(items)
        else:
            self._sends_ready.set()

    async def _append_task(self) -> None:
        """Every connection's SENDs go through here: what all connections read since the last
        pass is grouped by queue, appended and waited for together (a connection per producer
        made a batch, a wait and a response task of every message). Each connection's SENDs
        keep their order; a SEND_IDEMPOTENT is put after the plain SENDs queued before it."""
        while True:
            await self._sends_ready.wait()
            self._sends_ready = trio.Event()
            items, self._sends = self._sends, []
            self._put_items(items)

    def _put_items(self, items: list[tuple[Outbox, cp.Frame, cp.SendRequest]]) -> None:
        """Append a pass of SENDs, send them to the idle slaves, then register the waits and
        answer the refusals: the slave works on the frame while the master does the rest (it
        is only read after this step, so no ack can come before its waits exist)."""
        answered: list = []
        plain: list = []
        for outbox, frame, request in items:
            if frame.kind == cp.SEND:
                plain.append(((outbox, frame), request))
                continue
            answered.append(self._append_sends(plain))
            plain = []
            answered.append(self._append_idempotent((outbox, frame), request))
        answered.append(self._append_sends(plain))
        if self.ha_service is not None:
            self.ha_service.push()
        for each in answered:
            if each:
                self._respond_when_safe(each)
        self.after_appends(push=False)

    @property
    def warm_ahead(self) -> int:
        """Bytes kept faulted in ahead of the writer: ``warm_ahead_size`` on a master, none on a
        slave, which writes frames with ``pwrite`` (``ha_slave``): a page the kernel allocates for
        a write is not zeroed first where it is written whole, and warming it ahead would be a
        second pass over every page (zero, then write). 64 producers x 32 messages: +15-30 %
        (docs/benchmarks.md). The next segment is still made ahead on both."""
        return 0 if self.role is BrokerRole.SLAVE else self._warm_ahead_size

    def after_appends(self, *, push: bool = True) -> None:
        """What follows a pass of appends (a master's puts, a frame on a slave), done here
        rather than by waking a task per append (for a lone producer each wake-up was a
        scheduler pass on the put's path): frames to the idle slave connections (unless the
        caller pushed already), the consume queue units, and a wake-up for the dispatch task
        only if a pass leaves more, for the warm-up task only when the write area needs it."""
        if push and self.ha_service is not None:
            self.ha_service.push()
        store = self.store
        store.dispatch()
        if store.reput_from_offset < store.dispatch_end_offset and store.dispatch_error is None:
            self.new_data.notify()
        if store.commit_log.mapped_file_queue.needs_warming(self.warm_ahead):
            self._warm_wanted.set()

    def _append_sends(self, sends: list) -> list:
        """``sends``: ((outbox, frame), SendRequest) pairs, appended by topic/queue group; each
        reply with its Appended."""
        answered: list = []
        for group in coalesce(sends, bytes_max=COALESCE_BYTES_MAX):
            answered += self._append_group(group)
        return answered

    def _append_idempotent(self, reply: tuple[Outbox, cp.Frame], request: cp.SendRequest) -> list:
        """A SEND_IDEMPOTENT: a retry is answered with the original offsets once they are as safe
        as a new put would be; a new one is tagged with its producer id and sequences and put.
        The reply with its Appended (none if refused here)."""
        if self._write_refusal() is None:
            lookup = self.producers.lookup(request.producer_id, request.first_sequence, len(request.bodies))
            if lookup.verdict is Verdict.REFUSED:
                outbox, frame = reply
                outbox.respond(frame, self._error(frame, lookup.reason))
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

    def _respond_when_safe(self, answered: list) -> None:
        """Answer puts appended together (``answered``: ((outbox, frame), Appended) pairs).
        Refusals at once; the stored ones from a single task once the highest of them is
        replicated and flushed as configured (its waits cover every lower offset): one wait per
        pass, however many connections, requests and queues it held."""
        started = time.perf_counter()
        stored = [(reply, each) for reply, each in answered if each.status is rec.PutMessageStatus.PUT_OK]
        outboxes = set()
        for (outbox, frame), each in answered:
            if each.status is not rec.PutMessageStatus.PUT_OK or not self._must_wait(each):
                outbox.respond(frame, cp.encode_send_response(self._finish_put(each, started)))
                outboxes.add(outbox)
        for outbox in outboxes:
            outbox.flush()
        if stored and self._must_wait(stored[0][1]):
            _StoredAnswer(self, stored, started)

    async def _role_request(self, outbox: Outbox, frame: cp.Frame) -> None:
        try:
            if frame.kind == cp.PROMOTE:
                if bytes(frame.payload) not in (b"\x00", b"\x01"):
                    raise ValueError(f"PROMOTE payload must be one byte, 0 (ASYNC_MASTER) or 1 (SYNC_MASTER), not {bytes(frame.payload)[:8]!r}")
                await self.promote(BrokerRole.SYNC_MASTER if frame.payload[:1] == b"\x01" else BrokerRole.ASYNC_MASTER)
            else:
                await self.demote(parse_address(cp.decode_demote(frame.payload)))
        except (ValueError, wire.ProtocolError) as error:
            outbox.respond(frame, cp.encode_simple_response(cp.ERROR, str(error), b""))
        else:
            outbox.respond(frame, cp.encode_simple_response(cp.OK, "", json.dumps(self.status()).encode()))
        outbox.flush()

    def _error(self, frame: cp.Frame, reason: str) -> bytes:
        if frame.kind in cp.SEND_KINDS:
            return cp.encode_send_response(cp.SendResponse(rec.PutMessageStatus.MESSAGE_ILLEGAL.name, reason, -1, [], []))
        return cp.encode_simple_response(cp.ERROR, reason)

    # -- puts -----------------------------------------------------------------------------

    def append_many(self, requests: list[cp.SendRequest]) -> list[Appended] | None:
        """Append several SENDs as one batch; one Appended each. None when the batch was refused
        for its content (the caller retries them one by one so one bad message fails alone)."""
        if len(requests) == 1:
            return [self.append(requests[0])]
        first = requests[0]
        merged = cp.SendRequest(
            first.topic, first.queue_id, [b for r in requests for b in r.bodies], [p for r in requests for p in r.properties],
            first.flag, first.born_timestamp,
        )  # fmt: skip
        appended = self.append(merged)
        if appended.result is None:
            if appended.status in (rec.PutMessageStatus.MESSAGE_ILLEGAL, rec.PutMessageStatus.PROPERTIES_SIZE_EXCEEDED):
                return None
            return [dataclasses.replace(appended) for _ in requests]
        return split_appended(appended, [len(r.bodies) for r in requests])

    def _write_refusal(self) -> Appended | None:
        if self.role is BrokerRole.SLAVE:
            master = format_address(self.master_ha) if self.master_ha else "unknown"
            return Appended(rec.PutMessageStatus.SERVICE_NOT_AVAILABLE, f"this broker is a slave; its master's HA address is {master}")
        if self.fenced_by is not None:
            return Appended(rec.PutMessageStatus.SERVICE_NOT_AVAILABLE, f"this broker is fenced: {self.fenced_by}")
        return None

    def append(self, request: cp.SendRequest) -> Appended:
        """Steps 1 and 2 of a put: refuse, or append."""
        refusal = self._write_refusal()
        if refusal is not None:
            return refusal
        store = self.store
        if self.config.min_in_sync_replicas:
            in_sync = self.replicas.in_sync_count(master_max_offset=store.commit_log.max_offset, max_gap=self.config.ha_max_gap_not_in_sync)
            if in_sync < self.config.min_in_sync_replicas:
                return Appended(
                    rec.PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH,
                    f"{in_sync} slave(s) in sync, fewer than min_in_sync_replicas {self.config.min_in_sync_replicas}; not stored",
                )
        properties = request.properties
        shared = properties.count(properties[0]) == len(properties)  # compared in C
        batch = rec.MessageBatch(
            request.topic, request.bodies, queue_id=request.queue_id,
            properties=request.properties[0] if shared else request.properties,
            flag=request.flag, born_timestamp=request.born_timestamp,
        )  # fmt: skip
        result = store.append_batch(batch)
        if result.status is rec.PutMessageStatus.PUT_OK:  # after_appends follows the pass
            if request.producer_id:
                self.producers.remember(request.producer_id, request.first_sequence, stored_messages(result, request.queue_id))
            if self.metrics:
                self.metrics.appended(result)
        stored = result if result.status is rec.PutMessageStatus.PUT_OK else None
        return Appended(result.status, result.reason, stored, request.queue_id)

    def _must_wait(self, appended: Appended) -> bool:
        """Whether the put waits for a flush or for slaves (else it is answered at once)."""
        if appended.status is not rec.PutMessageStatus.PUT_OK:
            return False
        return self.store.sync_flush or (self.role is BrokerRole.SYNC_MASTER and self.config.in_sync_replicas > 0)

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
        status, reason = appended.status, appended.reason
        flush_wait = None
        if self.store.sync_flush:
            flush_wait = self._wait_for(self._flush_waiters, next_offset, self._sync_flush_timeout_ms, callback)
            self._flush_requested.set()
        ack_wait = None
        if self.role is BrokerRole.SYNC_MASTER and self.config.in_sync_replicas > 0:
            if self.replicas.ack_watermark(self.config.in_sync_replicas) < next_offset:
                admission = self.replicas.admit(
                    next_offset=next_offset, master_max_offset=self.store.commit_log.max_offset,
                    max_gap=self.config.ha_max_gap_not_in_sync, replicas=self.config.in_sync_replicas,
                )  # fmt: skip
                if admission is Admission.SLAVE_NOT_AVAILABLE:
                    status, reason = rec.PutMessageStatus.SLAVE_NOT_AVAILABLE, self._not_available_reason(next_offset)
                else:
                    ack_wait = self._wait_for(self._ack_waiters, next_offset, self.config.slave_timeout_ms, callback)
        return status, reason, flush_wait, ack_wait

    def _not_available_reason(self, next_offset: int) -> str:
        """SLAVE_NOT_AVAILABLE's reason: how many in-sync slaves were needed, how many there were."""
        gap = self.config.ha_max_gap_not_in_sync
        ready = self.replicas.ready_count(next_offset=next_offset, max_gap=gap)
        return (f"stored on the master only: in_sync_replicas {self.config.in_sync_replicas} slave(s) needed within "
                f"ha_max_gap_not_in_sync {gap} bytes of the put's end {next_offset}, {ready} there "
                f"({len(self.replicas.slaves)} connected)")  # fmt: skip

    @staticmethod
    def _final_status(status, reason: str, flush_wait: _Wait | None, ack_wait: _Wait | None) -> tuple:
        """A put's status once its waits have ended."""
        if flush_wait is not None and not flush_wait.ok:
            status, reason = rec.PutMessageStatus.FLUSH_DISK_TIMEOUT, "stored, but not known to be flushed within sync_flush_timeout"
        if ack_wait is not None and not ack_wait.ok and status is rec.PutMessageStatus.PUT_OK:
            status, reason = rec.PutMessageStatus.FLUSH_SLAVE_TIMEOUT, "stored on the master; no slave acknowledged it within slave_timeout"
        return status, reason

    def _finish_put(self, appended: Appended, started: float) -> cp.SendResponse:
        if self.metrics:
            self.metrics.put_done(appended.status.name, time.perf_counter() - started)
        result = appended.result
        if result is None:  # nothing stored: queue id -1 and no offsets, whatever the status
            return cp.SendResponse(appended.status.name, appended.reason, -1, [], [])
        return cp.SendResponse(appended.status.name, appended.reason, appended.queue_id, list(result.offsets), list(result.queue_offsets))

    def _wait_for(self, waiters: OffsetWaiters, offset: int, timeout_ms: int, callback=None) -> _Wait:
        wait = _Wait(callback)
        deadline = trio.current_time() + timeout_ms / 1000
        try:
            waiters.add(offset, deadline, wait)
        except WaitersFull:
            wait.done = True  # ok stays False: reported as a timeout
            wait.event.set()
            return wait
        if deadline < self._timer_at:  # due before the timer next looks by itself: wake it
            self._timer_wakeup.set()
        return wait

    def on_ack(self) -> None:
        """A slave's report moved: release the SYNC_MASTER puts it covers."""
        watermark = self.replicas.ack_watermark(self.config.in_sync_replicas)
        for wait in self._ack_waiters.release(watermark):
            wait.finish(True)

    # -- other requests -------------------------------------------------------------------

    def _answer(self, frame: cp.Frame) -> bytes:
        try:
            if frame.kind == cp.PULL:
                return self._pull(cp.decode_pull(frame.payload))
            if frame.kind == cp.READ:
                return self._read(*cp.decode_read(frame.payload))
            return cp.encode_simple_response(cp.OK, "", json.dumps(self.status()).encode())
        except wire.ProtocolError as error:
            return self._error(frame, str(error))
        except ReadError as error:  # a queue unit naming bytes the log no longer has: that request fails, not the broker
            LOGGER.warning("%s request failed: %s", "PULL" if frame.kind == cp.PULL else "READ", error)
            return self._error(frame, f"read failed: {error}")

    def _pull(self, request: cp.PullRequest) -> bytes:
        queue = self.store.consume_queues.find(request.topic, request.queue_id)
        if queue is None:
            return cp.encode_pull_response(cp.PullResponse(cp.NOT_FOUND, f"no queue {request.topic}/{request.queue_id}", request.queue_offset, 0, []))
        records = []
        next_offset = max(request.queue_offset, queue.min_offset_in_queue)
        total = 0
        for offset, size, _tags in queue.read(next_offset, min(request.count_max, PULL_COUNT_MAX)):
            total += size
            if records and total > PULL_BYTES_MAX:
                break
            records.append(bytes(self.store.read(offset, size)))
        next_offset += len(records)
        status = cp.OK if records or request.queue_offset <= queue.max_offset_in_queue else cp.OFFSET_ILLEGAL
        return cp.encode_pull_response(cp.PullResponse(status, "", next_offset, queue.max_offset_in_queue, records))

    def _read(self, offset: int, size_max: int) -> bytes:
        try:
            data = bytes(self.store.read(offset, min(size_max, READ_SIZE_MAX)))
        except ReadError as error:
            return cp.encode_simple_response(cp.OFFSET_ILLEGAL, str(error), offset, b"")
        return cp.encode_simple_response(cp.OK, "", offset, data)

    def status(self) -> dict:
        store = self.store
        master_max = store.commit_log.max_offset
        now = time.monotonic()
        slaves = []
        for progress in self.replicas.slaves.values():
            lag_bytes, lag_seconds = self.replicas.lag(progress, master_max_offset=master_max, now=now)
            slaves.append({
                "address": progress.address, "slave_id": progress.slave_id, "ack_offset": progress.ack_offset,
                "lag_bytes": lag_bytes, "lag_seconds": round(lag_seconds, 3),
                "connected_since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(progress.connected_since)),  # UTC
            })  # fmt: skip
        status = {
            **self.addresses(),
            "epoch": store.epochs.last_epoch,
            "epochs": [[e.epoch, e.start_offset] for e in store.epochs.entries],
            "min_offset": store.commit_log.min_offset,
            "max_offset": master_max,
            "flushed_offset": store.commit_log.flushed_offset,
            "dispatched_offset": store.reput_from_offset,
            "flush": store.config.flush_disk_type.value,
            "slaves": slaves,
            "producers": len(self.producers),
            "duplicate_sends": self.duplicate_sends,
            "uptime_seconds": round(time.time() - self.started_at, 1),
        }
        if self.role is BrokerRole.SLAVE:
            status["master_ha"] = format_address(self.master_ha) if self.master_ha else None
            status["master_connected"] = self.master_connected
        if store.dispatch_error:
            status["dispatch_error"] = store.dispatch_error
        if self.fenced_by:
            status["fenced_by"] = self.fenced_by
        return status

    # -- background tasks -----------------------------------------------------------------

    async def _group_commit_task(self) -> None:
        """SYNC_FLUSH: one fdatasync for everything appended so far, then release its waiters."""
        while True:
            await self._flush_requested.wait()
            self._flush_requested = trio.Event()
            async with self.maintenance:
                flushed = await trio.to_thread.run_sync(self.store.flush_commitlog, 0)
            for wait in self._flush_waiters.release(flushed):
                wait.finish(True)
            self.new_data.notify()  # under SYNC_FLUSH dispatch follows the flushed offset
            if len(self._flush_waiters):
                self._flush_requested.set()

    async def _async_flush_task(self) -> None:
        store_config = self.store.config
        thorough_at = trio.current_time() + store_config.flush_commitlog_thorough_interval_ms / 1000
        while True:
            await trio.sleep(store_config.flush_interval_commitlog_ms / 1000)
            least_pages = store_config.flush_commitlog_least_pages
            if trio.current_time() >= thorough_at:
                least_pages = 0
                thorough_at = trio.current_time() + store_config.flush_commitlog_thorough_interval_ms / 1000
            async with self.maintenance:
                await trio.to_thread.run_sync(self.store.flush_commitlog, least_pages)

    async def _waiter_timer_task(self) -> None:
        """Expire flush and ack waiters at their deadlines."""
        while True:
            deadlines = [d for d in (self._flush_waiters.next_deadline(), self._ack_waiters.next_deadline()) if d is not None]
            self._timer_at = min([trio.current_time() + WAITER_TIMER_MAX_SECONDS, *deadlines])
            with trio.move_on_at(self._timer_at):
                await self._timer_wakeup.wait()
            self._timer_at = math.inf  # awake: whatever is registered now is seen below or next pass
            self._timer_wakeup = trio.Event()
            now = trio.current_time()
            for wait in self._flush_waiters.expire(now) + self._ack_waiters.expire(now):
                wait.finish(False)

    async def _dispatch_task(self) -> None:
        while True:
            await self.new_data.wait(0.1)
            while self.store.dispatch():
                await trio.sleep(0)
            await trio.sleep(DISPATCH_INTERVAL_SECONDS)

    async def _warm_task(self) -> None:
        """Keep the write area faulted in: looks after appends (not on a timer: an idle broker
        should cost nothing), at most once per WARM_INTERVAL_SECONDS."""
        while True:
            with trio.move_on_after(WARM_IDLE_SECONDS):
                await self._warm_wanted.wait()
            self._warm_wanted = trio.Event()
            await trio.sleep(WARM_INTERVAL_SECONDS)
            ahead = self.warm_ahead
            if self.store.commit_log.mapped_file_queue.needs_warming(ahead):
                async with self.warming:
                    await trio.to_thread.run_sync(self.store.warm_commitlog, ahead)

    async def _housekeeping_task(self) -> None:
        store_config = self.store.config
        clean_at = trio.current_time() + CLEAN_INTERVAL_SECONDS
        while True:
            await trio.sleep(HOUSEKEEPING_INTERVAL_SECONDS)
            async with self.maintenance:
                await trio.to_thread.run_sync(self.store.flush_consume_queues, store_config.flush_consume_queue_least_pages)
                await trio.to_thread.run_sync(self.store.write_checkpoint)
            if trio.current_time() >= clean_at:
                clean_at = trio.current_time() + CLEAN_INTERVAL_SECONDS
                async with self.maintenance:
                    deleted = await trio.to_thread.run_sync(self.store.clean_expired)
                if deleted:
                    LOGGER.info("retention deleted %d segment(s): %s", len(deleted), ", ".join(os.path.basename(p) for p in deleted))


def tag_properties(properties: bytes, producer_id: str, sequence: int) -> bytes:
    """A message's properties with its producer id and sequence added (hasvc/dedupe.py)."""
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
    by_producer: dict[bytes, list] = {}
    for match, place in store.find_at_record_ends(span_bytes, PRODUCER_TAG):
        producer_id, sequence = match.groups()
        by_producer.setdefault(producer_id, []).append((int(sequence), Stored(place.offset, place.size, place.queue_id, place.queue_offset)))
    for producer_id, entries in by_producer.items():
        table.load(producer_id.decode(errors="replace"), entries)
    return sum(len(entries) for entries in by_producer.values())


def first_epoch() -> int:
    """A new cluster's first epoch: random in [1, 2**20], so two unrelated stores are very unlikely
    to share an (epoch, start offset) entry and be taken for one history; later epochs count up."""
    return secrets.randbelow(2**20) + 1
