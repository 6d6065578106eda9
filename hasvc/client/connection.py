"""One connection to one broker: ``connect`` and the ``Client`` it yields.

One connection carries many requests at once: each has a request id and its response may come in
any order, so a single connection can carry a whole benchmark's load.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence

import trio
from crc32c import crc32c as _crc32c

from commitlog import record as rec
from hasvc import transport
from hasvc.client.results import (
    ClientError,
    ConnectError,
    DamagedRecordError,
    PullResult,
    SendResult,
    TransferResult,
    message_properties,
    send_results,
)
from hasvc.config import parse_address
from hasvc.protocol import client as cp
from hasvc.protocol import wire

REQUEST_TIMEOUT_SECONDS = 30.0  # above the broker's 5 s flush and 3 s slave timeouts
# The deadlines of requests sent are kept in issue order and the answered ones dropped from the
# front; past this many the queue is compacted (one request unanswered for 30 s in a fast stream
# would otherwise keep every later deadline until it times out).
DEADLINES_QUEUED_MAX = 65536
_TIMED_OUT = object()  # a request's slot when its deadline passed before its response came


class Client:
    def __init__(self, connection: transport.Connection, *, frame_size_max: int = cp.FRAME_SIZE_MAX_DEFAULT):
        self._connection = connection
        self._ids = itertools.count(1)
        self._pending: dict[int, list] = {}  # request id -> [event, frame]
        self._decoder = cp.FrameDecoder(frame_size_max=frame_size_max, responses=True)
        self._error: BaseException | None = None
        # Requests made while the writer is busy or not yet scheduled leave in one send: tasks
        # woken together (say, by one read of responses) share a syscall and reach the broker in
        # one read, which appends them as one batch and waits once for the slave.
        self._outgoing: list[bytes] = []
        self._send_wakeup = trio.Event()
        # (deadline, request id) in issue order: one timer task for all requests, not a cancel
        # scope with a deadline each (~10-20 us of trio bookkeeping a request, docs/PROXY.md)
        self._deadlines: collections.deque[tuple[float, int]] = collections.deque()

    async def _send_loop(self) -> None:
        try:
            while True:
                await self._send_wakeup.wait()
                self._send_wakeup = trio.Event()
                frames, self._outgoing = self._outgoing, []
                # one writev straight to the descriptor on plain TCP (Connection.send_parts), not
                # trio's socket layers (and no join of the frames)
                await self._connection.send_parts(frames)
            raise AssertionError("unreachable")
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._fail(error)

    async def _timeout_loop(self) -> None:
        """Answer every request whose deadline passed with ``_TIMED_OUT``. The timeout is one
        constant, so deadlines come in issue order: the loop sleeps until the oldest pending one,
        or, with none pending, for REQUEST_TIMEOUT_SECONDS (any request made meanwhile has a
        later deadline than that wake-up, so no request needs to wake this task)."""
        while True:
            self._drop_answered()
            if not self._deadlines:
                await trio.sleep(REQUEST_TIMEOUT_SECONDS)
                continue
            deadline, request_id = self._deadlines[0]
            if trio.current_time() < deadline:
                await trio.sleep_until(deadline)
                continue
            self._deadlines.popleft()
            slot = self._pending.pop(request_id, None)
            if slot is not None:
                slot[1] = _TIMED_OUT
                slot[0].set()
        raise AssertionError("unreachable")

    def _drop_answered(self) -> None:
        deadlines, pending = self._deadlines, self._pending
        while deadlines and deadlines[0][1] not in pending:
            deadlines.popleft()
        if len(deadlines) > DEADLINES_QUEUED_MAX:
            self._deadlines = collections.deque(item for item in deadlines if item[1] in pending)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        for slot in self._pending.values():
            slot[0].set()
        self._pending.clear()

    async def _receive_loop(self) -> None:
        try:
            while True:
                data = await self._connection.receive_some()
                if not data:
                    raise EOFError("broker closed the connection")
                self._decoder.receive_data(data)
                while (frame := self._decoder.next_frame()) is not None:
                    slot = self._pending.pop(frame.request_id, None)
                    if slot is not None:
                        slot[1] = frame
                        slot[0].set()
            raise AssertionError("unreachable")
        except (EOFError, OSError, wire.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._fail(error)
        finally:
            self._fail(EOFError("client closed"))

    async def _request(self, kind: int, payload: bytes) -> bytes:
        if self._error is not None:
            raise ClientError(f"connection failed: {self._error}")
        request_id = next(self._ids) & 0xFFFFFFFF
        slot = [trio.Event(), None]
        self._pending[request_id] = slot
        self._drop_answered()
        self._deadlines.append((trio.current_time() + REQUEST_TIMEOUT_SECONDS, request_id))
        frame = cp.encode_frame(kind, request_id, payload)
        if len(self._pending) == 1 and not self._outgoing:
            # the only request out (one caller waiting on each answer): written now, without a
            # pass of the writer task; what the socket does not take now goes to the writer
            try:
                rest = self._connection.write_now([frame])
            except OSError as error:
                self._fail(error)  # answers this request's slot too
                rest = b""
            if rest is not None:  # None: TLS, or the writer is sending; it takes the frame
                frame = rest
        if frame:
            self._outgoing.append(frame)
            self._send_wakeup.set()
        await slot[0].wait()
        if slot[1] is _TIMED_OUT:
            raise ClientError(f"no response within {REQUEST_TIMEOUT_SECONDS:.0f} s")
        if slot[1] is None:
            raise ClientError(f"connection failed: {transport.describe(self._error)}")
        return slot[1].payload

    async def send(self, topic: str, body: bytes, *, tags: str | None = None, keys: str | None = None,
                   properties: Mapping[str, str] | None = None, queue_id: int = 0) -> SendResult:  # fmt: skip
        results = await self.send_batch(topic, [body], tags=tags, keys=keys, properties=properties, queue_id=queue_id)
        return results[0]

    @property
    def broken(self) -> bool:
        """The connection has failed; every further request fails at once."""
        return self._error is not None

    async def send_batch(self, topic: str, bodies: Sequence[bytes], *, tags: str | None = None, keys: str | None = None,
                         properties: Mapping[str, str] | None = None, queue_id: int = 0,
                         producer_id: str = "", first_sequence: int = -1) -> list[SendResult]:  # fmt: skip
        """Send messages sharing topic, queue and properties in one request; one result each.
        With ``producer_id``, message i carries sequence ``first_sequence + i`` and the broker
        answers a repeat of the same sequences with the original offsets (hasvc/state/dedupe.py)."""
        encoded = message_properties(tags, keys, properties)
        request = cp.SendRequest(topic, queue_id, list(bodies), [encoded] * len(bodies), 0, _now_ms(), producer_id, first_sequence)
        kind = cp.SEND_IDEMPOTENT if producer_id else cp.SEND
        return send_results(await self._request(kind, cp.encode_send(request)), len(bodies))

    async def pull(self, topic: str, queue_id: int, queue_offset: int, *, count_max: int = 32) -> PullResult:
        payload = await self._request(cp.PULL, cp.encode_pull(cp.PullRequest(topic, queue_id, queue_offset, count_max)))
        response = cp.decode_pull_response(payload)
        if response.status == cp.DAMAGED:
            raise _damaged(response.reason)
        if response.status not in (cp.OK, cp.NOT_FOUND, cp.OFFSET_ILLEGAL):
            raise ClientError(f"{response.status}: {response.reason}")
        records = [_checked_record(data) for data in response.records]
        return PullResult(response.status, records, response.next_queue_offset, response.max_queue_offset)

    async def read(self, offset: int, *, size_max: int = 1024 * 1024) -> bytes:
        """Raw log bytes from ``offset`` (up to the end of its segment or ``size_max``)."""
        status, reason, _, data = cp.decode_read_response(await self._request(cp.READ, cp.encode_read(offset, size_max)))
        if status == cp.DAMAGED:
            raise _damaged(reason)
        if status != cp.OK:
            raise ClientError(f"{status}: {reason}")
        return data

    async def read_record(self, offset: int) -> rec.Record:
        data = await self.read(offset, size_max=rec.BODY_SIZE_MAX_DEFAULT + 65536)
        try:
            record = rec.decode_record(data, crc_function=None)
        except rec.RecordError as error:
            raise ClientError(f"no record at offset {offset}: {error.reason}") from None
        if record.physical_offset != offset:
            raise ClientError(f"offset {offset} is not a record boundary")
        return _crc_checked(data, record)

    async def promote(self, *, sync: bool = True, fence_reason: str = "") -> dict:
        """Make a slave the master (SYNC_MASTER unless ``sync`` is False); its status after.
        With ``fence_reason`` it starts fenced (``fence(fence_reason, fence=False)`` lifts it)."""
        status, reason, data = cp.decode_status_response(await self._request(cp.PROMOTE, cp.encode_promote(sync, fence_reason)))
        if status != cp.OK:
            raise ClientError(f"{status}: {reason}")
        return json.loads(data)

    async def demote(self, master_ha: str) -> dict:
        """Make a master the slave of the master whose HA address is ``master_ha``."""
        status, reason, data = cp.decode_status_response(await self._request(cp.DEMOTE, cp.encode_demote(master_ha)))
        if status != cp.OK:
            raise ClientError(f"{status}: {reason}")
        return json.loads(data)

    async def fence(self, reason: str, *, fence: bool = True) -> dict:
        """Make a classic master refuse writes (SERVICE_NOT_AVAILABLE, ``reason`` in STATUS
        ``fenced_by``) while it keeps serving its slaves; ``fence=False`` lifts a fence set with
        the same reason. Its status after."""
        status, reason_text, data = cp.decode_status_response(await self._request(cp.FENCE, cp.encode_fence(fence, reason)))
        if status != cp.OK:
            raise ClientError(f"{status}: {reason_text}")
        return json.loads(data)

    async def transfer_leader(self, target: str) -> TransferResult:
        """Ask the DLedger member (the leader) to hand leadership to member ``target``; a refusal
        is a result, not an error (the broker answers within about 10 s)."""
        payload = await self._request(cp.TRANSFER_LEADER, cp.encode_transfer_leader(target))
        status, reason, data = cp.decode_status_response(payload)
        try:
            details = json.loads(data) if data else {}
        except ValueError:
            raise ClientError(f"TRANSFER_LEADER response is not JSON: {bytes(data[:40])!r}") from None
        return TransferResult(status, reason, details)

    async def status(self) -> dict:
        status, reason, data = cp.decode_status_response(await self._request(cp.STATUS, b""))
        if status != cp.OK:
            raise ClientError(f"{status}: {reason}")
        return json.loads(data)


def _checked_record(data) -> rec.Record:
    """A record as a PULL or READ answer holds it, its body CRC checked here too (as Kafka's
    consumers check ``check.crcs``): the broker checks every record before it serves it
    (``check_crc_on_read``), this catches what changed after (memory, the wire) and a broker that
    does not check. Stores a broker writes use CRC32C; a record with the CRC tail
    (``append_record_crc``) has its record CRC checked too."""
    try:
        record = rec.decode_record(data, crc_function=None)
    except rec.RecordError as error:
        raise ClientError(f"the broker sent a record that does not decode: {error.reason}") from None
    return _crc_checked(data, record)


def _crc_checked(data, record: rec.Record) -> rec.Record:
    """``record`` (decoded at the start of ``data``) if its body CRC and record CRC (when it has
    the tail) match; DamagedRecordError naming the one that failed otherwise."""
    if not rec.crcs_ok(data, 0, record, _crc32c):
        which = "body" if _crc32c(record.body) & rec.CRC_MASK != record.body_crc else "record"
        raise DamagedRecordError(f"record at offset {record.physical_offset} failed its {which} CRC on arrival: not handed out",
                                 record.physical_offset)  # fmt: skip
    return record


def _damaged(reason: str) -> DamagedRecordError:
    """The error for a DAMAGED answer, whose reason starts ``record at offset N is damaged``."""
    words = reason.split(" ", 4)
    offset = int(words[3]) if len(words) > 3 and words[:3] == ["record", "at", "offset"] and words[3].isdigit() else -1
    return DamagedRecordError(f"{cp.DAMAGED}: {reason}", offset)


def _now_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


@contextlib.asynccontextmanager
async def connect(address: str, secret: bytes | str | None = None, *, tls_ca: str | None = None) -> AsyncIterator[Client]:
    """Connect, run the preface, and yield a Client; closes the connection on exit."""
    if isinstance(secret, str):
        secret = secret.encode()
    ssl_context = transport.client_ssl_context(ca=tls_ca) if tls_ca else None
    try:
        where = parse_address(address)
    except ValueError as error:
        raise ConnectError(f"{error} (give HOST:PORT, e.g. 127.0.0.1:10911)") from None
    try:
        connection = await transport.connect(where, ssl_context=ssl_context)
    except OSError as error:
        # trio's "all attempts to connect to ... failed" has the reason in its cause
        cause = error.__cause__.exceptions[0] if isinstance(error.__cause__, BaseExceptionGroup) else error.__cause__
        if isinstance(cause, OSError) and cause.errno:
            reason = os.strerror(cause.errno)
        else:
            reason = error.strerror or str(error)
        if reason.startswith("TLS handshake"):  # it connected: the handshake failed (it names the address)
            raise ConnectError(f"{reason} (is the broker using TLS with a certificate --tls-ca trusts?)") from None
        raise ConnectError(f"cannot connect to {address}: {reason} (is a broker listening there?)") from None
    try:
        try:
            await transport.client_preface(connection, port_kind=wire.PORT_KIND_CLIENT, secret=secret)
        except (transport.AuthenticationError, wire.ProtocolError, EOFError, trio.TooSlowError) as error:
            text = str(error) or type(error).__name__
            # the preface's errors name the peer already: the address once
            raise ConnectError(text if text.startswith(connection.peer) else f"{address}: {text}") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as error:
            raise ConnectError(f"{address}: connection failed during the preface: {transport.describe(error)}") from None
        client = Client(connection)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._receive_loop)
            nursery.start_soon(client._send_loop)
            nursery.start_soon(client._timeout_loop)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await connection.aclose()
