"""DLedger mode: a broker whose log is replicated by Raft (``hasvc node``).

Theory of operation
-------------------
``DLedgerBroker`` composes, in one trio loop: the member's store (``DLedgerMessageStore``: records
in DLedger entries, consume queues over committed ones), the pure Raft core (``RaftNode``), its
driver (``RaftDriver``: the Raft port, one outbound connection per peer, timers, the background
flush), and the classic put path and client port unchanged: ``PutService`` appends through
``RaftLog.append_batch`` (a pass's groups over several queues through ``append_batches``, one
proposal for them all), which *proposes* the records (planned at their final offsets) instead of
writing them -- the proposals of one pass of puts carried out in one Ready when PutService calls
``RaftReplicator.appended``, their entries appended and pushed together -- and waits, as under SYNC_MASTER, until the ``RaftReplicator``'s replicated offset
-- the end of the committed entries -- passes the put's end. So a put is answered PUT_OK only once
a quorum has its entry (in memory, or flushed with ``--flush sync``); a put whose entry does not
commit in ``slave_timeout_ms`` is answered FLUSH_SLAVE_TIMEOUT, and one whose leader lost its
term before the commit is answered SLAVE_NOT_AVAILABLE (the waits fail on the role change): never
PUT_OK without a quorum. A retried idempotent send is recognised by the new leader, which rebuilds
its producer table from the committed log before it takes writes.

Roles (``hasvc status``: ``raft_role`` is the core's, ``role`` the broker role the node plays): a
leader plays SYNC_MASTER once every entry of its log is committed and dispatched (its no-op entry
commits the earlier terms' tail), after continuing each queue from its consume queue; every other
member plays SLAVE, serving committed reads, and refuses writes naming the leader it knows.

The driver carries each ``Ready`` out in the core's order: the hard state saved (fsynced), the
log truncated and appended (a follower's runs with ``append_run``), then messages queued to the
peers' senders (bounded: a message that does not fit is dropped, which Raft survives), then the
commit index to the store and dispatch, role changes to the broker. Acknowledgements
(PushResponse) read from a peer together are stepped one by one and their Ready carried out once
(they change no log; anything else read after them waits for that Ready first). Time is
``trio.current_time()`` only. A sender reads an APPEND's entries from the data files when it
sends it (the stored bytes, a view of the mapping per data file, written with the frame headers
in one ``writev``; what the socket does not take is copied before any wait, so no view of a
mapping is held while a truncate or retention may change it).

Flushing does not block the loop: the msync of the entry files runs in a worker thread while the
loop goes on appending, every 10 ms (DLedger's FlushDataService) or, with ``--flush sync``, as soon
as entries were appended. The one exception is a small flush with ``--flush sync`` (at most
SYNC_INLINE_ENTRIES_MAX entries waiting, as with one writer): it runs in the loop at the end of the
drain that appended them, after that drain's messages left (``_sync_after_append``). It is a group commit: the index appended when a flush starts is what it
marks flushed (``persisted``), and entries appended meanwhile wait for the next one; with
``--flush sync`` the core counts (leader) and acknowledges (follower) an entry only once it is
marked flushed. Only the data files decide what is flushed: recovery trusts them alone and
rebuilds the index units that do not match them, so the index files are synced after the
``persisted`` step, off the acknowledgement's path, at most every INDEX_FLUSH_INTERVAL_SECONDS (an
index unit not yet synced costs a longer recovery scan after a crash, never an entry). One sync runs at
a time, in a worker thread started from the loop (``_start_sync``: by an append with
``--flush sync``, by the end of the previous sync, and every FLUSH_INTERVAL_SECONDS), its end
handled by a callback. A full disk ends no task and no process: a leader answers puts DISK_FULL
(the disk above ``disk_max_used_space_ratio``, or no room for the files the proposal's entries
need: ``make_room`` before the core takes them), a follower drops an APPEND it has no room for
(the leader sends it again), the warm-up and the checkpoint try again later; an append that
still fails (the term-start no-op) is rolled back whole by the store and the core starts over as
a follower from the stored log (``_append_failed``). A leader hands over for a full disk only to a
member that said it has room (``hasvc.state.raft.disk_room``). A truncate (a TRUNCATE push from the leader) and retention cut and delete
files, so they hold the files quiet (``files_quiet``): they wait for the sync in flight, and none
starts until they are done. A reset (a RESET from the leader: this member needs entries the group
deleted) deletes every entry and consume-queue file (``DLedgerMessageStore.reset_log``) before its
answer is sent, holding the files quiet and the broker's ``maintenance`` lock (no consume-queue
flush in a worker thread meanwhile).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import logging
import math
import os
import random
import time

import trio

from commitlog import record as rec
from commitlog.dledger.entry_store import DLedgerStoreConfig
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.mapped_file import DiskFullError, StoreError, is_disk_full
from commitlog.dledger.entry_codec import BODY_OFFSET as ENTRY_HEADER_SIZE
from commitlog.dledger.entry_codec import ENTRY_SIZE_MAX
from commitlog.scrub import EntryScrubber
from commitlog.store import AppendResult, disk_used_ratio
from hasvc import admission as port_admission
from hasvc import transport
from hasvc.broker.raft_metrics import serve_raft_metrics
from hasvc.broker.client_port import ClientPort
from hasvc.client import ClientError, connect
from hasvc.broker.put_service import PutService, rebuild_producer_table
from hasvc.broker.store_tasks import SCRUB_PASS_PAUSE_SECONDS, SCRUB_STEP_PAUSE_MIN_SECONDS
from hasvc.config import Address, BrokerConfig, BrokerRole, format_address
from hasvc.protocol import raft as raft_wire
from hasvc.protocol import wire
from hasvc.state.dedupe import ProducerTable
from hasvc.state.raft.config import RaftConfig
from hasvc.state.raft.messages import Push, PushResponse, PushType, ResetPush
from hasvc.state.raft.node import RaftNode
from hasvc.state.raft.ready import Proposed, Role
from hasvc.state.raft.retention import node_keep_from
from hasvc.state.replication import Admission
from hasvc.state.role import RoleState

LOGGER = logging.getLogger(__name__)


def _nothing() -> None:
    """A worker job's completion that has nothing to carry out (the warm-up's)."""

# Messages queued for one peer's sender; one more is dropped (Raft re-sends what matters).
RAFT_SEND_QUEUE_MAX = 4096
# Reconnecting to a peer: first pause, doubling up to the max (a peer that restarts is back soon).
RAFT_RECONNECT_MIN_SECONDS = 0.05
RAFT_RECONNECT_MAX_SECONDS = 1.0
# A sender's read of its own connection, which only watches for the peer's EOF (nothing is sent back).
RAFT_WATCH_READ_SIZE = 4096
# DLedger flushStoreIntervalMs (10 ms) and checkPointInterval (3 s); consume queues every 1 s
# (RocketMQ flushIntervalConsumeQueue).
FLUSH_INTERVAL_SECONDS = 0.010
# The index files are synced at most this often (DLedger syncs them with the data files every
# 10 ms). Recovery trusts only the data files and rebuilds the index units that do not match them,
# so an index unit not yet synced costs a longer recovery scan after a power loss (at most this
# long's writes), never an entry; at 10 ms the index sync's worker thread started behind one put in
# ten at one writer and the loop then waited on the GIL for the thread (``strace``: ~0.3 ms).
INDEX_FLUSH_INTERVAL_SECONDS = 1.0
CHECKPOINT_INTERVAL_SECONDS = 3.0
CONSUME_QUEUE_FLUSH_INTERVAL_SECONDS = 1.0
DISPATCH_INLINE_BYTES_MAX = 256 * 1024  # entries a commit dispatches inline; beyond, the dispatcher task
# The scrub walks at most this many entry bytes a step, on the trio thread (native checks of the
# entries and of their messages' CRCs, a comparison of the units: well under a millisecond here).
DLEDGER_SCRUB_STEP_BYTES = 256 * 1024
# Fetching one damaged entry from one member for its repair (connect, two READs or a few for the
# largest entry): longer than any answer of a member that serves, shorter than a pass's pause.
REPAIR_FETCH_TIMEOUT_SECONDS = 10.0
# A damaged entry no member gave a copy of is tried again this many times a pass, this long apart
# (a member that just started learns its peers' client ports from their HELLOs within a second or
# two), then passed over until the next pass.
REPAIR_ATTEMPTS_PER_PASS = 3
REPAIR_RETRY_SECONDS = 1.0
# What fetching from one member may fail with (the next member is tried); anything else is our bug.
REPAIR_FETCH_ERRORS = (transport.AuthenticationError, OSError, EOFError, wire.ProtocolError, trio.TooSlowError,
                       trio.BrokenResourceError, trio.ClosedResourceError, ClientError)  # fmt: skip
# With --flush sync, a flush of at most this many unflushed entries runs in the loop rather than in
# the worker thread: the thread's hand-off (start, wake-up byte, a loop pass) cost more than the
# msync (~130 us here) and sat on the path of every put at one writer; more entries than this mean
# puts keep arriving, and the thread lets the loop take them during the msync (group commit).
SYNC_INLINE_ENTRIES_MAX = 2
# Inbound Raft connections (hasvc/admission.py): members identified by their HELLO, two per peer
# (a reconnect overlapping the old one), counted apart from the strangers -- connections still in
# the preface or before their HELLO. A member needs a stranger's slot for a round trip or two, and
# the oldest stranger makes room for a new connection; 3 s covers a preface and a HELLO on a loaded
# loop and is shorter than any election timeout a member waits out before it tries again.
RAFT_STRANGERS_MAX = 16
RAFT_STRANGER_TIMEOUT_SECONDS = 3.0
# TRANSFER_LEADER (``hasvc transfer-leader``) answers at the latest this long after it started:
# the core aborts a transfer its target did not complete within election_timeout_min_seconds
# (6.3 s by default, 1 s with etcd timing), so this is a backstop for a leader that steps down
# and hears of no successor. The same order as the ~10 s a DLedger admin request waits.
TRANSFER_LEADER_WAIT_SECONDS = 10.0
# keep_from_index of a forced clean (disk above disk_clean_ratio): no member's need holds it back;
# the store's own limits (committed, flushed, dispatched, the file being written) still do.
RETAIN_NOTHING_INDEX = 1 << 62
# A full disk lasts: each kind of failure (no room for an APPEND, the warm-up, the checkpoint) is
# logged at most once per this long, and the warm-up and a blocked dispatch try again after
# DISK_FULL_RETRY_SECONDS (each warm-up try creates and removes a whole file).
DISK_FULL_LOG_INTERVAL_SECONDS = 30.0
DISK_FULL_RETRY_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    group: str
    self_id: str
    peers: dict[str, Address]  # every member's Raft address, self included
    raft: RaftConfig
    upgrade_classic: bool = False  # a classic store may be continued as this member's (smooth upgrade)

    def validate(self) -> GroupConfig:
        if self.self_id not in self.peers:
            raise ValueError(f"--self {self.self_id!r} is not among --peers ({', '.join(self.peers)})")
        if len(self.peers) not in (1, 3, 5, 7):
            raise ValueError(f"a DLedger group has an odd number of members (3 or 5), not {len(self.peers)}")
        if not self.group:
            raise ValueError("--group must not be empty")
        self.raft.validate()
        return self


def parse_peers(text: str) -> dict[str, Address]:
    """``n0-HOST:PORT;n1-HOST:PORT;...`` (DLedger's peers syntax) -> {id: address}."""
    from hasvc.config import parse_address

    peers: dict[str, Address] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        member, separator, address = part.partition("-")
        if not separator or not member:
            raise ValueError(f"peer {part!r}: expected ID-HOST:PORT")
        if member in peers:
            raise ValueError(f"peer id {member!r} appears twice")
        peers[member] = parse_address(address)
    if not peers:
        raise ValueError("--peers names no member")
    return peers


class DLedgerRole(RoleState):
    """RoleState for a member: SLAVE means "not a leader that has caught up"; the refusal names
    the leader this member knows."""

    __slots__ = ("leader_hint",)

    def __init__(self) -> None:
        super().__init__(BrokerRole.SYNC_MASTER, None)
        self.role = BrokerRole.SLAVE
        self.leader_hint = "no leader is known yet"

    def check_invariants(self) -> None:
        assert self.fenced_by is None

    def write_refusal(self) -> str | None:
        if self.role is BrokerRole.SLAVE:
            return f"this DLedger member does not lead: {self.leader_hint}"
        return None


class RaftReplicator:
    """The Replicator seam for DLedger mode: replicated = committed by the group. ``appended``
    (PutService: a pass of puts proposed) carries the proposals' Ready out (``after_proposals``:
    the driver's ``drain``): their entries appended and pushed together."""

    def __init__(self, store: DLedgerMessageStore, *, after_proposals=lambda: None) -> None:
        self.store = store
        self._listeners = []
        self._after_proposals = after_proposals

    def appended(self) -> None:
        self._after_proposals()

    def replicated_offset(self) -> int:
        return self.store.committed_end_offset()

    def admit(self, next_offset: int) -> Admission:
        return Admission.WAIT

    def shortfall(self, next_offset: int) -> str:
        return "not committed by a quorum of the group"

    def in_sync_count(self) -> int:
        return 1

    def subscribe(self, listener) -> None:
        self._listeners.append(listener)

    def committed(self) -> None:
        offset = self.replicated_offset()
        for listener in self._listeners:
            listener(offset)


class RaftLog:
    """What ``PutService`` and ``ClientPort`` use as a store: the member's store, whose
    ``append_batch`` proposes through the Raft core."""

    def __init__(self, store: DLedgerMessageStore, driver: RaftDriver) -> None:
        self._store = store
        self._driver = driver

    def __getattr__(self, name):
        return getattr(self._store, name)

    def append_batch(self, batch: rec.MessageBatch) -> AppendResult:
        """Propose ``batch``; its Ready is carried out once the pass of puts is proposed
        (``RaftReplicator.appended``, which PutService calls next, before any wait)."""
        return self._driver.propose_plan(lambda: self._store.plan_batch(batch), drain=False)

    def append_batches(self, batches: list[rec.MessageBatch]) -> AppendResult:
        """Propose several batches (a pass's groups over several queues) as one proposal, in
        their order: one AppendResult for them all, its offsets and queue offsets each
        message's (``PutService`` cuts it per batch and request). Refused as a whole."""
        return self._driver.propose_plan(lambda: self._store.plan_batches(batches), drain=False)


@dataclasses.dataclass(frozen=True, slots=True)
class _Rest:
    """The part of a frame that ``RaftDriver._send_now`` wrote in part and the kernel did not
    take, queued for the sender task to send first on that same connection."""

    connection: transport.Connection
    data: bytes


@dataclasses.dataclass
class TransferWait:
    """A TRANSFER_LEADER request waiting for its outcome: set by ``RaftDriver.drain``."""

    target: str
    term: int  # the leader's term when the transfer started
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    status: str = ""
    reason: str = ""


class RaftDriver:
    """Drives one ``RaftNode`` over trio: see the module."""

    def __init__(self, *, group: GroupConfig, store: DLedgerMessageStore, secret: bytes | None,
                 on_commit, on_role, maintenance: trio.Lock | None = None) -> None:  # fmt: skip
        self.group = group
        self.store = store
        self.secret = secret
        self.on_commit = on_commit
        self.on_role = on_role
        self.node = RaftNode(self_id=group.self_id, members=tuple(group.peers), log=store.entries, config=group.raft,
                             rng=random.Random(), now=trio.current_time())  # fmt: skip
        self._queues = {peer: trio.open_memory_channel(RAFT_SEND_QUEUE_MAX) for peer in group.peers if peer != group.self_id}
        self._wakeup = trio.Event()
        self._timer_deadline = -math.inf  # what the timer task sleeps to (-inf: not asleep yet)
        self._inbound: dict[str, trio.CancelScope] = {}
        self.dropped_messages = 0
        self.refused_connections = 0
        self.admission = port_admission.Admission(port_admission.AdmissionLimits(
            RAFT_STRANGERS_MAX, RAFT_STRANGER_TIMEOUT_SECONDS, known_max=2 * len(group.peers)), "raft")  # fmt: skip
        self.connected: dict[str, bool] = {peer: False for peer in self._queues}
        self._links: dict[str, transport.Connection] = {}  # the senders' live connections (``_send_now``)
        self._transfer_wait: TransferWait | None = None
        # Held by whoever deletes or flushes consume-queue files (the broker's), and by a reset.
        self._maintenance = maintenance if maintenance is not None else trio.Lock()
        # The entry files' syncs (see the module): at most one worker thread at a time, none
        # while a task holds the files quiet (``files_quiet``: a truncate, retention) or closes.
        self._token = trio.lowlevel.current_trio_token()
        self._syncing = False  # a sync of the entry files runs in a worker thread
        self._sync_idle = trio.Event()  # set whenever no sync runs
        self._sync_idle.set()
        self._quiet_holds = 0  # tasks in ``files_quiet``: no sync starts meanwhile
        self._closing = False
        self._index_synced_at = -math.inf
        self._sync_failed = trio.Event()
        self._sync_failure: BaseException | None = None
        self.client_address = ""  # this member's client port, sent in every HELLO (set before run)
        self.peer_client_addresses: dict[str, str] = {}  # what each peer's HELLO said
        self.peer_ssl_context = None  # TLS to the peers' Raft ports (--tls-cert; verified with --tls-ca), set before run
        self.appends_dropped_disk_full = 0  # APPEND pushes dropped: no room for their files
        self._disk_full_logged_at: dict[str, float] = {}  # kind -> when it was last logged
        self._warm_failure: BaseException | None = None  # the warm-up's thread met a full disk
        self._warm_retry_at = -math.inf

    def _log_disk_full(self, kind: str, error: BaseException) -> None:
        """One line per kind per DISK_FULL_LOG_INTERVAL_SECONDS."""
        now = trio.current_time()
        if now >= self._disk_full_logged_at.get(kind, -math.inf) + DISK_FULL_LOG_INTERVAL_SECONDS:
            self._disk_full_logged_at[kind] = now
            LOGGER.warning("raft: %s: the disk is full (said at most every %.0f s): %s", kind,
                           DISK_FULL_LOG_INTERVAL_SECONDS, error)  # fmt: skip

    # -- carrying a Ready out ------------------------------------------------------------

    def drain(self) -> None:
        self.node.disk_full = self.store.disk_full()  # for the core's next event: hasvc.state.raft.disk_room
        ready = self.node.ready()
        entries = self.store.entries
        if ready.hard_state is not None:
            entries.save_hard_state(ready.hard_state)
        if ready.reset is not None:
            assert self._quiet_holds and not self._syncing, "reset outside files_quiet"
            assert self._maintenance.statistics().owner is trio.lowlevel.current_task(), "reset without maintenance"
            LOGGER.warning("raft: reset by the leader: entries %d..%d and the consume queues dropped; the log starts "
                           "empty at entry %d (offset %d), the leader's first", entries.first_index(),
                           entries.last_index(), ready.reset.first_index, ready.reset.first_offset)  # fmt: skip
            self.store.reset_log(ready.reset)
        if ready.truncate_after is not None:
            assert self._quiet_holds and not self._syncing, "truncate outside files_quiet"
            entries.truncate(after_index=ready.truncate_after)
        try:
            if ready.entries:
                entries.append(ready.entries)
            if ready.runs:
                for run in ready.runs:  # a leader's stored bytes, checked by the core's step (check_run)
                    entries.append_run(run)
        except DiskFullError as error:  # nothing of the failed append written (make_room)
            self._append_failed(error)
            return
        appended = bool(ready.entries or ready.runs)
        for reason in ready.refused_runs:
            LOGGER.warning("raft: refused an APPEND (answered INCONSISTENT_STATE, the leader compares again): %s", reason)
        if ready.messages:
            self._send_messages(ready.messages)
        if ready.committed_index is not None:
            self.store.set_committed(ready.committed_index)
            self.on_commit()
        for change in ready.role_changes:
            LOGGER.info("raft: %s", change)
        if ready.role_changes or ready.committed_index is not None:
            self.on_role()
        if self._transfer_wait is not None:
            self._check_transfer(ready)
        if self.node.deadline() < self._timer_deadline:
            self._wakeup.set()
        if appended and self.group.raft.flush_sync:
            self._sync_after_append()

    def _append_failed(self, error: DiskFullError) -> None:
        """The Ready's entries could not be stored (a full disk the driver did not see coming:
        the leader's term-start no-op, a file boundary ``make_room`` did not cover): the core
        believes it holds them, so it starts over from what the store holds, as after a
        restart without losing anything (its hard state was saved first): a follower of its
        term, which the broker sees as a role change (waiting puts fail). The Ready's messages
        are dropped, which Raft survives. The process goes on."""
        self._log_disk_full("append", error)
        self.store.discard_plans()
        old = self.node
        self.node = RaftNode(self_id=old.self_id, members=old.members, log=self.store.entries, config=old.config,
                             rng=random.Random(), now=trio.current_time())  # fmt: skip
        if self._transfer_wait is not None:
            self._transfer_wait.status, self._transfer_wait.reason = "TRANSFER_FAILED", f"no room to append: {error}"
            self._transfer_wait.done.set()
            self._transfer_wait = None
        self.on_role()
        self._wakeup.set()

    def _room_refusal(self, plan) -> AppendResult | None:
        """DISK_FULL for a leader's proposal while the disk is above the ratio or the files its
        entries need cannot be made (``make_room``); None: propose."""
        store = self.store
        if store.disk_full():
            return AppendResult(rec.PutMessageStatus.DISK_FULL, reason=store.disk.reason)
        try:
            store.entries.make_room(data_size=plan.positions[-1] + plan.entry_sizes[-1] - store.entries.data_end(),
                                    count=plan.first_index + len(plan.bodies) - store.entries.last_index() - 1)  # fmt: skip
        except DiskFullError as error:
            store.disk.no_room(str(error))
            return AppendResult(rec.PutMessageStatus.DISK_FULL, reason=str(error))
        return None

    def _sync_after_append(self) -> None:
        """With flush_sync, after a drain appended entries and sent its messages (the pushes
        leave before this member's own msync, so the followers' flushes overlap it): flush at
        once, in the loop when at most SYNC_INLINE_ENTRIES_MAX entries wait (then ``persisted``
        and another drain carry the acknowledgement out), else in the worker thread."""
        if self._syncing or self._quiet_holds or self._closing:
            return
        entries = self.store.entries
        target = entries.flush_target()
        if target - entries.flushed_index() > SYNC_INLINE_ENTRIES_MAX:
            self._start_sync()
            return
        try:
            entries.sync_data_files()
        except Exception as error:  # noqa: BLE001 -- as a worker thread's failure: the _flush_ticker task raises it
            self._sync_failure = error
            self._sync_failed.set()
            return
        self._data_synced(target)

    def _send_messages(self, messages) -> None:
        """Send a Ready's messages, each peer's in their order: written from here in one
        ``writev`` a peer (``_send_now``), else queued for its sender (one more than fits is
        dropped, which Raft survives). A pass of puts at 64 producers x 32 messages makes
        several pushes to each follower (up to push_batch_size_max, 1 MiB, each): a write each
        was a system call and a wake-up of the follower per push."""
        if len(messages) == 1:
            by_peer = {messages[0].target: messages}
        else:
            by_peer = {}
            for message in messages:
                by_peer.setdefault(message.target, []).append(message)
        for target, group in by_peer.items():
            if not self._send_now(target, group):
                queue = self._queues[target][0]
                for message in group:
                    try:
                        queue.send_nowait(message)
                    except trio.WouldBlock:
                        self.dropped_messages += 1

    def _send_now(self, target: str, messages) -> bool:
        """Write ``messages`` (all for ``target``) to its connection from here in one ``writev``,
        when its sender task is idle (waiting for its queue, nothing queued, not sending) on
        plain TCP: a message through the sender task cost that task's step and a scheduler pass
        per message, on every hop of a put (push, acknowledgement, flushed acknowledgement).
        What the kernel does not take is queued, as bytes, for the sender to finish before
        anything else. False: queue them."""
        connection = self._links.get(target)
        if connection is None:
            return False
        statistics = self._queues[target][1].statistics()
        if statistics.current_buffer_used or statistics.tasks_waiting_receive != 1 or connection.raw_fileno < 0:
            return False  # (a send in progress: the sender is not waiting; write_now checks it again too)
        parts, ends = [], []  # ends[i]: parts of messages[:i + 1]
        for message in messages:
            parts += self._frame_parts(message, connection)
            ends.append(len(parts))
        try:
            sent = connection.writev_now(parts)
        except OSError:
            return False  # the sender's own write will meet the error and reconnect
        if sent is None:
            return False
        try:
            self._queue_unsent(target, connection, messages, parts, ends, sent)
        finally:
            parts.clear()  # views of the data files: never held while the log may change
        return True

    def _queue_unsent(self, target: str, connection: transport.Connection, messages, parts: list, ends: list[int],
                      sent: int) -> None:  # fmt: skip
        """Queue for ``target``'s sender what a ``writev`` of ``messages``' ``parts`` did not send
        (``sent`` bytes went): the rest of the message it stopped in, copied (a ``_Rest``: no
        view of a data file outlives the call), then the messages after it as they are (their
        sender frames them when it sends them), not a copy of every unsent byte of a pass."""
        index = 0
        while index < len(parts) and sent >= len(parts[index]):
            sent -= len(parts[index])
            index += 1
        if index == len(parts):
            return
        stopped = next(i for i, end in enumerate(ends) if end > index)  # the message the write stopped in
        queue = self._queues[target][0]
        start = ends[stopped - 1] if stopped else 0
        if index > start or sent:  # begun: its rest must follow on this connection
            rest = [parts[index][sent:], *parts[index + 1 : ends[stopped]]]
            queue.send_nowait(_Rest(connection, b"".join(rest)))  # the buffer is empty: it fits
        else:
            queue.send_nowait(messages[stopped])
        for message in messages[stopped + 1 :]:
            try:
                queue.send_nowait(message)
            except trio.WouldBlock:
                self.dropped_messages += 1

    def _check_transfer(self, ready) -> None:
        """Finish the waiting transfer once the core aborted it or a leader of a later term is
        known (a new leader steps this one down with its vote request, then names itself)."""
        wait, node = self._transfer_wait, self.node
        if any(aborted.target == wait.target for aborted in ready.transfers_aborted):
            wait.status = "TRANSFER_ABORTED"
            wait.reason = (f"{wait.target} did not take over within {self.group.raft.election_timeout_min_seconds} s "
                           f"(election_timeout_min_seconds); {self.group.self_id} leads on in term {node.term}")  # fmt: skip
        elif node.role is not Role.LEADER and node.leader_id is not None and node.term > wait.term:
            if node.leader_id == wait.target:
                wait.status, wait.reason = "OK", ""
            else:
                wait.status = "TRANSFER_FAILED"
                wait.reason = f"{node.leader_id} took over in term {node.term}, not {wait.target}"
        else:
            return
        self._transfer_wait = None
        wait.done.set()

    async def transfer_leadership(self, target: str, *, wait_seconds: float) -> tuple[str, str]:
        """Hand leadership to ``target`` and wait for the outcome, at most ``wait_seconds``:
        (status, reason), status OK once ``target`` leads a later term, else the core's refusal
        (``RefusalStatus``), TRANSFER_ABORTED, TRANSFER_FAILED or TRANSFER_TIMEOUT."""
        refused = self.node.transfer_leadership(target, trio.current_time())
        if refused is not None:
            self.drain()
            return refused.status.value, refused.reason
        assert self._transfer_wait is None, "the core refuses a second transfer while one runs"
        wait = self._transfer_wait = TransferWait(target, self.node.term)
        self.drain()  # TimeoutNow goes out now if the target has every entry
        with trio.move_on_after(wait_seconds):
            await wait.done.wait()
        if not wait.done.is_set():
            if self._transfer_wait is wait:
                self._transfer_wait = None
            node = self.node
            return "TRANSFER_TIMEOUT", (f"no outcome within {wait_seconds} s: {self.group.self_id} is {node.role.value} "
                                        f"in term {node.term}, leader {node.leader_id or 'unknown'}")  # fmt: skip
        return wait.status, wait.reason

    def propose(self, messages: list[rec.Message]) -> AppendResult:
        return self.propose_plan(lambda: self.store.plan_append(messages))

    def propose_plan(self, make_plan, *, drain: bool = True) -> AppendResult:
        """Propose the entries ``make_plan()`` plans (``store.plan_append`` or ``plan_batch``);
        ``drain=False``: the caller carries the Ready out (``drain``) before anything awaits."""
        try:
            plan = make_plan()
        except rec.MessageRejected as error:
            return AppendResult(error.status, reason=error.reason)
        refusal = self._room_refusal(plan)
        if refusal is not None:
            return refusal
        result = self.node.propose(plan.bodies, trio.current_time())
        if not isinstance(result, Proposed):
            return AppendResult(rec.PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                reason=f"{result.status.value}: {result.reason or 'leader ' + str(result.leader_id)}")  # fmt: skip
        assert result.first_index == plan.first_index, (result, plan.first_index)
        self.store.accept_plan(plan)
        if drain:
            self.drain()
        last = plan.offsets[-1] + len(plan.bodies[-1])
        return AppendResult(rec.PutMessageStatus.PUT_OK, wrote_offset=plan.offsets[0], wrote_bytes=last - plan.offsets[0],
                            store_timestamp=plan.store_timestamp, offsets=plan.offsets, queue_offsets=plan.queue_offsets)  # fmt: skip

    # -- tasks ---------------------------------------------------------------------------

    async def run(self, nursery: trio.Nursery, listener) -> None:
        self.drain()
        nursery.start_soon(self._timer)
        nursery.start_soon(self._flush_ticker)
        nursery.start_soon(self._checkpointer)
        for peer in self._queues:
            nursery.start_soon(self._sender, peer)
        nursery.start_soon(port_admission.serve_admitted, listener, self._serve_peer, self.admission)

    async def _timer(self) -> None:
        """Tick the core at its deadline. ``drain`` wakes this task only when the core's
        deadline moved before the one it sleeps to (most Readies move it later or leave it: a
        wake-up per Ready was a task step per message); a deadline that moved later makes it
        wake early, find nothing due and sleep again."""
        while True:
            self._timer_deadline = self.node.deadline()
            with trio.move_on_at(self._timer_deadline):
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            now = trio.current_time()
            if now >= self.node.deadline():
                self.node.tick(now)
                self.drain()

    # -- flushing the entry files ---------------------------------------------------------

    def _start_sync(self, *, data: bool = True) -> None:
        """Start a sync of the entry files in a worker thread unless one runs, a task holds the
        files quiet or the driver closes: the data files when entries wait to be flushed (and
        ``data``), else the index files once INDEX_FLUSH_INTERVAL_SECONDS after their last sync. The
        thread's end is handled in the loop by ``_synced`` (through the run_sync_soon task, with
        no task of its own: a flusher task cost three or four task steps a flush), which starts
        the next: with flush_sync the data files' at once (group commit), else only the index
        files' (the data files wait for the next tick: syncing back to back would cost a thread
        hand-off and an msync per few entries at high rates)."""
        if self._syncing or self._quiet_holds or self._closing:
            return
        entries = self.store.entries
        if data and entries.flushed_index() < entries.last_index():
            job, done = entries.sync_data_files, functools.partial(self._data_synced, entries.flush_target())
        elif entries.index_unsynced() and trio.current_time() >= self._index_synced_at + INDEX_FLUSH_INTERVAL_SECONDS:
            job, done = entries.sync_index_files, self._index_synced
        elif (self.node.role is Role.LEADER and trio.current_time() >= self._warm_retry_at
              and self.store.commit_log.mapped_file_queue.needs_warming(self.store.config.warm_ahead_size)):  # fmt: skip
            # The write area faulted in ahead of the appends, as a classic broker's warm-up task
            # does (StoreTasks.warm_task): without it every fourth 1 KiB entry's first write to a
            # page was a page fault on the loop (a sixth of a leader's main thread at 64
            # producers, py-spy). In the sync's place, between syncs, so truncations and
            # retention (files_quiet) exclude it as they exclude a sync. A leader's only: a
            # follower stores pushes with pwrite (DLedgerMmapFileStore.append_run), for which
            # pages faulted in ahead were zeroed for nothing (its worker threads 1.0-2.3 ->
            # 0.7-1.1 us a message at 64 x 1, docs/design/put-path.md).
            job, done = self._warm, self._warmed
        else:
            return
        self._syncing = True
        self._sync_idle = trio.Event()
        token = self._token
        trio.lowlevel.start_thread_soon(job, lambda result: token.run_sync_soon(self._synced, done, result),
                                        name=f"hasvc {self.group.self_id} {job.__name__}")  # fmt: skip

    def _synced(self, done, result) -> None:
        self._syncing = False
        self._sync_idle.set()
        try:
            result.unwrap()
            done()
        except BaseException as error:  # noqa: BLE001 -- a run_sync_soon callback must not raise:
            self._sync_failure = error  # the _flush_ticker task raises it
            self._sync_failed.set()
            return
        self._start_sync(data=self.group.raft.flush_sync)

    def _data_synced(self, target: int) -> None:
        """Group commit: entries up to ``target`` (the last index when the sync began) are
        flushed; those appended meanwhile wait for the next sync."""
        flushed = self.store.entries.flushed_to(target)
        self.node.persisted(flushed, trio.current_time())
        self.drain()

    def _warm(self) -> None:
        """The warm-up, in the worker thread: a full disk (the next file cannot be made) is
        kept for ``_warmed`` to log, not raised (it would stop the member)."""
        try:
            self.store.warm_commitlog()
        except (StoreError, OSError) as error:
            if not is_disk_full(error):
                raise
            self._warm_failure = error

    def _warmed(self) -> None:
        if self._warm_failure is not None:
            self._log_disk_full("warm-up", self._warm_failure)
            self._warm_failure = None
            self._warm_retry_at = trio.current_time() + DISK_FULL_RETRY_SECONDS

    def _index_synced(self) -> None:
        self._index_synced_at = trio.current_time()

    async def _flush_ticker(self) -> None:
        """Every FLUSH_INTERVAL_SECONDS start a sync if one is due (DLedger's FlushDataService;
        with flush_sync, appends start theirs at once and this catches up the index files);
        raise what a sync raised."""
        while True:
            with trio.move_on_after(FLUSH_INTERVAL_SECONDS):
                await self._sync_failed.wait()
            if self._sync_failure is not None:
                raise self._sync_failure
            self._start_sync()

    @contextlib.asynccontextmanager
    async def files_quiet(self):
        """Hold off the entry files' syncs (waiting for one that runs): for what cuts or deletes
        the files a sync's thread reads (a truncate, retention). Synchronous code inside only."""
        self._quiet_holds += 1
        try:
            while self._syncing:
                await self._sync_idle.wait()
            yield
        finally:
            self._quiet_holds -= 1
            if not self._quiet_holds:
                self._start_sync()

    async def close(self) -> None:
        """Start no more syncs and wait for the one that runs (its thread reads the mappings
        that closing the store unmaps)."""
        self._closing = True
        while self._syncing:
            await self._sync_idle.wait()

    async def _checkpointer(self) -> None:
        while True:
            await trio.sleep(CHECKPOINT_INTERVAL_SECONDS)
            try:
                self.store.write_checkpoint()
            except (StoreError, OSError) as error:  # the entries' checkpoint is written to a new file, renamed
                if not is_disk_full(error):
                    raise
                self._log_disk_full("checkpoint", error)

    async def _sender(self, peer: str) -> None:
        """Keep a connection to ``peer`` and send it what the core addresses to it; while there
        is none, what is queued is dropped (the core re-sends what still matters)."""
        receive = self._queues[peer][1]
        pause = RAFT_RECONNECT_MIN_SECONDS
        address = self.group.peers[peer]
        while True:
            try:
                connection = await transport.connect(address, ssl_context=self.peer_ssl_context)
                await transport.client_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=self.secret)
                hello = raft_wire.Hello(self.group.group, self.group.self_id, peer, client_address=self.client_address,
                                        data_start_offset=self._announced_data_start(),
                                        data_file_size=self.store.entries.data_file_size)  # fmt: skip
                await connection.send_all(raft_wire.encode_hello(hello))
            except (OSError, trio.BrokenResourceError, trio.TooSlowError, transport.AuthenticationError, EOFError) as error:
                LOGGER.debug("raft: cannot reach %s at %s: %s", peer, format_address(address), error)
                await self._drop_queued(receive, pause)
                pause = min(pause * 2, RAFT_RECONNECT_MAX_SECONDS)
                continue
            connected_at = trio.current_time()
            self.connected[peer] = True
            self._links[peer] = connection
            try:
                async with connection.stream, trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_closed, connection, peer, nursery.cancel_scope)
                    while True:
                        parts = self._frame_parts(await receive.receive(), connection)
                        while True:  # what else is queued goes in the same write
                            try:
                                parts += self._frame_parts(receive.receive_nowait(), connection)
                            except trio.WouldBlock:
                                break
                        try:
                            await connection.send_parts(parts)
                        finally:
                            parts.clear()  # views of the data files: never held while the log may change
            except BaseException as error:
                # The nursery wraps what the loop raised in an exception group: a broken
                # connection is expected, anything else (Cancelled among them) goes on up.
                if not transport.is_expected(error, (OSError, trio.BrokenResourceError, trio.ClosedResourceError)):
                    raise
                LOGGER.info("raft: connection to %s lost: %s", peer, transport.describe(error))
            finally:
                self.connected[peer] = False
                del self._links[peer]
            if trio.current_time() - connected_at < RAFT_RECONNECT_MAX_SECONDS:
                # It did not last (a peer that refuses this member's HELLO closes at once): back off
                # as for a failed connect, or the sender would reconnect in a tight loop.
                await self._drop_queued(receive, pause)
                pause = min(pause * 2, RAFT_RECONNECT_MAX_SECONDS)
            else:
                pause = RAFT_RECONNECT_MIN_SECONDS

    def _frame_parts(self, message, connection: transport.Connection) -> list:
        """The frames for ``message`` as parts for one writev: an APPEND's reference run read from
        the store as stored bytes -- a frame header and a view of the data file per run (a run
        stops at a file's end) -- or nothing when the log no longer holds those entries (a
        truncate or retention since the core queued it: dropped, as a lost message); any other
        message encoded. A ``_Rest`` (the end of a frame ``_send_now`` wrote in part): its bytes
        on the connection it began on, nothing on a later one (that frame is lost with its
        connection, as queued messages are; Raft re-sends what matters)."""
        if isinstance(message, _Rest):
            return [message.data] if message.connection is connection else []
        if not isinstance(message, Push) or message.type is not PushType.APPEND or message.entries.data is not None:
            return [raft_wire.encode(message)]
        reference = message.entries
        runs = self.store.entries.read_runs(reference.first_index, reference.count, reference.last_term)
        if runs is None:
            self.dropped_messages += 1
            return []
        parts, prev_term = [], message.prev_term
        for run in runs:
            parts.append(raft_wire.append_header(term=message.term, index=run.first_index, prev_term=prev_term,
                                                 commit_index=message.commit_index, count=run.count,
                                                 last_term=run.last_term, size=len(run.data)))  # fmt: skip
            parts.append(run.data)
            prev_term = run.last_term
        return parts

    @staticmethod
    async def _watch_closed(connection, peer: str, scope: trio.CancelScope) -> None:
        """End the connection to ``peer`` as soon as the peer closes it. The peer never sends on
        it after the preface, so a read returns only at EOF or a reset: a member that died (and
        restarted) is noticed at once and reconnected to, instead of on the next write, which
        is lost -- typically a vote request in the election after a leader's death, splitting the
        vote and costing an election timeout (drill: 1.4-1.8 s failovers, 2 rounds in 50)."""
        try:
            while await connection.stream.receive_some(RAFT_WATCH_READ_SIZE):
                pass  # nothing is expected after the preface: ignored
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        LOGGER.info("raft: connection to %s closed by the peer", peer)
        scope.cancel()

    async def _drop_queued(self, receive, pause: float) -> None:
        with trio.move_on_after(pause):
            while True:
                await receive.receive()
                self.dropped_messages += 1

    async def _serve_peer(self, stream, ticket: port_admission.Ticket | None = None) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        try:
            await transport.server_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=self.secret)
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
                                self.drain()
                            if isinstance(event, raft_wire.Hello):
                                source = self._check_hello(event, connection.peer)
                                if source is None or not self.admission.identified(ticket):
                                    return
                                old = self._inbound.get(source)
                                if old is not None:
                                    old.cancel()  # a peer that reconnected: its old connection is dead
                                self._inbound[source] = scope
                            elif isinstance(event, Push) and event.type is PushType.TRUNCATE:
                                async with self.files_quiet():  # the truncate waits for a sync in flight
                                    self._step(event)
                                now = trio.current_time()  # (after a wait: for acknowledgements after it)
                            elif isinstance(event, ResetPush):  # deletes entry and consume-queue files
                                async with self._maintenance, self.files_quiet():
                                    self._step(event)
                                now = trio.current_time()
                            else:
                                self._step(event)
                    finally:
                        if acknowledged:  # also when a bad frame ends the connection
                            self.drain()
            except wire.ProtocolError as error:
                self.refused_connections += 1
                LOGGER.warning("raft: %s (%s) sent a bad frame, connection closed: %s", connection.peer, source, error)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, EOFError):
                self._peer_gone(source, scope)
            else:
                self._peer_gone(source, scope)  # EOF
            finally:
                if source is not None and self._inbound.get(source) is scope:
                    del self._inbound[source]
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
            self.node.step(message, trio.current_time() if now is None else now)
        except ValueError as error:
            self.drain()  # whatever the core did before it refused (it refuses before touching the log)
            raise wire.ProtocolError(f"{type(message).__name__} refused: {error}") from None
        if drain:
            self.drain()

    def _room_for(self, push: Push) -> bool:
        """Whether the files an APPEND's run needs exist or can be made (``make_room``; a run
        lies in one data file, from the next entry's pos, or overlaps what we hold: then at
        most its size past our end)."""
        if push.index > self.store.entries.last_index() + 1:
            return True  # not a run we could append (the core answers it)
        try:
            self.store.entries.make_room_for_run(push.entries)
        except DiskFullError as error:
            self.appends_dropped_disk_full += 1
            self._log_disk_full(f"an APPEND from {push.source} dropped", error)
            return False
        return True

    def _peer_gone(self, source: str | None, scope: trio.CancelScope) -> None:
        """The connection from ``source`` ended by itself (not replaced by a newer one): tell the
        core, which starts an election soon if that was its leader (``RaftNode.peer_unreachable``)."""
        if source is not None and self._inbound.get(source) is scope:
            LOGGER.info("raft: the connection from %s ended", source)
            self.node.peer_unreachable(source, trio.current_time())
            self.drain()

    def _check_hello(self, hello: raft_wire.Hello, peer: str) -> str | None:
        why = None
        if hello.group != self.group.group:
            why = f"group {hello.group!r}, this member is in {self.group.group!r}"
        elif hello.target != self.group.self_id:
            why = f"meant for member {hello.target!r}, this is {self.group.self_id!r}"
        elif hello.source not in self._queues:
            why = f"unknown member {hello.source!r} (members: {', '.join(self.group.peers)})"
        elif hello.data_file_size and hello.data_file_size != self.store.entries.data_file_size:
            # Every entry's pos and blank record depend on it: the logs could not be byte-identical.
            why = (f"{hello.source}'s data files are {hello.data_file_size} bytes, this member's "
                   f"{self.store.entries.data_file_size} (commitlog_segment_size must be equal on every member)")
        if why is not None:
            self.refused_connections += 1
            LOGGER.warning("raft: %s refused: %s", peer, why)
            return None
        if hello.client_address:
            self.peer_client_addresses[hello.source] = hello.client_address
        if hello.data_start_offset:
            self._adopt_data_start(hello.source, hello.data_start_offset)
        return hello.source

    def _announced_data_start(self) -> int:
        """What HELLO says of where this log starts: its first data file's offset while its first
        index is 0 (0, or a smooth upgrade's divide); 0, "not said", once retention or a reset
        moved its start (a member that needs entries from before it is RESET, not told)."""
        entries = self.store.entries
        return entries.data_start_offset if entries.first_index() == 0 else 0

    def _adopt_data_start(self, peer: str, offset: int) -> None:
        """A group upgraded from a classic log starts its entries at the divide; a member that
        joins it with an empty store (no classic part) must place its entries at the same offsets,
        or the records' offsets would not be where they lie. It learns the divide from the first
        HELLO that names one (before any push or vote can reach it on that connection)."""
        entries = self.store.entries
        if entries.data_start_offset == offset or entries.first_index() > 0:
            return  # (a start moved by retention or a reset: the leader's RESET and COMPARE decide)
        if entries.last_index() >= 0 or self.store.divided_offset >= 0:
            LOGGER.error("raft: %s's log starts at offset %d, this member's at %d: it cannot follow that log "
                         "(every member must come from the same classic log, or start empty)",
                         peer, offset, entries.data_start_offset)  # fmt: skip
            return
        LOGGER.warning("raft: this empty log starts at offset %d, where %s's does (a smoothly upgraded group)", offset, peer)
        entries.start_at(offset)

    def client_address_of(self, member: str | None) -> str | None:
        """The client port ``member`` announced (this member's own too), None if unknown."""
        if member is None:
            return None
        if member == self.group.self_id:
            return self.client_address or None
        return self.peer_client_addresses.get(member)


class DLedgerBroker:
    """A DLedger member: see the module."""

    def __init__(self, config: BrokerConfig, group: GroupConfig) -> None:
        self.config = config.validate()
        self.group = group.validate()
        self.role_state = DLedgerRole()
        self.producers = ProducerTable(window=config.producer_sequence_window, producers_max=config.producers_max)
        self.store: DLedgerMessageStore | None = None
        self.driver: RaftDriver | None = None
        self.replicator: RaftReplicator | None = None
        self.put_service: PutService | None = None
        self.client_port: ClientPort | None = None
        self.listen_address: Address | None = None
        self.raft_address: Address | None = None
        self.metrics = None  # RaftMetrics, with --metrics-listen
        self.metrics_address: Address | None = None
        self.started_at = time.time()
        self._dispatch_wakeup = trio.Event()
        self._taking_writes = False
        self._nursery: trio.Nursery | None = None
        # The term whose producer table is being rebuilt in a worker thread (None: none is): a
        # leader takes writes once it is done, if it still leads that term.
        self._rebuilding_for: int | None = None
        self.retention_passes = 0  # retention passes done (status: lets a test wait for one)
        self.scrubber: EntryScrubber | None = None  # the store's background check, once running
        # Held while a worker thread flushes the consume queues (StoreTasks.maintenance's role)
        # and while retention deletes files (consume queue files among them).
        self.maintenance = trio.Lock()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # A member syncs each append with --flush sync (the Raft config's), whatever the store's own flush says.
        store_config = dataclasses.replace(self.config.store_config(),
                                           small_write_pages=self.config.small_write_pages_for(self.group.raft.flush_sync))  # fmt: skip
        # Damage below what this member knew durable is cut and repaired from the leader, unless
        # it has no other copy (a group of one) or the settings say to refuse or to accept the loss.
        entry_config = DLedgerStoreConfig(data_file_size=store_config.commitlog_segment_size,
                                          page_cache_keep_size=store_config.page_cache_keep_size,
                                          preallocate_step_size=store_config.preallocate_step_size,
                                          small_write_pages=store_config.small_write_pages,
                                          recovery_cut_segments_max=self.config.recovery_cut_segments_max,
                                          recovery_accept_lost_entries=self.config.recovery_accept_lost_entries,
                                          recovery_repair_from_peers=self.config.recovery_repair_from_peers
                                          and len(self.group.peers) > 1)  # fmt: skip
        self.store = await trio.to_thread.run_sync(lambda: DLedgerMessageStore.open(
            self.config.store, store_config, self_id=self.group.self_id, group=self.group.group,
            upgrade_classic=self.group.upgrade_classic, dledger=entry_config))  # fmt: skip
        for damage in self.store.damaged:
            LOGGER.error("store %s: damaged entries cut, to be repaired from the leader: %s", self.config.store,
                         damage.describe())  # fmt: skip
        mark = self.store.entries.load_hard_state()
        if mark.catch_up_index >= 0:
            LOGGER.warning("store %s: entries up to %d (term %d) were lost here: this member neither votes as itself "
                           "nor stands for election until the leader has caught it up to there", self.config.store,
                           mark.catch_up_index, mark.catch_up_term)  # fmt: skip
        LOGGER.info("store %s: entries %d..%d, committed %d, dispatched %d", self.config.store,
                    self.store.entries.first_index(), self.store.entries.last_index(), self.store.entries.committed_index,
                    self.store.dispatched_index)  # fmt: skip
        try:
            async with trio.open_nursery() as nursery:
                await self._serve(nursery, task_status)
        finally:
            if self.put_service is not None:
                self.put_service.fail_all_waits()
            with trio.CancelScope(shield=True):
                if self.driver is not None:
                    await self.driver.close()
                await trio.to_thread.run_sync(self.store.close)
            LOGGER.info("store closed cleanly")

    async def _serve(self, nursery: trio.Nursery, task_status) -> None:
        self._nursery = nursery
        self.driver = RaftDriver(group=self.group, store=self.store, secret=self.config.secret,
                                 on_commit=self._on_commit, on_role=self._on_role,
                                 maintenance=self.maintenance)  # fmt: skip
        self.replicator = RaftReplicator(self.store, after_proposals=self.driver.drain)
        log = RaftLog(self.store, self.driver)
        self.put_service = PutService(config=self.config, store=log, role=self.role_state, replicator=self.replicator,
                                      producers=self.producers, after_appends=lambda: None)  # fmt: skip
        self.client_port = ClientPort(config=self.config, store=log, puts=self.put_service, status=self.status,
                                      promote=self._no_promote, demote=self._no_promote,
                                      transfer_leader=self.transfer_leader)  # fmt: skip
        own = self.group.peers[self.group.self_id]
        client_ssl, raft_ssl = self._server_ssl()
        try:
            raft_listener, raft_socket = await transport.open_listener(own, ssl_context=raft_ssl)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise OSError(error.errno, f"the Raft address {format_address(own)} of member {self.group.self_id} (its "
                                       f"entry in --peers) is in use: is a member with --self {self.group.self_id} "
                                       "running already? Two cannot run in one group") from None  # fmt: skip
        self.raft_address = transport.listener_address(raft_socket)
        client_listener, client_socket = await transport.open_listener(self.config.listen, ssl_context=client_ssl)
        self.listen_address = transport.listener_address(client_socket)
        self.driver.client_address = self._announced_client_address()
        nursery.start_soon(port_admission.serve_admitted, client_listener, self.client_port.serve_client,
                           self.client_port.admission)  # fmt: skip
        nursery.start_soon(self.client_port.append_task)
        nursery.start_soon(self.put_service.waiter_timer_task)
        nursery.start_soon(self._dispatcher)
        nursery.start_soon(self._consume_queue_flusher)
        nursery.start_soon(self._retention)
        nursery.start_soon(self._scrub)
        await self.driver.run(nursery, raft_listener)
        if self.config.metrics_listen is not None:  # after the driver runs: a scrape reads STATUS
            self.metrics, self.metrics_address = await nursery.start(
                functools.partial(serve_raft_metrics, self.config.metrics_listen, status=self.status))
            self.put_service.metrics = self.client_port.metrics = self.metrics
        task_status.started(self.addresses())
        LOGGER.info("ready: %s", json.dumps(self.addresses()))

    def _server_ssl(self):
        """(client port's, Raft port's) server TLS contexts, None without --tls-cert; sets the
        driver's context for its own connections to the peers. With --tls-ca the Raft port is
        mutual TLS: a peer must present a certificate the CA signed, and so must we."""
        config = self.config
        if config.tls_cert is None:
            return None, None
        if config.tls_ca is None:
            self.driver.peer_ssl_context = transport.unverified_client_ssl_context()
        else:
            self.driver.peer_ssl_context = transport.client_ssl_context(ca=config.tls_ca, cert=config.tls_cert, key=config.tls_key)
        client_ssl = transport.server_ssl_context(cert=config.tls_cert, key=config.tls_key)
        raft_ssl = transport.server_ssl_context(cert=config.tls_cert, key=config.tls_key, client_ca=config.tls_ca)
        return client_ssl, raft_ssl

    async def _no_promote(self, *args, **kwargs) -> dict:
        raise ValueError("a DLedger member is never promoted or demoted by hand: the group elects its leader")

    async def transfer_leader(self, target: str) -> tuple[str, str, dict]:
        """TRANSFER_LEADER (DLedger LEADERSHIP_TRANSFER): refused naming the leader unless this
        member leads, refused for an unknown member or one too far behind (its lag named), else
        answered once ``target`` leads or the transfer failed, within TRANSFER_LEADER_WAIT_SECONDS."""
        node = self.driver.node
        started = trio.current_time()
        lag = node.status(started).peers.get(target)
        details = {"self_id": self.group.self_id, "target": target, "previous_term": node.term,
                   "target_lag_entries": lag.lag_entries if lag is not None else None}  # fmt: skip
        if target not in self.group.peers:
            members = ", ".join(self.group.peers)
            status, reason = "UNKNOWN_MEMBER", f"{target!r} is not a member of group {self.group.group} ({members})"
        elif node.role is not Role.LEADER:
            status, reason = "NOT_LEADER", f"{self.group.self_id} does not lead: {self.role_state.leader_hint}"
        else:
            LOGGER.warning("handing leadership of term %d to %s", node.term, target)
            status, reason = await self.driver.transfer_leadership(target, wait_seconds=TRANSFER_LEADER_WAIT_SECONDS)
            LOGGER.warning("leadership transfer to %s: %s %s", target, status, reason)
        leader = node.leader_id
        details.update(term=node.term, leader_id=leader, elapsed_seconds=round(trio.current_time() - started, 3),
                       leader_raft_address=format_address(self.group.peers[leader]) if leader else None,
                       leader_client_address=self.driver.client_address_of(leader))  # fmt: skip
        return status, reason, details

    def _announced_client_address(self) -> str:
        """The client port as peers should tell clients: a wildcard host is replaced by the host
        of this member's Raft address (the one the others reach it at)."""
        host, port = self.listen_address
        if host in ("0.0.0.0", "::", ""):
            host = self.group.peers[self.group.self_id][0]
        return format_address((host, port))

    def listen_address_text(self) -> str | None:
        return format_address(self.listen_address) if self.listen_address is not None else None

    def addresses(self) -> dict:
        return {"role": self.role_state.role.name, "listen": format_address(self.listen_address),
                "raft_listen": format_address(self.raft_address), "group": self.group.group,
                "self_id": self.group.self_id, "pid": os.getpid(), "store": self.config.store,
                **({"metrics_listen": format_address(self.metrics_address)} if self.metrics_address else {})}  # fmt: skip

    # -- commit, dispatch, role ----------------------------------------------------------

    def _on_commit(self) -> None:
        """Answer the puts the commit covers, then dispatch what it committed to the consume
        queues inline, up to DISPATCH_INLINE_BYTES_MAX (a commit usually covers a few entries:
        the dispatcher task cost two task steps per commit); the dispatcher does the rest, in
        batches with a checkpoint between them."""
        self.replicator.committed()
        store = self.store
        if store.dispatched_index < store.entries.committed_index:
            store.dispatch(DISPATCH_INLINE_BYTES_MAX)
            if store.dispatched_index < store.entries.committed_index and store.dispatch_error is None:
                self._dispatch_wakeup.set()

    async def _dispatcher(self) -> None:
        while True:
            with trio.move_on_after(DISK_FULL_RETRY_SECONDS if self.store.dispatch_blocked else math.inf):
                await self._dispatch_wakeup.wait()
            self._dispatch_wakeup = trio.Event()
            while self.store.dispatch():
                await trio.lowlevel.checkpoint()
            self._on_role()

    async def _consume_queue_flusher(self) -> None:
        """Flush the consume queues in a worker thread, as the classic broker's housekeeping
        does: an msync in the loop stalled every put for its duration once a second (p99).
        Safe beside the dispatcher's appends (``ConsumeQueueStore.flush`` copies the queue list;
        a file's flush reads its write position once); anything that deletes consume queue
        files must hold ``maintenance`` too."""
        while True:
            await trio.sleep(CONSUME_QUEUE_FLUSH_INTERVAL_SECONDS)
            async with self.maintenance:
                await trio.to_thread.run_sync(self.store.flush_consume_queues)

    async def _retention(self) -> None:
        """DLedger's CleanSpaceService, every ``dledger_clean_interval_seconds``: delete expired
        head files, never an entry the core's ``retention_floor`` keeps (what some member may
        still need) unless the disk is above ``disk_clean_ratio`` (then a member left behind is
        RESET by the leader to its first index: ``behind_log_start`` until it answered). Runs on
        the trio thread, not a worker: appends, the dispatcher and the deletion share the file
        lists (a pass unlinks at most ``delete_segments_per_pass_max`` files); with the entry
        files quiet (``files_quiet``: no sync of a file being deleted) and ``maintenance`` held
        (no consume queue flush meanwhile)."""
        store = self.store
        while True:
            await trio.sleep(self.config.dledger_clean_interval_seconds)
            over_ratio = disk_used_ratio(store.path) > store.config.disk_clean_ratio
            keep_from = node_keep_from(self.driver.node, over_ratio=over_ratio, now=trio.current_time())  # never strands a member that is down
            async with self.maintenance, self.driver.files_quiet():
                deleted = store.clean_expired(keep_from_index=keep_from, over_ratio=over_ratio)
            self.retention_passes += 1
            if deleted:
                LOGGER.warning("retention deleted %d file(s)%s; the log starts at entry %d (offset %d)", len(deleted),
                               " (disk above disk_clean_ratio: regardless of the members' needs)" if over_ratio else "",
                               store.entries.first_index(), store.min_offset)  # fmt: skip

    async def _scrub(self) -> None:
        """The member's store re-checked in the background (``commitlog.scrub.EntryScrubber``),
        ``scrub_bytes_per_second`` (0: off): every data file, every entry whole (header against
        its index unit, bodyCrc, the message's CRCs) and its consume-queue units (rewritten from
        the record where they differ). A damaged entry -- found by the scrub, or by a read
        (STATUS ``damaged``) -- is repaired in place from a member that holds it committed
        (``_repair_entry``): never cut, and nothing of a healthy copy changes. On the trio thread,
        a step of at most DLEDGER_SCRUB_STEP_BYTES at a time with ``maintenance`` held, as
        retention runs (the entry files are never reset or deleted under it)."""
        rate = self.store.config.scrub_bytes_per_second
        if rate <= 0:
            return
        self.scrubber = EntryScrubber(self.store)
        tried: set[tuple[str, int]] = set()  # damage reads found that a repair was tried for this pass
        while True:
            async with self.maintenance:
                step = self.scrubber.step(DLEDGER_SCRUB_STEP_BYTES)
            for topic, queue_id, queue_offset in step.units_repaired:
                LOGGER.warning("scrub: consume queue %s/%d unit %d did not match its record: rewritten from it",
                               topic, queue_id, queue_offset)  # fmt: skip
            for damage in step.damaged:
                tried.add((damage.file, damage.from_offset))
                if self.store.record_damage(damage):
                    LOGGER.error("scrub: damaged entry at %s: repairing it from a member that holds it", damage.describe())
                for attempt in range(1, REPAIR_ATTEMPTS_PER_PASS + 1):  # the peers' ports are learnt as they connect
                    if await self._repair_entry(damage, damage.index, damage.from_offset,
                                                last_attempt=attempt == REPAIR_ATTEMPTS_PER_PASS):  # fmt: skip
                        self.scrubber.repaired(damage)
                        break
                    if attempt < REPAIR_ATTEMPTS_PER_PASS:
                        await trio.sleep(REPAIR_RETRY_SECONDS)
                else:
                    self.scrubber.skip(damage)
            for damage in [d for d in self.store.read_damaged if (d.file, d.from_offset) not in tried]:
                tried.add((damage.file, damage.from_offset))  # found by a read: once a pass
                found = self.store.damaged_entry(damage)
                if found is not None:
                    await self._repair_entry(damage, *found)
            if step.pass_completed:
                tried.clear()
                await trio.sleep(SCRUB_PASS_PAUSE_SECONDS)
            else:
                await trio.sleep(max((step.checked_to - step.checked_from) / rate, SCRUB_STEP_PAUSE_MIN_SECONDS))
        raise AssertionError("unreachable")

    async def _repair_entry(self, damage, index: int, pos: int, *, last_attempt: bool = True) -> bool:
        """Fetch committed entry ``index`` (at data offset ``pos``) from each member that announced
        its client port in turn, with READ (the members' data files are byte-identical), and
        write the first copy that checks over this member's (``DLedgerMessageStore.repair_entry``:
        the entry, its message and agreement with what is left of this copy). True once repaired;
        False when no member gave a copy that checks (said in one line on the ``last_attempt``:
        where, what each member answered, and that the next pass tries again)."""
        tried = []
        for member, address in sorted(self.driver.peer_client_addresses.items()):
            if member == self.group.self_id or not address:
                continue
            try:
                with trio.fail_after(REPAIR_FETCH_TIMEOUT_SECONDS):
                    data = await self._fetch_entry(address, pos)
            except REPAIR_FETCH_ERRORS as error:
                tried.append(f"{member}: {transport.describe(error) if isinstance(error, OSError) else error}")
                continue
            async with self.maintenance:
                try:
                    rewritten = self.store.repair_entry(index, pos, data)
                except StoreError as error:
                    tried.append(f"{member}: {error}")
                    continue
            LOGGER.warning("scrub: entry %d at offset %d repaired from %s's copy (%s)", index, pos, member,
                           ", ".join(rewritten) or "this copy was whole again: nothing rewritten")  # fmt: skip
            return True
        if last_attempt:
            LOGGER.error("scrub: damaged entry at %s not repaired: no member gave a copy that checks (%s); it stays in "
                         "STATUS damaged, reads of it answer DAMAGED, and the scrub tries again next pass",
                         damage.describe(), "; ".join(tried) or ("a group of one has no other copy" if len(self.group.peers) == 1
                                                                  else "no member's client port is known yet"))  # fmt: skip
        return False

    async def _fetch_entry(self, address: str, pos: int) -> bytes:
        """The stored bytes of the entry at data offset ``pos`` on the member at ``address``
        (READ serves committed entries only, headers included), its header's size long."""
        async with connect(address, self.config.secret, tls_ca=self.config.tls_ca) as client:
            data = bytearray(await client.read(pos, size_max=ENTRY_HEADER_SIZE))
            size = int.from_bytes(data[4:8], "big", signed=True) if len(data) >= 8 else -1
            if not ENTRY_HEADER_SIZE <= size <= ENTRY_SIZE_MAX:
                raise ClientError(f"no entry at offset {pos} there (size word {size})")
            while len(data) < size:
                more = await client.read(pos + len(data), size_max=size - len(data))
                if not more:
                    raise ClientError(f"the entry at offset {pos} ends at {pos + len(data)} there")
                data += more
            return bytes(data[:size])

    def _on_role(self) -> None:
        """Play SYNC_MASTER while leading with every entry committed and dispatched, else SLAVE."""
        node = self.driver.node
        leading = node.role is Role.LEADER
        if not leading:
            leader = node.leader_id
            client = self.driver.client_address_of(leader)
            self.role_state.leader_hint = (f"the leader is {leader} (raft {format_address(self.group.peers[leader])}"
                                           + (f", client {client}" if client else "") + ")"
                                           if leader else "no leader is known yet")  # fmt: skip
        if self._taking_writes and not leading:
            self._taking_writes = False
            self.role_state.role = BrokerRole.SLAVE
            self.store.discard_plans()
            self.put_service.fail_ack_waits()
            LOGGER.warning("no longer leading (term %d): writes refused, waiting puts failed", node.term)
        elif leading and not self._taking_writes:
            if self.store.dispatched_index < self.store.entries.committed_index:
                self._dispatch_wakeup.set()
                return
            if not self.store.caught_up() or self._rebuilding_for == node.term:
                return
            self._rebuilding_for = node.term
            self._nursery.start_soon(self._take_writes, node.term)

    async def _take_writes(self, term: int) -> None:
        """Rebuild the producer table (the log's last ``producer_table_rebuild_bytes``) in a worker
        thread, then take writes if this member still leads ``term``. In the event loop the scan
        held it for up to 1.8 s on a busy machine: no heartbeats went out, the followers elected
        another leader, and a drill's failover took 10-20 s of leaders deposed as they began."""
        node = self.driver.node
        started = trio.current_time()
        try:
            async with self.maintenance:  # never beside retention deleting the files it reads
                found = await trio.to_thread.run_sync(functools.partial(
                    rebuild_producer_table, self.store, self.producers, span_bytes=self.config.producer_table_rebuild_bytes))
        finally:
            self._rebuilding_for = None
        if node.role is not Role.LEADER or node.term != term or self._taking_writes or not self.store.caught_up():
            self._on_role()  # a later term, or a step down meanwhile: decide again from now
            return
        self.store.resume_queue_offsets()
        self._taking_writes = True
        self.role_state.role = BrokerRole.SYNC_MASTER
        LOGGER.warning("leading term %d: taking writes from index %d (producer table: %d sequence(s) in %.3f s)", term,
                       self.store.entries.last_index() + 1, found, trio.current_time() - started)  # fmt: skip

    # -- status --------------------------------------------------------------------------

    def status(self) -> dict:
        node = self.driver.node
        raft = node.status(trio.current_time())
        stats = self.store.statistics()
        leader = raft.leader_id
        status = {
            "mode": "dledger", "group": self.group.group, "self_id": self.group.self_id,
            "role": self.role_state.role.name, "raft_role": raft.role.value, "term": raft.term, "epoch": raft.term,
            "leader_id": leader, "leader_address": format_address(self.group.peers[leader]) if leader else None,
            "leader_client_address": self.driver.client_address_of(leader),
            "ledger_begin_index": self.store.entries.first_index(), "ledger_end_index": raft.ledger_end_index,
            "committed_index": raft.committed_index, "flushed_index": raft.flushed_index,
            "dispatched_index": self.store.dispatched_index, "pending_proposals": raft.pending_count,
            "min_offset": stats.min_offset, "max_offset": stats.max_offset, "committed_offset": stats.committed_offset,
            "dispatched_offset": stats.dispatched_offset, "flushed_offset": stats.flushed_offset,
            "listen": format_address(self.listen_address), "raft_listen": format_address(self.raft_address),
            "pid": os.getpid(), "store": self.config.store,
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "duplicate_sends": self.put_service.duplicate_sends,
            "raft_messages_dropped": self.driver.dropped_messages,
            "raft_connections_refused": self.driver.refused_connections,
            **self.driver.admission.statistics(), **self.client_port.admission.statistics(),
            **self.client_port.answer_budget.statistics(),
            "appends_dropped_disk_full": self.driver.appends_dropped_disk_full,
            "retention_floor_index": node.retention_floor(), "retention_passes": self.retention_passes,
            "scrub": self.scrubber.statistics.to_json() if self.scrubber is not None else None,
            "catch_up_index": raft.catch_up_index,
            "damaged": [damage.to_json() for damage in self.store.damaged],
            "peers": {peer: {"match_index": p.match_index, "lag_entries": p.lag_entries,
                             "behind_log_start": p.behind_log_start,
                             "last_contact_seconds": None if p.last_contact_seconds == float("inf") else round(p.last_contact_seconds, 3),
                             "connected": self.driver.connected.get(peer, False)}
                      for peer, p in raft.peers.items()},
        }  # fmt: skip
        if self.store.disk.full:
            status["disk_full"] = self.store.disk.reason
        if self.store.dispatch_blocked is not None:
            status["dispatch_blocked"] = self.store.dispatch_blocked
        return status
