"""The Raft driver: one ``RaftNode`` over trio (see ``hasvc.broker.raft``): the Raft port, one
outbound connection per peer, the timer, the entry files' background flush, proposals."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import random

import trio

from commitlog import record as rec
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.mapped_file import DiskFullError, StoreError, is_disk_full
from commitlog.store import AppendResult
from hasvc import admission as port_admission
from hasvc import transport
from hasvc.broker.raft.group import GroupConfig
from hasvc.config import format_address
from hasvc.protocol import raft as raft_wire
from hasvc.protocol import wire
from hasvc.state.raft.messages import Push, PushResponse, PushType, ResetPush
from hasvc.state.raft.node import RaftNode
from hasvc.state.raft.ready import Proposed, Role

LOGGER = logging.getLogger(__name__)


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
# A full disk lasts: each kind of failure (no room for an APPEND, the warm-up, the checkpoint) is
# logged at most once per this long, and the warm-up and a blocked dispatch try again after
# DISK_FULL_RETRY_SECONDS (each warm-up try creates and removes a whole file).
DISK_FULL_LOG_INTERVAL_SECONDS = 30.0
DISK_FULL_RETRY_SECONDS = 1.0


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

