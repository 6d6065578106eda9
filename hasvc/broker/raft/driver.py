"""The Raft driver: one ``RaftNode`` over trio (see ``hasvc.broker.raft``). It carries each
``Ready`` out in the core's order (``drain``: hard state saved, log truncated or reset and
appended, messages to the peers, the commit to the store, role changes to its owner), proposes
(``propose_plan``: a leader's refusal for a full disk first), ticks the core at its deadline,
writes the checkpoint, and hands leadership over. Its concerns of their own, each a class beside
it: ``RaftSenders`` (``peers.py``: one outbound connection per peer), ``RaftListener``
(``listener.py``: the Raft port's inbound connections, stepping what they read) and ``EntrySync``
(``sync.py``: the entry files' syncs and ``files_quiet``). Its owner (``RaftBroker``, the
controller) reads ``node`` (replaced after an append the disk refused) and the counters."""

from __future__ import annotations

import dataclasses
import logging
import math
import random

import trio

from commitlog import record as rec
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.mapped_file import DiskFullError, StoreError, is_disk_full
from commitlog.store import AppendResult
from hasvc import admission as port_admission
from hasvc.broker.raft.group import GroupConfig
from hasvc.broker.raft.listener import RaftListener
from hasvc.broker.raft.peers import RaftSenders
from hasvc.broker.raft.sync import EntrySync
from hasvc.state.raft.node import RaftNode
from hasvc.state.raft.ready import Proposed, Role

LOGGER = logging.getLogger(__name__)

# DLedger checkPointInterval (3 s).
CHECKPOINT_INTERVAL_SECONDS = 3.0
# A full disk lasts: each kind of failure (no room for an APPEND, the warm-up, the checkpoint) is
# logged at most once per this long.
DISK_FULL_LOG_INTERVAL_SECONDS = 30.0


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
        self._wakeup = trio.Event()
        self._timer_deadline = -math.inf  # what the timer task sleeps to (-inf: not asleep yet)
        self._transfer_wait: TransferWait | None = None
        # Held by whoever deletes or flushes consume-queue files (the broker's), and by a reset.
        self.maintenance = maintenance if maintenance is not None else trio.Lock()
        self.client_address = ""  # this member's client port, sent in every HELLO (set before run)
        self.peer_ssl_context = None  # TLS to the peers' Raft ports (--tls-cert; verified with --tls-ca), set before run
        self._disk_full_logged_at: dict[str, float] = {}  # kind -> when it was last logged
        # The last proposal was refused for want of room (its files could not be made), and none
        # has passed the room check since: the core's ``disk_full`` (a hand-over to a member with
        # room) holds while this member cannot append, not only until the store's next disk
        # measurement, which with the ratio unreached says "not full" again (disk_check_interval).
        self.no_room = False
        self.sync = EntrySync(self)
        self.senders = RaftSenders(self)
        self.listener = RaftListener(self)
        # Read by the owner's STATUS and repair (the same objects as the parts': never replaced).
        self.connected = self.senders.connected
        self.admission = self.listener.admission
        self.peer_client_addresses = self.listener.peer_client_addresses

    @property
    def dropped_messages(self) -> int:
        """Messages to peers dropped: a full queue, no connection, entries no longer held."""
        return self.senders.dropped_messages

    @property
    def refused_connections(self) -> int:
        """Inbound Raft connections refused: preface, HELLO, a bad frame."""
        return self.listener.refused_connections

    @property
    def appends_dropped_disk_full(self) -> int:
        """APPEND pushes dropped: no room for their files."""
        return self.listener.appends_dropped_disk_full

    def log_disk_full(self, kind: str, error: BaseException) -> None:
        """One line per kind per DISK_FULL_LOG_INTERVAL_SECONDS."""
        now = trio.current_time()
        if now >= self._disk_full_logged_at.get(kind, -math.inf) + DISK_FULL_LOG_INTERVAL_SECONDS:
            self._disk_full_logged_at[kind] = now
            LOGGER.warning("raft: %s: the disk is full (said at most every %.0f s): %s", kind,
                           DISK_FULL_LOG_INTERVAL_SECONDS, error)  # fmt: skip

    # -- carrying a Ready out ------------------------------------------------------------

    def drain(self) -> None:
        if self.no_room and self.node.role is not Role.LEADER:
            self.no_room = False  # a leader's want of room; a follower's is its listener's (``_room_for``)
        self.node.disk_full = self.no_room or self.store.disk_full()  # for the core's next event: hasvc.state.raft.disk_room
        ready = self.node.ready()
        entries = self.store.entries
        if ready.hard_state is not None:
            entries.save_hard_state(ready.hard_state)
        if ready.reset is not None:
            assert self.sync.quiet_holds and not self.sync.syncing, "reset outside files_quiet"
            assert self.maintenance.statistics().owner is trio.lowlevel.current_task(), "reset without maintenance"
            LOGGER.warning("raft: reset by the leader: entries %d..%d and the consume queues dropped; the log starts "
                           "empty at entry %d (offset %d), the leader's first", entries.first_index(),
                           entries.last_index(), ready.reset.first_index, ready.reset.first_offset)  # fmt: skip
            self.store.reset_log(ready.reset)
        if ready.truncate_after is not None:
            assert self.sync.quiet_holds and not self.sync.syncing, "truncate outside files_quiet"
            entries.truncate(after_index=ready.truncate_after)
        try:
            if ready.entries:
                run = self.store.take_run(ready.entries)  # a proposal its planner framed already: one pwrite
                if run is not None:
                    entries.append_framed(run)
                else:
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
            self.senders.send(ready.messages)
        flush = appended and self.group.raft.flush_sync
        if flush and self.node.role is not Role.LEADER and self.sync.after_append(inline_only=True):
            # A follower's flush in the loop, and the acknowledgement it releases, before the
            # commit this push carried is applied: that dispatch (the consume queues) was on the
            # leader's path to every put's answer at one writer. A flush for the worker thread
            # still starts after it (measured at one writer only; started first, the thread
            # would wait for the GIL the dispatch holds). A leader applies its commit first (the
            # puts' answers), then flushes.
            flush = False
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
        if flush:
            self.sync.after_append()

    def _append_failed(self, error: DiskFullError) -> None:
        """The Ready's entries could not be stored (a full disk the driver did not see coming:
        the leader's term-start no-op, a file boundary ``make_room`` did not cover): the core
        believes it holds them, so it starts over from what the store holds, as after a
        restart without losing anything (its hard state was saved first): a follower of its
        term, which the broker sees as a role change (waiting puts fail). The Ready's messages
        are dropped, which Raft survives. The process goes on."""
        self.log_disk_full("append", error)
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
            self.no_room = True
            return AppendResult(rec.PutMessageStatus.DISK_FULL, reason=str(error))
        self.no_room = False
        return None

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
        nursery.start_soon(self.sync.ticker)
        nursery.start_soon(self._checkpointer)
        for peer in self.senders.queues:
            nursery.start_soon(self.senders.sender, peer)
        nursery.start_soon(port_admission.serve_admitted, listener, self.listener.serve_peer, self.admission)

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

    def files_quiet(self):
        """Hold off the entry files' syncs while the caller cuts or deletes files (a truncate,
        retention): ``EntrySync.files_quiet``, an async context manager."""
        return self.sync.files_quiet()

    async def close(self) -> None:
        """Start no more syncs and wait for the one that runs (``EntrySync.close``)."""
        await self.sync.close()

    async def _checkpointer(self) -> None:
        while True:
            await trio.sleep(CHECKPOINT_INTERVAL_SECONDS)
            try:
                self.store.write_checkpoint()
            except (StoreError, OSError) as error:  # the entries' checkpoint is written to a new file, renamed
                if not is_disk_full(error):
                    raise
                self.log_disk_full("checkpoint", error)


    def client_address_of(self, member: str | None) -> str | None:
        """The client port ``member`` announced (this member's own too), None if unknown."""
        if member is None:
            return None
        if member == self.group.self_id:
            return self.client_address or None
        return self.peer_client_addresses.get(member)


