"""Several brokers as one: ``connect_cluster`` and the ``FailoverClient`` that follows the
master (the decisions are ``hasvc.state.failover``'s; this module carries them out)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Sequence

import trio

from commitlog import record as rec
from hasvc.client.connection import Client, connect
from hasvc.client.results import ClientError, ConnectError, PullResult, SendResult
from hasvc.state import failover


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
                raise ConnectError(f"no master among {', '.join(self.addresses)} within {self.failover_timeout:.0f} s")
            await trio.sleep(pause)

    async def _current(self, failed_generation: int | None = None, deadline: float | None = None) -> tuple[Client, int]:
        """The master's client; after a failure on ``failed_generation``, a new one (found once,
        however many tasks saw the failure)."""
        # the usual case without the lock: taking it is a checkpoint, a trip through trio's
        # scheduler for every request (nothing awaits between this check and the return)
        if self._client is not None and not self._client.broken and self.generation not in (failed_generation, self._unusable):
            return self._client, self.generation
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
