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
silence from the moment it became leader. On a timer (``ELECTION_CHECK_INTERVAL_SECONDS``, or at the
first master's lapse while every group is quiet: ``next_election_check``), after each applied
command and after each heartbeat from a group without a master the leader asks the election rules
(``ElectionTracker.decide``) what to do and proposes the ``Elect``s they decide, one in flight
per group; a heartbeat's answer, lease included, is the tracker's (``ElectionTracker.answer``),
but that a new leader also withholds the lease from a master an earlier leader elected until
``master_lease_seconds`` after it applied that election (``ControllerPort.inherited_election``; the
requests themselves are answered in ``hasvc.controller.port``; STATUS and metrics in
``hasvc.controller.observe``; the limits and ``ControllerConfig`` in ``hasvc.controller.config``).

Snapshots (``hasvc.controller.snapshots``): after ``snapshot_interval_entries`` applied entries
(and at a clean stop) the state is written to ``STORE/controller/snapshot`` (``ControllerState.snapshot``:
CRC32C, with the Raft index it reflects; written to a temporary file, fsynced, renamed). Retention
then (after each snapshot) deletes whole entry files below ``min(snapshot index + 1, the core's
retention floor)`` -- never an entry a member may still need -- so a restart reads the snapshot and
replays only what follows it. A log that starts past the state (a store wiped, or a controller
down while the group cut its log, RESET by the leader to its first index) cannot be replayed:
the controller applies nothing and serves no broker until it fetched another controller's
snapshot (SNAPSHOT on the controller port) and installed it (``install_state``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time

import trio

from commitlog import record as rec
from commitlog.config import StoreConfig
from commitlog.dledger.entry_store import DLedgerStoreConfig
from commitlog.dledger.message_store import DLedgerMessageStore
from hasvc import admission as port_admission
from hasvc import transport
from hasvc.broker.raft.driver import RaftDriver
from hasvc.broker.raft.listener import open_raft_listener
from hasvc.config import Address, format_address
from hasvc.protocol import controller as cp
from hasvc.state.controller import state as cs
from hasvc.state.controller.elect import ElectionTracker
from hasvc.state.raft.ready import Role


from hasvc.controller.config import (CONTROLLER_CONNECTIONS_MAX, CONTROLLER_INDEX_FILE_SIZE, CONTROLLER_RAFT,  # noqa: F401 (CONTROLLER_RAFT: hasvc.cli.controller's)
                                     CONTROLLER_RAFT_GROUP, CONTROLLER_STRANGER_TIMEOUT_SECONDS, CONTROLLER_STRANGERS_MAX, CONTROLLER_SYNC_TICK_SECONDS,
                                     CONTROLLER_TOPIC, COMMAND_COMMIT_TIMEOUT_SECONDS, ELECTION_CHECK_INTERVAL_SECONDS,
                                     ControllerConfig)  # fmt: skip
from hasvc.controller.observe import controller_status, serve_controller_metrics
from hasvc.controller.port import ControllerPort
from hasvc.controller.snapshots import ControllerSnapshots

LOGGER = logging.getLogger(__name__)


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
        self.snapshots = ControllerSnapshots(self)
        self._election_due = trio.Event()
        self.started_at = time.time()
        self.elections = 0  # Elects this controller proposed that were accepted (STATUS, metrics)
        self.requests = {name: 0 for name in cp.KIND_NAMES.values()}
        self.connections_refused = 0  # bad preface or bad frame
        self.port = ControllerPort(self)  # the controller port's requests

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
                if loaded and self.applied_index > self.snapshot_index and self.replayable():
                    self.snapshots.write_now()  # a clean stop: the next start replays nothing
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
        return self.snapshots.path

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
        if not self.replayable():
            LOGGER.warning("%s: the log starts at entry %d but the state reflects entry %d (%s): a snapshot will be "
                           "fetched from another controller", self.config.store, entries.first_index(),
                           self.applied_index, self.snapshot_path if data is not None else "no snapshot")  # fmt: skip
            self.snapshots.wanted.set()
            return
        LOGGER.info("controller state: snapshot at entry %d, log %d..%d, committed %d", self.snapshot_index,
                    entries.first_index(), entries.last_index(), entries.committed_index)  # fmt: skip
        self._apply_committed()

    def replayable(self) -> bool:
        """The log holds every entry after the applied one (or all of them from its start)."""
        entries = self.store.entries
        return entries.first_index() <= self.applied_index + 1 or entries.last_index() < entries.first_index() <= 0

    def install_state(self, state: cs.ControllerState) -> None:
        """Take a fetched snapshot's state (written to disk already) and apply what follows it."""
        assert state.applied_index + 1 >= self.store.entries.first_index() and not self.replayable()
        self.state = state
        self.applied_index = self.snapshot_index = state.applied_index
        self._elected_at.clear()  # elections before it: none of them applied here
        self._apply_committed()
        if self.driver.node.role is Role.LEADER:
            self._on_role()

    async def _serve(self, nursery: trio.Nursery) -> None:
        self.driver = RaftDriver(group=self.group, store=self.store, secret=self.config.secret,
                                 on_commit=self._on_commit, on_role=self._on_role)  # fmt: skip
        if self.group.raft.flush_sync:  # every append syncs at once: the ticker has little to do (see there)
            self.driver.sync.tick_seconds = CONTROLLER_SYNC_TICK_SECONDS
        port_ssl, raft_ssl = self._server_ssl()
        own = self.group.peers[self.group.self_id]
        raft_listener, raft_socket = await open_raft_listener(own, noun="controller", self_id=self.group.self_id,
                                                              ssl_context=raft_ssl)  # fmt: skip
        self.raft_address = transport.listener_address(raft_socket)
        listener, socket = await transport.open_listener(self.config.listen, ssl_context=port_ssl)
        self.listen_address = transport.listener_address(socket)
        self.driver.client_address = self._announced_address()
        if self.config.metrics_listen is not None:
            self.metrics_address = await nursery.start(serve_controller_metrics, self.config.metrics_listen, self)
        nursery.start_soon(port_admission.serve_admitted, listener, self.port.serve_connection, self.admission)
        nursery.start_soon(self._election_timer)
        nursery.start_soon(self.snapshots.run_snapshotter)
        nursery.start_soon(self.snapshots.run_fetcher)
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
                if not self.snapshots.wanted.is_set() and not self.snapshots.fetching:
                    LOGGER.warning("the log now starts at entry %d (reset by the leader) but the state reflects entry "
                                   "%d: a snapshot will be fetched from another controller", entries.first_index(),
                                   self.applied_index)  # fmt: skip
                self.snapshots.wanted.set()
                return
            stored = entries.get(index)
            command = self._command_of(index, stored.body)
            if command is None:
                if index > self.state.applied_index:
                    self.state.note_applied(index)
                answer = None
            else:
                answer = self.state.apply(command, index=index)
                self._log_applied(index, command, answer)
                self._election_due.set()  # the state moved: the election rules look at once (next_election_check)
                if isinstance(command, cs.Elect) and answer.accepted and command.new_master_id is not None:
                    self._elected_at[command.group] = trio.current_time()
            self.applied_index = index
            proposal = self._proposals.pop(index, None)
            if proposal is not None:
                proposal.answer = answer if stored.term == proposal.term else None
                proposal.done.set()
            if self.applied_index - self.snapshot_index >= self.config.snapshot_interval_entries:
                self.snapshots.due.set()

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
            if (not self.store.caught_up() or self.applied_index < self.store.entries.committed_index
                    or not self.replayable()):  # fmt: skip
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


    # -- elections -------------------------------------------------------------------------

    async def _election_timer(self) -> None:
        check_at = -math.inf
        while True:
            with trio.move_on_at(check_at):
                await self._election_due.wait()
            self._election_due = trio.Event()
            now = trio.current_time()
            self._elections_done(now)
            if self._serving and self.holds_lease(now):
                for command in self.tracker.decide(self.state, now):
                    if command.group not in self._electing:
                        self._start_election(command, now)
            check_at = self.next_election_check(now)
        raise AssertionError("unreachable")

    def next_election_check(self, now: float) -> float:
        """When the election rules must look next: ``ELECTION_CHECK_INTERVAL_SECONDS`` after
        ``now``, but later while every group is quiet -- its master named, not restarted, heard
        from -- and no Elect is in flight: then ``decide`` can do nothing before the first
        master's lapse (``ElectionTracker.lapsed``), the only rule that moves with time alone, so
        the check is at that moment (a heartbeat meanwhile moves it later: the timer looks again
        and sleeps on). Anything else that may call for an election wakes the timer at once
        (``_election_due``: a command applied, a heartbeat of a group without master, leadership
        taken). An election still starts at most the interval late; an idle leader wakes about
        once a heartbeat timeout instead of twenty times a second."""
        soon = now + ELECTION_CHECK_INTERVAL_SECONDS
        if not self._serving or self._electing or not self.holds_lease(now):
            return soon
        timeout = self.config.timings.broker_heartbeat_timeout_seconds
        lapse_at = math.inf
        for name, group in self.state.groups.items():
            if group.master_id is None or group.master_restarted:
                return soon
            seen = self.tracker.liveness(name, group.master_id)
            since = max(seen.received_at if seen is not None else -math.inf, self.tracker.leader_since)
            lapse_at = min(lapse_at, since + timeout)
        return max(soon, lapse_at)

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

    def retain(self) -> list[str]:
        return self.snapshots.retain()

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict:
        return controller_status(self)
