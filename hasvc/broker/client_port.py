"""The client port: accept connections, read requests, hand SENDs to the put path, answer the rest.

Theory of operation
-------------------
Each connection has a task that runs its preface and its ``Outbox`` writer, but on plain TCP it
does not read: one reader task (``_read_task``) waits on every plain TCP connection together
(``transport.ReadinessGroup``), and each pass reads every connection that has bytes, decodes
their frames, puts all the SENDs read in the pass together (``PutService.put_items``, inline: one
pass is one batch) and answers the other requests. A task per connection had cost a trio wait,
a failed ``read`` and a task switch per put with a connection per producer, twice the master's
CPU per put of one shared connection; a receive that is exactly one SEND frame (every receive
with a connection per writer) is queued straight from the read, without the decoder's Python
calls. A connection hands itself back to its own task when it must wait (its outbox is full:
that task waits for room, takes the rest of its frames, then rejoins the group), when it ends
or when it breaks. TLS connections (whose bytes trio's stream
must decrypt) read in their own task as before; their SENDs go to the append task, or are put
at once when theirs is the only connection. Each connection's SENDs keep their order. PULL,
READ and STATUS are answered from the store at once; PROMOTE, DEMOTE and TRANSFER_LEADER run in
a task of their own (they wait for the store or the group) and answer when done.

Errors end one connection: a bad preface, a malformed frame or a peer that goes away is logged
once with the peer address and closes that connection alone.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from itertools import repeat

import trio

from commitlog.commit_log import ReadError
from commitlog.read_check import CheckedRead, describe_for_reader
from commitlog.store import MessageStore
from hasvc import admission as port_admission
from hasvc import transport
from hasvc.broker.outbox import AnswerBudget, Outbox, error_response
from hasvc.broker.put_service import PutService
from hasvc.config import Address, BrokerConfig, BrokerRole, parse_address
from hasvc.protocol import client as cp
from hasvc.protocol import wire

LOGGER = logging.getLogger(__name__)

FRAME_HEADER_SIZE = cp.FRAME_HEADER.size
NEW_TUPLE = tuple.__new__  # a NamedTuple made without its Python __new__ (a call a put)
PULL_COUNT_MAX = 1024  # records in one PULL response
# Record bytes in one PULL response (past the first record): with 1024 records of up to 4 MiB
# bodies a response could pass a client's 16 MiB frame_size_max and be refused whole.
PULL_BYTES_MAX = 4 * 1024 * 1024
READ_SIZE_MAX = 4 * 1024 * 1024  # bytes in one READ response
# Bytes asked of the kernel per read of a client connection, into one reused buffer (one a port): a
# pass takes what its reads brought. 16 writers' 32-message requests (~33 KiB each, ~530 KiB in
# flight) come in one read where 256 KiB (transport.RECEIVE_SIZE) cut them into three passes, each
# with its own push, slave frame, answers and wake-ups: the master's and the slave's CPU a request
# fell in every alternating series at 16 x 32 and 64 x 32, 4 MiB took no more
# (docs/design/put-path.md, "A read of 1 MiB").
CLIENT_RECEIVE_SIZE = 1024 * 1024
# Client connections still in their preface (hasvc/admission.py), counted apart from connected
# clients (connections_max): a new one closes the oldest, so stalled connections never keep a
# client out; a preface is a round trip or two, 5 s leaves a loaded loop room.
CLIENT_STRANGERS_MAX = 1024
CLIENT_PREFACE_TIMEOUT_SECONDS = 5.0
# What ends one client connection (logged, that connection closed); anything else is our bug.
CLIENT_CONNECTION_ERRORS = (
    transport.AuthenticationError, wire.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError,
    EOFError, trio.TooSlowError, OSError,
)


class _Client:
    """One client connection's reading state, shared by its task and the port's reader task.
    ``fd`` is its number in the readiness group (-1 when not in it); the reader sets ``ended``
    or ``error`` and ``handed_back`` when it gives the connection back to its task."""

    __slots__ = ("connection", "decoder", "outbox", "nursery", "fd", "handed_back", "ended", "error")

    def __init__(self, connection: transport.Connection, decoder: cp.FrameDecoder, outbox: Outbox, nursery: trio.Nursery) -> None:
        self.connection = connection
        self.decoder = decoder
        self.outbox = outbox
        self.nursery = nursery  # PROMOTE, DEMOTE and TRANSFER_LEADER run here
        self.fd = -1
        self.handed_back = trio.Event()
        self.ended = False
        self.error: BaseException | None = None


class ClientPort:
    """The client connections of one broker. What it needs is passed in: the configuration, the
    store (reads), the put path, and the broker's answers to STATUS, PROMOTE, DEMOTE and (a
    DLedger member only) TRANSFER_LEADER: ``transfer_leader(target)`` returns the response's
    status, reason and JSON object."""

    def __init__(self, *, config: BrokerConfig, store: MessageStore, puts: PutService, status: Callable[[], dict],
                 promote: Callable[[BrokerRole], Awaitable[None]], demote: Callable[[Address], Awaitable[None]],
                 transfer_leader: Callable[[str], Awaitable[tuple[str, str, dict]]] | None = None,
                 fence: Callable[[bool, str], Awaitable[None]] | None = None) -> None:  # fmt: skip
        self.config = config
        self.store = store
        self.puts = puts
        self.status = status
        self.promote = promote
        self.demote = demote
        self.transfer_leader = transfer_leader
        self.fence = fence  # FENCE: a classic broker only
        self.metrics = None  # BrokerMetrics when served: counts reads that met damage
        # SENDs read and not yet put, in the order read: (outbox, frame, request), the request
        # None when the put path decodes it (``PutService.decodes_sends``).
        self._sends: list[tuple[Outbox, cp.Frame, cp.SendRequest | None]] = []
        self._sends_ready = trio.Event()
        self._client_connections = 0
        self.answer_budget = AnswerBudget(config.client_answer_bytes_total_max)  # every connection's queued answers
        self.admission = port_admission.Admission(port_admission.AdmissionLimits(
            CLIENT_STRANGERS_MAX, CLIENT_PREFACE_TIMEOUT_SECONDS, config.connections_max), "client")  # fmt: skip
        self._group = transport.ReadinessGroup()  # the plain TCP connections _read_task reads
        # _read_client reads into this; the decoder's buffer copies what came (wire.Buffer.feed
        # keeps bytes only). ``os.read`` of RECEIVE_SIZE made a 256 KiB ``bytes`` each time, above
        # glibc's mmap threshold: a read cost an ``mmap``, the shrink to what came an ``mremap`` and
        # its free a ``munmap`` (with the TLB shootdown a multi-threaded process pays for one),
        # 0.27-0.29 of each a put at one writer (`scripts/dev/syscalls_per_put.py`: master 9.14 -> 8.13).
        self._receive_view = memoryview(bytearray(CLIENT_RECEIVE_SIZE))
        self._receive_views = [self._receive_view]  # os.readv's list, made once
        # The kinds _read_client queues for the put path straight from a receive (undecoded).
        self._sends_undecoded = cp.SEND_KINDS if puts.decodes_sends else frozenset()

    async def serve_client(self, stream, ticket: port_admission.Ticket | None = None) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        self._client_connections += 1
        client = None
        try:
            await transport.server_preface(connection, port_kind=wire.PORT_KIND_CLIENT, secret=self.config.secret)
            if not self.admission.identified(ticket):
                raise transport.AuthenticationError(f"{self.config.connections_max} client connections already (connections_max)")
            decoder = cp.FrameDecoder(frame_size_max=self.config.frame_size_max, responses=False)
            outbox = Outbox(connection, self.config.requests_in_flight_max, bytes_max=self.config.client_answer_bytes_max,
                            budget=self.answer_budget, muted_timeout_seconds=self.config.client_muted_timeout_seconds)  # fmt: skip
            async with trio.open_nursery() as nursery:
                nursery.start_soon(outbox.run)
                client = _Client(connection, decoder, outbox, nursery)
                if connection.raw_fileno >= 0:
                    await self._serve_in_group(client)
                else:
                    await self._serve_alone(client)
                nursery.cancel_scope.cancel()  # the peer closed: the writer task goes too
        except BaseException as error:
            if not transport.is_expected(error, CLIENT_CONNECTION_ERRORS):
                raise
            if isinstance(transport.first_leaf(error), transport.AuthenticationError | wire.ProtocolError):
                LOGGER.warning("client %s: %s; connection closed", connection.peer, transport.describe(error))
            else:
                LOGGER.info("client %s closed: %s", connection.peer, transport.describe(error))
        finally:
            if client is not None:
                self._leave_group(client)  # before the close frees its descriptor number
                client.outbox.discard()
            self._client_connections -= 1
            await connection.aclose()

    async def _serve_in_group(self, client: _Client) -> None:
        """A plain TCP connection: read by ``_read_task`` while it can take requests; here
        only what was read ahead with the preface and what the reader leaves when the outbox
        is full. Returns when the peer closed; raises what broke the connection."""
        data = client.connection.take_buffered()
        if data:
            client.decoder.receive_data(data)
        while True:
            await self._take_all(client)
            self._submit_sends()
            client.outbox.flush()
            client.handed_back = trio.Event()
            client.fd = client.connection.raw_fileno
            if client.fd < 0:
                raise trio.ClosedResourceError(f"connection to {client.connection.peer} is closed")
            self._group.add(client.fd, client)
            await client.handed_back.wait()
            if client.error is not None:
                raise client.error
            if client.ended:
                return

    async def _serve_alone(self, client: _Client) -> None:
        """A TLS connection: its own receive loop. Returns when the peer closed."""
        while True:
            data = await client.connection.receive_some()
            if not data:
                return
            client.decoder.receive_data(data)
            await self._take_all(client)
            self._submit_sends()
            client.outbox.flush()  # answers to requests other than SENDs

    def _leave_group(self, client: _Client) -> None:
        if client.fd >= 0:
            self._group.discard(client.fd)
            client.fd = -1

    async def _take_all(self, client: _Client) -> None:
        """Take every frame decoded so far, waiting for room in the outbox when it is full."""
        while not self._take_frames(client):
            # The room comes from responses: the SENDs read so far must be put, and the answers
            # queued sent, before this connection waits for it.
            self._submit_sends()
            client.outbox.flush()
            await client.outbox.wait_room()

    def _take_frames(self, client: _Client) -> bool:
        """Take decoded frames while the outbox has room (each holds a place until answered):
        SENDs queued for the put path, other requests answered or started. False when it
        stopped for want of room, True when no frame is left."""
        decoder, outbox = client.decoder, client.outbox
        while True:
            room = outbox.in_flight_limit - outbox.in_flight
            if room <= 0:  # outbox.full, written out
                return False
            # Every whole frame the room allows up to the first that is not a SEND, split by one
            # call a received piece (not a next_frame and a skip a frame); SENDs only, left for
            # the put path to decode, are queued in one step, each frame holding its place.
            frames, plain, error = decoder.take_frames(room)
            if plain and self.puts.decodes_sends:
                outbox.take_places(len(frames))
                self._sends += zip(repeat(outbox), frames, repeat(None))
            else:
                self._take_each(client, frames)
            if error is not None:
                raise wire.ProtocolError(error)
            if plain and len(frames) < room:
                return True  # no whole frame left (a pass ending in another request's frame may have more)

    def _take_each(self, client: _Client, frames: list[cp.Frame]) -> None:
        """Frames taken one by one (a pass with other requests than SENDs, or SENDs decoded here)."""
        outbox = client.outbox
        for frame in frames:
            outbox.take_place()
            if frame.kind in cp.ADMIN_KINDS:
                client.nursery.start_soon(self._role_request, outbox, frame)
                continue
            if frame.kind not in cp.SEND_KINDS:
                outbox.respond_counted(frame, self.answer(frame))  # counted: a READ's is up to 4 MiB
                continue
            if self.puts.decodes_sends:  # decoded with its pass, natively (SEND and SEND_IDEMPOTENT)
                self._sends.append((outbox, frame, None))
                continue
            try:
                request = cp.decode_send(frame.payload, idempotent=frame.kind == cp.SEND_IDEMPOTENT)
            except wire.ProtocolError as error:
                outbox.respond(frame, error_response(frame, str(error)))
                continue
            self._sends.append((outbox, frame, request))

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
        """The port's own tasks: the reader of the plain TCP connections (``_read_task``), and
        the append loop for SENDs that connections' own tasks read (TLS, or the rest of a read
        that found the outbox full): what they queued since the last pass, put together."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_task)
                while True:
                    await self._sends_ready.wait()
                    self._sends_ready = trio.Event()
                    items, self._sends = self._sends, []
                    if items:
                        self.puts.put_items(items)
        finally:
            self._group.close()

    async def _read_task(self) -> None:
        """One pass per wait: read every ready connection of the group, put every SEND read
        (grouped by queue, appended and waited for together: ``PutService.put_items``), then
        send what was answered at once."""
        look_first = True
        while True:
            touched = [client.outbox for client in await self._group.wait(look_first=look_first) if self._read_client(client)]
            sends = len(self._sends)
            if sends:
                items, self._sends = self._sends, []
                self.puts.put_items(items)
            for outbox in touched:
                if outbox.queued:  # SYNC_MASTER puts are answered later, by the acks
                    outbox.flush()
            # More may have come in meanwhile only if more than one request was in flight: a
            # lone writer's next request waits for this one's answer.
            look_first = sends > 1 or len(touched) > 1
        raise AssertionError("unreachable")

    def _read_client(self, client: _Client) -> bool:
        """One receive of a ready connection and its frames taken; the connection handed back
        to its task when it ended, broke or must wait for room. True if anything was read.

        A receive that is exactly one SEND frame, with nothing buffered before it and room in
        the outbox (a connection per writer: every receive), is queued for the pass here: the
        decoder's feed, two ``next_frame`` and ``_take_frames`` cost ~10 Python calls a put,
        half of what a put costs the port beside one shared connection. The frame is the one
        the decoder would give (same checks; anything else goes the decoder's way)."""
        try:
            # Connection.receive_now written out (a read per put with a connection per writer):
            # a member's descriptor stays open until it leaves the group.
            view = self._receive_view
            try:
                size = os.readv(client.fd, self._receive_views)
            except BlockingIOError:
                return False  # nothing after all (the group reported it before an earlier read took it)
            except OSError as error:
                raise trio.BrokenResourceError(f"receive from {client.connection.peer}: {error}") from error
            if size >= FRAME_HEADER_SIZE and not client.decoder.buffered:
                length, kind, request_id = cp.FRAME_HEADER.unpack_from(view)
                outbox = client.outbox
                if (length + 4 == size and kind in self._sends_undecoded and length <= client.decoder.frame_size_max
                        and outbox.in_flight < outbox.in_flight_limit):  # fmt: skip
                    outbox.in_flight += 1  # outbox.take_place, written out
                    payload = memoryview(view[FRAME_HEADER_SIZE:size].tobytes())
                    self._sends.append((outbox, NEW_TUPLE(cp.Frame, (kind, request_id, payload)), None))
                    return True
            data = view[:size]
            if data:
                client.decoder.receive_data(data)
                if self._take_frames(client):
                    return True
            else:
                client.ended = True
        except CLIENT_CONNECTION_ERRORS as error:
            client.error = error
        self._leave_group(client)
        client.handed_back.set()
        return True

    async def _role_request(self, outbox: Outbox, frame: cp.Frame) -> None:
        if frame.kind == cp.TRANSFER_LEADER:
            outbox.respond(frame, await self._transfer_leader(frame))
            outbox.flush()
            return
        try:
            if frame.kind == cp.PROMOTE:
                sync, fence_reason = cp.decode_promote(bytes(frame.payload))
                role = BrokerRole.SYNC_MASTER if sync else BrokerRole.ASYNC_MASTER
                await (self.promote(role, fence_reason=fence_reason) if fence_reason else self.promote(role))
            elif frame.kind == cp.FENCE:
                if self.fence is None:
                    raise ValueError("a DLedger member is not fenced by hand: hasvc transfer-leader moves its leadership")
                await self.fence(*cp.decode_fence(frame.payload))
            else:
                await self.demote(parse_address(cp.decode_demote(frame.payload)))
        except (ValueError, wire.ProtocolError) as error:
            outbox.respond(frame, cp.encode_simple_response(cp.ERROR, str(error), b""))
        else:
            outbox.respond(frame, cp.encode_simple_response(cp.OK, "", json.dumps(self.status()).encode()))
        outbox.flush()

    async def _transfer_leader(self, frame: cp.Frame) -> bytes:
        try:
            target = cp.decode_transfer_leader(frame.payload)
        except wire.ProtocolError as error:
            return cp.encode_simple_response(cp.ERROR, str(error), b"{}")
        if self.transfer_leader is None:
            return cp.encode_simple_response(cp.ERROR, "a classic broker has no Raft group to hand leadership in: "
                                             "hasvc promote/demote move its master", b"{}")  # fmt: skip
        status, reason, details = await self.transfer_leader(target)
        return cp.encode_simple_response(status, reason, json.dumps(details).encode())

    def answer(self, frame: cp.Frame) -> bytes:
        """The response to a PULL, READ or STATUS frame (they need no wait): an error response
        for that request alone when it is malformed or the store cannot read what it names."""
        try:
            if frame.kind == cp.PULL:
                request = cp.decode_pull(frame.payload)
                if self.answer_budget.exhausted:
                    refusal = cp.PullResponse(cp.SERVICE_NOT_AVAILABLE, self._budget_spent(), request.queue_offset, 0, [])
                    return cp.encode_pull_response(refusal)
                return self._pull(request)
            if frame.kind == cp.READ:
                offset, size_max = cp.decode_read(frame.payload)
                if self.answer_budget.exhausted:
                    return cp.encode_simple_response(cp.SERVICE_NOT_AVAILABLE, self._budget_spent(), offset, b"")
                return self._read(offset, size_max)
            return cp.encode_simple_response(cp.OK, "", json.dumps(self.status()).encode())
        except wire.ProtocolError as error:
            return error_response(frame, str(error))
        except ReadError as error:  # a queue unit naming bytes the log no longer has: that request fails, not the broker
            LOGGER.warning("%s request failed: %s", "PULL" if frame.kind == cp.PULL else "READ", error)
            return error_response(frame, f"read failed: {error}")

    def _budget_spent(self) -> str:
        self.answer_budget.refused += 1
        return (f"answers queued on all connections reach client_answer_bytes_total_max "
                f"({self.answer_budget.bytes_queued} of {self.answer_budget.bytes_max} bytes): retry later")

    def _pull(self, request: cp.PullRequest) -> bytes:
        queue = self.store.consume_queues.find(request.topic, request.queue_id)
        if queue is None:
            return cp.encode_pull_response(cp.PullResponse(cp.NOT_FOUND, f"no queue {request.topic}/{request.queue_id}", request.queue_offset, 0, []))
        next_offset = max(request.queue_offset, queue.min_offset_in_queue)
        total = 0
        units = queue.read(next_offset, min(request.count_max, PULL_COUNT_MAX))
        # Retention deletes consume-queue files whole: the oldest one left may still list units of
        # messages below the log's minimum offset. They count as removed (RocketMQ's correctMinOffset).
        expired = sum(1 for offset, _size, _tags in units if offset < self.store.min_offset)
        next_offset += expired
        end = expired
        for _offset, size, _tags in units[expired:]:
            total += size
            if end > expired and total > PULL_BYTES_MAX:
                break
            end += 1
        checked = self._checked(self.store.read_records(units[expired:end], copy=True), "PULL")
        records = checked.views  # bytes, copied as they were checked
        if checked.damage is not None and not records:  # the next record is the damaged one
            return cp.encode_pull_response(cp.PullResponse(cp.DAMAGED, describe_for_reader(checked.damage), next_offset,
                                                           queue.max_offset_in_queue, []))  # fmt: skip
        next_offset += len(records)
        status = cp.OK if records or request.queue_offset <= queue.max_offset_in_queue else cp.OFFSET_ILLEGAL
        return cp.encode_pull_response(cp.PullResponse(status, "", next_offset, queue.max_offset_in_queue, records))

    def _read(self, offset: int, size_max: int) -> bytes:
        try:
            checked = self._checked(self.store.read_checked(offset, min(size_max, READ_SIZE_MAX)), "READ")
        except ReadError as error:
            return cp.encode_simple_response(cp.OFFSET_ILLEGAL, str(error), offset, b"")
        data = bytes(checked.views[0])
        if checked.damage is not None and not data:
            return cp.encode_simple_response(cp.DAMAGED, describe_for_reader(checked.damage), offset, b"")
        return cp.encode_simple_response(cp.OK, "", offset, data)

    def _checked(self, checked: CheckedRead, kind: str) -> CheckedRead:
        """Report damage a read found: one ERROR line the first time (the store keeps it in
        ``damaged``, STATUS shows it), and the count of reads that met it. The reader gets
        what lies before the damage, or DAMAGED when the damage is where it asked to start."""
        damage = checked.damage
        if damage is not None:
            if checked.new:
                LOGGER.error("damaged record found by a %s: %s bytes [%d, %d): %s; not served (STATUS damaged lists it)",
                             kind, damage.file, damage.from_offset, damage.to_offset, damage.reason)  # fmt: skip
            if self.metrics is not None:
                self.metrics.read_met_damage(kind)
        return checked
