"""The client library.

    async with hasvc.client.connect("127.0.0.1:10911", secret=None) as client:
        result = await client.send("Orders", b"hello", tags="new", keys="order-1")
        records = await client.pull("Orders", 0, 0, count_max=32)

    client = hasvc.client.BlockingClient("127.0.0.1:10911")   # same methods, for scripts
    client.send("Orders", b"hello"); client.close()

One connection carries many requests at once: each has a request id and its response may come in
any order, so a single connection can carry a whole benchmark's load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import secrets
import threading
from collections.abc import AsyncIterator, Mapping, Sequence

import trio

from commitlog import record as rec
from hasvc import transport
from hasvc.config import parse_address
from hasvc.protocol import client as cp
from hasvc.protocol import wire
from hasvc.state import failover

REQUEST_TIMEOUT_SECONDS = 30.0  # above the broker's 5 s flush and 3 s slave timeouts


class ClientError(Exception):
    """The broker answered with an error, or the connection failed."""


@dataclasses.dataclass(frozen=True, slots=True)
class SendResult:
    status: str
    offset: int
    queue_id: int
    queue_offset: int
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "PUT_OK"


@dataclasses.dataclass(frozen=True, slots=True)
class TransferResult:
    """A TRANSFER_LEADER outcome: ``status`` OK or why not (docs/PROTOCOL.md §2), ``details`` the
    response's JSON object (leader_id, term, target_lag_entries, ...)."""

    status: str
    reason: str
    details: dict

    @property
    def ok(self) -> bool:
        return self.status == cp.OK


@dataclasses.dataclass(frozen=True, slots=True)
class PullResult:
    status: str
    records: list[rec.Record]
    next_queue_offset: int
    max_queue_offset: int


def message_properties(tags: str | None, keys: str | None, properties: Mapping[str, str] | None) -> bytes:
    merged = dict(properties or {})
    if tags:
        merged[rec.PROPERTY_TAGS] = tags
    if keys:
        merged[rec.PROPERTY_KEYS] = keys
    return rec.encode_properties(merged)


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

    async def _send_loop(self) -> None:
        try:
            while True:
                await self._send_wakeup.wait()
                self._send_wakeup = trio.Event()
                frames, self._outgoing = self._outgoing, []
                await self._connection.send_all(b"".join(frames))
            raise AssertionError("unreachable")
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._fail(error)

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
        self._outgoing.append(cp.encode_frame(kind, request_id, payload))
        self._send_wakeup.set()
        with trio.move_on_after(REQUEST_TIMEOUT_SECONDS) as timeout:
            await slot[0].wait()
        if timeout.cancelled_caught:
            self._pending.pop(request_id, None)
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
        response = cp.decode_send_response(await self._request(kind, cp.encode_send(request)))
        if not response.offsets:
            # nothing stored: the response's queue id is -1 (docs/PROTOCOL.md, SEND response)
            return [SendResult(response.status, -1, response.queue_id, -1, response.reason) for _ in bodies]
        return [
            SendResult(response.status, offset, response.queue_id, queue_offset, response.reason)
            for offset, queue_offset in zip(response.offsets, response.queue_offsets, strict=True)
        ]

    async def pull(self, topic: str, queue_id: int, queue_offset: int, *, count_max: int = 32) -> PullResult:
        payload = await self._request(cp.PULL, cp.encode_pull(cp.PullRequest(topic, queue_id, queue_offset, count_max)))
        response = cp.decode_pull_response(payload)
        if response.status not in (cp.OK, cp.NOT_FOUND, cp.OFFSET_ILLEGAL):
            raise ClientError(f"{response.status}: {response.reason}")
        records = [rec.decode_record(data, crc_function=None) for data in response.records]
        return PullResult(response.status, records, response.next_queue_offset, response.max_queue_offset)

    async def read(self, offset: int, *, size_max: int = 1024 * 1024) -> bytes:
        """Raw log bytes from ``offset`` (up to the end of its segment or ``size_max``)."""
        status, reason, _, data = cp.decode_read_response(await self._request(cp.READ, cp.encode_read(offset, size_max)))
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
        return record

    async def promote(self, *, sync: bool = True) -> dict:
        """Make a slave the master (SYNC_MASTER unless ``sync`` is False); its status after."""
        status, reason, data = cp.decode_status_response(await self._request(cp.PROMOTE, b"\x01" if sync else b"\x00"))
        if status != cp.OK:
            raise ClientError(f"{status}: {reason}")
        return json.loads(data)

    async def demote(self, master_ha: str) -> dict:
        """Make a master the slave of the master whose HA address is ``master_ha``."""
        status, reason, data = cp.decode_status_response(await self._request(cp.DEMOTE, cp.encode_demote(master_ha)))
        if status != cp.OK:
            raise ClientError(f"{status}: {reason}")
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
        connection = await transport.connect(parse_address(address), ssl_context=ssl_context)
    except OSError as error:
        raise ClientError(f"cannot connect to {address}: {error.strerror or error}") from None
    try:
        try:
            await transport.client_preface(connection, port_kind=wire.PORT_KIND_CLIENT, secret=secret)
        except (transport.AuthenticationError, wire.ProtocolError, EOFError, trio.TooSlowError) as error:
            raise ClientError(f"{address}: {error}") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as error:
            raise ClientError(f"{address}: connection failed during the preface: {transport.describe(error)}") from None
        client = Client(connection)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._receive_loop)
            nursery.start_soon(client._send_loop)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await connection.aclose()


# Client failover. RocketMQ's producer retries a failed send twice within sendMsgTimeout (3 s);
# a failover here also waits for a slave to be promoted, so the budget is longer.
FAILOVER_TIMEOUT_SECONDS = 30.0
FAILOVER_BACKOFF_MIN_SECONDS = 0.05
# Asking every broker for its status at most this far apart while none is master: a DLedger group
# elects within its election timeout (1-2 s etcd-like) and a client that slept 1 s between rounds
# found the new leader up to 1 s late (drill failover p50 2.6 s with 1.0 here). A round is one
# small STATUS per address, cheap at 4 per second.
FAILOVER_BACKOFF_MAX_SECONDS = 0.25
STATUS_TIMEOUT_SECONDS = 3.0  # asking one broker whether it is the master


class FailoverClient:
    """Requests go to the current master among ``addresses``. On a lost connection or
    SERVICE_NOT_AVAILABLE the client asks every address for its status and moves to the master
    with the newest epoch (a fenced or slave broker is never chosen).

    Sends are idempotent: every message carries this client's producer id and a sequence number.
    A send is retried on the new master only when the caller asked (``retry_sends`` or
    ``retry=True``): the broker then answers a retry of a message it already has with the original
    offsets instead of storing it twice. Reads and status are always retried."""

    def __init__(self, addresses: Sequence[str], secret: bytes | str | None, nursery: trio.Nursery, *,
                 tls_ca: str | None = None, retry_sends: bool = False,
                 failover_timeout: float = FAILOVER_TIMEOUT_SECONDS):  # fmt: skip
        if not addresses:
            raise ValueError("no broker addresses")
        self.addresses = list(addresses)
        self._secret = secret
        self._tls_ca = tls_ca
        self._nursery = nursery
        self.retry_sends = retry_sends
        self.failover_timeout = failover_timeout
        self.producer_id = secrets.token_hex(8)
        self._sequence = 0
        self._client: Client | None = None
        self._scope: trio.CancelScope | None = None
        self.address: str | None = None  # the master in use
        self.generation = 0  # connections made so far
        self.failovers = 0  # times a master was (re)found after a failure
        self._unusable = -1  # a generation whose broker answered SERVICE_NOT_AVAILABLE
        self._lock = trio.Lock()

    async def _hold(self, address: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            async with connect(address, self._secret, tls_ca=self._tls_ca) as client:
                task_status.started((client, scope))
                await trio.sleep_forever()

    async def _status_of(self, address: str) -> dict | None:
        with trio.move_on_after(STATUS_TIMEOUT_SECONDS):
            try:
                async with connect(address, self._secret, tls_ca=self._tls_ca) as client:
                    return await client.status()
            except ClientError:
                return None
        return None

    async def _find_master(self, deadline: float) -> tuple[str, dict]:
        """Ask every address for its status until ``failover.choose_master`` finds the master."""
        backoff = failover.Backoff(FAILOVER_BACKOFF_MIN_SECONDS, FAILOVER_BACKOFF_MAX_SECONDS)
        while True:
            statuses = [(address, await self._status_of(address)) for address in self.addresses]
            chosen = failover.choose_master(statuses)
            if chosen is not None:
                return chosen
            named = failover.named_leaders(statuses, known=self.addresses)
            if named:  # a DLedger member named a leader these addresses do not include: ask it too
                self.addresses.extend(named)
                continue
            pause = backoff.next_pause(now=trio.current_time(), deadline=deadline)
            if pause is None:
                raise ClientError(f"no master among {', '.join(self.addresses)} within {self.failover_timeout:.0f} s")
            await trio.sleep(pause)

    async def _current(self, failed_generation: int | None = None, deadline: float | None = None) -> tuple[Client, int]:
        """The master's client; after a failure on ``failed_generation``, a new one (found once,
        however many tasks saw the failure)."""
        async with self._lock:
            stale = self.generation in (failed_generation, self._unusable)
            if self._client is not None and not self._client.broken and not stale:
                return self._client, self.generation
            if self._scope is not None:
                self._scope.cancel()
                self._client = self._scope = None
                self.failovers += 1
            deadline = deadline if deadline is not None else trio.current_time() + self.failover_timeout
            while True:
                address, _ = await self._find_master(deadline)
                try:
                    self._client, self._scope = await self._nursery.start(self._hold, address)
                except ClientError:
                    if trio.current_time() > deadline:
                        raise
                    continue
                self.address = address
                self.generation += 1
                return self._client, self.generation

    async def send(self, topic: str, body: bytes, **kwargs) -> SendResult:
        return (await self.send_batch(topic, [body], **kwargs))[0]

    async def send_batch(self, topic: str, bodies: Sequence[bytes], *, retry: bool | None = None, **kwargs) -> list[SendResult]:
        """As Client.send_batch, to the current master; see the class for retries."""
        first = self._sequence
        self._sequence += len(bodies)
        return await self.send_idempotent(topic, bodies, producer_id=self.producer_id, first_sequence=first, retry=retry, **kwargs)

    async def send_idempotent(self, topic: str, bodies: Sequence[bytes], *, producer_id: str, first_sequence: int,
                              retry: bool | None = None, **kwargs) -> list[SendResult]:  # fmt: skip
        """As send_batch, under a caller's own producer id and sequences (a gateway that sends
        for many producers keys each one's retries this way)."""
        retry = self.retry_sends if retry is None else retry
        first = first_sequence
        deadline = trio.current_time() + self.failover_timeout
        client, generation = await self._current()
        while True:
            try:
                results = await client.send_batch(topic, bodies, producer_id=producer_id, first_sequence=first, **kwargs)
            except ClientError:
                if failover.after_send(failover.SendOutcome.FAILED, retry=retry, now=trio.current_time(), deadline=deadline) is failover.Next.RAISE:
                    raise
            else:
                outcome = failover.outcome_of(results[0].status)
                if outcome is failover.SendOutcome.NOT_MASTER:
                    self._unusable = generation  # the next request looks for the master again
                if failover.after_send(outcome, retry=retry, now=trio.current_time(), deadline=deadline) is failover.Next.RETURN:
                    return results
            client, generation = await self._current(generation, deadline)

    async def _read_request(self, name: str, *args, **kwargs):
        deadline = trio.current_time() + self.failover_timeout
        client, generation = await self._current()
        while True:
            try:
                return await getattr(client, name)(*args, **kwargs)
            except ClientError:
                if not client.broken or trio.current_time() > deadline:
                    raise
            client, generation = await self._current(generation, deadline)

    async def pull(self, topic: str, queue_id: int, queue_offset: int, *, count_max: int = 32) -> PullResult:
        return await self._read_request("pull", topic, queue_id, queue_offset, count_max=count_max)

    async def read(self, offset: int, *, size_max: int = 1024 * 1024) -> bytes:
        return await self._read_request("read", offset, size_max=size_max)

    async def read_record(self, offset: int) -> rec.Record:
        return await self._read_request("read_record", offset)

    async def status(self) -> dict:
        return await self._read_request("status")


@contextlib.asynccontextmanager
async def connect_cluster(addresses: Sequence[str], secret: bytes | str | None = None, *, tls_ca: str | None = None,
                          retry_sends: bool = False, failover_timeout: float = FAILOVER_TIMEOUT_SECONDS,
                          ) -> AsyncIterator[FailoverClient]:  # fmt: skip
    """A FailoverClient over ``addresses`` (any of master and slaves, in any order)."""
    async with trio.open_nursery() as nursery:
        client = FailoverClient(addresses, secret, nursery, tls_ca=tls_ca, retry_sends=retry_sends,
                                failover_timeout=failover_timeout)  # fmt: skip
        try:
            yield client
        finally:
            nursery.cancel_scope.cancel()


class BlockingClient:
    """The same methods, blocking, for scripts: a trio loop runs on a private thread."""

    def __init__(self, address: str, secret: bytes | str | None = None, *, tls_ca: str | None = None):
        self._ready = threading.Event()
        self._token = None
        self._client: Client | None = None
        self._error: BaseException | None = None
        self._done: trio.Event | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main, address, secret, tls_ca), daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    async def _main(self, address, secret, tls_ca) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._done = trio.Event()
        try:
            async with connect(address, secret, tls_ca=tls_ca) as client:
                self._client = client
                self._ready.set()
                await self._done.wait()
        except BaseException as error:  # reported to the caller's thread
            self._error = error
            self._ready.set()

    def _call(self, name: str, *args, **kwargs):
        method = getattr(self._client, name)
        return trio.from_thread.run(lambda: method(*args, **kwargs), trio_token=self._token)

    def send(self, *args, **kwargs) -> SendResult:
        return self._call("send", *args, **kwargs)

    def send_batch(self, *args, **kwargs) -> list[SendResult]:
        return self._call("send_batch", *args, **kwargs)

    def pull(self, *args, **kwargs) -> PullResult:
        return self._call("pull", *args, **kwargs)

    def read(self, *args, **kwargs) -> bytes:
        return self._call("read", *args, **kwargs)

    def read_record(self, *args, **kwargs) -> rec.Record:
        return self._call("read_record", *args, **kwargs)

    def status(self) -> dict:
        return self._call("status")

    def promote(self, **kwargs) -> dict:
        return self._call("promote", **kwargs)

    def demote(self, master_ha: str) -> dict:
        return self._call("demote", master_ha)

    def transfer_leader(self, target: str) -> TransferResult:
        return self._call("transfer_leader", target)

    def close(self) -> None:
        if self._done is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._done.set, trio_token=self._token)
        self._thread.join()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
