"""A loopback partition relay: TCP forwarders between the members of a group, which a drill or a
test can cut and heal, so that a member is partitioned away both ways without touching the kernel.

Theory of operation
-------------------
For a group of members ``n0..nk`` whose Raft ports are known, ``PartitionRelay`` listens once per
ordered pair ``(a, b)`` (a ``Link``) and forwards to ``b``'s Raft port. Member ``a`` is started with
``--peers`` naming, for every other member ``b``, the listener of link ``(a, b)`` (``peers_for``),
and its own real Raft address for itself: every byte between two members then passes a link.

``isolate(member)`` cuts every link from and to the member. A cut behaves like a network that
drops packets, not like one that resets connections: the connections through the link are closed
(bytes already dropped would leave a half-frame behind, and a peer must not see a corrupt stream),
and new connections are accepted but nothing is forwarded either way — what they send is read and
dropped, and they wait for answers that never come, until their own timeouts give up. ``heal``
closes those black-holed connections, so that members reconnect and find the link working again.

Limits: ``COPY_BUFFER_SIZE`` bytes per read (64 KiB: a socket buffer's worth); a link holds at most
``LINK_CONNECTIONS_MAX`` live connections (a member reconnects once per backoff; more is a bug, and
the extra ones are closed). Loopback only: the relay never listens elsewhere.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import socket

import trio

from hasvc.config import Address, format_address

LOGGER = logging.getLogger(__name__)

COPY_BUFFER_SIZE = 64 * 1024
LINK_CONNECTIONS_MAX = 64
LOOPBACK = "127.0.0.1"


# Ports handed out by free_port in this process: never twice.
_HANDED_OUT: set[int] = set()
# free_port picks below the kernel's ephemeral range, down to this port.
FREE_PORT_LOW = 10000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as file:
            return int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def _slice(low: int, high: int) -> tuple[int, int]:
    """The part of ``[low, high)`` this process picks from: all of it, or the ``i``-th of ``n``
    equal parts when ``HASVC_FREE_PORT_SLICE=i/n`` is set (the test suite sets it for each of its
    parallel workers, so that two workers never pick the same port between pick and bind)."""
    shown = os.environ.get("HASVC_FREE_PORT_SLICE", "")
    try:
        index, count = (int(part) for part in shown.split("/"))
    except ValueError:
        return low, high
    if not 0 <= index < count or (high - low) // count < 100:
        return low, high
    width = (high - low) // count
    return low + index * width, low + (index + 1) * width


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now, for a process started later.

    Raft ports must be known before any member starts, because each member's ``--peers`` names
    them, so there is a window between this check and the member's bind. A port from the
    kernel's ephemeral range (what binding port 0 gives) can be taken in that window by any
    outgoing connection on the host -- a CI run hit it: a member found its Raft port in use -- so
    the port is picked at random below that range, where only listeners that name their port
    go; one nothing listens on, and not handed out before in this process."""
    high = _ephemeral_low()
    if high - FREE_PORT_LOW >= 1000:
        low, high = _slice(FREE_PORT_LOW, high)
        for _ in range(200):
            port = random.randrange(low, high)
            if port in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind((host, port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    _HANDED_OUT.add(port)
    return port


@dataclasses.dataclass(eq=False)
class _Pair:
    """One connection through a link: the accepted side and, when forwarding, the upstream side."""

    scope: trio.CancelScope
    black_holed: bool


class Link:
    """Forwards connections from one member to another's Raft port, unless cut."""

    def __init__(self, source: str, target: str, target_address: Address) -> None:
        self.source = source
        self.target = target
        self.target_address = target_address
        self.address: Address | None = None  # the listener's, once started
        self.cut = False
        self.connections_accepted = 0
        self.bytes_forwarded = 0
        self.bytes_dropped = 0
        self._pairs: set[_Pair] = set()
        self._changed = trio.lowlevel.ParkingLot()  # woken whenever a counter or the pair set changes

    def __repr__(self) -> str:
        return f"Link({self.source}->{self.target} {'cut' if self.cut else 'open'})"

    @property
    def live_connections(self) -> int:
        return len(self._pairs)

    async def wait_until(self, predicate) -> None:
        """Wait until ``predicate(self)`` holds (checked whenever the link's counters change)."""
        while not predicate(self):
            await self._changed.park()

    def _note(self) -> None:
        self._changed.unpark_all()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
        self.address = listeners[0].socket.getsockname()[:2]
        task_status.started(self.address)
        await trio.serve_listeners(self._handle, listeners)

    def set_cut(self, cut: bool) -> None:
        """Cut: close what forwards. Heal: close what was black-holed. Either way members reconnect."""
        if cut == self.cut:
            return
        self.cut = cut
        for pair in list(self._pairs):
            if pair.black_holed != cut:
                pair.scope.cancel()

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections_accepted += 1
        self._note()
        pair = _Pair(scope=trio.CancelScope(), black_holed=self.cut)
        if len(self._pairs) >= LINK_CONNECTIONS_MAX:
            LOGGER.warning("%r: %d connections already, closing a new one", self, len(self._pairs))
            await stream.aclose()
            return
        self._pairs.add(pair)
        self._note()
        try:
            with pair.scope:
                if pair.black_holed:
                    await self._drop(stream)
                else:
                    await self._forward(stream)
        finally:
            self._pairs.discard(pair)
            self._note()
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _drop(self, stream: trio.SocketStream) -> None:
        while data := await _receive(stream):
            self.bytes_dropped += len(data)
            self._note()

    async def _forward(self, stream: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream(*self.target_address)
        except OSError as error:  # the target is down: the member sees its connection closed
            LOGGER.debug("%r: target %s: %s", self, format_address(self.target_address), error)
            return
        async with upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._copy, stream, upstream, nursery.cancel_scope)
            nursery.start_soon(self._copy, upstream, stream, nursery.cancel_scope)

    async def _copy(self, source: trio.SocketStream, sink: trio.SocketStream, both: trio.CancelScope) -> None:
        """Copy until either side ends; then end the whole pair (a half-open relay helps no one)."""
        try:
            while data := await _receive(source):
                await sink.send_all(data)
                self.bytes_forwarded += len(data)
                self._note()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            both.cancel()


async def _receive(stream: trio.SocketStream) -> bytes:
    try:
        return await stream.receive_some(COPY_BUFFER_SIZE)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return b""


class PartitionRelay:
    """A link per ordered pair of members; ``isolate``/``heal`` cut and restore a member's links."""

    def __init__(self, raft_addresses: dict[str, Address]) -> None:
        if len(raft_addresses) < 2:
            raise ValueError("a partition relay needs at least two members")
        self.raft_addresses = dict(raft_addresses)
        self.links = {(a, b): Link(a, b, raft_addresses[b]) for a in raft_addresses for b in raft_addresses if a != b}
        self.isolated: set[str] = set()

    async def start(self, nursery: trio.Nursery) -> None:
        """Open every link's listener (in ``nursery``); returns once all listen."""
        for link in self.links.values():
            await nursery.start(link.serve)

    def peers_for(self, member: str) -> str:
        """``--peers`` for ``member``: itself at its real Raft address, every other member via a link."""
        parts = []
        for other, address in self.raft_addresses.items():
            if other != member:
                address = self.links[(member, other)].address
                assert address is not None, "start the relay first"
            parts.append(f"{other}-{format_address(address)}")
        return ";".join(parts)

    def isolate(self, member: str) -> None:
        """Partition ``member`` from every other member, both ways."""
        self._check(member)
        self.isolated.add(member)
        self._apply()

    def heal(self, member: str | None = None) -> None:
        """Undo ``isolate`` for ``member`` (all members when None)."""
        if member is None:
            self.isolated.clear()
        else:
            self._check(member)
            self.isolated.discard(member)
        self._apply()

    def _check(self, member: str) -> None:
        if member not in self.raft_addresses:
            raise KeyError(f"unknown member {member!r}; members are {sorted(self.raft_addresses)}")

    def _apply(self) -> None:
        for (a, b), link in self.links.items():
            link.set_cut(a in self.isolated or b in self.isolated)
