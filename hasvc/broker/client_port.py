"""The client port: accept connections, read requests, hand SENDs to the put path, answer the rest.

Theory of operation
-------------------
One task per connection reads frames (``client_protocol.FrameDecoder``) and answers each through
the connection's ``Outbox``, which bounds the requests in flight. SENDs read together, from every
connection, are put together: with a single connection they are put at once from its receive loop
(nobody to batch with, and a task's scheduler pass cost ~10 % of a lone producer's latency),
otherwise by the append task, which groups what all connections read since its last pass. PULL,
READ and STATUS are answered from the store at once; PROMOTE and DEMOTE run in a task of their own
(they wait for the store) and answer with the new status.

Errors end one connection: a bad preface, a malformed frame or a peer that goes away is logged
once with the peer address and closes that connection alone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

import trio

from commitlog.commit_log import ReadError
from commitlog.store import MessageStore
from hasvc import transport
from hasvc.broker.outbox import Outbox, error_response
from hasvc.broker.put_service import PutService
from hasvc.config import Address, BrokerConfig, BrokerRole, parse_address
from hasvc.protocol import client as cp
from hasvc.protocol import wire

LOGGER = logging.getLogger(__name__)

PULL_COUNT_MAX = 1024  # records in one PULL response
# Record bytes in one PULL response (past the first record): with 1024 records of up to 4 MiB
# bodies a response could pass a client's 16 MiB frame_size_max and be refused whole.
PULL_BYTES_MAX = 4 * 1024 * 1024
READ_SIZE_MAX = 4 * 1024 * 1024  # bytes in one READ response
ACCEPT_RETRY_SECONDS = 0.1  # after a failed accept (EMFILE and friends)
# What ends one client connection (logged, that connection closed); anything else is our bug.
CLIENT_CONNECTION_ERRORS = (
    transport.AuthenticationError, wire.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError,
    EOFError, trio.TooSlowError, OSError,
)


async def serve_listener(listener, handler: Callable[[trio.abc.Stream], Awaitable[None]], *, connections_max: int) -> None:
    """Accept forever, at most ``connections_max`` connections at once (the client port and the HA port)."""
    limiter = trio.CapacityLimiter(connections_max)
    async with trio.open_nursery() as nursery:
        while True:
            token = object()
            await limiter.acquire_on_behalf_of(token)
            try:
                stream = await listener.accept()
            except OSError as error:  # EMFILE and friends: wait and go on accepting
                limiter.release_on_behalf_of(token)
                LOGGER.warning("accept failed: %s", error)
                await trio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            nursery.start_soon(_run_connection, handler, stream, limiter, token)
    raise AssertionError("unreachable")


async def _run_connection(handler, stream, limiter: trio.CapacityLimiter, token: object) -> None:
    try:
        await handler(stream)
    finally:
        limiter.release_on_behalf_of(token)


class ClientPort:
    """The client connections of one broker. What it needs is passed in: the configuration, the
    store (reads), the put path, and the broker's answers to STATUS, PROMOTE and DEMOTE."""

    def __init__(self, *, config: BrokerConfig, store: MessageStore, puts: PutService, status: Callable[[], dict],
                 promote: Callable[[BrokerRole], Awaitable[None]], demote: Callable[[Address], Awaitable[None]]) -> None:  # fmt: skip
        self.config = config
        self.store = store
        self.puts = puts
        self.status = status
        self.promote = promote
        self.demote = demote
        # SENDs read by every connection, for append_task: (outbox, frame, request).
        self._sends: list[tuple[Outbox, cp.Frame, cp.SendRequest]] = []
        self._sends_ready = trio.Event()
        self._client_connections = 0

    async def serve_client(self, stream) -> None:
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
                            outbox.respond(frame, error_response(frame, str(error)))
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
            self.puts.put_items(items)
        else:
            self._sends_ready.set()

    async def append_task(self) -> None:
        """Every connection's SENDs go through here: what all connections read since the last
        pass is grouped by queue, appended and waited for together (a connection per producer
        made a batch, a wait and a response task of every message). Each connection's SENDs
        keep their order; a SEND_IDEMPOTENT is put after the plain SENDs queued before it."""
        while True:
            await self._sends_ready.wait()
            self._sends_ready = trio.Event()
            items, self._sends = self._sends, []
            self.puts.put_items(items)
        raise AssertionError("unreachable")

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

    def _answer(self, frame: cp.Frame) -> bytes:
        try:
            if frame.kind == cp.PULL:
                return self._pull(cp.decode_pull(frame.payload))
            if frame.kind == cp.READ:
                return self._read(*cp.decode_read(frame.payload))
            return cp.encode_simple_response(cp.OK, "", json.dumps(self.status()).encode())
        except wire.ProtocolError as error:
            return error_response(frame, str(error))
        except ReadError as error:  # a queue unit naming bytes the log no longer has: that request fails, not the broker
            LOGGER.warning("%s request failed: %s", "PULL" if frame.kind == cp.PULL else "READ", error)
            return error_response(frame, f"read failed: {error}")

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
