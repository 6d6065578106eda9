"""The controller-mode simulation's actors (``hasvc.testing.controller_sim``): a broker (agent,
SyncStateSet tracker, lease, the reduced classic data path) and the controller group (one
linearizable state, one leader in office at a time)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from commitlog.epoch import EpochEntry, find_consistent_point, validate
from hasvc.state.controller import agent
from hasvc.state.controller.elect import HeartbeatAnswer
from hasvc.state.controller.state import AlterSyncStateSet, ControllerState, Elect, Register
from hasvc.state.controller.sync_set import SyncStateSetTracker
from hasvc.testing.checker import SafetyViolation
from hasvc.testing.controller_sim_model import (BATCH_SIZE_MAX, COMMIT_DELAY_SECONDS, CONTROLLER_ELECTION_SECONDS,
                                                CONTROLLERS, DEPOSED_TAIL_SECONDS, GROUP, HELLO_RETRY_SECONDS,
                                                SESSION_IDLE_SECONDS, WRITE_TIMEOUT_SECONDS, Ack, Bye,
                                                ControllerReply, ControllerRequest, HeartbeatBody, Hello,
                                                HelloAnswer, Put, PutReply, Transfer)  # fmt: skip

if TYPE_CHECKING:
    from hasvc.testing.controller_sim import ControllerSim


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
        self.flushed = 0  # the log's length at the last flush: what a power loss keeps
        self.up = True
        self.reset_process()

    def reset_process(self) -> None:
        """What a process holds and loses on a kill (the log and epoch table stay)."""
        self.role = agent.Role.NONE
        self.registered = False  # a process registers once, at its start (as hasvc broker does)
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

    def flush(self) -> None:
        self.flushed = len(self.log)

    def lose_power(self, rng) -> None:
        """A power loss while down: a random part of the unflushed tail is gone; the epoch table
        stays whole (the store's epoch file is fsynced at every change), so its last entry may
        start past the log's end: the broker then reports that start as ``lost_tail``."""
        cut = rng.randint(min(self.flushed, len(self.log)), len(self.log))
        del self.log[cut:]
        del self.log_epochs[cut:]
        self.flushed = cut

    @property
    def lost_tail(self) -> int | None:
        last = self.epochs[-1] if self.epochs else None
        return last.start_offset if last is not None and last.start_offset > len(self.log) else None

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
        if not self.registered:
            self.ask_controller(Register(GROUP, self.identity, f"{self.name}:client", self.name))
        else:
            self.ask_controller(HeartbeatBody(self.broker_id, self.last_epoch, len(self.log), self.lost_tail))
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
            self.registered = True
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
            if proposal.new_set == {self.broker_id}:
                self.flush()  # as the broker does: alone once accepted, it must hold what was acknowledged
            self.sim.set_changes += 1
            self.ask_controller(proposal)

    # -- roles -------------------------------------------------------------------------------

    def promote(self, epoch: int, answer: HeartbeatAnswer) -> None:
        sim = self.sim
        self.leave_master()
        if epoch > self.last_epoch:  # entries past the log's end (a lost tail) go first, as open_epoch does
            self.epochs = [entry for entry in self.epochs if entry.start_offset <= len(self.log)]
            self.epochs.append(EpochEntry(epoch, len(self.log)))
            validate(self.epochs)
        sim.checker.on_promote(self.name, epoch, self.log, sim.now)
        sim.elections += 1
        self.role = agent.Role.MASTER
        self.following = None
        self.session = 0
        start = self.epochs[-1].start_offset
        in_set = answer.sync_state_set if self.broker_id in answer.sync_state_set else frozenset({self.broker_id})
        self.tracker = sim.tracker_class(GROUP, self.broker_id, epoch, epoch_start_offset=start, master_end=len(self.log),
                                           sync_state_set=in_set, sync_state_set_epoch=answer.sync_state_set_epoch,
                                           timings=sim.timings, now=sim.now, asynchronous=sim.asynchronous)  # fmt: skip

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
            cut = min(cut, len(self.log))  # a lost tail: our last epoch's entry starts past our end
            if cut < 0:
                if not sim.checker.unclean:
                    raise SafetyViolation(f"{self.name} shares no epoch with its master: {self.epochs} vs {master_epochs}")
                cut = 0
        if cut < len(self.log):
            sim.checker.on_truncate(self.name, self.log, cut)
            sim.truncations += 1
            del self.log[cut:]
            del self.log_epochs[cut:]
        held = [entry for entry in self.epochs if entry.start_offset <= len(self.log)]  # a lost tail's entry holds nothing
        known = held[-1].epoch if held else 0
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
        others = [b for b in sorted(group.sync_state_set - {group.master_id} - group.restarted)  # a restarted one: refused
                  if self.tracker.alive(GROUP, b, sim.now)]  # fmt: skip
        if others:
            sim.switchovers += 1
            self.propose(self.tracker.stamped(Elect(GROUP, sim.rng.choice(others), group.epoch, "operator switchover")), None)

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
            self.tracker.heartbeat(GROUP, body.broker_id, body.epoch, body.max_offset, sim.now, lost_tail=body.lost_tail)
            reply(self.tracker.answer(self.state, GROUP, body.broker_id, sim.now))
        elif isinstance(body, Register):
            self.propose(body, lambda answer: reply(answer.broker_id))
        else:
            def altered(answer) -> None:
                group = answer.group
                reply((answer.accepted, group.sync_state_set, group.sync_state_set_epoch, group.epoch))

            self.propose(body, altered)
