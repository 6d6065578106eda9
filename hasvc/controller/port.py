"""The controller port (``hasvc controller --listen``): the connections brokers and operators
open, and the answer to each request (``hasvc.protocol.controller``).

Theory of operation
-------------------
``ControllerPort`` serves one connection at a time per task: the preface (port kind 4, the
secret's HMAC), then frames, each answered in order. STATUS is answered by any controller;
everything else only by the leader that serves (``ControllerServer._serving``: leading with its
log applied), and HEARTBEAT only while it holds its Raft leader lease; otherwise NOT_LEADER
naming the leader's controller port (or none). REGISTER, ALTER_SYNC_STATE_SET and ELECT become
commands of the replicated state (``ControllerServer._execute``: answered once committed);
HEARTBEAT is the leader's soft state (``ElectionTracker``), and its lease is the tracker's but
for the process's own rule (``inherited_election``). An operator's ELECT is checked here
(``switchover``) before it is proposed.
"""

from __future__ import annotations

import logging

import trio

from hasvc import admission as port_admission
from hasvc import transport
from hasvc.protocol import controller as cp
from hasvc.protocol import wire
from hasvc.state.controller import state as cs
from hasvc.state.controller.elect import LOST_END_UNKNOWN
from hasvc.state.raft.ready import Role

LOGGER = logging.getLogger(__name__)


class ControllerPort:
    """The requests of one controller's port; ``server`` is the ``ControllerServer`` it answers for."""

    def __init__(self, server) -> None:
        self.server = server

    async def serve_connection(self, stream, ticket: port_admission.Ticket | None = None) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        try:
            await transport.server_preface(connection, port_kind=wire.PORT_KIND_CONTROLLER, secret=self.server.config.secret)
            self.server.admission.authenticated(ticket)
        except (transport.AuthenticationError, wire.ProtocolError, trio.TooSlowError, trio.BrokenResourceError,
                EOFError, OSError) as error:  # fmt: skip
            self.server.connections_refused += 1
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
                    if not self.server.admission.identified(ticket):
                        return
                    answer = await self.answer(frame.message)
                    await connection.send_all(cp.encode_answer(frame.request_id, answer))
        except wire.ProtocolError as error:
            self.server.connections_refused += 1
            LOGGER.warning("controller port: %s sent a bad frame, connection closed: %s", connection.peer, error)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, EOFError):
            pass

    async def answer(self, request: cp.Request) -> cp.Answer:
        self.server.requests[cp.KIND_NAMES[request.KIND]] += 1
        if isinstance(request, cp.StatusRequest):
            return cp.Answer(cp.STATUS, cp.STATUS_OK, controller=self.server.status())
        if isinstance(request, cp.SnapshotRequest):  # another controller's, leader or not
            return self.server.snapshots.answer(request)
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
            outcome = await self.server._execute(command)
        except cs.StateFormatError as error:  # a field over the state's bounds (a long identity, ...)
            return cp.refused(request.KIND, str(error), self._view(command.group) if with_view else None)
        if isinstance(outcome, str):
            return cp.not_leader(request.KIND, self.server._leader_address(), outcome)
        view = self._view(command.group, outcome.group)  # the group just after the command (as it was if refused)
        if not outcome.accepted:
            return cp.refused(request.KIND, outcome.reason, view if with_view else None)
        if isinstance(command, cs.Register):
            self.server._election_due.set()
            return cp.Answer(cp.REGISTER, cp.STATUS_OK, view=view, broker_id=outcome.broker_id)
        return cp.Answer(request.KIND, cp.STATUS_OK, view=view)

    def _not_leader(self, kind: int) -> cp.Answer | None:
        """NOT_LEADER unless this controller serves as leader and (HEARTBEAT) holds its lease."""
        if not self.server._serving:
            node = self.server.driver.node
            if node.role is Role.LEADER:
                return cp.not_leader(kind, None, f"{self.server.group.self_id} leads term {node.term} but has not applied its "
                                                 "log yet")  # fmt: skip
            leader = self.server._leader_address()
            return cp.not_leader(kind, leader, f"{self.server.group.self_id} does not lead" +
                                 (f": {node.leader_id} does" if node.leader_id else ": no leader is known yet"))  # fmt: skip
        if kind == cp.HEARTBEAT and not self.server.holds_lease(trio.current_time()):
            return cp.not_leader(kind, None, f"{self.server.group.self_id} has not heard from a quorum of controllers within "
                                             f"{self.server.group.raft.election_timeout_min_seconds} s")  # fmt: skip
        return None


    def _view(self, name: str, group: cs.GroupState | None = None) -> cp.GroupView:
        """``name``'s view: of ``group`` when given, else of the current state."""
        group = group if group is not None else self.server.state.groups.get(name)
        if group is None:
            return cp.GroupView(name, None, None, None, 0, (), 0)
        master = group.members.get(group.master_id) if group.master_id is not None else None
        return cp.GroupView(name, group.master_id, master.client_address if master else None,
                            master.ha_address if master else None, group.epoch, tuple(sorted(group.sync_state_set)),
                            group.sync_state_set_epoch)  # fmt: skip

    def _heartbeat(self, request: cp.HeartbeatRequest) -> cp.Answer:
        group = self.server.state.groups.get(request.group)
        if group is None or request.broker_id not in group.members:
            return cp.refused(cp.HEARTBEAT, f"broker {request.broker_id} is not a member of group {request.group!r}: "
                                            "register first")  # fmt: skip
        now = trio.current_time()
        self.server.tracker.heartbeat(request.group, request.broker_id, request.epoch, request.max_offset, now,
                                      lost_tail=request.lost_tail)  # fmt: skip
        if group.master_id is None:
            self.server._election_due.set()
        answer = self.server.tracker.answer(self.server.state, request.group, request.broker_id, now)
        lease = answer.lease and not self.inherited_election(request.group, now)
        return cp.Answer(cp.HEARTBEAT, cp.STATUS_OK, view=cp.GroupView(
            request.group, answer.master_id, answer.master_client_address, answer.master_ha_address, answer.epoch,
            tuple(sorted(answer.sync_state_set)), answer.sync_state_set_epoch, lease=lease))  # fmt: skip

    def inherited_election(self, name: str, now: float) -> bool:
        """The group's master was elected by an earlier controller leader less than
        master_lease_seconds before this controller applied it: that leader may have granted the
        previous master a lease until then, which this one never heard of (the tracker withholds
        a newer epoch's lease only behind the grants it made itself). A controller leader that
        dies is replaced within ~0.1 s (its followers see its connections end), before such a
        lease runs out."""
        elected_at = self.server._elected_at.get(name)
        return (elected_at is not None and elected_at <= self.server.tracker.leader_since
                and now < elected_at + self.server.config.timings.master_lease_seconds)  # fmt: skip


    def _switchover(self, request: cp.ElectRequest) -> cs.Elect | cp.Answer:
        """An operator's ELECT: the named broker (alive, in the SyncStateSet unless unclean
        elections are allowed) or, None, the best other candidate."""
        group = self.server.state.groups.get(request.group)
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
            if target == group.master_id and not group.master_restarted:  # a restarted one is named by nobody yet
                return cp.refused(cp.ELECT, f"broker {target} is the master already (epoch {group.epoch})")
            if target not in group.members:
                return cp.refused(cp.ELECT, f"broker {target} is not a member of group {request.group!r}")
            if target not in group.sync_state_set and not self.server.config.timings.allow_unclean_election:
                return cp.refused(cp.ELECT, f"broker {target} is not in the SyncStateSet {sorted(group.sync_state_set)} "
                                            "(it may lack acknowledged writes; unclean elections are off)")  # fmt: skip
            unclean = self.server.config.timings.allow_unclean_election
            if target in group.restarted and not unclean:
                return cp.refused(cp.ELECT, f"broker {target} restarted since it entered the SyncStateSet (it may have lost "
                                            "unflushed writes): the controller elects by log ends")  # fmt: skip
            if not self.server.tracker.alive(request.group, target, now):
                return cp.refused(cp.ELECT, f"broker {target} has not heartbeaten within "
                                            f"{self.server.config.timings.broker_heartbeat_timeout_seconds} s")  # fmt: skip
            if target not in group.sync_state_set or target in group.restarted:  # allowed: unclean elections are on
                lost_tail = self.server.tracker.lost_end(request.group, group, target)
                if lost_tail == LOST_END_UNKNOWN:
                    ending = ", and a member that may hold what it lost is not heard since"
                else:
                    ending = f", its log ending before offset {lost_tail}, which it may have lost" if lost_tail is not None else ""
                why = "outside the SyncStateSet" if target not in group.sync_state_set else "restarted" + ending
                return self.server.tracker.stamped(cs.Elect(
                    request.group, target, group.epoch, f"an operator's switchover (ELECT); UNCLEAN: broker {target} "
                    f"{why}, acknowledged writes may be lost"))  # fmt: skip
        return self.server.tracker.stamped(cs.Elect(request.group, target, group.epoch, "an operator's switchover (ELECT)"))

    def _candidates(self, name: str, group: cs.GroupState, now: float) -> list[int]:
        """An operator's switchover without a target: the alive members of the SyncStateSet but
        the master, best first (highest (epoch, max_offset), then the lowest id)."""
        alive = [b for b in sorted(group.sync_state_set - group.restarted)
                 if b != group.master_id and self.server.tracker.alive(name, b, now)]  # fmt: skip
        key = {b: self.server.tracker.liveness(name, b) for b in alive}
        return sorted(alive, key=lambda b: (-key[b].epoch, -key[b].max_offset, b))

