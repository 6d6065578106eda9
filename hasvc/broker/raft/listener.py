"""A Raft member's Raft port, inbound: each connection's preface, its HELLO (the member it comes
from: group, target, data-file size, client port and log start checked), then its messages
stepped into the core in order. Acknowledgements (PushResponse) read together are stepped one by
one and their Ready carried out once (they change no log; anything else read after them waits
for that Ready first). A TRUNCATE holds the entry files quiet, a RESET also the broker's
``maintenance`` lock. A frame no member could send closes that connection alone; the member goes
on. Connections are admitted apart from strangers (``hasvc/admission.py``)."""

from __future__ import annotations

import errno
import logging
from typing import TYPE_CHECKING

import trio

from commitlog.mapped_file import DiskFullError
from hasvc import admission as port_admission
from hasvc import transport
from hasvc.broker.raft.group import running_already_hint
from hasvc.config import Address, format_address
from hasvc.protocol import raft as raft_wire
from hasvc.protocol import wire
from hasvc.state.raft.messages import Push, PushResponse, PushType, ResetPush

if TYPE_CHECKING:
    from hasvc.broker.raft.driver import RaftDriver

LOGGER = logging.getLogger(__name__)

# Inbound Raft connections (hasvc/admission.py): members identified by their HELLO, two per peer
# (a reconnect overlapping the old one), counted apart from the strangers -- connections still in
# the preface or before their HELLO. A member needs a stranger's slot for a round trip or two, and
# the oldest stranger makes room for a new connection; 3 s covers a preface and a HELLO on a loaded
# loop and is shorter than any election timeout a member waits out before it tries again.
RAFT_STRANGERS_MAX = 16
RAFT_STRANGER_TIMEOUT_SECONDS = 3.0


async def open_raft_listener(address: Address, *, noun: str, self_id: str, ssl_context=None):
    """``transport.open_listener`` for the Raft port of ``self_id`` (a ``member`` or a
    ``controller``, ``noun``): the address in use is one line naming it and its --self."""
    try:
        return await transport.open_listener(address, ssl_context=ssl_context)
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        raise OSError(error.errno, f"the Raft address {format_address(address)} of {noun} {self_id} (its entry in "
                                   f"--peers) is in use: {running_already_hint(noun, self_id)}") from None  # fmt: skip


class RaftListener:
    """The inbound side of one driver (see the module): ``inbound`` (peer -> the cancel scope of
    its live connection), ``peer_client_addresses`` (what each peer's HELLO said), counters."""

    def __init__(self, driver: RaftDriver) -> None:
        self._driver = driver  # its node (replaced after a failed append), drain, syncs and locks
        self._store = driver.store
        self._group = group = driver.group
        self.admission = port_admission.Admission(port_admission.AdmissionLimits(
            RAFT_STRANGERS_MAX, RAFT_STRANGER_TIMEOUT_SECONDS, known_max=2 * len(group.peers)), "raft")  # fmt: skip
        self.inbound: dict[str, trio.CancelScope] = {}
        self.refused_connections = 0
        self.peer_client_addresses: dict[str, str] = {}  # what each peer's HELLO said
        self.appends_dropped_disk_full = 0  # APPEND pushes dropped: no room for their files

    async def serve_peer(self, stream, ticket: port_admission.Ticket | None = None) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        try:
            await transport.server_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=self._driver.secret)
            self.admission.authenticated(ticket)
        except (transport.AuthenticationError, wire.ProtocolError, trio.TooSlowError, trio.BrokenResourceError,
                EOFError, OSError) as error:  # fmt: skip
            self.refused_connections += 1
            LOGGER.warning("raft: %s refused: %s", connection.peer, error)
            with trio.CancelScope(shield=True):
                await connection.stream.aclose()
            return
        decoder = raft_wire.RaftDecoder()
        source = None
        scope = trio.CancelScope()
        with scope:
            try:
                while True:
                    data = await connection.receive_some()
                    if not data:
                        break
                    decoder.receive_data(data)
                    acknowledged = False  # acknowledgements stepped, their Ready not carried out yet
                    now = trio.current_time()  # theirs: read together, stepped together
                    try:
                        while (event := decoder.next_event()) is not None:
                            if isinstance(event, PushResponse):
                                # Stepped now, carried out once for all read together (a follower
                                # answers every push: a Ready each was a third of a leader's calls).
                                acknowledged = True
                                self._step(event, drain=False, now=now)
                                continue
                            if acknowledged:
                                acknowledged = False
                                self._driver.drain()
                            if isinstance(event, raft_wire.Hello):
                                source = self._check_hello(event, connection.peer)
                                if source is None or not self.admission.identified(ticket):
                                    return
                                old = self.inbound.get(source)
                                if old is not None:
                                    old.cancel()  # a peer that reconnected: its old connection is dead
                                self.inbound[source] = scope
                            elif isinstance(event, Push) and event.type is PushType.TRUNCATE:
                                async with self._driver.sync.files_quiet():  # the truncate waits for a sync in flight
                                    self._step(event)
                                now = trio.current_time()  # (after a wait: for acknowledgements after it)
                            elif isinstance(event, ResetPush):  # deletes entry and consume-queue files
                                async with self._driver.maintenance, self._driver.sync.files_quiet():
                                    self._step(event)
                                now = trio.current_time()
                            else:
                                self._step(event)
                    finally:
                        if acknowledged:  # also when a bad frame ends the connection
                            self._driver.drain()
            except wire.ProtocolError as error:
                self.refused_connections += 1
                LOGGER.warning("raft: %s (%s) sent a bad frame, connection closed: %s", connection.peer, source, error)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, EOFError):
                self._peer_gone(source, scope)
            else:
                self._peer_gone(source, scope)  # EOF
            finally:
                if source is not None and self.inbound.get(source) is scope:
                    del self.inbound[source]
                with trio.CancelScope(shield=True):
                    await connection.stream.aclose()

    def _step(self, message, *, drain: bool = True, now: float | None = None) -> None:
        """Hand a peer's message to the core and carry its Ready out (``drain=False``: the caller
        drains later, before it steps anything but another acknowledgement -- which changes no
        log, so the core may take several before one Ready). A message no member could send
        (the core's ValueError: an APPEND whose entries do not start at its index, a RESET in a
        PUSH frame, ...) is a protocol error: that connection is closed, the member goes on. An
        APPEND whose files this member has no room for is dropped (the leader sends it again)."""
        if type(message) is Push and message.type is PushType.APPEND and not self._room_for(message):
            return
        try:
            self._driver.node.step(message, trio.current_time() if now is None else now)
        except ValueError as error:
            self._driver.drain()  # whatever the core did before it refused (it refuses before touching the log)
            raise wire.ProtocolError(f"{type(message).__name__} refused: {error}") from None
        if drain:
            self._driver.drain()

    def _room_for(self, push: Push) -> bool:
        """Whether the files an APPEND's run needs exist or can be made (``make_room``; a run
        lies in one data file, from the next entry's pos, or overlaps what we hold: then at
        most its size past our end)."""
        if push.index > self._store.entries.last_index() + 1:
            return True  # not a run we could append (the core answers it)
        try:
            self._store.entries.make_room_for_run(push.entries)
        except DiskFullError as error:
            self.appends_dropped_disk_full += 1
            self._driver.log_disk_full(f"an APPEND from {push.source} dropped", error)
            return False
        return True

    def _peer_gone(self, source: str | None, scope: trio.CancelScope) -> None:
        """The connection from ``source`` ended by itself (not replaced by a newer one): tell the
        core, which starts an election soon if that was its leader (``RaftNode.peer_unreachable``)."""
        if source is not None and self.inbound.get(source) is scope:
            LOGGER.info("raft: the connection from %s ended", source)
            self._driver.node.peer_unreachable(source, trio.current_time())
            self._driver.drain()

    def _check_hello(self, hello: raft_wire.Hello, peer: str) -> str | None:
        why = None
        if hello.group != self._group.group:
            why = f"group {hello.group!r}, this member is in {self._group.group!r}"
        elif hello.target != self._group.self_id:
            why = f"meant for member {hello.target!r}, this is {self._group.self_id!r}"
        elif hello.source not in self._driver.senders.queues:
            why = f"unknown member {hello.source!r} (members: {', '.join(self._group.peers)})"
        elif hello.data_file_size and hello.data_file_size != self._store.entries.data_file_size:
            # Every entry's pos and blank record depend on it: the logs could not be byte-identical.
            why = (f"{hello.source}'s data files are {hello.data_file_size} bytes, this member's "
                   f"{self._store.entries.data_file_size} (commitlog_segment_size must be equal on every member)")
        if why is not None:
            self.refused_connections += 1
            LOGGER.warning("raft: %s refused: %s", peer, why)
            return None
        if hello.client_address:
            self.peer_client_addresses[hello.source] = hello.client_address
        if hello.data_start_offset:
            self._adopt_data_start(hello.source, hello.data_start_offset)
        return hello.source


    def _adopt_data_start(self, peer: str, offset: int) -> None:
        """A group upgraded from a classic log starts its entries at the divide; a member that
        joins it with an empty store (no classic part) must place its entries at the same offsets,
        or the records' offsets would not be where they lie. It learns the divide from the first
        HELLO that names one (before any push or vote can reach it on that connection)."""
        entries = self._store.entries
        if entries.data_start_offset == offset or entries.first_index() > 0:
            return  # (a start moved by retention or a reset: the leader's RESET and COMPARE decide)
        if entries.last_index() >= 0 or self._store.divided_offset >= 0:
            LOGGER.error("raft: %s's log starts at offset %d, this member's at %d: it cannot follow that log "
                         "(every member must come from the same classic log, or start empty)",
                         peer, offset, entries.data_start_offset)  # fmt: skip
            return
        LOGGER.warning("raft: this empty log starts at offset %d, where %s's does (a smoothly upgraded group)", offset, peer)
        entries.start_at(offset)

