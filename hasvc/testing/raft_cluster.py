"""SimCluster: 3 or 5 Raft cores on a simulated clock, network and logs, checked after every step.

Theory of operation
-------------------
The cluster is the cores' driver, exactly as a trio driver will be, minus trio: it delivers
messages from the ``SimNetwork``, calls ``tick`` when a core's ``deadline()`` comes, flushes a
member's ``SimLog`` a few milliseconds after it appended (DLedger flushes every 10 ms) and reports
it with ``persisted``, and after every event carries the core's ``Ready`` out in the contract's
order (hard state, truncate, append, send, then commit and the rest) -- telling the
``RaftChecker`` about each side effect first. Time jumps from event to event; nothing sleeps.

``crash(member)`` drops the core and whatever its log loses (``lose_unflushed``: a power loss,
else a process kill); ``crash_losing_tail(member, index)`` is a storage fault on top (the log
comes back without its entries from ``index``, its catch-up mark saved, as a member's recovery
cuts damage); ``start(member)`` builds a new core from the log, as a restart does.
``set_disk_full(member, full)`` and ``disk.arm_fsync_failure(member)`` are disk faults
(``hasvc.testing.raft_disk``): appends refused while full, a failed flush never believed.
Scenario code (``hasvc.testing.raft_sim``, tests) decides when to propose, crash and partition,
and calls ``run_until(t)`` in between.
"""

from __future__ import annotations

import dataclasses

import math
import random
from collections.abc import Callable, Sequence

from hasvc.state.raft.config import RaftConfig
from hasvc.state.raft.messages import (Message, Push, PushResponse, PushType, TimeoutNow, VoteRequest, VoteResponse,
                                       VoteResult)  # fmt: skip
from hasvc.state.raft.node import RaftNode
from hasvc.state.raft.storage import Entry, EntryRun
from hasvc.state.raft.ready import BecameLeader, ProposalStatus, Proposed, Refused, Role
from hasvc.state.raft.retention import node_keep_from
from hasvc.testing.digest import canonical
from hasvc.testing.checker import RaftChecker
from hasvc.testing.log import SimLog
from hasvc.testing.raft_disk import DiskFaults
from hasvc.testing.network import NetworkConfig, SimNetwork

# A run_until() that handles more events than this without reaching its time is a livelock bug.
EVENTS_PER_RUN_MAX = 1_000_000
# With coalesce_acknowledgements, acknowledgements for the member due this soon after the first
# come in the same "read" (a little early: as if the network were that much faster), so that
# several are stepped before one Ready in most seeds, not only when two fall due at one instant.
ACKNOWLEDGEMENTS_READ_TOGETHER_SECONDS = 0.005


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionEnded:
    """Not a Raft message: the network's way of saying that ``peer``'s connection ended (EOF or a
    reset), which the driver turns into ``RaftNode.peer_unreachable``."""

    peer: str


def with_stored_runs(message: Message, log) -> list[Message]:
    """What a driver sends for ``message``: an APPEND's reference run read from ``log`` as stored
    bytes, one push per run (a store's runs stop at data-file ends), nothing when the log no longer
    holds those entries; any other message as it is. The bytes are copied out of the log."""
    if not isinstance(message, Push) or message.type is not PushType.APPEND or message.entries.data is not None:
        return [message]
    reference = message.entries
    runs = log.read_runs(reference.first_index, reference.count, reference.last_term)
    if runs is None:
        return []
    pushes, prev_term = [], message.prev_term
    for run in runs:
        stored = EntryRun(run.first_index, run.count, run.last_term, bytes(run.data))
        pushes.append(dataclasses.replace(message, index=run.first_index, prev_term=prev_term, entries=stored))
        prev_term = run.last_term
    return pushes


def _corrupted(message: Message, rng: random.Random) -> Message:
    """``message`` with one byte of its run flipped (an APPEND; any other message as it is)."""
    if not isinstance(message, Push) or message.type is not PushType.APPEND:
        return message
    data = bytearray(message.entries.data)
    data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
    return dataclasses.replace(message, entries=dataclasses.replace(message.entries, data=bytes(data)))


def _sim_log(member: str) -> SimLog:
    return SimLog()


class SimCluster:
    def __init__(
        self,
        *,
        seed: int | str,
        members: Sequence[str] = ("n0", "n1", "n2"),
        config: RaftConfig | None = None,
        network: NetworkConfig | None = None,
        lose_unflushed: bool | None = None,
        flush_delay_seconds: tuple[float, float] = (0.002, 0.010),
        corrupt_run_probability: float = 0.0,
        coalesce_acknowledgements: bool = False,
        log_factory: Callable[[str], SimLog] | None = None,
        digest=None,
    ) -> None:
        self.seed = seed
        self.members = tuple(members)
        self.config = (config or RaftConfig()).validate()
        self.rng = random.Random(f"cluster-{seed}")
        self.network = SimNetwork(random.Random(f"network-{seed}"), network)
        # By default a crash is the worst the configured durability survives: a power loss with
        # flush_sync, a process kill (page cache kept) without.
        self.lose_unflushed = self.config.flush_sync if lose_unflushed is None else lose_unflushed
        self.flush_delay_seconds = flush_delay_seconds
        # A pushed run's bytes get one byte flipped on the way this often (a follower's check_run
        # must refuse it; the leader compares again): its own generator, so that the other draws
        # of a seed stay what they were without it.
        self.corrupt_run_probability = corrupt_run_probability
        self._corrupt_rng = random.Random(f"corrupt-{seed}")
        # As the trio driver does with what one read brings: acknowledgements (PushResponse) due
        # together for one member are stepped one after the other and their Ready carried out once.
        self.coalesce_acknowledgements = coalesce_acknowledgements
        # For scenarios that propose a few times before one Ready (raft_sim's clients), drawn
        # apart so that the other draws of a seed stay what they were.
        self.together_rng = random.Random(f"together-{seed}")
        # A member's log: the in-memory SimLog, or what ``log_factory(member)`` makes (the
        # raft-store simulation gives every member a real DLedger entry store).
        self.logs = {member: (log_factory or _sim_log)(member) for member in self.members}
        self.nodes: dict[str, RaftNode | None] = {member: None for member in self.members}
        self.checker = RaftChecker(self.members)
        self.now = 0.0
        self.events = 0
        self.crashes = 0
        self.acked_count = 0
        self.refused_runs = 0  # APPEND runs a follower's check refused (corrupted on the way)
        self.resets = 0
        self.lost_tails = 0  # storage faults: a member restarted without its tail (``crash_losing_tail``)
        # What each member acknowledged (term of the entry -> highest index) and the vote requests
        # it was asked: the checker's "never votes for a log missing what it acknowledged".
        self._acknowledged: dict[str, dict[int, int]] = {member: {} for member in self.members}
        self._vote_requests: dict[tuple[str, str, int, bool], tuple[int, int]] = {}
        self.outcomes: dict[ProposalStatus, int] = {status: 0 for status in ProposalStatus}
        self._incarnation = {member: 0 for member in self.members}
        self._flush_at = {member: math.inf for member in self.members}
        self._deadline = {member: math.inf for member in self.members}  # node.deadline() after its last event
        self._proposals: dict[tuple[str, int], tuple[bytes, ...]] = {}
        self.results: dict[tuple[str, int], ProposalStatus] = {}  # (leader, first index) -> outcome
        # A hashlib object fed every delivery and every Ready (``hasvc.testing.digest``); None: off.
        self.digest = digest
        # Full disks and failed fsyncs (``hasvc.testing.raft_disk``): none unless a scenario sets them.
        self.disk = DiskFaults(self.members, hold_seconds=self.config.election_timeout_max_seconds,
                               preferred=self.config.preferred_leader_id)  # fmt: skip
        for member in self.members:
            self.start(member)

    # ------------------------------------------------------------------ members

    def node(self, member: str) -> RaftNode:
        node = self.nodes[member]
        assert node is not None, f"{member} is down"
        return node

    def alive(self) -> list[str]:
        return [member for member, node in self.nodes.items() if node is not None]

    def start(self, member: str) -> None:
        assert self.nodes[member] is None, f"{member} is running"
        self._incarnation[member] += 1
        rng = random.Random(f"node-{self.seed}-{member}-{self._incarnation[member]}")
        node = RaftNode(
            self_id=member, members=self.members, log=self.logs[member], config=self.config, rng=rng, now=self.now
        )
        node.disk_full = self.disk.full[member]
        self.nodes[member] = node
        self.checker.on_start(member, self.logs[member], node.committed_index)
        self._drain(member)

    def crash(self, member: str) -> None:
        """``member``'s process dies: unflushed entries may go (``lose_unflushed``); its kernel
        closes its connections, so each peer that can hear it gets a ``ConnectionEnded``."""
        assert self.nodes[member] is not None, f"{member} is down"
        for peer in self.members:
            if peer != member:
                self.network.send(member, peer, ConnectionEnded(member), self.now)
        self.nodes[member] = None
        self.crashes += 1
        self._flush_at[member] = math.inf
        self._deadline[member] = math.inf
        self.network.discard_to(member)
        self._proposals = {key: bodies for key, bodies in self._proposals.items() if key[0] != member}
        log = self.logs[member]
        before = log.last_index()
        log.crash(lose_unflushed=self.lose_unflushed)
        if log.last_index() < before:
            self.checker.after_crash(self.logs, log.last_index() + 1)

    def crash_losing_tail(self, member: str, lost_from: int) -> bool:
        """``member`` crashes and its store comes back without entries ``lost_from``.. (damage
        its recovery cut, the catch-up mark saved: ``SimLog.lose_from``) -- only if every
        committed entry it loses has a healthy copy on another member and no other member is
        still marked (one damaged disk at a time: two members that both lost entries beyond any
        leader's log would each wait for the other to lead); False: nothing done."""
        log = self.logs[member]
        if not log.first_index() <= lost_from <= log.last_index():
            return False
        if any(self.logs[m].load_hard_state().catch_up_index >= 0 for m in self.members if m != member):
            return False
        if not self.checker.healthy_copy_holds(self.logs, member, lost_from):
            return False
        self.crash(member)
        if lost_from > log.last_index():  # the crash took it already (an unflushed tail)
            return True
        log.lose_from(lost_from)
        self.lost_tails += 1
        return True

    def set_disk_full(self, member: str, full: bool) -> None:
        """``member``'s disk fills (its appends fail, ``hasvc.testing.raft_disk``) or has room again."""
        self.disk.fill(member) if full else self.disk.free(member)
        if self.nodes[member] is not None:
            self.node(member).disk_full = full

    def _fsync_failed(self, member: str) -> None:
        """A flush of ``member`` failed (EIO): never believed; the member stops, without its
        unflushed tail (catch-up mark saved) when a healthy copy holds what that loses."""
        log = self.logs[member]
        if log.last_index() > log.flushed_index() >= log.first_index() - 1:
            if self.crash_losing_tail(member, log.flushed_index() + 1):
                return
        self.crash(member)

    def _append_failed(self, member: str) -> None:
        """The Ready's entries found no room: the core starts over from the log, its messages
        dropped and its connections kept (the driver's ``_append_failed``)."""
        self.disk.append_failures += 1
        self._proposals = {key: bodies for key, bodies in self._proposals.items() if key[0] != member}
        self.nodes[member] = None
        self.start(member)

    def compact(self, member: str, *, forced: bool = False) -> int:
        """Retention on ``member``: drop the entries below its core's ``retention_floor`` (as the
        driver's retention pass does) or, ``forced`` (a disk above its ratio), below where
        ``hasvc.state.raft.retention`` keeps from then (a leader: the lowest match index it knows;
        a follower whose match it does not know may be stranded); returns the log's first index now."""
        node, log = self.node(member), self.logs[member]
        before = log.first_index()
        keep_from = node_keep_from(node, over_ratio=True, now=self.now) if forced else node.retention_floor()
        first = log.compact(keep_from_index=keep_from, committed_index=node.committed_index)
        if first > before:
            self.checker.on_compact(member, log, first, self.logs, forced=forced)
        return first

    def reset_connection(self, source: str, target: str) -> None:
        """The connection from ``source`` to ``target`` breaks while both run (a reset): ``target``
        is told, as its driver would be; nothing else changes."""
        self.network.send(source, target, ConnectionEnded(source), self.now)

    def most_unflushed(self) -> str | None:
        """The live member with the most entries a power loss would take (None: nobody has any)."""
        tails = [(self.logs[m].last_index() - self.logs[m].flushed_index(), m) for m in self.alive()]
        tail, member = max(tails, default=(0, None))
        return member if tail > 0 else None

    def leader(self) -> str | None:
        """The live member that leads the highest term, if any."""
        leaders = [(self.node(m).term, m) for m in self.alive() if self.node(m).role is Role.LEADER]
        return max(leaders)[1] if leaders else None

    def propose(self, member: str, bodies: Sequence[bytes]) -> Proposed | Refused:
        return self.propose_together(member, [bodies])[0]

    def propose_together(self, member: str, proposals: Sequence[Sequence[bytes]]) -> list[Proposed | Refused]:
        """Several proposals, then one Ready (as the broker proposes a pass of puts)."""
        results = []
        for bodies in proposals:
            result = self.node(member).propose(bodies, self.now)
            if isinstance(result, Proposed):
                self._proposals[(member, result.first_index)] = tuple(bodies)
            results.append(result)
        self._drain(member)
        return results

    def transfer_leadership(self, member: str, target: str) -> Refused | None:
        self.disk.on_ordered_transfer(member, self.node(member).term)
        refusal = self.node(member).transfer_leadership(target, self.now)
        self._drain(member)
        return refusal

    # ------------------------------------------------------------------ stories (tests)

    def run_until_leader(self, *, timeout: float, among: Sequence[str] | None = None, step: float = 0.01) -> str:
        """Run until one live member (of `among`) leads and every live member it can reach follows it."""
        deadline = self.now + timeout
        while self.now < deadline:
            self.run_until(self.now + step)
            leaders = [
                m for m in (among or self.members) if self.nodes[m] is not None and self.node(m).role is Role.LEADER
            ]
            if not leaders:
                continue
            leader = max(leaders, key=lambda m: self.node(m).term)
            term = self.node(leader).term
            reachable = [m for m in self.alive() if m != leader and self.network.connected(m, leader)]
            if all(self.node(m).leader_id == leader and self.node(m).term == term for m in reachable):
                return leader
        raise AssertionError(f"no settled leader within {timeout} s: {self.describe()}")

    def propose_and_wait(self, member: str, bodies: Sequence[bytes], *, timeout: float) -> ProposalStatus | Refused:
        """Propose on `member` and run until the outcome is known (a Refused comes back at once)."""
        result = self.propose(member, bodies)
        if isinstance(result, Refused):
            return result
        key = (member, result.first_index)
        deadline = self.now + timeout
        while key not in self.results:
            if self.now >= deadline or self.nodes[member] is None:
                raise AssertionError(f"proposal {key} undecided after {timeout} s: {self.describe()}")
            self.run_until(self.now + 0.01)
        return self.results[key]

    def describe(self) -> str:
        parts = []
        for member in self.members:
            node = self.nodes[member]
            if node is None:
                parts.append(f"{member}: down")
            else:
                parts.append(f"{member}: {node.role.value} term {node.term} leader {node.leader_id} "
                             f"last {node.last_index} commit {node.committed_index}")  # fmt: skip
        return "; ".join(parts)

    # ------------------------------------------------------------------ time

    def run_until(self, until: float) -> None:
        """Handle every event due up to `until` in time order, then set the clock to `until`."""
        for _ in range(EVENTS_PER_RUN_MAX):
            due = self._next_event_at()
            if due > until:
                self.now = max(self.now, until)
                return
            self.now = max(self.now, due)
            self._handle_one()
        raise AssertionError(f"livelock: {EVENTS_PER_RUN_MAX} events without reaching t={until}")

    def _next_event_at(self) -> float:
        return min(self.network.next_delivery_at(), min(self._deadline.values()), min(self._flush_at.values()))

    def _handle_one(self) -> None:
        self.events += 1
        now = self.now
        if self.network.next_delivery_at() <= now:
            delivery = self.network.pop_due(now)
            if delivery is not None and self.nodes[delivery.target] is not None:
                if self.digest is not None:
                    self.digest.update(repr(canonical((now, delivery.target, delivery.message))).encode())
                if isinstance(delivery.message, ConnectionEnded):
                    self.node(delivery.target).peer_unreachable(delivery.message.peer, now)
                else:
                    message = delivery.message
                    if isinstance(message, VoteRequest):
                        key = (message.target, message.source, message.term, message.pre_vote)
                        self._vote_requests[key] = (message.ledger_end_term, message.ledger_end_index)
                    self.node(delivery.target).step(message, now)
                    if self.coalesce_acknowledgements and isinstance(delivery.message, PushResponse):
                        target = delivery.target

                        def acknowledgement(due, target=target) -> bool:
                            return due.target == target and isinstance(due.message, PushResponse)

                        window_end = now + ACKNOWLEDGEMENTS_READ_TOGETHER_SECONDS
                        while (more := self.network.pop_due_if(window_end, acknowledgement)) is not None:
                            self.events += 1
                            if self.digest is not None:
                                self.digest.update(repr(canonical((now, target, more.message))).encode())
                            self.node(target).step(more.message, now)
                self._drain(delivery.target)
            return
        for member in self.members:
            if self._flush_at[member] <= now:
                self._flush_at[member] = math.inf
                if self.disk.take_fsync_failure(member):
                    self._fsync_failed(member)
                    return
                self.node(member).persisted(self.logs[member].flush(), now)
                self._drain(member)
                return
            if self._deadline[member] <= now:
                self.node(member).tick(now)
                self._drain(member)
                return

    def _check_vote_or_acknowledgement(self, member: str, message: Message, log: SimLog) -> None:
        """Remember what ``member`` acknowledges; check each vote it grants against that."""
        if isinstance(message, PushResponse) and message.ack_index >= log.first_index():
            term = log.term_at(message.ack_index)
            acknowledged = self._acknowledged[member]
            acknowledged[term] = max(acknowledged.get(term, -1), message.ack_index)
        elif isinstance(message, VoteResponse) and message.result is VoteResult.ACCEPT:
            request = self._vote_requests.get((member, message.target, message.term, message.pre_vote))
            assert request is not None, ("a vote granted without a request", member, message)
            self.checker.on_vote_granted(member, message.target, request, self._acknowledged[member])

    def _drain(self, member: str) -> None:
        """Carry one Ready out, in the contract's order."""
        node = self.node(member)
        ready = node.ready()
        self._deadline[member] = node.deadline()
        if self.digest is not None:
            self.digest.update(repr(canonical((self.now, member, ready, self._deadline[member],
                                               node.status(self.now)))).encode())  # fmt: skip
        log = self.logs[member]
        if ready.hard_state is not None:
            self.checker.on_hard_state(member, ready.hard_state)
            log.save_hard_state(ready.hard_state)
        if ready.reset is not None:
            self.checker.on_reset(member, log, ready.reset)
            log.reset(ready.reset)
            self.resets += 1
        if ready.truncate_after is not None:
            self.checker.on_truncate(member, log, ready.truncate_after)
            log.truncate(after_index=ready.truncate_after)
        if (ready.entries or ready.runs) and self.disk.full[member]:
            self._append_failed(member)
            return
        if ready.entries:
            self.checker.on_append(member, log, ready.entries)
            log.append(ready.entries)
        for run in ready.runs:
            self.checker.on_append(member, log, run.entries(Entry))
            log.append_run(run)
        self.refused_runs += len(ready.refused_runs)
        if log.flushed_index() < log.last_index() and self._flush_at[member] == math.inf:
            self._flush_at[member] = self.now + self.rng.uniform(*self.flush_delay_seconds)
        for message in ready.messages:
            self._check_vote_or_acknowledgement(member, message, log)
            if isinstance(message, TimeoutNow):
                self.disk.on_handover(member, message.term, message.target, self.now)
            for wire_message in with_stored_runs(message, log):  # the sender's read of its log
                if self.corrupt_run_probability and self._corrupt_rng.random() < self.corrupt_run_probability:
                    wire_message = _corrupted(wire_message, self._corrupt_rng)
                self.checker.on_send(member, wire_message)
                self.network.send(member, wire_message.target, wire_message, self.now)
        for change in ready.role_changes:
            if isinstance(change, BecameLeader):
                self.checker.on_leader(member, change.term)
                self.disk.on_leader(member, change.term, self.now)
        if ready.committed_index is not None:
            self.checker.on_commit(member, log, ready.committed_index)
        for done in ready.proposals:
            bodies = self._proposals.pop((member, done.first_index))
            self.outcomes[done.status] += 1
            self.results[(member, done.first_index)] = done.status
            if done.status is ProposalStatus.SUCCESS:
                self.checker.on_acked(member, done.first_index, bodies)
                self.acked_count += len(bodies)
