"""The controller process (``hasvc controller``): a Raft group of 1, 3 or 5 controllers whose log
holds controller commands, applied in order to ``ControllerState``; its leader answers brokers.

Theory of operation
-------------------
The Raft side is DLedger mode's, reused whole: ``DLedgerMessageStore`` (entry files, recovery,
checkpoint, retention) under ``RaftDriver`` (the Raft port, its preface, secret, TLS and
admission, timers, flushing) over the pure ``RaftNode``. A controller command
(``hasvc.state.controller.state``: Register, Elect, AlterSyncStateSet, as
``encode_command`` bytes) is the body of one message record of topic ``CONTROLLER_TOPIC`` in one
entry. The group always runs with ``flush_sync`` (an entry counts toward the quorum only once
flushed: an epoch, once answered, survives a power loss of a minority) and with short timings
(``CONTROLLER_RAFT``: a controller group is small and on a LAN).

Every controller applies the committed entries in log order (``_apply_committed``; a no-op or a
record of another topic only moves the applied index), so all hold the same state. The leader
proposes a command and answers its request once the entry at the proposal's index commits with
the proposal's term (then the state's answer is that command's); a leadership lost before
fails the request NOT_LEADER (it may still commit: every command is safe to send again -- a
registration gives the same id back, an election or a set change names the epochs it was
decided in).

The leader answers brokers only once it has applied every entry of its log (``_serving``, as a
DLedger leader takes writes once caught up), and HEARTBEAT only while it holds its Raft leader
lease (``holds_lease``: it heard from a quorum within the election timeout): a controller cut
off from its group stops renewing masters' leases before another controller can be elected. A
non-leader answers NOT_LEADER naming the leader's controller port, which each controller
announces in its Raft HELLO. Heartbeats are soft state, the leader's alone
(``hasvc.state.controller.elect``): a new leader starts with none and counts every broker's
silence from the moment it became leader. On a timer (``ELECTION_CHECK_INTERVAL_SECONDS``) and
after each heartbeat from a group without a master the leader asks the election rules
(``ElectionTracker.decide``) what to do and proposes the ``Elect``s they decide, one in flight
per group; a heartbeat's answer, lease included, is the tracker's (``ElectionTracker.answer``),
but that a new leader also withholds the lease from a master an earlier leader elected until
``master_lease_seconds`` after it applied that election (``_inherited_election``).

Snapshots: after ``snapshot_interval_entries`` applied entries (and at a clean stop) the state
is written to ``STORE/controller/snapshot`` (``ControllerState.snapshot``: CRC32C, with the Raft
index it reflects; written to a temporary file, fsynced, renamed). Retention then (after
each snapshot) deletes whole entry files below ``min(snapshot index + 1, the core's retention
floor)`` -- never an entry a member may still need -- so a restart reads the snapshot and replays
only what follows it. A log
that starts past the snapshot (a store wiped and RESET by the leader) cannot be replayed: the
controller says so and stops, before it answers anything.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import math
import os
import time

import trio

from commitlog import record as rec
from commitlog.config import StoreConfig
from commitlog.dledger import entry_codec
from commitlog.dledger.entry_store import DLedgerStoreConfig
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.mapped_file import fsync_directory
from hasvc import admission as port_admission
from hasvc import transport
from hasvc.broker.raft.driver import RaftDriver
from hasvc.broker.raft.group import GroupConfig
from hasvc.config import Address, format_address
from hasvc.protocol import controller as cp
from hasvc.protocol import wire
from hasvc.state.controller import state as cs
from hasvc.state.controller.config import ControllerTimings
from hasvc.state.controller.elect import ElectionTracker
from hasvc.state.raft.config import RaftConfig
from hasvc.state.raft.ready import Role

LOGGER = logging.getLogger(__name__)

# The topic of the records that carry controller commands (one queue).
CONTROLLER_TOPIC = "HASVC_CONTROLLER"
# The Raft group name every controller's HELLO carries.
CONTROLLER_RAFT_GROUP = "hasvc-controller"
# The controller group's Raft timings: a small group on a LAN. Heartbeat 50 ms and an election
# timeout of 0.4-0.6 s: a controller leader's death is noticed and replaced in about half a
# second, well inside a broker's call_timeout_seconds (3 s), and the masters' leases (0.4 s,
# renewed every 0.1 s by heartbeats to any leader) ride it out when the new leader comes quickly.
# flush_sync: an entry counts toward the quorum only once flushed.
CONTROLLER_RAFT = RaftConfig(heartbeat_interval_seconds=0.05, election_timeout_min_seconds=0.4,
                             election_timeout_max_seconds=0.6, quorum_ack_timeout_seconds=2.0, flush_sync=True,
                             push_batch_size_max=256 * 1024)  # fmt: skip
# The entry files: commands are a few hundred bytes, so small files let retention cut the log
# soon after a snapshot (an entry file is deleted whole). 4 MiB holds ~10k commands.
CONTROLLER_DATA_FILE_SIZE = 4 * 1024 * 1024
# A data file must hold a command or two (a Register with long names is ~1.3 KiB as an entry).
LOG_FILE_SIZE_MIN = 16 * 1024
CONTROLLER_INDEX_FILE_SIZE = entry_codec.INDEX_UNIT_SIZE * 128 * 1024  # 128 Ki entries' units (4 MiB)
# A snapshot after this many applied entries: a restart replays at most this many.
SNAPSHOT_INTERVAL_ENTRIES = 1000
# How often the leader checks for lapsed masters (elect.py's decisions). Small against
# broker_heartbeat_timeout_seconds (0.7 s): an election starts at most this late.
ELECTION_CHECK_INTERVAL_SECONDS = 0.05
# A proposed command not committed within this is answered NOT_LEADER (the broker asks again,
# perhaps another controller): the group lost its quorum or its leader meanwhile.
COMMAND_COMMIT_TIMEOUT_SECONDS = 2.0
# The controller port's connections (hasvc/admission.py): brokers keep a few each
# (ControllerClient's connections_per_controller_max); strangers must finish the preface and
# send a request within the timeout.
CONTROLLER_STRANGERS_MAX = 64
CONTROLLER_STRANGER_TIMEOUT_SECONDS = 3.0
CONTROLLER_CONNECTIONS_MAX = 4096
SNAPSHOT_DIRECTORY = "controller"
SNAPSHOT_FILE = "snapshot"


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    store: str
    listen: Address  # the controller port
    self_id: str = "c0"
    peers: dict[str, Address] | None = None  # every controller's Raft address (None: a group of 1)
    raft: RaftConfig = CONTROLLER_RAFT
    timings: ControllerTimings = ControllerTimings()
    secret: bytes | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    metrics_listen: Address | None = None
    snapshot_interval_entries: int = SNAPSHOT_INTERVAL_ENTRIES
    log_file_size: int = CONTROLLER_DATA_FILE_SIZE  # each entry data file's size (retention deletes whole files)

    def group_config(self) -> GroupConfig:
        # A group of one: no peer connects, so its Raft port is any free port on loopback.
        peers = self.peers if self.peers is not None else {self.self_id: ("127.0.0.1", 0)}
        return GroupConfig(group=CONTROLLER_RAFT_GROUP, self_id=self.self_id, peers=peers, raft=self.raft)

    def validate(self) -> ControllerConfig:
        group = self.group_config()
        if len(group.peers) not in (1, 3, 5):
            raise ValueError(f"a controller group has 1, 3 or 5 controllers, not {len(group.peers)}")
        group.validate()
        self.timings.validate()
        if self.raft.election_timeout_min_seconds < self.timings.master_lease_seconds:
            raise ValueError(f"election_timeout_min_seconds ({self.raft.election_timeout_min_seconds}) of the controller "
                             f"group must not be below master_lease_seconds ({self.timings.master_lease_seconds}): a lease "
                             "an old controller leader granted must have run out when a new leader answers")  # fmt: skip
        if self.snapshot_interval_entries < 1:
            raise ValueError(f"snapshot_interval_entries must be >= 1, not {self.snapshot_interval_entries}")
        if not LOG_FILE_SIZE_MIN <= self.log_file_size < 1 << 31:
            raise ValueError(f"log_file_size must be {LOG_FILE_SIZE_MIN} bytes to 2 GiB, not {self.log_file_size}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        return self


@dataclasses.dataclass
class _Proposal:
    """A command waiting for its entry to commit."""

    index: int
    term: int
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    answer: cs.Answer | None = None  # None once done: the entry was not ours (leadership lost)
    proposed_at: float = -math.inf  # an Elect's (the election timer forgets it after the commit timeout)


class ControllerServer:
    """One controller: see the module."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config.validate()
        self.group = config.group_config()
        self.state = cs.ControllerState()
        self.applied_index = -1  # the last Raft index applied to ``state`` (-1: none)
        self.snapshot_index = -1  # the Raft index the snapshot on disk reflects (-1: none)
        self.store: DLedgerMessageStore | None = None
        self.driver: RaftDriver | None = None
        self.listen_address: Address | None = None
        self.raft_address: Address | None = None
        self.metrics_address: Address | None = None
        self.admission = port_admission.Admission(port_admission.AdmissionLimits(
            CONTROLLER_STRANGERS_MAX, CONTROLLER_STRANGER_TIMEOUT_SECONDS, CONTROLLER_CONNECTIONS_MAX), "controller")  # fmt: skip
        self._proposals: dict[int, _Proposal] = {}  # index -> the request waiting for it
        self._electing: dict[str, _Proposal] = {}  # group -> its Elect in flight
        self._serving = False  # leading with every entry applied
        # The leader's soft state: heartbeats, liveness, elections decided, leases granted.
        self.tracker = ElectionTracker(config.timings)
        self._elected_at: dict[str, float] = {}  # group -> when this controller applied its last election
        self._snapshot_due = trio.Event()
        self._election_due = trio.Event()
        self.started_at = time.time()
        self.elections = 0  # Elects this controller proposed that were accepted (STATUS, metrics)
        self.requests = {name: 0 for name in cp.KIND_NAMES.values()}
        self.connections_refused = 0  # bad preface or bad frame

    # -- lifetime --------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.store = await trio.to_thread.run_sync(self._open_store)
        loaded = False
        try:
            self._load_snapshot()
            loaded = True
            async with trio.open_nursery() as nursery:
                await self._serve(nursery)
                task_status.started(self.addresses())
                LOGGER.info("ready: %s", json.dumps(self.addresses()))
        finally:
            with trio.CancelScope(shield=True):
                if self.driver is not None:
                    await self.driver.close()
                if loaded and self.applied_index > self.snapshot_index and self._replayable():
                    self._write_snapshot()  # a clean stop: the next start replays nothing
                await trio.to_thread.run_sync(self.store.close)
            LOGGER.info("store closed cleanly")

    def _open_store(self) -> DLedgerMessageStore:
        os.makedirs(self.config.store, exist_ok=True)
        size = self.config.log_file_size
        store_config = StoreConfig(commitlog_segment_size=size, file_reserved_time_hours=0.0, warm_ahead_size=size,
                                   scrub_bytes_per_second=0)  # fmt: skip
        entry_config = DLedgerStoreConfig(data_file_size=size,
                                          index_file_size=CONTROLLER_INDEX_FILE_SIZE,
                                          recovery_repair_from_peers=len(self.group.peers) > 1)  # fmt: skip
        store = DLedgerMessageStore.open(self.config.store, store_config, self_id=self.group.self_id,
                                         group=CONTROLLER_RAFT_GROUP, dledger=entry_config)  # fmt: skip
        for damage in store.damaged:
            LOGGER.error("store %s: damaged entries cut, to be repaired from the leader: %s", self.config.store,
                         damage.describe())  # fmt: skip
        return store

    @property
    def snapshot_path(self) -> str:
        return os.path.join(self.config.store, SNAPSHOT_DIRECTORY, SNAPSHOT_FILE)

    def _load_snapshot(self) -> None:
        """The state from the snapshot (if any), then every committed entry after it applied."""
        try:
            with open(self.snapshot_path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            data = None
        if data is not None:
            try:
                self.state = cs.ControllerState.restore(data)
            except cs.StateFormatError as error:
                raise cs.StateFormatError(f"{self.snapshot_path}: {error} (a controller with a damaged snapshot "
                                          "cannot rebuild its state: copy the file from another controller)") from None  # fmt: skip
            self.applied_index = self.snapshot_index = self.state.applied_index
        entries = self.store.entries
        if not self._replayable():
            raise cs.StateFormatError(
                f"{self.config.store}: the log starts at entry {entries.first_index()} but the state reflects entry "
                f"{self.applied_index} ({self.snapshot_path if data is not None else 'no snapshot'}): entries in "
                "between are gone; copy the snapshot file from another controller (stopped) and start again")  # fmt: skip
        LOGGER.info("controller state: snapshot at entry %d, log %d..%d, committed %d", self.snapshot_index,
                    entries.first_index(), entries.last_index(), entries.committed_index)  # fmt: skip
        self._apply_committed()

    def _replayable(self) -> bool:
        """The log holds every entry after the applied one (or all of them from its start)."""
        entries = self.store.entries
        return entries.first_index() <= self.applied_index + 1 or entries.last_index() < entries.first_index() <= 0

    async def _serve(self, nursery: trio.Nursery) -> None:
        self.driver = RaftDriver(group=self.group, store=self.store, secret=self.config.secret,
                                 on_commit=self._on_commit, on_role=self._on_role)  # fmt: skip
        port_ssl, raft_ssl = self._server_ssl()
        own = self.group.peers[self.group.self_id]
        try:
            raft_listener, raft_socket = await transport.open_listener(own, ssl_context=raft_ssl)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise OSError(error.errno, f"the Raft address {format_address(own)} of controller {self.group.self_id} "
                                       f"(its entry in --peers) is in use: is a controller with --self "
                                       f"{self.group.self_id} running already?") from None  # fmt: skip
        self.raft_address = transport.listener_address(raft_socket)
        listener, socket = await transport.open_listener(self.config.listen, ssl_context=port_ssl)
        self.listen_address = transport.listener_address(socket)
        self.driver.client_address = self._announced_address()
        if self.config.metrics_listen is not None:
            self.metrics_address = await nursery.start(serve_controller_metrics, self.config.metrics_listen, self)
        nursery.start_soon(port_admission.serve_admitted, listener, self._serve_connection, self.admission)
        nursery.start_soon(self._election_timer)
        nursery.start_soon(self._snapshotter)
        await self.driver.run(nursery, raft_listener)

    def _server_ssl(self):
        """(controller port's, Raft port's) server TLS contexts (None without --tls-cert), as
        ``hasvc node``: with --tls-ca the Raft port is mutual TLS."""
        config = self.config
        if config.tls_cert is None:
            return None, None
        if config.tls_ca is None:
            self.driver.peer_ssl_context = transport.unverified_client_ssl_context()
        else:
            self.driver.peer_ssl_context = transport.client_ssl_context(ca=config.tls_ca, cert=config.tls_cert,
                                                                        key=config.tls_key)  # fmt: skip
        port_ssl = transport.server_ssl_context(cert=config.tls_cert, key=config.tls_key)
        raft_ssl = transport.server_ssl_context(cert=config.tls_cert, key=config.tls_key, client_ca=config.tls_ca)
        return port_ssl, raft_ssl

    def _announced_address(self) -> str:
        """The controller port as the others name it in NOT_LEADER: a wildcard host is replaced by
        the host of this controller's Raft address."""
        host, port = self.listen_address
        if host in ("0.0.0.0", "::", ""):
            host = self.group.peers[self.group.self_id][0]
        return format_address((host, port))

    def addresses(self) -> dict:
        return {"mode": "controller", "listen": format_address(self.listen_address),
                "raft_listen": format_address(self.raft_address), "self_id": self.group.self_id,
                "metrics_listen": format_address(self.metrics_address) if self.metrics_address else None,
                "pid": os.getpid(), "store": self.config.store}  # fmt: skip

    # -- applying the log ------------------------------------------------------------------

    def _on_commit(self) -> None:
        self._apply_committed()
        self.store.dispatch()  # the topic's consume queue (retention keeps what it has not indexed)

    def _apply_committed(self) -> None:
        entries = self.store.entries
        while self.applied_index < entries.committed_index:
            index = self.applied_index + 1
            if index < entries.first_index():  # a RESET by the leader: the entries before are gone here
                raise cs.StateFormatError(
                    f"{self.config.store}: the log now starts at entry {entries.first_index()} (reset by the leader) but "
                    f"the state reflects entry {self.applied_index}: copy the snapshot file from another controller "
                    "(stopped) and start again")  # fmt: skip
            stored = entries.get(index)
            command = self._command_of(index, stored.body)
            if command is None:
                if index > self.state.applied_index:
                    self.state.note_applied(index)
                answer = None
            else:
                answer = self.state.apply(command, index=index)
                self._log_applied(index, command, answer)
                if isinstance(command, cs.Elect) and answer.accepted and command.new_master_id is not None:
                    self._elected_at[command.group] = trio.current_time()
            self.applied_index = index
            proposal = self._proposals.pop(index, None)
            if proposal is not None:
                proposal.answer = answer if stored.term == proposal.term else None
                proposal.done.set()
            if self.applied_index - self.snapshot_index >= self.config.snapshot_interval_entries:
                self._snapshot_due.set()

    def _command_of(self, index: int, body: bytes) -> cs.Command | None:
        """The command an entry carries; None for a no-op. A body that is not a command record
        is damage no recovery caught: the state cannot go on without it (StoreError)."""
        if not body:
            return None
        try:
            record = rec.decode_record(body, 0, limit=len(body))
        except rec.RecordError as error:
            raise cs.StateFormatError(f"{self.config.store}: entry {index} is not a record: {error.reason}") from None
        if record.topic != CONTROLLER_TOPIC:
            return None
        try:
            return cs.decode_command(bytes(record.body))
        except cs.StateFormatError as error:
            raise cs.StateFormatError(f"{self.config.store}: entry {index}: {error}") from None

    @staticmethod
    def _log_applied(index: int, command: cs.Command, answer: cs.Answer) -> None:
        if isinstance(command, cs.Elect) and answer.accepted:
            group = answer.group
            LOGGER.warning("group %s: broker %s elected master in epoch %d (%s)", command.group,
                           command.new_master_id, group.epoch, command.reason)  # fmt: skip
        elif isinstance(command, cs.AlterSyncStateSet) and answer.accepted:
            LOGGER.info("group %s: SyncStateSet %s (set epoch %d)", command.group, sorted(command.new_set),
                        answer.group.sync_state_set_epoch)  # fmt: skip
        elif isinstance(command, cs.Register) and answer.accepted:
            LOGGER.info("group %s: broker %d registered (%s, HA %s)", command.group, answer.broker_id,
                        command.client_address, command.ha_address)  # fmt: skip
        LOGGER.debug("entry %d: %s -> %s", index, command, answer)

    def _on_role(self) -> None:
        """Serve as leader once every entry of this leader's log is applied; stop at once when
        leadership is lost (waiting requests answered NOT_LEADER)."""
        node = self.driver.node
        leading = node.role is Role.LEADER
        if self._serving and not leading:
            self._serving = False
            self.store.discard_plans()
            self._fail_proposals()
            self.tracker.stepped_down()
            LOGGER.warning("no longer the controller leader (term %d)", node.term)
        elif leading and not self._serving:
            if not self.store.caught_up() or self.applied_index < self.store.entries.committed_index:
                return
            self.store.resume_queue_offsets()
            self._serving = True
            self.tracker.became_leader(trio.current_time())  # every broker's silence counted from now
            LOGGER.warning("controller leader in term %d (state at entry %d)", node.term, self.applied_index)
            self._election_due.set()

    def _fail_proposals(self) -> None:
        proposals, self._proposals = self._proposals, {}
        for proposal in proposals.values():
            proposal.done.set()
        self._electing.clear()

    # -- commands --------------------------------------------------------------------------

    async def _execute(self, command: cs.Command) -> cs.Answer | str:
        """The state's answer once ``command`` committed, or why it was not (a string)."""
        if not self._serving:
            return "not the leader"
        proposal = self._propose(command)
        if isinstance(proposal, str):
            return proposal
        with trio.move_on_after(COMMAND_COMMIT_TIMEOUT_SECONDS):
            await proposal.done.wait()
        if not proposal.done.is_set():
            self._proposals.pop(proposal.index, None)
            return f"not committed within {COMMAND_COMMIT_TIMEOUT_SECONDS} s (COMMAND_COMMIT_TIMEOUT_SECONDS)"
        if proposal.answer is None:
            return "leadership lost before the command committed"
        return proposal.answer

    def _propose(self, command: cs.Command) -> _Proposal | str:
        body = cs.encode_command(command)
        plans = []

        def plan():
            plans.append(self.store.plan_append([rec.Message(topic=CONTROLLER_TOPIC, body=body)]))
            return plans[-1]

        result = self.driver.propose_plan(plan, drain=False)
        if result.status is not rec.PutMessageStatus.PUT_OK:
            return f"{result.status.name}: {result.reason}"
        proposal = _Proposal(plans[-1].first_index, self.driver.node.term)
        assert proposal.index > self.applied_index, (proposal, self.applied_index)
        self._proposals[proposal.index] = proposal
        self.driver.drain()  # after the proposal is known: a group of one may commit within the drain
        return proposal

    # -- the controller port ---------------------------------------------------------------

    async def _serve_connection(self, stream, ticket: port_admission.Ticket | None = None) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        try:
            await transport.server_preface(connection, port_kind=wire.PORT_KIND_CONTROLLER, secret=self.config.secret)
            self.admission.authenticated(ticket)
        except (transport.AuthenticationError, wire.ProtocolError, trio.TooSlowError, trio.BrokenResourceError,
                EOFError, OSError) as error:  # fmt: skip
            self.connections_refused += 1
            LOGGER.warning("controller port: %s refused: %s", connection.peer, error)
            return
        decoder = cp.ControllerDecoder(answers=False)
        try:
            while True:
                data = await connection.receive_some()
                if not data:
                    return
                decoder.receive_data(data)
                while (frame := decoder.next_event()) is not None:
                    if not self.admission.identified(ticket):
                        return
                    answer = await self._answer(frame.message)
                    await connection.send_all(cp.encode_answer(frame.request_id, answer))
        except wire.ProtocolError as error:
            self.connections_refused += 1
            LOGGER.warning("controller port: %s sent a bad frame, connection closed: %s", connection.peer, error)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, EOFError):
            pass

    async def _answer(self, request: cp.Request) -> cp.Answer:
        self.requests[cp.KIND_NAMES[request.KIND]] += 1
        if isinstance(request, cp.StatusRequest):
            return cp.Answer(cp.STATUS, cp.STATUS_OK, controller=self.status())
        refusal = self._not_leader(request.KIND)
        if refusal is not None:
            return refusal
        if isinstance(request, cp.HeartbeatRequest):
            return self._heartbeat(request)
        if isinstance(request, cp.RegisterRequest):
            command = cs.Register(request.group, request.identity, request.client_address, request.ha_address)
        elif isinstance(request, cp.AlterSyncStateSetRequest):
            command = cs.AlterSyncStateSet(request.group, request.master_id, request.epoch,
                                           request.sync_state_set_epoch, frozenset(request.sync_state_set))  # fmt: skip
        else:
            command = self._switchover(request)
            if isinstance(command, cp.Answer):
                return command
        with_view = request.KIND == cp.ALTER_SYNC_STATE_SET  # a refused set change says what the set is
        try:
            outcome = await self._execute(command)
        except cs.StateFormatError as error:  # a field over the state's bounds (a long identity, ...)
            return cp.refused(request.KIND, str(error), self._view(command.group) if with_view else None)
        if isinstance(outcome, str):
            return cp.not_leader(request.KIND, self._leader_address(), outcome)
        view = self._view(command.group, outcome.group)  # the group just after the command (as it was if refused)
        if not outcome.accepted:
            return cp.refused(request.KIND, outcome.reason, view if with_view else None)
        if isinstance(command, cs.Register):
            self._election_due.set()
            return cp.Answer(cp.REGISTER, cp.STATUS_OK, view=view, broker_id=outcome.broker_id)
        return cp.Answer(request.KIND, cp.STATUS_OK, view=view)

    def _not_leader(self, kind: int) -> cp.Answer | None:
        """NOT_LEADER unless this controller serves as leader and (HEARTBEAT) holds its lease."""
        if not self._serving:
            node = self.driver.node
            if node.role is Role.LEADER:
                return cp.not_leader(kind, None, f"{self.group.self_id} leads term {node.term} but has not applied its "
                                                 "log yet")  # fmt: skip
            leader = self._leader_address()
            return cp.not_leader(kind, leader, f"{self.group.self_id} does not lead" +
                                 (f": {node.leader_id} does" if node.leader_id else ": no leader is known yet"))  # fmt: skip
        if kind == cp.HEARTBEAT and not self.holds_lease(trio.current_time()):
            return cp.not_leader(kind, None, f"{self.group.self_id} has not heard from a quorum of controllers within "
                                             f"{self.group.raft.election_timeout_min_seconds} s")  # fmt: skip
        return None

    def holds_lease(self, now: float) -> bool:
        """Leading, and a quorum (this controller counted) heard from within the election timeout:
        no other controller can have been elected meanwhile (the core's check-quorum)."""
        node = self.driver.node
        if node.role is not Role.LEADER:
            return False
        window = self.group.raft.election_timeout_min_seconds
        heard = 1 + sum(1 for peer in self.group.peers if peer != self.group.self_id
                        and now - node.last_contact_at(peer) < window)  # fmt: skip
        return heard > len(self.group.peers) // 2

    def _leader_address(self) -> str | None:
        leader = self.driver.node.leader_id
        if leader is None or leader == self.group.self_id:
            return None
        return self.driver.client_address_of(leader)

    def _view(self, name: str, group: cs.GroupState | None = None) -> cp.GroupView:
        """``name``'s view: of ``group`` when given, else of the current state."""
        group = group if group is not None else self.state.groups.get(name)
        if group is None:
            return cp.GroupView(name, None, None, None, 0, (), 0)
        master = group.members.get(group.master_id) if group.master_id is not None else None
        return cp.GroupView(name, group.master_id, master.client_address if master else None,
                            master.ha_address if master else None, group.epoch, tuple(sorted(group.sync_state_set)),
                            group.sync_state_set_epoch)  # fmt: skip

    def _heartbeat(self, request: cp.HeartbeatRequest) -> cp.Answer:
        group = self.state.groups.get(request.group)
        if group is None or request.broker_id not in group.members:
            return cp.refused(cp.HEARTBEAT, f"broker {request.broker_id} is not a member of group {request.group!r}: "
                                            "register first")  # fmt: skip
        now = trio.current_time()
        self.tracker.heartbeat(request.group, request.broker_id, request.epoch, request.max_offset, now)
        if group.master_id is None:
            self._election_due.set()
        answer = self.tracker.answer(self.state, request.group, request.broker_id, now)
        lease = answer.lease and not self._inherited_election(request.group, now)
        return cp.Answer(cp.HEARTBEAT, cp.STATUS_OK, view=cp.GroupView(
            request.group, answer.master_id, answer.master_client_address, answer.master_ha_address, answer.epoch,
            tuple(sorted(answer.sync_state_set)), answer.sync_state_set_epoch, lease=lease))  # fmt: skip

    def _inherited_election(self, name: str, now: float) -> bool:
        """The group's master was elected by an earlier controller leader less than
        master_lease_seconds before this controller applied it: that leader may have granted the
        previous master a lease until then, which this one never heard of (the tracker withholds
        a newer epoch's lease only behind the grants it made itself). A controller leader that
        dies is replaced within ~0.1 s (its followers see its connections end), before such a
        lease runs out."""
        elected_at = self._elected_at.get(name)
        return (elected_at is not None and elected_at <= self.tracker.leader_since
                and now < elected_at + self.config.timings.master_lease_seconds)  # fmt: skip

    # -- elections -------------------------------------------------------------------------

    def _switchover(self, request: cp.ElectRequest) -> cs.Elect | cp.Answer:
        """An operator's ELECT: the named broker (alive, in the SyncStateSet unless unclean
        elections are allowed) or, None, the best other candidate."""
        group = self.state.groups.get(request.group)
        if group is None:
            return cp.refused(cp.ELECT, f"no group {request.group!r}")
        now = trio.current_time()
        if request.broker_id is None:
            candidates = self._candidates(request.group, group, now)
            if not candidates:
                return cp.refused(cp.ELECT, "no other alive member of the SyncStateSet to elect")
            target = candidates[0]
        else:
            target = request.broker_id
            if target == group.master_id:
                return cp.refused(cp.ELECT, f"broker {target} is the master already (epoch {group.epoch})")
            if target not in group.members:
                return cp.refused(cp.ELECT, f"broker {target} is not a member of group {request.group!r}")
            if target not in group.sync_state_set and not self.config.timings.allow_unclean_election:
                return cp.refused(cp.ELECT, f"broker {target} is not in the SyncStateSet {sorted(group.sync_state_set)} "
                                            "(it may lack acknowledged writes; unclean elections are off)")  # fmt: skip
            if not self.tracker.alive(request.group, target, now):
                return cp.refused(cp.ELECT, f"broker {target} has not heartbeaten within "
                                            f"{self.config.timings.broker_heartbeat_timeout_seconds} s")  # fmt: skip
        return cs.Elect(request.group, target, group.epoch, "an operator's switchover (ELECT)")

    def _candidates(self, name: str, group: cs.GroupState, now: float) -> list[int]:
        """An operator's switchover without a target: the alive members of the SyncStateSet but
        the master, best first (highest (epoch, max_offset), then the lowest id)."""
        alive = [b for b in sorted(group.sync_state_set) if b != group.master_id and self.tracker.alive(name, b, now)]
        key = {b: self.tracker.liveness(name, b) for b in alive}
        return sorted(alive, key=lambda b: (-key[b].epoch, -key[b].max_offset, b))

    async def _election_timer(self) -> None:
        while True:
            with trio.move_on_after(ELECTION_CHECK_INTERVAL_SECONDS):
                await self._election_due.wait()
            self._election_due = trio.Event()
            now = trio.current_time()
            self._elections_done(now)
            if not self._serving or not self.holds_lease(now):
                continue
            for command in self.tracker.decide(self.state, now):
                if command.group not in self._electing:
                    self._start_election(command, now)
        raise AssertionError("unreachable")

    def _start_election(self, command: cs.Elect, now: float) -> None:
        proposal = self._propose(command)
        if isinstance(proposal, str):
            LOGGER.warning("group %s: election not proposed: %s", command.group, proposal)
            return
        proposal.proposed_at = now
        self._electing[command.group] = proposal

    def _elections_done(self, now: float) -> None:
        """Forget the Elects in flight that committed (counted when accepted) or timed out."""
        for group, proposal in list(self._electing.items()):
            if proposal.done.is_set():
                del self._electing[group]
                if proposal.answer is not None and proposal.answer.accepted:
                    self.elections += 1
                elif proposal.answer is not None:
                    LOGGER.info("group %s: election refused: %s", group, proposal.answer.reason)
            elif now - proposal.proposed_at >= COMMAND_COMMIT_TIMEOUT_SECONDS:
                del self._electing[group]
                self._proposals.pop(proposal.index, None)

    # -- snapshots and retention -----------------------------------------------------------

    async def _snapshotter(self) -> None:
        while True:
            await self._snapshot_due.wait()
            self._snapshot_due = trio.Event()
            data, index = self.state.snapshot(), self.applied_index
            await trio.to_thread.run_sync(self._write_snapshot_file, data)
            self.snapshot_index = index
            LOGGER.info("controller snapshot at entry %d (%d bytes)", index, len(data))
            async with self.driver.files_quiet():  # no sync of a file being deleted
                self.retain()
        raise AssertionError("unreachable")

    def _write_snapshot(self) -> None:
        self._write_snapshot_file(self.state.snapshot())
        self.snapshot_index = self.applied_index

    def _write_snapshot_file(self, data: bytes) -> None:
        """Write to a temporary file, fsync, rename over the snapshot, fsync the directory: the
        snapshot on disk is always a whole one."""
        directory = os.path.dirname(self.snapshot_path)
        os.makedirs(directory, exist_ok=True)
        temporary = self.snapshot_path + ".tmp"
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.snapshot_path)
        fsync_directory(directory)

    def retain(self) -> list[str]:
        """Delete whole entry files below the snapshot and the core's floor (what no member may
        still need; never regardless of the floor), after each snapshot: entries the floor held
        back go after a later one."""
        keep_from = min(self.snapshot_index + 1, self.driver.node.retention_floor())
        if keep_from <= self.store.entries.first_index():
            return []
        deleted = self.store.clean_expired(keep_from_index=keep_from, over_ratio=False)
        if deleted:
            LOGGER.info("retention deleted %d entry file(s); the log starts at entry %d (snapshot at %d)", len(deleted),
                        self.store.entries.first_index(), self.snapshot_index)  # fmt: skip
        return deleted

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict:
        now = trio.current_time()
        node = self.driver.node
        raft = node.status(now)
        leader = raft.leader_id
        groups = {}
        for name, group in sorted(self.state.groups.items()):
            members = {}
            for broker_id, member in sorted(group.members.items()):
                heartbeat = self.tracker.liveness(name, broker_id)
                members[str(broker_id)] = {
                    "identity": member.identity, "client_address": member.client_address,
                    "ha_address": member.ha_address,
                    "alive": self.tracker.alive(name, broker_id, now) if self._serving else None,
                    "last_heartbeat_seconds": round(now - heartbeat.received_at, 3) if heartbeat else None,
                    "epoch": heartbeat.epoch if heartbeat else None,
                    "max_offset": heartbeat.max_offset if heartbeat else None}  # fmt: skip
            groups[name] = {"master_id": group.master_id, "epoch": group.epoch,
                            "sync_state_set": sorted(group.sync_state_set),
                            "sync_state_set_epoch": group.sync_state_set_epoch, "members": members}  # fmt: skip
        entries = self.store.entries
        return {
            "mode": "controller", "self_id": self.group.self_id, "raft_role": raft.role.value,
            "role": "LEADER" if self._serving else ("CANDIDATE" if raft.role is Role.LEADER else "FOLLOWER"),
            "term": raft.term, "leader_id": leader,
            "leader_address": self._announced_address() if leader == self.group.self_id else self._leader_address(),
            "holds_lease": self.holds_lease(now), "listen": format_address(self.listen_address),
            "raft_listen": format_address(self.raft_address), "pid": os.getpid(), "store": self.config.store,
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "applied_index": self.applied_index, "committed_index": raft.committed_index,
            "snapshot_index": self.snapshot_index, "log_first_index": entries.first_index(),
            "log_last_index": entries.last_index(), "elections": self.elections, "requests": dict(self.requests),
            "controller_connections_refused": self.connections_refused, **self.admission.statistics(),
            "raft_messages_dropped": self.driver.dropped_messages,
            "raft_connections_refused": self.driver.refused_connections,
            "damaged": [damage.to_json() for damage in self.store.damaged],
            "peers": {peer: {"match_index": p.match_index,
                             "last_contact_seconds": None if p.last_contact_seconds == float("inf") else round(p.last_contact_seconds, 3),
                             "connected": self.driver.connected.get(peer, False)}
                      for peer, p in raft.peers.items()},
            "groups": groups,
        }  # fmt: skip


async def serve_controller_metrics(address: Address, server: ControllerServer, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """The controller's metrics on ``address`` (prometheus-client, ``hasvc.metrics_http``)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily

    from hasvc.metrics_http import start_metrics_server

    class Collector:
        def collect(self):
            node = server.driver.node
            for name, value, text in (
                ("hasvc_controller_leader", int(server._serving), "This controller serves as the group's leader"),
                ("hasvc_controller_term", node.term, "The controller group's Raft term"),
                ("hasvc_controller_applied_index", server.applied_index, "The last Raft entry applied to the state"),
                ("hasvc_controller_snapshot_index", server.snapshot_index, "The Raft entry the snapshot reflects"),
                ("hasvc_controller_groups", len(server.state.groups), "Broker groups the controllers know"),
                ("hasvc_controller_elections", server.elections, "Elections this controller proposed and saw accepted"),
            ):
                yield GaugeMetricFamily(name, text, value=value)
            for name, value in server.admission.statistics().items():
                yield GaugeMetricFamily(f"hasvc_{name}", f"STATUS {name}", value=value)

    registry = CollectorRegistry()
    registry.register(Collector())
    http, _thread = start_metrics_server(address, registry)
    task_status.started(http.server_address[:2])
    try:
        await trio.sleep_forever()
    finally:
        http.shutdown()
        http.server_close()
