"""A classic master/slave cluster built from the real pure cores, on ``SimNetwork`` and ``MemoryLog``.

Theory of operation
-------------------
Each broker is a ``MemoryLog`` (its disk), an epoch table (durable, as the epoch file is fsynced)
and the cores the brokers run: ``RoleState`` (role, fencing, promotion), ``handshake.admit_slave``
and ``handshake.reconcile`` (the epoch relation), ``TransferCursor`` (frame planning),
``follower.offset_refusal`` and ``follower.Reports`` (the slave's checks and what it may report),
``ReplicaSet`` (acks, watermark) and ``PutTracker`` (refusal, waits, final status). The cluster
does the I/O those cores ask for against the simulated log and network, on one simulated clock.

Messages (all tagged with the slave's session number, so a dead session's stragglers are ignored):
``("shello", s, SlaveHello)``, ``("mhello", s, MasterHello)``, ``("frame", s, offset, bytes)`` (empty
bytes: a heartbeat) and ``("report", s, offset)``. A lost, duplicated or reordered frame shows up
at the slave as an offset refusal, which ends the session as a broken TCP stream would; the slave
says hello again.

Storage faults (``FaultyLog``, the faults' switches on ``Broker``): a full disk refuses appends
(the master answers DISK_FULL and stores nothing; a slave takes no frame and reports nothing, its
session breaks as a refused write closes the connection) until space frees; an I/O error on a
write or an fsync leaves the broker ``io_failed``: it never retries and believes -- a master
answers its waits and new puts with errors, a slave takes and reports nothing more -- until the
operator restarts it (a crash: what was not flushed may be gone). Damage done to a stopped
broker's disk (a flipped bit in a record, or flushed bytes gone) is found when it starts:
``damage`` holds the range; the operator repairs it from a peer or accepts the loss
(``repair``, ``accept_loss``) before ``restart``, which refuses a damaged store.

``ClassicChecker`` (``hasvc.testing.classic_checker``; see its docstring) is called after every
delivery and every tick.
"""

from __future__ import annotations

import random

from commitlog.epoch import EpochEntry, truncate_suffix_by_offset
from commitlog.record import PutMessageStatus
from hasvc.config import BrokerRole
from hasvc.protocol import ha
from hasvc.state import follower, handshake, succession
from hasvc.state.puts import PutTracker, final_status
from hasvc.state.replication import ReplicationViolation, SlaveProgress
from hasvc.state.transfer import Heartbeat, TransferCursor
from hasvc.testing.classic_broker import SEGMENT_SIZE, Broker, Pending, SafetyViolation, Session, _read
from hasvc.testing.classic_checker import ClassicChecker
from hasvc.testing.classic_storage_faults import StorageFaults
from hasvc.testing.network import NetworkConfig, SimNetwork

BATCH_SIZE = 256  # bytes per frame at most (RocketMQ: 32 KiB; small here to cut frames often)
HEARTBEAT_SECONDS = 0.05  # RocketMQ's haSendHeartbeatInterval is 5 s; scaled down with the run
HELLO_RETRY_SECONDS = 0.05  # a slave without a session says hello again this often
FLUSH_INTERVAL_SECONDS = 0.1  # ASYNC_FLUSH: RocketMQ flushes every 500 ms; scaled down
ACK_TIMEOUT_SECONDS = 0.5  # slave_timeout (RocketMQ's syncFlushTimeout, 5 s), scaled down
MAX_GAP = 1 << 20  # ha_max_gap_not_in_sync (RocketMQ: 256 MiB); larger than any run's log
SESSION_TIMEOUT_SECONDS = 4 * HEARTBEAT_SECONDS  # a slave that hears nothing this long reconnects
TICK_SECONDS = 0.005  # how often nodes look at their timers


class ClassicCluster(StorageFaults):
    """``names[0]`` starts as master (epoch 1), the others as its slaves. The brokers are in
    ``classic_broker``, the checker in ``classic_checker``, the storage faults and the operator's
    repair in ``StorageFaults`` (``classic_storage_faults``, a base class)."""

    def __init__(self, rng: random.Random, names: list[str], *, role: BrokerRole, flush_before_ack: bool,
                 network: NetworkConfig, in_sync_replicas: int = 1, min_in_sync_replicas: int = 0) -> None:  # fmt: skip
        self.rng = rng
        self.now = 0.0
        self.network = SimNetwork(rng, network)
        self.flush_before_ack = flush_before_ack
        self.master_role = role
        self.tracker = PutTracker(sync_flush=flush_before_ack, in_sync_replicas=in_sync_replicas,
                                  min_in_sync_replicas=min_in_sync_replicas,
                                  flush_timeout_seconds=ACK_TIMEOUT_SECONDS, ack_timeout_seconds=ACK_TIMEOUT_SECONDS)  # fmt: skip
        self.brokers = {names[0]: Broker(names[0], role, None)}
        self.brokers[names[0]].epochs.append(EpochEntry(1, 0))
        for name in names[1:]:
            self.brokers[name] = Broker(name, BrokerRole.SLAVE, names[0])
        self.checker = ClassicChecker()
        self.checker.in_sync_replicas = in_sync_replicas
        self.checker.highest_epoch = 1
        self.session_counter = 0
        self.put_counter = 0
        self.outcomes: dict[str, int] = {}
        self.events = 0
        self.ticks = 1  # the next tick is at ticks * TICK_SECONDS (counted: float steps would stall)
        self.crashes = 0
        self.promotions = 0
        self.truncations = 0
        self.promotion_epoch_cuts = 0
        self.restart_epochs = 0  # masters that opened a new epoch as they restarted after a crash
        self.successions = {True: 0, False: 0}  # the operator's choices, by whether they kept every ack
        self.records: list[tuple[int, bytes]] = []  # every put any master stored: (offset, bytes)
        self.storage_faults: dict[str, int] = {}  # by kind: what the disks did
        self.repairs = 0
        self.accepted_losses = 0  # damage cut because no peer held the range
        self.shrunk_refusals = 0  # a slave refused a master that lost bytes of its own epoch
        # Mutation switches for the hand check of the checker (never set by the simulation).
        self.mutation = ""

    # ------------------------------------------------------------------ driving

    def master(self) -> Broker | None:
        for broker in self.brokers.values():
            if broker.up and not broker.role.is_slave:
                return broker
        return None

    def run_until(self, until: float) -> None:
        while True:
            at = min(self.network.next_delivery_at(), self._next_tick())
            if at > until:
                break
            self.now = max(self.now, at)
            delivery = self.network.pop_due(self.now)
            if delivery is not None:
                if self.brokers[delivery.target].up:
                    self._deliver(self.brokers[delivery.target], delivery.source, delivery.message)
            else:
                self.ticks += 1
                self._tick()
            self.events += 1
            self.checker.check(list(self.brokers.values()))
        self.now = max(self.now, until)

    def _next_tick(self) -> float:
        return self.ticks * TICK_SECONDS

    def _tick(self) -> None:
        for broker in self.brokers.values():
            if not broker.up:
                continue
            if self.now >= broker.flush_at:
                self._flush(broker)
                broker.flush_at = self.now + FLUSH_INTERVAL_SECONDS
            if broker.role.is_slave:
                if broker.session and broker.session.established and self.now - broker.hello_at > SESSION_TIMEOUT_SECONDS:
                    broker.session = None  # nothing from the master for too long: reconnect
                if broker.session is None or (not broker.session.established and self.now >= broker.hello_at):
                    self._hello(broker)
            else:
                self._pump(broker)
                self._expire(broker)

    def _flush(self, broker: Broker) -> None:
        if broker.io_failed:
            return  # never retried: what it wrote may be gone from the page cache
        if broker.fail_next_fsync and broker.log.flushed_offset < broker.log.max_offset:
            self._io_failed(broker, "EIO on an fsync")
            return
        broker.log.flush()
        if broker.session and broker.session.reports:
            broker.session.reports.flushed_to(broker.log.flushed_offset)

    def _io_failed(self, broker: Broker, reason: str) -> None:
        """A write or an fsync failed: the broker acknowledges nothing more until it restarts. A
        master answers its waits with errors; a slave takes and reports nothing more."""
        broker.io_failed = f"{reason} at {self.now:.3f}"
        broker.fail_next_write = broker.fail_next_fsync = False
        for _wait in broker.pending:
            self._outcome(PutMessageStatus.UNKNOWN_ERROR.value)
        broker.pending = []

    def _send(self, source: str, target: str, message: tuple) -> None:
        self.network.send(source, target, message, self.now)

    # ------------------------------------------------------------------ client puts

    def put(self, data: bytes) -> str:
        """A client's put to the running master; the answer's status (waits resolve later)."""
        self.put_counter += 1
        master = self.master()
        if master is None:
            return self._outcome("NO_MASTER")
        refusal = self.tracker.refusal(master.role, lambda: master.replicas.in_sync_count(
            master_max_offset=master.log.max_offset, max_gap=MAX_GAP))  # fmt: skip
        if refusal is not None:
            return self._outcome(refusal.status.value)
        if master.io_failed:  # a write or fsync failed: it never retries and believes
            return self._outcome(PutMessageStatus.SERVICE_NOT_AVAILABLE.value)
        if self.now < master.disk_full_until:  # ENOSPC: nothing stored, nothing acknowledged
            return self._outcome(PutMessageStatus.DISK_FULL.value)
        if master.fail_next_write:  # EIO on the write: nothing stored
            self._io_failed(master, "EIO on a write")
            return self._outcome(PutMessageStatus.UNKNOWN_ERROR.value)
        self.checker.stored(master)
        offset = master.log.max_offset
        if offset + len(data) > offset - offset % SEGMENT_SIZE + SEGMENT_SIZE:  # a record never crosses a segment
            offset = offset - offset % SEGMENT_SIZE + SEGMENT_SIZE
            master.log.append_replicated(master.log.max_offset, b"\0" * (offset - master.log.max_offset))
        master.log.append_replicated(offset, data)
        self.records.append((offset, data))
        if self.tracker.sync_flush:
            self._flush(master)
            if master.io_failed:
                return self._outcome(PutMessageStatus.UNKNOWN_ERROR.value)
        end = offset + len(data)
        watermark = self._watermark(master)
        if self.mutation == "ack-before-report":
            watermark = end
        plan = self.tracker.plan(end, role=master.role, replicated_to=watermark,
                                 admit=lambda: master.replicas.admit(next_offset=end, max_gap=MAX_GAP,
                                                                     replicas=self.tracker.in_sync_replicas),
                                 shortfall=lambda: "no slave in sync")  # fmt: skip
        if plan.ack:
            master.pending.append(Pending(self.put_counter, offset, end, self.tracker.ack_deadline(self.now), master.last_epoch,
                                          self._generations()))  # fmt: skip
            self._pump(master)
            return "WAITING"
        status, _ = final_status(plan.status, plan.reason, flushed=True if plan.flush else None, acked=None)
        if status is PutMessageStatus.PUT_OK and master.role.sync_master:
            self.checker.acknowledged(master, self.put_counter, offset, data, master.last_epoch, list(self.brokers.values()))
        return self._outcome(status.value)

    def _outcome(self, status: str) -> str:
        self.outcomes[status] = self.outcomes.get(status, 0) + 1
        return status

    def _generations(self) -> tuple[int, ...]:
        return tuple(b.log.generation for b in self.brokers.values())

    def _watermark(self, master: Broker) -> int:
        needed = 1 if self.mutation == "ack-one-of-two" else self.tracker.in_sync_replicas
        return master.replicas.ack_watermark(needed)

    def _release(self, master: Broker) -> None:
        if master.io_failed:
            return
        watermark = self._watermark(master)
        for wait in [w for w in master.pending if w.end <= watermark]:
            master.pending.remove(wait)
            status, _ = final_status(PutMessageStatus.PUT_OK, "", flushed=None, acked=True)
            data = _read(master.log, wait.offset, wait.end)
            excused = not self.flush_before_ack and wait.generations != self._generations()
            self.checker.acknowledged(master, wait.put_id, wait.offset, data, wait.epoch, list(self.brokers.values()),
                                      excused=excused)  # fmt: skip
            self._outcome(status.value)

    def _expire(self, master: Broker) -> None:
        for wait in [w for w in master.pending if w.deadline <= self.now]:
            master.pending.remove(wait)
            self._outcome(final_status(PutMessageStatus.PUT_OK, "", flushed=None, acked=False)[0].value)

    # ------------------------------------------------------------------ master side

    def _pump(self, master: Broker) -> None:
        for session, cursor in master.cursors.items():
            slave = next(name for name, number in master.session_of.items() if number == session)
            while (planned := cursor.frame(master.log.max_offset)) is not None:
                data = bytes(master.log.read(planned.offset, planned.size_max))
                cursor.sent(planned, len(data), now=self.now)
                self._send(master.name, slave, ("frame", session, planned.offset, data))
            beat = cursor.heartbeat(self.now)
            if isinstance(beat, Heartbeat):
                cursor.heartbeat_sent(now=self.now)
                self._send(master.name, slave, ("frame", session, beat.offset, b""))

    def _on_slave_hello(self, master: Broker, source: str, session: int, hello: ha.SlaveHello) -> None:
        admission = handshake.admit_slave(hello, master.view())
        if admission.fence_epoch:
            master.role.epoch_seen(admission.fence_epoch)
            master.role.fence(admission.fence_reason)
        old = master.session_of.pop(source, None)
        if old is not None:
            master.replicas.remove(old)
            master.cursors.pop(old, None)
        if admission.admitted:
            master.session_of[source] = session
            master.replicas.add(SlaveProgress(session, source, source, self.now, caught_up_at=self.now))
        self._send(master.name, source, ("mhello", session, admission.master_hello(master.view())))

    def _on_report(self, master: Broker, session: int, offset: int) -> None:
        if session not in master.replicas.slaves:
            return
        try:
            first = master.replicas.on_report(session, offset, master_max_offset=master.log.max_offset, now=self.now)
        except ReplicationViolation:  # the driver closes that connection alone (a reordered stream here)
            master.replicas.remove(session)
            master.cursors.pop(session, None)
            master.session_of = {n: s for n, s in master.session_of.items() if s != session}
            return
        if first:
            master.cursors[session] = TransferCursor(offset, now=self.now, batch_size=BATCH_SIZE,
                                                     segment_size=SEGMENT_SIZE, heartbeat_seconds=HEARTBEAT_SECONDS)  # fmt: skip
        self._release(master)

    # ------------------------------------------------------------------ slave side

    def _hello(self, slave: Broker) -> None:
        if slave.io_failed:
            return
        self.session_counter += 1
        slave.session = Session(self.session_counter)
        slave.hello_at = self.now + HELLO_RETRY_SECONDS
        hello = ha.SlaveHello(slave.name, slave.name, slave.log.max_offset,
                              tuple((e.epoch, e.start_offset) for e in slave.epochs))  # fmt: skip
        self._send(slave.name, slave.master, ("shello", slave.session.number, hello))

    def _on_master_hello(self, slave: Broker, session: int, hello: ha.MasterHello) -> None:
        if slave.session is None or slave.session.number != session or slave.session.established:
            return
        if slave.io_failed:
            return
        answer = handshake.reconcile(slave.view(), slave.log.max_wrote_offset, hello)
        if answer.master_epoch:
            slave.role.epoch_seen(answer.master_epoch)
        if answer.refusal:
            self.shrunk_refusals += answer.master_shrank
            slave.session = None
            return
        if answer.truncate_to is not None and self.mutation != "skip-truncate":
            self.checker.slave_cut(slave, answer.truncate_to, hello)
            slave.log.truncate(answer.truncate_to)
            self.truncations += 1
        if answer.epochs is not None:
            slave.epochs = list(answer.epochs)
        slave.session.established = True
        slave.hello_at = self.now
        slave.session.reports = follower.Reports(flush_before_ack=self.flush_before_ack)
        slave.session.reports.flushed = slave.log.flushed_offset
        self._report(slave)

    def _report(self, slave: Broker) -> None:
        if slave.io_failed:
            return  # nothing past what it knew flushed: it reports nothing more
        offset = slave.session.reports.report(log_end=slave.log.max_offset)
        self._send(slave.name, slave.master, ("report", slave.session.number, offset))

    def _on_frame(self, slave: Broker, session: int, offset: int, data: bytes) -> None:
        if slave.session is None or slave.session.number != session or not slave.session.established:
            return
        if slave.io_failed:
            return  # takes and reports nothing: the master sees it fall behind
        refusal = follower.offset_refusal(offset, log_end=slave.log.max_offset, log_started=True)
        if refusal is None and data:
            room = SEGMENT_SIZE - offset % SEGMENT_SIZE
            refusal = follower.room_refusal(offset, len(data), room=room)
        if refusal is None and data and self.now < slave.disk_full_until:
            refusal = "ENOSPC"  # the append is refused: no report, the connection closes
        if refusal is not None:
            slave.session = None  # the stream broke: say hello again
            return
        if data and slave.fail_next_write:
            self._io_failed(slave, "EIO on a write")
            return
        slave.hello_at = self.now  # last heard from the master
        if data:
            slave.log.append_replicated(offset, data)
            if self.flush_before_ack:
                self._flush(slave)
        self._report(slave)

    def _deliver(self, broker: Broker, source: str, message: tuple) -> None:
        kind = message[0]
        if broker.role.is_slave:
            if source != broker.master:
                return
            if kind == "mhello":
                self._on_master_hello(broker, message[1], message[2])
            elif kind == "frame":
                self._on_frame(broker, message[1], message[2], message[3])
        else:
            if kind == "shello":
                self._on_slave_hello(broker, source, message[1], message[2])
            elif kind == "report":
                self._on_report(broker, message[1], message[2])

    # ------------------------------------------------------------------ faults

    def crash(self, name: str, *, power_loss: bool, clean: bool = False) -> None:
        """A kill or a power loss; ``clean``: a SIGTERM stop (flushed first, no abort file)."""
        broker = self.brokers[name]
        assert broker.up
        if clean:
            self._flush(broker)  # a failed fsync leaves it unclean: the abort file stays
            clean = not broker.io_failed
        broker.up = False
        broker.clean_stop = clean
        for _wait in broker.pending:  # the clients see the connection close: no answer
            self._outcome("NO_ANSWER")
        broker.pending = []
        broker.log.crash(self.rng, lose_unflushed=power_loss)
        broker.epochs = truncate_suffix_by_offset(broker.epochs, broker.log.max_offset + 1)
        self.network.discard_to(name)
        self.crashes += 1
        self.checker.after_crash(list(self.brokers.values()))

    def restart(self, name: str, role: BrokerRole, master: str | None) -> None:
        """Start a stopped broker again; as a master after a crash it opens a new epoch at its
        recovered end (``succession.epoch_on_start``). A damaged store refuses to start: the
        operator repairs it or accepts the loss first."""
        broker = self.brokers[name]
        assert not broker.up
        if broker.damage is not None:
            raise SafetyViolation(f"{name} started on a damaged store: {broker.damage.reason}")
        broker.start(role, master)
        if role is not BrokerRole.SLAVE:
            last = broker.last_epoch if broker.epochs else None
            epoch = succession.epoch_on_start(last, clean_exit=broker.clean_stop)
            if epoch is not None:
                broker.epochs = truncate_suffix_by_offset(broker.epochs, broker.log.max_offset + 1)
                broker.epochs.append(EpochEntry(epoch, broker.log.max_offset))
                self.checker.promoted(epoch)
                self.restart_epochs += 1
            for other in self.brokers.values():
                if other is not broker and other.role.is_slave:
                    other.master = name
                    other.role.master_ha = (name, 0)
                    other.session = None

    def promote(self, name: str) -> None:
        """``hasvc promote``: begin (the new epoch), flush and persist it at the log's end, finish."""
        broker = self.brokers[name]
        promotion, _effects = broker.role.begin_promotion(self.master_role, local_epoch=broker.last_epoch)
        broker.session = None
        self._flush(broker)
        if broker.epochs and broker.epochs[-1].start_offset > broker.log.max_offset:
            # FINDING: a slave that adopted its master's table before catching up to the last
            # epoch's start cannot open the next epoch at its end: Broker.promote's
            # EpochFile.append raises ValueError ("epoch history must grow"). Here the entries
            # past the end are cut first (counted), as the driver should do.
            broker.epochs = truncate_suffix_by_offset(broker.epochs, broker.log.max_offset + 1)
            self.promotion_epoch_cuts += 1
        broker.epochs.append(EpochEntry(promotion.epoch, broker.log.max_offset))
        self.checker.promoted(promotion.epoch)
        broker.role.finish_promotion(promotion)
        self.promotions += 1
        for other in self.brokers.values():
            if other is not broker and other.role.is_slave:
                other.master = name
                other.role.master_ha = (name, 0)
                other.session = None
