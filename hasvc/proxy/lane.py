"""The send lane: the gateway's sends from the gRPC loop straight to the master, with no thread hop.

Theory of operation
-------------------
The gRPC handlers run in an asyncio loop; the gateway's state and its failover client in a trio
loop in another thread (``hasvc/proxy/server.py``). A send that crosses to trio and back pays two
hand-overs between the threads (a wake-up byte, a pass of each loop and the GIL changing hands
twice): 0.26 ms of the 0.93 ms the proxy held one send at one sender on a loaded machine
(docs/PROXY.md, "The send lane"), and the trio client's own passes on top of the master's round
trip. The lane is one more connection to the master, driven from the asyncio loop by callbacks: a
handler encodes its SEND_IDEMPOTENT, a send alone is written at once and concurrent ones of one
loop pass leave in one write, and the response settles the handler's future from
``data_received``.

It only ever sends where the failover client already is: it connects to ``cluster.address`` for
``cluster.generation`` (the trio side's master; reading two attributes across threads is safe
under the GIL, and a stale read only costs a refused attempt). Whenever it cannot tell the
outcome — not connected yet, the connection failed or timed out, a response it cannot decode, or the broker answered
SERVICE_NOT_AVAILABLE (no longer the master) — ``send`` returns None and the caller sends the same
key through the failover client, which finds the master and retries; the broker answers a repeat
of a key with the first attempt's offsets (``hasvc/state/dedupe.py``), so a message the lane
did store is not stored twice. After a failover the generation changes and the lane reconnects to
the new master on the next send.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import ssl

from hasvc import transport
from hasvc.client.connection import REQUEST_TIMEOUT_SECONDS
from hasvc.client.results import SendResult, send_results
from hasvc.config import parse_address
from hasvc.protocol import client as cp
from hasvc.protocol import wire
from hasvc.state import failover

log = logging.getLogger("hasvc.proxy")

# A lane that failed to connect, or whose connection broke, waits this long before trying the same
# master again (its sends go through the failover client meanwhile); a new master (a new
# generation of the failover client) is tried at once.
RECONNECT_PAUSE_SECONDS = 1.0
# How often pending requests are checked against REQUEST_TIMEOUT_SECONDS (the trio client's).
TIMEOUT_CHECK_SECONDS = 1.0


class _Protocol(asyncio.Protocol):
    """Bytes in and out of one lane connection: the preface first (``expect``), frames after."""

    def __init__(self, lane: SendLane):
        self.lane = lane
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.want: tuple[int, asyncio.Future] | None = None
        self.decoder: cp.FrameDecoder | None = None  # set once the preface is done
        self.lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def expect(self, size: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.want = (size, future)
        self._check_want()
        return future

    def _check_want(self) -> None:
        if self.want is not None and len(self.buffer) >= self.want[0]:
            (size, future), self.want = self.want, None
            data = bytes(self.buffer[:size])
            del self.buffer[:size]
            if not future.done():
                future.set_result(data)

    def data_received(self, data: bytes) -> None:
        if self.decoder is None:
            self.buffer += data
            self._check_want()
            return
        try:
            self.decoder.receive_data(data)
            while (frame := self.decoder.next_frame()) is not None:
                self.lane._answered(self, frame)
        except wire.ProtocolError as error:
            self.lane._break(self, f"bad frame from the master: {error}")

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self.want is not None and not self.want[1].done():
            self.want[1].set_exception(EOFError("the master closed the connection"))
        self.lane._break(self, f"connection lost: {exc or 'closed by the master'}")


class SendLane:
    """Sends from the asyncio loop on a connection of their own to the failover client's master;
    see the module. ``send`` returns the results, or None when the caller must send through the
    failover client instead. Used from the asyncio loop's thread only."""

    def __init__(self, cluster, *, secret: bytes | str | None, tls_ca: str | None):
        self.cluster = cluster
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self._ssl = transport.client_ssl_context(ca=tls_ca) if tls_ca else None
        self._protocol: _Protocol | None = None
        self._generation = -1  # the failover client's generation the connection was made for
        self._connecting: asyncio.Task | None = None
        self._tried_generation = -1  # the generation of the last attempt to connect
        self._retry_at = 0.0  # after a failed connect: no new attempt for that generation before this (loop time)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._deadlines: collections.deque[tuple[float, int]] = collections.deque()
        self._outgoing: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None
        self.stats = {"sent": 0, "fallbacks": 0, "connects": 0, "breaks": 0}

    # --- sending ---

    async def send(self, request: cp.SendRequest) -> list[SendResult] | None:
        protocol = self._ready()
        if protocol is None:
            self.stats["fallbacks"] += 1
            return None
        loop = asyncio.get_running_loop()
        request_id = next(self._ids) & 0xFFFFFFFF
        frame = cp.encode_frame(cp.SEND_IDEMPOTENT, request_id, cp.encode_send(request))
        if not self._pending and not self._outgoing:
            # the only request out: it leaves now, and the bookkeeping below runs while the master
            # works (its answer is read by this loop, so it cannot come before the future is there)
            protocol.transport.write(frame)
            if protocol is not self._protocol:  # the write found the connection broken: outcome unknown
                self.stats["fallbacks"] += 1
                return None
        else:
            if not self._outgoing:
                loop.call_soon(self._flush)  # the frames of this pass of the loop leave in one write
            self._outgoing.append(frame)
        future = loop.create_future()
        self._pending[request_id] = future
        self._deadlines.append((loop.time() + REQUEST_TIMEOUT_SECONDS, request_id))
        try:
            payload = await future
        finally:
            self._pending.pop(request_id, None)
        if payload is None:  # the connection failed or timed out: the outcome is unknown
            self.stats["fallbacks"] += 1
            return None
        try:
            results = send_results(payload, len(request.bodies))
        except wire.ProtocolError as error:  # a frame whose payload is not a SEND response: a broken peer
            self._break(protocol, f"bad SEND response from the master: {error}")
            self.stats["fallbacks"] += 1
            return None
        if failover.outcome_of(results[0].status) is not failover.SendOutcome.STORED:
            self.stats["fallbacks"] += 1
            return None  # not the master (any more): the failover client finds the one that is
        self.stats["sent"] += 1
        return results

    def _ready(self) -> _Protocol | None:
        """The connection to the failover client's current master, or None (starting one if
        none is being made)."""
        protocol = self._protocol
        generation = self.cluster.generation
        if protocol is not None and not protocol.lost and self._generation == generation:
            return protocol
        if protocol is not None:
            self._break(protocol, "the failover client moved to another master")
        address = self.cluster.address
        loop = asyncio.get_running_loop()
        if address and self._connecting is None and (generation != self._tried_generation or loop.time() >= self._retry_at):
            self._tried_generation = generation
            self._connecting = loop.create_task(self._connect(address, generation))
        return None

    def _flush(self) -> None:
        frames, self._outgoing = self._outgoing, []
        protocol = self._protocol
        if protocol is not None and not protocol.lost and frames:
            protocol.transport.writelines(frames)

    def _answered(self, protocol: _Protocol, frame: cp.Frame) -> None:
        future = self._pending.pop(frame.request_id, None)
        if future is not None and not future.done():
            future.set_result(frame.payload)

    # --- the connection ---

    async def _connect(self, address: str, generation: int) -> None:
        loop = asyncio.get_running_loop()
        protocol: _Protocol | None = None
        try:
            host, port = parse_address(address)
            async with asyncio.timeout(transport.PREFACE_TIMEOUT_SECONDS):
                _, protocol = await loop.create_connection(lambda: _Protocol(self), host, port, ssl=self._ssl)
                preface = transport.ClientPreface(peer=address, port_kind=wire.PORT_KIND_CLIENT, secret=self._secret)
                protocol.transport.write(preface.reply(await protocol.expect(wire.HELLO.size)))
                preface.check(await protocol.expect(wire.AUTH_OK.size))
            protocol.decoder = cp.FrameDecoder(frame_size_max=cp.FRAME_SIZE_MAX_DEFAULT, responses=True)
            if protocol.buffer:  # frames cannot come before a request; anything here is a broken peer
                raise wire.ProtocolError(f"{len(protocol.buffer)} unexpected bytes after the preface")
        except (OSError, EOFError, TimeoutError, ssl.SSLError, wire.ProtocolError, transport.AuthenticationError) as error:
            log.warning("send lane: cannot connect to %s (%s); sends go through the failover client", address, error)
            if protocol is not None and protocol.transport is not None:
                protocol.transport.abort()
            self._retry_at = loop.time() + RECONNECT_PAUSE_SECONDS
            return
        finally:
            self._connecting = None
        self._protocol, self._generation = protocol, generation
        self.stats["connects"] += 1
        if self._timer is None:
            self._timer = loop.call_later(TIMEOUT_CHECK_SECONDS, self._check_timeouts)
        log.info("send lane connected to %s", address)

    def _check_timeouts(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(TIMEOUT_CHECK_SECONDS, self._check_timeouts)
        deadlines = self._deadlines
        while deadlines and deadlines[0][1] not in self._pending:
            deadlines.popleft()
        if deadlines and deadlines[0][0] <= loop.time() and self._protocol is not None:
            self._break(self._protocol, f"no response within {REQUEST_TIMEOUT_SECONDS:.0f} s")

    def _break(self, protocol: _Protocol, why: str) -> None:
        """Drop ``protocol``'s connection; every request on it is answered None (the callers send
        through the failover client)."""
        if protocol is not self._protocol:
            return
        self._protocol = None
        self._retry_at = asyncio.get_running_loop().time() + RECONNECT_PAUSE_SECONDS  # unless the master changes
        self.stats["breaks"] += 1
        log.info("send lane: %s", why)
        if protocol.transport is not None:
            protocol.transport.abort()
        pending, self._pending = self._pending, {}
        self._deadlines.clear()
        self._outgoing.clear()
        for future in pending.values():
            if not future.done():
                future.set_result(None)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
        if self._protocol is not None:
            self._break(self._protocol, "closing")
