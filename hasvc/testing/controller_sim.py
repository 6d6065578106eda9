"""Deterministic simulation of controller mode: a controller group, 2-3 brokers and a client under
seeded faults, on the real pure cores (``hasvc.state.controller``), checked after every step.

    python -m hasvc.testing.sim controller --seeds 10000 [--first-seed 0]
    python -m hasvc.testing.sim controller --seed S          # replay one seed, printing its report

The model
---------
* **Controllers** ``c0 c1 c2`` share one linearizable ``ControllerState`` (what their Raft log
  gives them) and one of them leads at a time, with its own ``ElectionTracker`` (soft state, lost
  at every change). A leader proposes commands (``Register``, ``Elect`` from ``decide`` every
  ``DECIDE_EVERY_SECONDS``, ``AlterSyncStateSet`` from masters); a proposal commits after a few
  milliseconds while its leader is in office. A **leader change** ends the old leader's office a
  moment later (it answers until then: its Raft lease), leaves a gap of a Raft election timeout
  (``CONTROLLER_ELECTION_SECONDS``, not below the master lease: the condition ``elect`` states),
  and the proposals the old leader had not committed are each applied or lost before the new
  leader answers anything (Raft: they were or were not in the new leader's log). A controller
  that is not the leader answers NOT_LEADER naming the leader when one is in office.
* **Brokers** run ``agent.plan`` on every heartbeat answer and, as master, a
  ``SyncStateSetTracker``. Their log is a list of write ids (one offset unit each) with an epoch
  table (``commitlog.epoch``). The data path is the classic one, reduced: a slave says hello with
  its epoch table, cuts its log to the consistent point with the master's table and adopts it,
  then the master sends batches from the slave's last ack and the slave appends and acks. A
  master acknowledges a write when ``confirm_offset(now)`` reaches it (lease, set size, every
  counted member holds it); writes wait at most ``WRITE_TIMEOUT_SECONDS``.
* **Faults**: broker kills and restarts (a process kill: the page cache survives, so a killed
  broker's log is intact; power loss is *not* modelled), partitions (a broker alone, a broker with
  the client -- a master the clients reach but the controllers do not --, the controllers alone,
  any split of brokers, client and controllers),
  heals, message delay, loss, duplication and reordering, controller leader changes, and an
  operator's switchover (an ``Elect`` of another alive member of the set while the master lives).
  Unclean election is allowed in ``UNCLEAN_SHARE`` of the seeds.

The invariants (``ControllerChecker``)
-------------------------------------
* never two brokers acting as master with a lease that holds at the same instant (so never two
  acknowledging at once), and at most one broker acknowledges in any epoch;
* acknowledgements' epochs never go back (no acknowledgement in an epoch older than one already
  acknowledged in), the controller's epochs only grow (``GroupState.check_successor``), and (with
  unclean election off) no broker's epoch table goes back to an older last epoch when it follows
  a master;
* with unclean election off: every acknowledged write is in a new master's log when it takes
  office, no slave ever cuts an acknowledged write, and at the end every acknowledged write is in
  the master's log;
* liveness, after faults stop and the network heals: the controller's master acknowledges
  writes within ``SETTLE_SECONDS`` (in its last ``SETTLE_PROGRESS_SECONDS``).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Callable
from typing import Any

from commitlog.epoch import EpochEntry, find_consistent_point, validate
from hasvc.state.controller import agent
from hasvc.state.controller.config import ControllerTimings
from hasvc.state.controller.elect import ElectionTracker, HeartbeatAnswer
from hasvc.state.controller.state import AlterSyncStateSet, ControllerState, Elect, Register
from hasvc.state.controller.sync_set import SyncStateSetTracker
from hasvc.testing.checker import SafetyViolation
from hasvc.testing.network import NetworkConfig, SimNetwork

GROUP = "g"
CONTROLLERS = ("c0", "c1", "c2")
CLIENT = "client"
CHAOS_SECONDS = 4.0  # simulated seconds of faults
SETTLE_SECONDS = 4.0  # healed, all up: then the master must acknowledge writes again
SETTLE_PROGRESS_SECONDS = 1.0  # ... within this last part of the settle
DECIDE_EVERY_SECONDS = 0.05  # how often the controller leader runs decide()
COMMIT_DELAY_SECONDS = (0.002, 0.01)  # a controller proposal's Raft round trip
CONTROLLER_ELECTION_SECONDS = (0.4, 0.6)  # the controller group's election timeout (>= the master lease)
DEPOSED_TAIL_SECONDS = 0.05  # a deposed controller leader answers at most this long after the change
TRANSFER_EVERY_SECONDS = 0.005  # a master sends to each slave behind it this often
BATCH_SIZE_MAX = 32  # writes per transfer
HELLO_RETRY_SECONDS = 0.3  # a slave with no word from its master says hello again after this
SESSION_IDLE_SECONDS = 1.0  # a master drops a slave session silent this long (the HA housekeeping)
WRITE_TIMEOUT_SECONDS = 1.0  # a write waiting for acks longer than this fails (FLUSH_SLAVE_TIMEOUT)
CLIENT_RETRY_SECONDS = 0.3  # the client tries another broker after this long without an answer
UNCLEAN_SHARE = 0.1  # of the seeds allow unclean election (the loss checks are off there)


@dataclasses.dataclass(frozen=True, slots=True)
class SeedReport:
    seed: int
    brokers: int
    min_in_sync_replicas: int
    unclean: bool
    events: int
    crashes: int
    acked: int
    elections: int
    controller_changes: int
    switchovers: int
    truncations: int
    set_changes: int
    # Simulated seconds from a master's kill to the first write acknowledged in a newer epoch,
    # one per kill of an acknowledging master followed by a failover (other faults may intervene).
    failovers: tuple[float, ...] = ()


# -- messages ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ControllerRequest:
    request_id: int
    body: Any  # Register | HeartbeatBody | AlterSyncStateSet


@dataclasses.dataclass(frozen=True, slots=True)
class HeartbeatBody:
    broker_id: int
    epoch: int
    max_offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class ControllerReply:
    request_id: int
    status: str  # OK, NOT_LEADER
    leader: str | None = None
    body: Any = None  # broker id (Register), HeartbeatAnswer, (accepted, set, set epoch) (Alter)


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    session: int
    slave_id: int
    epochs: tuple[EpochEntry, ...]
    end: int


@dataclasses.dataclass(frozen=True, slots=True)
class HelloAnswer:
    session: int
    epochs: tuple[EpochEntry, ...]
    end: int


@dataclasses.dataclass(frozen=True, slots=True)
class Transfer:
    session: int
    from_offset: int
    items: tuple[tuple[int, int], ...]  # (epoch, write id)


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    session: int
    slave_id: int
    offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class Bye:
    session: int
    slave_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class Put:
    write_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class PutReply:
    write_id: int
    ok: bool
    master: str | None = None


# -- the checker ---------------------------------------------------------------------------------


class ControllerChecker:
    def __init__(self, unclean: bool) -> None:
        self.unclean = unclean
        # (write id, offset) -> epoch; a duplicated Put is stored (and may be acknowledged) twice
        self.acked: dict[tuple[int, int], int] = {}
        self.ackers: dict[int, str] = {}  # epoch -> the broker that acknowledged in it
        self.acked_epoch_max = 0
        self.killed_master: tuple[float, int] | None = None  # (when, its epoch): a failover under way
        self.failovers: list[float] = []

    def on_kill(self, epoch: int, now: float) -> None:
        if self.killed_master is None and epoch == self.acked_epoch_max:
            self.killed_master = (now, epoch)

    def on_ack(self, broker: str, epoch: int, offset: int, write_id: int, now: float) -> None:
        if self.killed_master is not None and epoch > self.killed_master[1]:
            self.failovers.append(now - self.killed_master[0])
            self.killed_master = None
        other = self.ackers.setdefault(epoch, broker)
        if other != broker:
            raise SafetyViolation(f"{broker} and {other} both acknowledged writes in epoch {epoch}")
        if epoch < self.acked_epoch_max:
            raise SafetyViolation(f"{broker} acknowledged in epoch {epoch} after an acknowledgement in epoch "
                                  f"{self.acked_epoch_max}")  # fmt: skip
        self.acked_epoch_max = epoch
        assert (write_id, offset) not in self.acked
        self.acked[(write_id, offset)] = epoch

    def missing(self, log: list[int]) -> list[int]:
        return sorted(w for w, offset in self.acked if offset >= len(log) or log[offset] != w)

    def on_promote(self, broker: str, epoch: int, log: list[int]) -> None:
        if not self.unclean and (lost := self.missing(log)):
            raise SafetyViolation(f"{broker} became master in epoch {epoch} without acknowledged writes {lost[:5]}")

    def on_truncate(self, broker: str, log: list[int], cut: int) -> None:
        if self.unclean:
            return
        gone = [w for offset, w in enumerate(log[cut:], cut) if (w, offset) in self.acked]
        if gone:
            raise SafetyViolation(f"{broker} cut acknowledged writes {gone[:5]} (log cut to {cut})")

    def masters_at_once(self, masters: list[str], now: float, what: str) -> None:
        if len(masters) > 1:
            raise SafetyViolation(f"{masters} all act as master {what} at {now:.4f}")


# -- mutations: one core rule broken on purpose, to see the checker catch it ------------------------


class _ExpandAfterAccept(SyncStateSetTracker):
    """apache/rocketmq#5663: a pending expansion not waited for until the controller accepts it."""

    __slots__ = ()

    def counted_members(self) -> frozenset[int]:
        if self.proposal is not None and self.proposal.new_set > self.sync_state_set:
            return self.sync_state_set
        return super().counted_members()


class _ShrinkBeforeAccept(SyncStateSetTracker):
    """A pending shrink taken at once: the slave still in the controller's set stops being waited for."""

    __slots__ = ()

    def counted_members(self) -> frozenset[int]:
        if self.proposal is not None and self.proposal.new_set < self.sync_state_set:
            return self.proposal.new_set
        return super().counted_members()


class _AckWithoutLease(SyncStateSetTracker):
    __slots__ = ()

    def confirm_offset(self, now: float) -> int | None:
        return self.ack_watermark() if self.admit() else None


class _GrantWithoutHold(ElectionTracker):
    """Renew a lease to a master the leader decided lapsed, and to a new master at once."""

    __slots__ = ()

    def _may_grant(self, name, group, now) -> bool:
        return now >= self.leader_since


class _ElectOutsideSet(ElectionTracker):
    """Elect the best alive member whether in the SyncStateSet or not (unclean, unannounced)."""

    __slots__ = ()

    def _choose(self, name, group, now, *, exclude):
        alive = [b for b in sorted(group.members) if b != exclude and self.alive(name, b, now)]
        return self._best(name, alive), True


MUTATIONS = {"expand-after-accept": "tracker", "shrink-before-accept": "tracker", "ack-without-lease": "tracker",
             "grant-without-hold": "elect", "elect-outside-set": "elect"}  # fmt: skip
_MUTATED = {"expand-after-accept": _ExpandAfterAccept, "shrink-before-accept": _ShrinkBeforeAccept,
            "ack-without-lease": _AckWithoutLease, "grant-without-hold": _GrantWithoutHold,
            "elect-outside-set": _ElectOutsideSet}  # fmt: skip


# -- the brokers ---------------------------------------------------------------------------------


class Broker:
    def __init__(self, sim: ControllerSim, name: str) -> None:
        self.sim = sim
        self.name = name
        self.identity = f"store-{name}"
        self.log: list[int] = []  # write ids, one offset each
        self.log_epochs: list[int] = []  # the epoch of each offset (for transfers)
        self.epochs: list[EpochEntry] = []
        self.broker_id: int | None = None
        self.up = True
        self.reset_process()

    def reset_process(self) -> None:
        """What a process holds and loses on a kill (the log and epoch table stay)."""
        self.role = agent.Role.NONE
        self.following: int | None = None
        self.master_node: str | None = None
        self.tracker: SyncStateSetTracker | None = None
        self.waiters: dict[int, tuple[int, float]] = {}  # end offset -> (write id, deadline)
        self.sessions: dict[int, dict] = {}  # master: slave id -> {session, ack, sent_end, heard_at, node}
        self.session = 0  # slave: the current session with its master (0: none)
        self.handshaken = False  # slave: the session's handshake is done (one per session, as one per TCP connection)
        self.heard_master_at = -math.inf
        self.controller = self.sim.rng.choice(CONTROLLERS)
        self.requests: dict[int, tuple[float, Any]] = {}  # request id -> (sent at, body)
        self.answered_at = -math.inf
        self.generation = getattr(self, "generation", 0) + 1  # timers of an older process are void

    @property
    def last_epoch(self) -> int:
        return self.epochs[-1].epoch if self.epochs else 0

    def local(self) -> agent.LocalState:
        return agent.LocalState(self.broker_id, self.role, self.last_epoch, len(self.log), self.following)

    # -- controller traffic ----------------------------------------------------------------

    def ask_controller(self, body: Any) -> None:
        sim = self.sim
        if sim.now - self.answered_at > 3 * sim.timings.broker_heartbeat_interval_seconds:
            self.controller = CONTROLLERS[(CONTROLLERS.index(self.controller) + 1) % len(CONTROLLERS)]
            self.answered_at = sim.now  # give the next one its chance
        request_id = sim.next_id()
        self.requests[request_id] = (sim.now, body)
        if len(self.requests) > 64:
            self.requests.pop(next(iter(self.requests)))
        sim.network.send(self.name, self.controller, ControllerRequest(request_id, body), sim.now)

    def heartbeat_timer(self) -> None:
        sim = self.sim
        if self.broker_id is None:
            self.ask_controller(Register(GROUP, self.identity, f"{self.name}:client", self.name))
        else:
            self.ask_controller(HeartbeatBody(self.broker_id, self.last_epoch, len(self.log)))
        if self.tracker is not None:
            self.propose(self.tracker.tick(sim.now))
        self.check_sessions()

    def on_controller_reply(self, source: str, reply: ControllerReply) -> None:
        sim = self.sim
        sent = self.requests.pop(reply.request_id, None)
        if sent is None:
            return  # a duplicate, or too old
        sent_at, body = sent
        if reply.status == "NOT_LEADER":
            if reply.leader is not None:
                self.controller = reply.leader
            return
        self.answered_at = sim.now
        self.controller = source
        if isinstance(body, Register):
            self.broker_id = reply.body
        elif isinstance(body, HeartbeatBody):
            self.on_heartbeat_answer(reply.body, sent_at)
        elif self.tracker is not None and body.epoch == self.tracker.epoch:
            accepted, new_set, set_epoch, master_epoch = reply.body
            self.tracker.on_answer(body, accepted, new_set, set_epoch, master_epoch=master_epoch)
            self.propose(self.tracker.tick(sim.now))
            self.release()

    def on_heartbeat_answer(self, answer: HeartbeatAnswer, sent_at: float) -> None:
        sim = self.sim
        for effect in agent.plan(self.local(), answer, sent_at):
            if isinstance(effect, agent.Promote):
                self.promote(effect.epoch, answer)
            elif isinstance(effect, agent.FollowMaster):
                self.follow(effect.master_id, effect.ha_address)
            elif isinstance(effect, agent.RenewLease):
                self.tracker.renew(effect.sent_at)
            elif isinstance(effect, agent.Fence):
                self.tracker.lease_until = -math.inf
        if self.tracker is not None and answer.master_id == self.broker_id:
            self.tracker.on_heartbeat(answer.sync_state_set, answer.sync_state_set_epoch, master_epoch=answer.epoch)
            self.propose(self.tracker.tick(sim.now))
        self.release()

    def propose(self, proposal: AlterSyncStateSet | None) -> None:
        if proposal is not None:
            self.sim.set_changes += 1
            self.ask_controller(proposal)

    # -- roles -------------------------------------------------------------------------------

    def promote(self, epoch: int, answer: HeartbeatAnswer) -> None:
        sim = self.sim
        self.leave_master()
        if epoch > self.last_epoch:
            self.epochs.append(EpochEntry(epoch, len(self.log)))
            validate(self.epochs)
        sim.checker.on_promote(self.name, epoch, self.log)
        sim.elections += 1
        self.role = agent.Role.MASTER
        self.following = None
        self.session = 0
        start = self.epochs[-1].start_offset
        in_set = answer.sync_state_set if self.broker_id in answer.sync_state_set else frozenset({self.broker_id})
        self.tracker = sim.tracker_class(GROUP, self.broker_id, epoch, epoch_start_offset=start, master_end=len(self.log),
                                           sync_state_set=in_set, sync_state_set_epoch=answer.sync_state_set_epoch,
                                           timings=sim.timings, now=sim.now)  # fmt: skip

    def leave_master(self) -> None:
        for write_id, _ in self.waiters.values():
            self.sim.reply_client(self.name, PutReply(write_id, False))
        self.waiters.clear()
        self.sessions.clear()
        self.tracker = None

    def follow(self, master_id: int, master_node: str) -> None:
        self.leave_master()
        if self.session and self.master_node is not None:
            self.sim.network.send(self.name, self.master_node, Bye(self.session, self.broker_id), self.sim.now)
        self.role = agent.Role.SLAVE
        self.following = master_id
        self.master_node = master_node
        self.say_hello()

    # -- the data path: slave side -----------------------------------------------------------

    def say_hello(self) -> None:
        sim = self.sim
        self.session = sim.next_id()
        self.handshaken = False
        self.heard_master_at = sim.now
        sim.network.send(self.name, self.master_node, Hello(self.session, self.broker_id, tuple(self.epochs), len(self.log)),
                         sim.now)  # fmt: skip

    def check_sessions(self) -> None:
        sim = self.sim
        if self.role is agent.Role.SLAVE and sim.now - self.heard_master_at > HELLO_RETRY_SECONDS:
            self.say_hello()
        if self.tracker is not None:
            for slave_id, session in list(self.sessions.items()):
                if sim.now - session["heard_at"] > SESSION_IDLE_SECONDS:
                    del self.sessions[slave_id]
                    self.propose(self.tracker.on_disconnect(slave_id, sim.now))

    def on_hello_answer(self, message: HelloAnswer) -> None:
        sim = self.sim
        if self.role is not agent.Role.SLAVE or message.session != self.session or self.handshaken:
            return  # a duplicate: the network may deliver one twice, TCP never does
        self.handshaken = True
        self.heard_master_at = sim.now
        master_epochs = list(message.epochs)
        if not self.log:
            cut = 0
        else:
            cut = find_consistent_point(self.epochs, len(self.log), master_epochs, message.end)
            if cut < 0:
                if not sim.checker.unclean:
                    raise SafetyViolation(f"{self.name} shares no epoch with its master: {self.epochs} vs {master_epochs}")
                cut = 0
        if cut < len(self.log):
            sim.checker.on_truncate(self.name, self.log, cut)
            sim.truncations += 1
            del self.log[cut:]
            del self.log_epochs[cut:]
        known = self.last_epoch
        self.epochs = [entry for entry in master_epochs if entry.start_offset <= cut]
        validate(self.epochs)
        if self.last_epoch < known and not sim.checker.unclean:  # unclean: a master may lack our epochs
            raise SafetyViolation(f"{self.name} went back from epoch {known} to {self.last_epoch} "
                                  f"following {self.master_node}")  # fmt: skip
        sim.network.send(self.name, self.master_node, Ack(self.session, self.broker_id, len(self.log)), sim.now)

    def on_transfer(self, message: Transfer) -> None:
        sim = self.sim
        if self.role is not agent.Role.SLAVE or message.session != self.session or not self.handshaken:
            return
        self.heard_master_at = sim.now
        if message.from_offset == len(self.log):
            for epoch, write_id in message.items:
                if epoch != self.last_epoch:
                    assert epoch > self.last_epoch, (self.name, epoch, self.epochs)
                    self.epochs.append(EpochEntry(epoch, len(self.log)))
                self.log.append(write_id)
                self.log_epochs.append(epoch)
        sim.network.send(self.name, self.master_node, Ack(self.session, self.broker_id, len(self.log)), sim.now)

    # -- the data path: master side ----------------------------------------------------------

    def on_hello(self, source: str, message: Hello) -> None:
        sim = self.sim
        if self.tracker is None:
            return
        self.sessions[message.slave_id] = {"session": message.session, "ack": -1, "sent_end": len(self.log),
                                           "heard_at": sim.now, "node": source}  # fmt: skip
        sim.network.send(self.name, source, HelloAnswer(message.session, tuple(self.epochs), len(self.log)), sim.now)

    def on_ack(self, message: Ack) -> None:
        sim = self.sim
        session = self.sessions.get(message.slave_id)
        if self.tracker is None or session is None or session["session"] != message.session:
            return
        session["heard_at"] = sim.now
        if message.offset < session["ack"]:
            return  # reordered
        session["ack"] = message.offset
        sent_end = max(session["sent_end"], message.offset)
        self.propose(self.tracker.on_ack(message.slave_id, message.offset, sent_end, sim.now))
        self.release()

    def on_bye(self, message: Bye) -> None:
        session = self.sessions.get(message.slave_id)
        if self.tracker is not None and session is not None and session["session"] == message.session:
            del self.sessions[message.slave_id]
            self.propose(self.tracker.on_disconnect(message.slave_id, self.sim.now))
            self.release()

    def transfer_timer(self) -> None:
        sim = self.sim
        if self.tracker is None:
            return
        for session in self.sessions.values():
            if 0 <= session["ack"] < len(self.log):
                start = session["ack"]
                end = min(len(self.log), start + BATCH_SIZE_MAX)
                items = tuple(zip(self.log_epochs[start:end], self.log[start:end]))
                session["sent_end"] = len(self.log)
                sim.network.send(self.name, session["node"], Transfer(session["session"], start, items), sim.now)

    def on_put(self, message: Put) -> None:
        sim = self.sim
        tracker = self.tracker
        if tracker is None or tracker.confirm_offset(sim.now) is None:  # no lease, or too few in sync
            hint = None if tracker is not None else self.master_node
            sim.reply_client(self.name, PutReply(message.write_id, False, hint))
            return
        self.log.append(message.write_id)
        self.log_epochs.append(tracker.epoch)
        tracker.on_append(len(self.log))
        self.waiters[len(self.log)] = (message.write_id, sim.now + WRITE_TIMEOUT_SECONDS)
        self.release()

    def release(self) -> None:
        sim = self.sim
        tracker = self.tracker
        if tracker is None or not self.waiters:
            return
        confirm = tracker.confirm_offset(sim.now)
        for end in sorted(self.waiters):
            write_id, deadline = self.waiters[end]
            if confirm is not None and end <= confirm:
                sim.checker.on_ack(self.name, tracker.epoch, end - 1, write_id, sim.now)
                sim.reply_client(self.name, PutReply(write_id, True))
            elif sim.now >= deadline:
                sim.reply_client(self.name, PutReply(write_id, False))
            else:
                continue
            del self.waiters[end]


# -- the controllers -----------------------------------------------------------------------------


class Controllers:
    """The controller group: one state, one leader in office at a time."""

    def __init__(self, sim: ControllerSim) -> None:
        self.sim = sim
        self.state = ControllerState()
        self.leader = sim.rng.choice(CONTROLLERS)
        self.office = (0.0, math.inf)  # the leader answers in [start, end)
        self.term = 1
        self.tracker = sim.election_class(sim.timings)
        self.tracker.became_leader(0.0)
        self.pending: list[tuple[int, Any, Callable | None]] = []  # (term, command, on applied)
        self.index = 0

    def in_office(self, node: str) -> bool:
        return node == self.leader and self.office[0] <= self.sim.now < self.office[1]

    def change_leader(self) -> None:
        sim = self.sim
        if self.office[1] != math.inf:
            return  # a change under way
        deposed_at = sim.now + sim.rng.uniform(0, DEPOSED_TAIL_SECONDS)
        starts_at = deposed_at + sim.rng.uniform(*CONTROLLER_ELECTION_SECONDS)
        self.office = (self.office[0], deposed_at)
        sim.controller_changes += 1
        sim.at(starts_at, self.take_office)

    def take_office(self) -> None:
        sim = self.sim
        pending, self.pending = self.pending, []
        for _, command, _ in pending:
            if sim.rng.random() < 0.5:  # it reached the new leader's log: committed now, its answer lost
                self.apply(command)
        self.leader = sim.rng.choice(CONTROLLERS)
        self.term += 1
        self.office = (sim.now, math.inf)
        self.tracker = sim.election_class(sim.timings)
        self.tracker.became_leader(sim.now)

    def apply(self, command: Any):
        self.index += 1
        answer = self.state.apply(command, index=self.index)
        if isinstance(command, Elect) and answer.accepted:
            self.sim.epochs_elected.append(answer.group.epoch)
        return answer

    def propose(self, command: Any, on_applied: Callable | None) -> None:
        sim = self.sim
        entry = (self.term, command, on_applied)
        self.pending.append(entry)
        sim.at(sim.now + sim.rng.uniform(*COMMIT_DELAY_SECONDS), lambda: self.commit(entry))

    def commit(self, entry) -> None:
        term, command, on_applied = entry
        if term != self.term or not self.in_office(self.leader) or entry not in self.pending:
            return  # deposed first: settled when the next leader takes office
        self.pending.remove(entry)
        answer = self.apply(command)
        if on_applied is not None:
            on_applied(answer)

    def decide_timer(self) -> None:
        sim = self.sim
        if self.in_office(self.leader):
            for elect in self.tracker.decide(self.state, sim.now):
                self.propose(elect, None)

    def switchover(self) -> None:
        """An operator's ELECT: another alive member of the set, while the master lives."""
        sim = self.sim
        group = self.state.groups.get(GROUP)
        if group is None or group.master_id is None or not self.in_office(self.leader):
            return
        others = [b for b in sorted(group.sync_state_set - {group.master_id}) if self.tracker.alive(GROUP, b, sim.now)]
        if others:
            sim.switchovers += 1
            self.propose(Elect(GROUP, sim.rng.choice(others), group.epoch, "operator switchover"), None)

    def on_request(self, node: str, source: str, request: ControllerRequest) -> None:
        sim = self.sim
        if not self.in_office(node):
            leader = self.leader if self.in_office(self.leader) else None
            sim.network.send(node, source, ControllerReply(request.request_id, "NOT_LEADER", leader), sim.now)
            return
        body = request.body
        term = self.term

        def reply(answer_body: Any) -> None:
            if self.term == term and self.in_office(node):
                sim.network.send(node, source, ControllerReply(request.request_id, "OK", None, answer_body), sim.now)

        if isinstance(body, HeartbeatBody):
            if GROUP not in self.state.groups or body.broker_id not in self.state.groups[GROUP].members:
                return
            self.tracker.heartbeat(GROUP, body.broker_id, body.epoch, body.max_offset, sim.now)
            reply(self.tracker.answer(self.state, GROUP, body.broker_id, sim.now))
        elif isinstance(body, Register):
            self.propose(body, lambda answer: reply(answer.broker_id))
        else:
            def altered(answer) -> None:
                group = answer.group
                reply((answer.accepted, group.sync_state_set, group.sync_state_set_epoch, group.epoch))

            self.propose(body, altered)


# -- the simulation ------------------------------------------------------------------------------


class ControllerSim:
    def __init__(self, seed: int, mutation: str = "") -> None:
        rng = self.rng = random.Random(f"controller-sim-{seed}")
        self.seed = seed
        mutated = _MUTATED.get(mutation)
        self.tracker_class = mutated if MUTATIONS.get(mutation) == "tracker" else SyncStateSetTracker
        self.election_class = mutated if MUTATIONS.get(mutation) == "elect" else ElectionTracker
        names = ["b1", "b2"] if rng.random() < 0.4 else ["b1", "b2", "b3"]
        self.unclean = rng.random() < UNCLEAN_SHARE
        min_in_sync = rng.choice([1, 2, 2]) if len(names) == 2 else rng.choice([1, 2, 2, 3])
        self.timings = ControllerTimings(min_in_sync_replicas=min_in_sync, allow_unclean_election=self.unclean).validate()
        network = NetworkConfig(delay_min_seconds=0.0002, delay_max_seconds=rng.choice([0.001, 0.005, 0.02]),
                                drop_probability=rng.choice([0.0, 0.0, 0.01, 0.05]),
                                duplicate_probability=rng.choice([0.0, 0.01]),
                                straggler_probability=rng.choice([0.0, 0.0, 0.02]), straggler_delay_seconds=0.1,
                                fifo=rng.random() < 0.7)  # fmt: skip
        self.network = SimNetwork(random.Random(f"controller-sim-net-{seed}"), network)
        self.now = 0.0
        self.events = 0
        self._timers: list[tuple[float, int, Callable]] = []
        self._ids = 0
        self.checker = ControllerChecker(self.unclean)
        self.crashes = self.elections = self.controller_changes = self.switchovers = 0
        self.truncations = self.set_changes = 0
        self.epochs_elected: list[int] = []
        self.controllers = Controllers(self)
        self.brokers = {name: Broker(self, name) for name in names}
        self.client_target = rng.choice(names)
        self.client_heard_at = 0.0
        self.writes = 0

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def at(self, when: float, action: Callable) -> None:
        heapq.heappush(self._timers, (when, self.next_id(), action))

    def every(self, period: float, action: Callable, *, jitter: bool = True) -> None:
        def tick() -> None:
            action()
            self.at(self.now + period * (self.rng.uniform(0.8, 1.2) if jitter else 1), tick)

        self.at(self.now + self.rng.uniform(0, period), tick)

    def broker_timer(self, broker: Broker, period: float, action: Callable) -> None:
        generation = broker.generation

        def tick() -> None:
            if broker.up and broker.generation == generation:
                action()
                self.at(self.now + period, tick)

        self.at(self.now + self.rng.uniform(0, period), tick)

    def start_broker(self, broker: Broker) -> None:
        broker.up = True
        broker.reset_process()
        self.broker_timer(broker, self.timings.broker_heartbeat_interval_seconds, broker.heartbeat_timer)
        self.broker_timer(broker, TRANSFER_EVERY_SECONDS, broker.transfer_timer)
        self.broker_timer(broker, 0.05, broker.release)

    def crash(self, broker: Broker, *, restart_after: float | None = None) -> None:
        self.crashes += 1
        if broker.tracker is not None:
            self.checker.on_kill(broker.tracker.epoch, self.now)
        broker.up = False
        broker.reset_process()  # its waiting writes are never answered: the client's retry notices
        self.network.discard_to(broker.name)
        if restart_after is None:
            restart_after = self.rng.uniform(0.1, 1.5)
        self.at(self.now + restart_after, lambda: self.start_broker(broker) if not broker.up else None)

    def reply_client(self, broker: str, reply: PutReply) -> None:
        self.network.send(broker, CLIENT, reply, self.now)

    # -- the client and the faults -------------------------------------------------------------

    def client_timer(self) -> None:
        if self.now - self.client_heard_at > CLIENT_RETRY_SECONDS:
            names = list(self.brokers)
            self.client_target = names[(names.index(self.client_target) + 1) % len(names)]
            self.client_heard_at = self.now
        self.writes += 1
        self.network.send(CLIENT, self.client_target, Put(self.writes), self.now)

    def on_client_reply(self, source: str, reply: PutReply) -> None:
        self.client_heard_at = self.now
        if not reply.ok and reply.master is not None and reply.master in self.brokers:
            self.client_target = reply.master

    def fault(self) -> None:
        rng = self.rng
        names = list(self.brokers)
        roll = rng.random()
        up = [b for b in self.brokers.values() if b.up]
        if roll < 0.25 and up:
            master = next((b for b in up if b.tracker is not None), None)
            self.crash(master if master is not None and rng.random() < 0.6 else rng.choice(up))
        elif roll < 0.45:
            self.network.partition([rng.choice(names)])
        elif roll < 0.55:
            master = next((b.name for b in up if b.tracker is not None), rng.choice(names))
            self.network.partition([master, CLIENT])  # the master reaches its clients, not the controllers
        elif roll < 0.58:
            self.network.partition(list(CONTROLLERS))
        elif roll < 0.66:
            sides = [[*CONTROLLERS], *([name] for name in names), [CLIENT]]  # the controllers move as one
            rng.shuffle(sides)
            cut = rng.randint(1, len(sides) - 1)
            self.network.partition([node for side in sides[:cut] for node in side])  # any split, e.g. a master
            # with one slave and the clients, the other slave with the controllers
        elif roll < 0.8:
            self.network.heal()
        elif roll < 0.92:
            self.controllers.change_leader()
        else:
            self.controllers.switchover()

    # -- the loop --------------------------------------------------------------------------------

    def deliver(self, source: str, target: str, message: Any) -> None:
        if target in CONTROLLERS:
            if isinstance(message, ControllerRequest):
                self.controllers.on_request(target, source, message)
            return
        if target == CLIENT:
            self.on_client_reply(source, message)
            return
        broker = self.brokers[target]
        if not broker.up:
            return
        handlers = {ControllerReply: lambda m: broker.on_controller_reply(source, m),
                    Hello: lambda m: broker.on_hello(source, m),
                    HelloAnswer: broker.on_hello_answer, Transfer: broker.on_transfer, Ack: broker.on_ack,
                    Bye: broker.on_bye, Put: broker.on_put}  # fmt: skip
        handlers[type(message)](message)

    def check(self) -> None:
        masters = [b for b in self.brokers.values() if b.up and b.tracker is not None]
        if len(masters) < 2:
            return  # one acting master at most: nothing to compare (most steps)
        self.checker.masters_at_once([b.name for b in masters if b.tracker.lease_holds(self.now)], self.now,
                                      "with a lease")  # fmt: skip
        self.checker.masters_at_once([b.name for b in masters if b.tracker.confirm_offset(self.now) is not None],
                                      self.now, "able to acknowledge")  # fmt: skip

    def run_until(self, until: float) -> None:
        while True:
            timer_at = self._timers[0][0] if self._timers else math.inf
            delivery_at = self.network.next_delivery_at()
            at = min(timer_at, delivery_at)
            if at > until:
                self.now = until
                return
            self.now = max(self.now, at)
            self.events += 1
            if delivery_at <= timer_at:
                delivery = self.network.pop_due(self.now)
                if delivery is not None:
                    self.deliver(delivery.source, delivery.target, delivery.message)
            else:
                _, _, action = heapq.heappop(self._timers)
                action()
            self.check()

    def run(self) -> SeedReport:
        rng = self.rng
        for broker in self.brokers.values():
            self.start_broker(broker)
        self.every(DECIDE_EVERY_SECONDS, self.controllers.decide_timer)
        self.every(0.01, self.client_timer)
        next_fault = rng.expovariate(2.5)
        while next_fault < CHAOS_SECONDS:
            self.run_until(next_fault)
            self.fault()
            next_fault += rng.expovariate(2.5)
        self.run_until(CHAOS_SECONDS)
        self.settle()
        return SeedReport(self.seed, len(self.brokers), self.timings.min_in_sync_replicas, self.unclean, self.events,
                          self.crashes, len(self.checker.acked), self.elections, self.controller_changes,
                          self.switchovers, self.truncations, self.set_changes,
                          tuple(self.checker.failovers))  # fmt: skip

    def settle(self) -> None:
        """Heal, bring every broker up, and require the controller's master to acknowledge writes
        in the settle's last ``SETTLE_PROGRESS_SECONDS`` (not a lease at one instant: on a lossy
        link a few heartbeats in a row may still go missing)."""
        self.network.heal()
        for broker in self.brokers.values():
            if not broker.up:
                self.start_broker(broker)
        self.run_until(self.now + SETTLE_SECONDS - SETTLE_PROGRESS_SECONDS)
        acked_before = len(self.checker.acked)
        self.run_until(self.now + SETTLE_PROGRESS_SECONDS)
        group = self.controllers.state.groups.get(GROUP)
        master = next((b for b in self.brokers.values() if group is not None and b.broker_id == group.master_id), None)
        if master is None or master.tracker is None or len(self.checker.acked) == acked_before:
            raise AssertionError(f"no master acknowledging {SETTLE_SECONDS} s after the faults stopped: "
                                 f"{len(self.checker.acked) - acked_before} acknowledged in the last "
                                 f"{SETTLE_PROGRESS_SECONDS} s, group {group}")  # fmt: skip
        if not self.unclean and (lost := self.checker.missing(master.log)):
            raise SafetyViolation(f"the final master {master.name} lacks acknowledged writes {lost[:5]}")


def run_seed(seed: int, *, mutation: str = "") -> SeedReport:
    """One seed's schedule; raises SafetyViolation (or an AssertionError of a core) on a bug.
    ``mutation`` (one of ``MUTATIONS``) breaks one core rule on purpose."""
    if mutation and mutation not in MUTATIONS:
        raise ValueError(f"unknown mutation {mutation!r}; choose one of {sorted(MUTATIONS)}")
    return ControllerSim(seed, mutation).run()


def kill_master_failover(seed: int, *, brokers: int = 3, min_in_sync_replicas: int = 2) -> float:
    """Simulated seconds from killing a settled master (the only fault, on a quiet LAN: links of
    0.2-1 ms, nothing lost) to the first write acknowledged in a newer epoch: what the timings
    and the protocol cost a failover, without a real network, disk or scheduler."""
    sim = ControllerSim(seed)
    sim.timings = ControllerTimings(min_in_sync_replicas=min_in_sync_replicas).validate()
    sim.network = SimNetwork(random.Random(f"controller-failover-net-{seed}"), NetworkConfig(delay_max_seconds=0.001))
    sim.checker = ControllerChecker(unclean=False)
    sim.brokers = {f"b{number}": Broker(sim, f"b{number}") for number in range(1, brokers + 1)}
    sim.client_target = "b1"
    for broker in sim.brokers.values():
        sim.start_broker(broker)
    sim.every(DECIDE_EVERY_SECONDS, sim.controllers.decide_timer)
    sim.every(0.01, sim.client_timer)
    sim.run_until(1.5)
    master = next(b for b in sim.brokers.values() if b.tracker is not None)
    sim.crash(master, restart_after=3.0)  # down past the heartbeat timeout: a failover, not a quick restart
    while not sim.checker.failovers and sim.now < 10.0:
        sim.run_until(sim.now + 0.01)
    if not sim.checker.failovers:
        raise AssertionError(f"seed {seed}: no write acknowledged within 8.5 s of killing master {master.name}")
    return sim.checker.failovers[0]


def failover_summary(reports: list[SeedReport]) -> str:
    """p50 and p99 of the simulated kill-to-first-acknowledgement times over ``reports``."""
    times = sorted(t for report in reports for t in report.failovers)
    if not times:
        return "no failovers measured"
    p50, p99 = times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]
    return (f"{len(times)} failovers (master killed -> first write acknowledged in a newer epoch) "
            f"p50 {p50:.2f} s, p99 {p99:.2f} s")  # fmt: skip


def replay_command(seed: int, mutation: str = "") -> str:
    if mutation:
        call = f'run_seed({seed}, mutation="{mutation}")'
        return f"python -c 'from hasvc.testing.controller_sim import run_seed; print({call})'"
    return f"python -m hasvc.testing.sim controller --seed {seed}"


def run_seeds(first: int, count: int, *, mutation: str = "") -> list[SeedReport]:
    """Seeds first..first+count-1; on a failure raise it with the replay command in the message."""
    reports = []
    for seed in range(first, first + count):
        try:
            reports.append(run_seed(seed, mutation=mutation))
        except AssertionError as error:
            raise AssertionError(f"seed {seed} failed: {error!r}\nreplay: {replay_command(seed, mutation)}") from error
    return reports
