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
import threading
from collections.abc import AsyncIterator, Mapping, Sequence

import trio

from commitlog import record as rec
from hasvc import transport
from hasvc.config import parse_address
from hasvc.protocol import client as cp
from hasvc.protocol import wire

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
        except (EOFError, OSError, wire.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._error = error
        finally:
            for slot in self._pending.values():
                slot[0].set()
            self._pending.clear()

    async def _request(self, kind: int, payload: bytes) -> bytes:
        if self._error is not None:
            raise ClientError(f"connection failed: {self._error}")
        request_id = next(self._ids) & 0xFFFFFFFF
        slot = [trio.Event(), None]
        self._pending[request_id] = slot
        try:
            await self._connection.send_all(cp.encode_frame(kind, request_id, payload))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._pending.pop(request_id, None)
            raise ClientError(f"connection failed: {transport.describe(error)}") from None
        with trio.fail_after(REQUEST_TIMEOUT_SECONDS):
            await slot[0].wait()
        if slot[1] is None:
            raise ClientError(f"connection failed: {self._error}")
        return slot[1].payload

    async def send(self, topic: str, body: bytes, *, tags: str | None = None, keys: str | None = None,
                   properties: Mapping[str, str] | None = None, queue_id: int = 0) -> SendResult:  # fmt: skip
        results = await self.send_batch(topic, [body], tags=tags, keys=keys, properties=properties, queue_id=queue_id)
        return results[0]

    async def send_batch(self, topic: str, bodies: Sequence[bytes], *, tags: str | None = None, keys: str | None = None,
                         properties: Mapping[str, str] | None = None, queue_id: int = 0) -> list[SendResult]:  # fmt: skip
        """Send messages sharing topic, queue and properties in one request; one result each."""
        encoded = message_properties(tags, keys, properties)
        request = cp.SendRequest(topic, queue_id, list(bodies), [encoded] * len(bodies), 0, _now_ms())
        response = cp.decode_send_response(await self._request(cp.SEND, cp.encode_send(request)))
        if not response.offsets:
            return [SendResult(response.status, -1, queue_id, -1, response.reason) for _ in bodies]
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
        client = Client(connection)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._receive_loop)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await connection.aclose()


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

    def close(self) -> None:
        if self._done is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._done.set, trio_token=self._token)
        self._thread.join()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
