"""The gRPC side: ``apache.rocketmq.v2.MessagingService`` on grpc.aio, bridged to the trio gateway.

Theory of operation
-------------------
The main thread runs asyncio with grpcio's aio server; a second thread runs trio with the
:class:`~hasvc.proxy.gateway.Gateway` and its FailoverClient (as ``BlockingClient`` runs its
client). A handler turns the request into plain values, hands a coroutine to the trio loop
(:class:`TrioBridge`: ``TrioToken.run_sync_soon`` in, ``loop.call_soon_threadsafe`` out) and turns
the result into the response. A call the client abandons (deadline, vanished client) cancels its
trio task. Why aio and not grpcio's thread pool: both bridges cost the same per request (measured,
docs/PROXY.md), and every long-polling receive (up to 20 s) and every client's Telemetry stream
(its whole life) would hold a pool thread.

Telemetry: the client sends its Settings; the proxy answers with them completed as RocketMQ's proxy
completes them (GrpcClientSettingsManager): producers get the body limit, message type validation
and the send backoff; consumers the receive batch size and long polling timeout. A Producer that
got no publishing settings would set its body limit to 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
import time

import grpc
import grpc.aio
import trio

from hasvc import client as hc
from hasvc.proxy import convert, gateway, limits
from hasvc.proxy.convert import Refused
from hasvc.proxy.lane import SendLane
from hasvc.proxy.acl_grpc import AclInterceptor
from hasvc.proxy.pb import Code, definition, service, service_grpc, status

log = logging.getLogger("hasvc.proxy")

CLIENT_ID_HEADER = "x-mq-client-id"
BROKER_NAME = "hasvc"
# RocketMQ's proxy: producer backoff 10 ms .. 1 s, x2, 3 attempts (grpcClientProducer*).
PRODUCER_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS, PRODUCER_BACKOFF_MAX_MS, PRODUCER_BACKOFF_MULTIPLIER = 10, 1000, 2
# RocketMQ's SubscriptionGroupConfig: 16 retries (17 attempts), then the dead-letter queue.
CONSUMER_ATTEMPTS = 17
# ... and its CustomizedRetryPolicy: a PushConsumer whose listener fails makes the message invisible
# for the attempt's delay (the broker's message delay levels 1s 5s 10s 30s 1m ... 2h).
CONSUMER_RETRY_DELAYS_SECONDS = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
SHUTDOWN_GRACE_SECONDS = 1.0


class TrioBridge:
    """Run trio coroutines from asyncio handlers (the trio loop runs in its own thread).

    Both hops are batched: calls made while an earlier hand-over is still queued ride on it (one
    ``TrioToken.run_sync_soon`` starts them all), and results ready while an earlier batch of
    results is still queued ride on that (one ``loop.call_soon_threadsafe`` settles them all).
    Each hand-over writes a wake-up byte and costs the receiving loop a pass, so with many calls in
    flight the hops no longer cost one wake-up each way per call.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken, nursery: trio.Nursery):
        self._loop, self._token, self._nursery = loop, token, nursery
        self._lock = threading.Lock()  # guards the two queues below (each is filled by one thread, drained by the other)
        self._to_start: list = []  # (is a task, work) to start or run, handed over by one run_sync_soon
        self._to_settle: list = []  # (future, ok, value) to settle, handed over by one call_soon_threadsafe
        # hops each way and what they carried (logged when the proxy stops: how well they batch)
        self.stats = {"trio_hops": 0, "trio_calls": 0, "asyncio_hops": 0, "asyncio_results": 0}

    def _start_all(self) -> None:  # in the trio thread
        with self._lock:
            batch, self._to_start = self._to_start, []
        self.stats["trio_hops"] += 1
        self.stats["trio_calls"] += len(batch)
        for is_task, work in batch:
            if is_task:
                self._nursery.start_soon(work)
            else:
                work()

    def _hand_over(self, is_task: bool, work) -> None:  # in the asyncio thread
        with self._lock:
            first = not self._to_start
            self._to_start.append((is_task, work))
        if first:
            try:
                self._token.run_sync_soon(self._start_all)
            except trio.RunFinishedError:
                with self._lock:
                    self._to_start.clear()
                raise RuntimeError("the gateway is shutting down") from None

    def _settle_all(self) -> None:  # in the asyncio thread
        with self._lock:
            batch, self._to_settle = self._to_settle, []
        self.stats["asyncio_hops"] += 1
        self.stats["asyncio_results"] += len(batch)
        for future, ok, value in batch:
            if not future.done():
                (future.set_result if ok else future.set_exception)(value)

    def _settle(self, future: asyncio.Future, ok: bool, value) -> None:  # in the trio thread
        with self._lock:
            first = not self._to_settle
            self._to_settle.append((future, ok, value))
        if first:
            self._loop.call_soon_threadsafe(self._settle_all)

    async def call(self, function, *args):
        future = self._loop.create_future()
        state = {"scope": None, "cancelled": False}

        async def task() -> None:
            with trio.CancelScope() as scope:
                state["scope"] = scope
                if state["cancelled"]:
                    scope.cancel()
                try:
                    result = await function(*args)
                except Exception as error:  # handed to the handler, which answers INTERNAL_SERVER_ERROR
                    self._settle(future, False, error)
                    return
                self._settle(future, True, result)
            if scope.cancelled_caught:
                self._settle(future, False, asyncio.CancelledError())

        def cancel() -> None:
            state["cancelled"] = True
            if state["scope"] is not None:
                state["scope"].cancel()

        self._hand_over(True, task)
        try:
            return await future
        except asyncio.CancelledError:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(cancel)
            raise

    def run_soon(self, function, *args) -> None:
        """Run ``function(*args)`` in the trio thread, soon; nothing waits for it."""
        with contextlib.suppress(RuntimeError):  # shutting down: nobody is left to wake
            self._hand_over(False, lambda: function(*args))

    async def call_soon(self, function, *args):
        """``function(*args, answer)`` runs synchronously in the trio thread, with no task of its
        own, and calls ``answer(result)`` once, then or later (from the trio thread); its result
        is returned. For calls whose only wait is for something another task finishes (an ack
        waits for the progress writer). Abandoning the call does not undo what it started."""
        future = self._loop.create_future()

        def answer(value) -> None:
            self._settle(future, True, value)

        def work() -> None:
            try:
                function(*args, answer)
            except Exception as error:  # handed to the handler, as in call()
                self._settle(future, False, error)

        self._hand_over(False, work)
        return await future


def _endpoints(host: str, port: int):
    endpoints = definition.Endpoints()
    try:
        version = ipaddress.ip_address(host).version
        endpoints.scheme = definition.IPv4 if version == 4 else definition.IPv6
    except ValueError:
        endpoints.scheme = definition.DOMAIN_NAME
    endpoints.addresses.add(host=host, port=port)
    return endpoints


def _client_id(context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_HEADER:
            return value
    return ""


class Servicer(service_grpc.MessagingServiceServicer):
    def __init__(self, bridge: TrioBridge, gate: gateway.Gateway, listen: tuple[str, int], advertise: tuple[str, int] | None):
        self.bridge = bridge
        self.gate = gate
        self.listen = listen
        self.advertise = advertise
        self.tls_listen: tuple[str, int] | None = None  # the TLS listener, when there is one
        self.metrics = None  # ProxyMetrics with --metrics-listen
        self.acl_interceptor: AclInterceptor | None = None  # with --acl
        self.settings: dict[str, object] = {}  # client id -> its last Settings
        self.lane: SendLane | None = None  # sends straight from this loop (hasvc/proxy/lane.py)
        # idempotence key -> the attempt in flight, and the event its retries wait on (None until one
        # waits): a retry of a message waits for the attempt before it
        self._sending: dict[tuple[str, int], asyncio.Event | None] = {}
        # ReceiveMessage's messages handed to grpc and not yet taken by it (grpc takes one when the
        # stream's HTTP/2 window has room: a client that does not read holds its stream there),
        # and the streams waiting so: the metrics' hasvc_proxy_bytes_queued, hasvc_proxy_streams_muted.
        self.bytes_queued = 0
        self.streams_muted = 0
        # bodies of the messages receives got from the gateway and grpc has not taken yet (all of a
        # receive's, not only the one handed to grpc): hasvc_proxy_receive_bytes_held; new receives
        # are refused while it is at receive_bytes_held_max (hasvc/proxy/limits.py)
        self.receive_bytes_held = 0
        self.receive_bytes_held_max = limits.RECEIVE_BYTES_HELD_MAX_DEFAULT
        self.receives_refused = 0

    # --- routes and client lifecycle ---

    def _answered(self, method: str, code: int) -> None:
        if self.metrics is not None:
            self.metrics.answered(method, code)

    def _access_point(self, request_endpoints) -> tuple[str, int]:
        """Our reachable address: --advertise, else the listen address unless it is a wildcard,
        else the address the client used to reach us (never 0.0.0.0)."""
        used = [(a.host, a.port) for a in request_endpoints.addresses if a.host and a.host not in ("0.0.0.0", "::")]
        if self.tls_listen is not None and any(port == self.tls_listen[1] for _, port in used):
            listen, advertise = self.tls_listen, None  # a TLS client is routed to the TLS listener
        else:
            listen, advertise = self.listen, self.advertise
        if advertise is not None:
            return advertise
        host, port = listen
        if host not in ("0.0.0.0", "::", ""):
            return host, port
        return (used[0][0], port) if used else ("127.0.0.1", port)

    def _queues(self, resource, endpoints):
        queues = []
        for queue_id in range(self.gate.config.queues):
            queue = definition.MessageQueue(id=queue_id, permission=definition.READ_WRITE,
                                            accept_message_types=[definition.NORMAL])  # fmt: skip
            queue.topic.CopyFrom(resource)
            queue.broker.name, queue.broker.id = BROKER_NAME, 0
            queue.broker.endpoints.CopyFrom(endpoints)
            queues.append(queue)
        return queues

    async def QueryRoute(self, request, context):
        refused = self.gate.check_topic(gateway.wrap_topic(request.topic))
        if refused is not None:
            return service.QueryRouteResponse(status=status(refused.code, refused.message))
        endpoints = _endpoints(*self._access_point(request.endpoints))
        return service.QueryRouteResponse(status=status(Code.OK), message_queues=self._queues(request.topic, endpoints))

    async def QueryAssignment(self, request, context):
        refused = self.gate.check_topic(gateway.wrap_topic(request.topic))
        if refused is not None:
            return service.QueryAssignmentResponse(status=status(refused.code, refused.message))
        endpoints = _endpoints(*self._access_point(request.endpoints))
        assignments = [definition.Assignment(message_queue=q) for q in self._queues(request.topic, endpoints)]
        return service.QueryAssignmentResponse(status=status(Code.OK), assignments=assignments)

    async def Heartbeat(self, request, context):
        return service.HeartbeatResponse(status=status(Code.OK))

    async def NotifyClientTermination(self, request, context):
        self.settings.pop(_client_id(context), None)
        return service.NotifyClientTerminationResponse(status=status(Code.OK))

    def _complete_settings(self, settings):
        """The client's Settings completed as RocketMQ's proxy completes them."""
        answer = definition.Settings()
        answer.CopyFrom(settings)
        backoff = answer.backoff_policy
        if settings.HasField("publishing"):
            backoff.max_attempts = PRODUCER_ATTEMPTS
            backoff.exponential_backoff.initial.FromMilliseconds(PRODUCER_BACKOFF_INITIAL_MS)
            backoff.exponential_backoff.max.FromMilliseconds(PRODUCER_BACKOFF_MAX_MS)
            backoff.exponential_backoff.multiplier = PRODUCER_BACKOFF_MULTIPLIER
            answer.publishing.max_body_size = self.gate.config.body_size_max
            answer.publishing.validate_message_type = True
        elif settings.HasField("subscription"):
            answer.subscription.receive_batch_size = gateway.RECEIVE_BATCH_MAX
            answer.subscription.long_polling_timeout.FromMilliseconds(int(gateway.LONG_POLLING_MAX_SECONDS * 1000))
            answer.subscription.fifo = False
            backoff.max_attempts = CONSUMER_ATTEMPTS
            for seconds in CONSUMER_RETRY_DELAYS_SECONDS:
                backoff.customized_backoff.next.add(seconds=seconds)
        answer.metric.on = False
        return answer

    async def Telemetry(self, request_iterator, context):
        client_id = _client_id(context)
        try:
            async for command in request_iterator:
                if not command.HasField("settings"):
                    continue  # thread stack traces, verify results: nothing to answer
                settings = command.settings
                if not (settings.HasField("publishing") or settings.HasField("subscription")):
                    yield service.TelemetryCommand(status=status(Code.BAD_REQUEST, "there is no publishing or subscription data in settings"))
                    continue
                self.settings[client_id] = settings
                yield service.TelemetryCommand(status=status(Code.OK), settings=self._complete_settings(settings))
        finally:
            # a client that vanished mid-stream: forget its settings (NotifyClientTermination does too)
            self.settings.pop(client_id, None)

    # --- producing ---

    async def SendMessage(self, request, context):
        if not request.messages:
            return service.SendMessageResponse(status=status(Code.MESSAGE_CORRUPTED, "no message to send"))
        client_id = _client_id(context)
        started = time.monotonic()
        outcomes = []
        for message in request.messages:
            message.topic.name = gateway.wrap_topic(message.topic)
            outcomes.append(self._send(client_id, message))
        try:
            # one message (what the clients send): awaited directly, without gather's task
            results = [await outcomes[0]] if len(outcomes) == 1 else await asyncio.gather(*outcomes)
        except RuntimeError as error:
            return service.SendMessageResponse(status=status(Code.INTERNAL_SERVER_ERROR, str(error)))
        entries = [service.SendResultEntry(status=status(r.code, r.message), message_id=r.message_id,
                                           offset=max(r.queue_offset, 0)) for r in results]  # fmt: skip
        codes = {r.code for r in results}
        overall = status(results[0].code, results[0].message) if len(codes) == 1 else status(Code.MULTIPLE_RESULTS)
        self._answered("SendMessage", overall.code)
        if self.metrics is not None:
            self.metrics.sent(overall.code, time.monotonic() - started)
        return service.SendMessageResponse(status=overall, entries=entries)

    async def _send(self, client_id: str, message) -> gateway.SendOutcome:
        prepared = self.gate.prepare_send(client_id, message)
        if isinstance(prepared, gateway.SendOutcome):
            return prepared
        key = prepared.key
        while key in self._sending:  # an earlier attempt of this message is still out: ours is its retry
            busy = self._sending[key]
            if busy is None:  # the first retry to wait makes the event (a send alone makes none)
                busy = self._sending[key] = asyncio.Event()
            await busy.wait()
        self._sending[key] = None
        try:
            results = await self.lane.send(prepared.request()) if self.lane is not None else None
            if results is None:  # no lane, or it could not tell: the failover client sends (and retries)
                outcome = await self.bridge.call(self.gate.send_prepared, prepared)
            else:
                outcome = gateway.send_outcome(prepared.checked.message_id, results[0])
                if results[0].offset >= 0 and prepared.topic in self.gate.waiting_topics():
                    self.bridge.run_soon(self.gate.wake, prepared.topic)  # a long-polling receive waits for it
        finally:
            if (waiting := self._sending.pop(key)) is not None:
                waiting.set()
        if outcome.code == Code.OK:
            self.gate.stats["sent"] += 1
        return outcome

    async def EndTransaction(self, request, context):
        return service.EndTransactionResponse(status=status(Code.UNSUPPORTED, "transactional messages are not supported by hasvc proxy"))

    async def RecallMessage(self, request, context):
        return service.RecallMessageResponse(status=status(Code.UNSUPPORTED, "delay messages (and so recall) are not supported by hasvc proxy"))

    # --- consuming ---

    async def ReceiveMessage(self, request, context):
        topic = gateway.wrap_topic(request.message_queue.topic)
        tags = convert.tag_filter(request.filter_expression if request.HasField("filter_expression") else None)
        if isinstance(tags, Refused):
            yield service.ReceiveMessageResponse(status=status(tags.code, tags.message))
            return
        invisible_ms = request.invisible_duration.ToMilliseconds() if request.HasField("invisible_duration") else 30_000
        wait = request.long_polling_timeout.ToMilliseconds() / 1000 if request.HasField("long_polling_timeout") else 0.0
        remaining = context.time_remaining()
        wait = min(wait, gateway.LONG_POLLING_MAX_SECONDS)
        if remaining is not None:
            wait = max(0.0, min(wait, remaining - gateway.LONG_POLLING_RESERVE_SECONDS))
        if self.receive_bytes_held >= self.receive_bytes_held_max:
            self.receives_refused += 1
            self._answered("ReceiveMessage", Code.TOO_MANY_REQUESTS)
            yield service.ReceiveMessageResponse(status=status(Code.TOO_MANY_REQUESTS, f"{self.receive_bytes_held} bytes of received "
                                                 f"messages wait for their consumers to read them (receive_bytes_held_max "
                                                 f"{self.receive_bytes_held_max}); retry later"))  # fmt: skip
            return
        try:
            result = await self.bridge.call(self.gate.receive, request.group.name, topic, request.message_queue.id, tags,
                                            request.batch_size or 1, invisible_ms, wait)  # fmt: skip
        except (RuntimeError, hc.ClientError) as error:
            yield service.ReceiveMessageResponse(status=status(Code.INTERNAL_SERVER_ERROR, str(error)))
            return
        if isinstance(result, Refused):
            self._answered("ReceiveMessage", result.code)
            yield service.ReceiveMessageResponse(status=status(result.code, result.message))
            return
        if not result:
            self._answered("ReceiveMessage", Code.MESSAGE_NOT_FOUND)
            yield service.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        self._answered("ReceiveMessage", Code.OK)
        held = sum(len(delivery.record.body) for delivery in result)  # until grpc takes each message
        self.receive_bytes_held += held
        try:
            yield service.ReceiveMessageResponse(status=status(Code.OK))
            # as RocketMQ's proxy: when the messages left (the clients measure receive latency with it)
            delivered_at = service.ReceiveMessageResponse()
            delivered_at.delivery_timestamp.GetCurrentTime()
            yield delivered_at
            for delivery in result:
                message = convert.delivered_message(delivery.record, receipt_handle=delivery.receipt_handle,
                                                    attempt=delivery.attempt, invisible_ms=delivery.invisible_ms)  # fmt: skip
                message.topic.CopyFrom(request.message_queue.topic)
                response = service.ReceiveMessageResponse(message=message)
                size = response.ByteSize()
                self.bytes_queued += size
                self.streams_muted += 1
                try:
                    yield response  # returns once grpc took it; GeneratorExit when the call ends first
                finally:
                    self.bytes_queued -= size
                    self.streams_muted -= 1
                    held -= len(delivery.record.body)
                    self.receive_bytes_held -= len(delivery.record.body)
        finally:
            self.receive_bytes_held -= held

    async def AckMessage(self, request, context):
        topic = gateway.wrap_topic(request.topic)
        # all entries in one hop and one progress record, answered when it is stored; no task per ack
        handles = [entry.receipt_handle for entry in request.entries]
        try:
            answers = await self.bridge.call_soon(self.gate.ack_soon, request.group.name, topic, handles)
        except RuntimeError as error:
            return service.AckMessageResponse(status=status(Code.INTERNAL_SERVER_ERROR, str(error)))
        entries = [service.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                                 status=status(code, text))
                   for entry, (code, text) in zip(request.entries, answers, strict=True)]  # fmt: skip
        codes = {e.status.code for e in entries}
        overall = entries[0].status if len(codes) == 1 else status(Code.MULTIPLE_RESULTS)
        if not entries:
            overall = status(Code.BAD_REQUEST, "no entries to acknowledge")
        self._answered("AckMessage", overall.code)
        return service.AckMessageResponse(status=overall, entries=entries)

    async def ChangeInvisibleDuration(self, request, context):
        invisible_ms = request.invisible_duration.ToMilliseconds()
        code, text, handle = await self.bridge.call(self.gate.change_invisible, request.group.name,
                                                    gateway.wrap_topic(request.topic), request.receipt_handle, invisible_ms)  # fmt: skip
        self._answered("ChangeInvisibleDuration", code)
        return service.ChangeInvisibleDurationResponse(status=status(code, text), receipt_handle=handle)

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        # After its last attempt a PushConsumer hands the message over: it goes to %DLQ%<group>.
        code, text = await self.bridge.call(self.gate.dead_letter, request.group.name, gateway.wrap_topic(request.topic),
                                            request.receipt_handle)  # fmt: skip
        if code == Code.OK:
            log.warning("group %s gave up on message %s after %d attempts: moved to %s%s", request.group.name,
                        request.message_id, request.delivery_attempt, gateway.DLQ_PREFIX, request.group.name)  # fmt: skip
        self._answered("ForwardMessageToDeadLetterQueue", code)
        return service.ForwardMessageToDeadLetterQueueResponse(status=status(code, text))

    async def PullMessage(self, request, context):
        yield service.PullMessageResponse(status=status(Code.UNSUPPORTED, "offset-based PullMessage is not supported; use SimpleConsumer or PushConsumer"))

    async def UpdateOffset(self, request, context):
        return service.UpdateOffsetResponse(status=status(Code.UNSUPPORTED, "offset-based consumption is not supported"))

    async def GetOffset(self, request, context):
        return service.GetOffsetResponse(status=status(Code.UNSUPPORTED, "offset-based consumption is not supported"))

    async def QueryOffset(self, request, context):
        return service.QueryOffsetResponse(status=status(Code.UNSUPPORTED, "offset-based consumption is not supported"))

    async def SyncLiteSubscription(self, request, context):
        return service.SyncLiteSubscriptionResponse(status=status(Code.UNSUPPORTED, "lite topics are not supported"))


@contextlib.contextmanager
def trio_thread(brokers: list[str], secret, tls_ca, config: gateway.GatewayConfig, loop):
    """Start the trio loop with the gateway; yield (bridge, gateway) once replayed; stop it after."""
    box: dict = {}
    ready = threading.Event()

    async def main() -> None:
        try:
            async with hc.connect_cluster(brokers, secret, tls_ca=tls_ca, retry_sends=True) as cluster:
                gate = gateway.Gateway(cluster, config)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(gate.writer)
                    await gate.replay()
                    box["stop"] = trio.Event()
                    box["bridge"] = TrioBridge(loop, trio.lowlevel.current_trio_token(), nursery)
                    box["gateway"] = gate
                    ready.set()
                    await box["stop"].wait()
                    nursery.cancel_scope.cancel()
        except BaseException as error:  # reported to the starting thread
            box["error"] = error
            ready.set()
            if not isinstance(error, Exception):
                raise

    thread = threading.Thread(target=trio.run, args=(main,), name="hasvc-proxy-trio", daemon=True)
    thread.start()
    ready.wait()
    if "error" in box:
        raise box["error"]
    try:
        yield box["bridge"], box["gateway"]
    finally:
        with contextlib.suppress(trio.RunFinishedError):
            box["bridge"]._token.run_sync_soon(box["stop"].set)
        thread.join()


def _bind(server, address: tuple[str, int], credentials=None) -> int:
    host, port = address
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_secure_port(target, credentials) if credentials else server.add_insecure_port(target)
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    return bound


def tls_credentials(cert_file: str, key_file: str):
    with open(key_file, "rb") as key, open(cert_file, "rb") as cert:
        return grpc.ssl_server_credentials([(key.read(), cert.read())])


async def serve(listen: tuple[str, int], brokers: list[str], *, secret=None, tls_ca=None,
                advertise: tuple[str, int] | None = None, config: gateway.GatewayConfig,
                tls_listen: tuple[str, int] | None = None, tls_cert: str | None = None, tls_key: str | None = None,
                metrics_listen: tuple[str, int] | None = None, acl=None,
                server_limits: limits.ProxyLimits | None = None) -> int:  # fmt: skip
    """``acl``: hasvc.proxy.acl.Acl, every call authenticated and authorized (AclInterceptor);
    ``server_limits``: the gRPC server's (the defaults when None)."""
    server_limits = server_limits or limits.ProxyLimits()
    config = dataclasses.replace(config, progress_events_queued_max=server_limits.progress_events_queued_max)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    with trio_thread(brokers, secret, tls_ca, config, loop) as (bridge, gate):
        interceptor = AclInterceptor(acl) if acl is not None else None
        server = grpc.aio.server(options=limits.server_options(config.body_size_max, server_limits),
                                 maximum_concurrent_rpcs=server_limits.calls_max,
                                 interceptors=[interceptor] if interceptor is not None else None)  # fmt: skip
        servicer = Servicer(bridge, gate, listen, advertise)
        servicer.receive_bytes_held_max = server_limits.receive_bytes_held_max
        servicer.acl_interceptor = interceptor
        if interceptor is not None:
            interceptor.on_answered = servicer._answered
        if config.send_lane and not config.null_sends:
            servicer.lane = SendLane(gate.cluster, secret=secret, tls_ca=tls_ca)
        service_grpc.add_MessagingServiceServicer_to_server(servicer, server)
        host = listen[0]
        bound = _bind(server, listen)
        servicer.listen = (host, bound)
        ready = {"listen": f"{host}:{bound}", "access_point": "{}:{}".format(*servicer._access_point(definition.Endpoints())),
                 "brokers": brokers, "queues": config.queues, "pid": os.getpid(),
                 "loop": type(loop).__module__.partition(".")[0], "send_lane": servicer.lane is not None,
                 "acl": acl is not None}  # fmt: skip
        if tls_listen is not None:
            servicer.tls_listen = (tls_listen[0], _bind(server, tls_listen, tls_credentials(tls_cert, tls_key)))
            ready["tls_listen"] = "{}:{}".format(*servicer.tls_listen)
        if metrics_listen is not None:
            from hasvc.proxy.metrics import serve_metrics

            servicer.metrics, metrics_port = serve_metrics(gate, servicer, metrics_listen)
            ready["metrics_listen"] = f"{metrics_listen[0]}:{metrics_port}"
        await server.start()
        log.info("proxy serving on %s in front of %s; %s", ", ".join(v for k, v in ready.items() if k.endswith("listen")),
                 ",".join(brokers), gate.summary())  # fmt: skip
        sys.stdout.write("READY " + json.dumps(ready) + "\n")
        sys.stdout.flush()
        await stop.wait()
        log.info("stopping: %s; bridge %s%s", gate.summary(), bridge.stats,
                 f"; send lane {servicer.lane.stats}" if servicer.lane is not None else "")  # fmt: skip
        await server.stop(SHUTDOWN_GRACE_SECONDS)
        if servicer.lane is not None:
            servicer.lane.close()
    return 0
