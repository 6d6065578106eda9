"""A classic broker whose role a controller decides (``hasvc broker --controllers ... --group ...``).

Theory of operation
-------------------
``ControlledBroker`` is the classic ``Broker`` (same store, client port, put path, HA service and
HA client, byte for byte the same replication) with no ``--role``: it starts as a slave of nobody
(it refuses writes and replicates from no one) and a controller group tells it what to be.

* **Register** once the store is open: the store's identity (``STORE/identity``) gets the same
  broker id back across restarts; the client and HA addresses go with it. The HA port is fixed
  before registering (port 0 is resolved to a free port once), so the address the controller
  hands to slaves stays right across promotions.
* **Heartbeat** every ``broker_heartbeat_interval_seconds`` to the controller leader (the client
  finds it, and finds the next one after a controller election). Each answer goes to the agent
  (``hasvc.state.controller.agent.plan``) and its effects are carried out in order:
  ``Promote(epoch)`` is the classic promotion to SYNC_MASTER with the controller's epoch (cut a
  partial record, append the epoch at the log's end -- or resume it, a master restarted in its
  epoch --, rebuild the producer table), fenced until the lease is granted; a master named again
  in a newer epoch closes its HA port (its slaves hand-shake the new epoch), opens the epoch and
  serves again; ``FollowMaster`` is the classic demotion (or a slave's switch of master): the epoch
  handshake cuts only what the new master's history never had; ``RenewLease`` renews the lease
  from when the heartbeat was *sent*; ``Fence`` refuses writes at once.
* **The lease** (``SyncStateSetTracker.renew/lease_holds``): the lease task fences the master
  (SERVICE_NOT_AVAILABLE: clients look for the new master) the moment its lease runs out and
  fails the puts still waiting for acks (they were stored here, not confirmed); every release of
  a SYNC_MASTER waiter asks ``confirm_offset(now)``, which is None without a lease, so no waiter
  is released after the lease ran out even before the task runs.
* **The producer table follows the log on a slave** (``ProducerFollower``,
  ``hasvc.broker.producer_follow``): a promotion reads only the last moment's records.
* **The SyncStateSet** (``SyncStateSetReplicator``): the put path's ``Replicator`` backed by
  ``SyncStateSetTracker``: slaves' reports (the HA service's ``ReplicaSet``, each slave known by
  the id it registered with, sent as its HA ``slave_id`` ``GROUP:ID``), closed connections and
  a timer feed it; the proposals it returns go to the controller one at a time
  (``ALTER_SYNC_STATE_SET``) and only its answers change the set.

Nothing here decides: the agent, the tracker and the controller do; this module carries out.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import logging
import math
import operator
import socket
from collections.abc import Callable

import trio

from hasvc import transport
from hasvc.broker.broker import Broker
from hasvc.broker.producer_follow import ProducerFollower
from hasvc.broker.store_tasks import FAILED
from hasvc.config import Address, BrokerConfig, BrokerRole, format_address, parse_address
from hasvc.controller.client import ControllerClient, ControllerUnavailable
from hasvc.protocol import controller as cp
from hasvc.state import role as role_effects
from hasvc.state.controller import agent
from hasvc.state.controller.config import ControllerTimings
from hasvc.state.controller.elect import HeartbeatAnswer
from hasvc.state.controller.state import AlterSyncStateSet
from hasvc.state.controller.sync_set import SyncStateSetTracker
from hasvc.state.replication import Admission, ReplicaSet, SlaveProgress
from hasvc.state.role import RoleState

LOGGER = logging.getLogger(__name__)

# The fence a controller-mode master holds while it has no lease (and from its first moment as
# master until the first lease): lifted only by a lease, never by hand.
LEASE_FENCE = "no controller lease: the controller may be electing another master"
# SyncStateSet proposals queued for the controller: one is in flight at a time (the tracker's
# rule) and a retry replaces nothing, so a few is plenty; beyond, a proposal is dropped and the
# tracker's retry (sync_set_proposal_retry_seconds) sends it again.
PROPOSALS_QUEUED_MAX = 4
# Pause between registrations that found no controller leader (the client already waited its
# call_timeout_seconds going round the list).
REGISTER_RETRY_SECONDS = 0.5
# A slave counts as caught up when its ack reaches what the master's log held this long ago:
# under steady SYNC_MASTER load acks trail the newest appends by a round trip (a batch is always
# in flight), so "reached the end when it acked" would never hold; a slave catching up from far
# behind trails by far more. Samples of the master's end are kept every
# END_SAMPLE_INTERVAL_SECONDS (the ring holds the last CATCH_UP_SLACK_SECONDS and a margin).
CATCH_UP_SLACK_SECONDS = 0.2
END_SAMPLE_INTERVAL_SECONDS = 0.01
END_SAMPLES_MAX = 2 * int(CATCH_UP_SLACK_SECONDS / END_SAMPLE_INTERVAL_SECONDS)
_SAMPLED_AT = operator.itemgetter(0)  # an end sample's time (the ring is in time order)
# Broker ids of the HA slave ids seen, kept for the per-report path; a group has a few members,
# so more than this means ids that come and go (cleared, then rebuilt as slaves report).
SLAVE_IDS_CACHED_MAX = 64
# A slave's first wait before connecting again to its master (ha_reconnect_backoff_min_ms is
# lowered to this when above): the controller names a master while that broker is still
# promoting itself, and its HA port opens milliseconds later; the classic default (1 s, RocketMQ
# retries every 5 s) would add a second to every failover, since the SyncStateSet expands only
# once a slave has connected. The back-off still doubles up to ha_reconnect_backoff_max_ms.
RECONNECT_BACKOFF_MIN_MS = 100


def slave_id_of(group: str, broker_id: int) -> str:
    """The HA ``slave_id`` a controller-mode slave sends: its master counts it by it."""
    return f"{group}:{broker_id}"


def broker_id_of(group: str, slave_id: str) -> int | None:
    """The broker id in a slave's HA ``slave_id``; None for one of another group or a classic slave."""
    prefix = f"{group}:"
    if not slave_id.startswith(prefix) or not slave_id[len(prefix):].isdigit():
        return None
    return int(slave_id[len(prefix):])


class SyncStateSetReplicator:
    """The put path's ``Replicator`` (``hasvc.replicator``) on a controller-mode master: records
    are as replicated as a put waits for once every member of the SyncStateSet (the union with a
    proposed one while it is in flight) holds them and the lease holds (``confirm_offset``).
    ``propose`` sends a proposal to the controller (the broker's queue)."""

    def __init__(self, group: str, replicas: ReplicaSet, *, log_end: Callable[[], int],
                 propose: Callable[[AlterSyncStateSet], None]) -> None:  # fmt: skip
        self.group = group
        self.replicas = replicas
        self.log_end = log_end
        self.propose = propose
        self.tracker: SyncStateSetTracker | None = None  # serving as master
        self.service = None  # the HA service, on a master
        self._listeners: list[Callable[[int], None]] = []
        self._ends: collections.deque[tuple[float, int]] = collections.deque(maxlen=END_SAMPLES_MAX)
        self._broker_ids: dict[str, int | None] = {}  # HA slave id -> broker id (broker_id_of, cached)
        # trio's clock, read directly on the put path (its current_time() is trio.current_time(),
        # one call instead of three: a clock read or two a put and a report); set by start()
        self._clock: trio.abc.Clock | None = None

    # -- the broker's side ---------------------------------------------------------------------

    def start(self, tracker: SyncStateSetTracker) -> None:
        """Serve as master in ``tracker``'s epoch."""
        self.tracker = tracker
        self._clock = trio.lowlevel.current_clock()
        self._ends.clear()
        self._ends.append((self._clock.current_time(), tracker.master_end))

    def stop(self) -> None:
        self.tracker = None

    def attach(self, service) -> None:
        assert self.service is None, "one HA service at a time"
        self.service = service

    def detach(self) -> None:
        self.service = None

    def _send(self, proposal: AlterSyncStateSet | None) -> None:
        if proposal is not None:
            self.propose(proposal)

    def changed(self, now: float | None = None) -> None:
        """The set, the lease or an ack moved: tell the put path the offset it may release to."""
        offset = self.replicated_offset(now)
        for listener in self._listeners:
            listener(offset)

    # -- Replicator ----------------------------------------------------------------------------

    def appended(self) -> None:
        tracker = self.tracker
        if tracker is not None:
            end = self.log_end()
            tracker.on_append(end)
            now = self._clock.current_time()
            if not self._ends or now - self._ends[-1][0] >= END_SAMPLE_INTERVAL_SECONDS:
                self._ends.append((now, end))
        service = self.service
        if service is not None:
            service.push()

    def replicated_offset(self, now: float | None = None) -> int:
        tracker = self.tracker
        if tracker is None:
            return -1
        confirmed = tracker.confirm_offset(self._clock.current_time() if now is None else now)
        return -1 if confirmed is None else confirmed

    def admit(self, next_offset: int) -> Admission:
        tracker = self.tracker
        return Admission.WAIT if tracker is not None and tracker.admit() else Admission.SLAVE_NOT_AVAILABLE

    def shortfall(self, next_offset: int) -> str:
        tracker = self.tracker
        if tracker is None:
            return "not serving as master"
        return (f"stored on the master only: the SyncStateSet {sorted(tracker.sync_state_set)} has fewer than "
                f"min_in_sync_replicas {tracker.timings.min_in_sync_replicas} members")  # fmt: skip

    def in_sync_count(self) -> int:
        tracker = self.tracker
        return 0 if tracker is None else len(tracker.sync_state_set) - 1

    def subscribe(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    # -- the HA service's side -----------------------------------------------------------------

    def on_report(self) -> None:
        """A slave reported (``HAService``): feed every counted slave's ack to the tracker. On
        every report of every slave: the clock is read once, the end sample found by bisection
        and the broker id parsed once per slave id (a plain master's report costs ~1 us; this
        path cost ~11 us before)."""
        if self.tracker is None:
            self.changed()  # not serving as master: nothing to feed (-1 to the put path)
            return
        now = self._clock.current_time()
        self._feed_acks(now)
        self.changed(now)

    def _feed_acks(self, now: float) -> None:
        """Every connected slave's last ack to the tracker, caught up or not as of now: an idle
        slave reports only every ha_send_heartbeat_interval, and one that holds the whole idle
        log is caught up all along (fed from the reports alone, it looked lagging after
        sync_set_lag_seconds_max and left the set, then came back at the next tick, over and over)."""
        tracker = self.tracker
        if tracker is not None:
            end = self.log_end()
            tracker.on_append(end)
            caught_up_end = self._end_at(now - CATCH_UP_SLACK_SECONDS)
            for progress in self.replicas.slaves.values():
                broker_id = self._broker_id(progress.slave_id)
                if broker_id is None or broker_id == tracker.master_id or progress.ack_offset < 0:
                    continue
                offset = min(progress.ack_offset, end)
                # caught up: it holds what the master held CATCH_UP_SLACK_SECONDS ago (see there)
                master_end = offset if offset >= caught_up_end else end
                self._send(tracker.on_ack(broker_id, offset, master_end, now))

    def _broker_id(self, slave_id: str) -> int | None:
        try:
            return self._broker_ids[slave_id]
        except KeyError:
            if len(self._broker_ids) >= SLAVE_IDS_CACHED_MAX:
                self._broker_ids.clear()
            found = self._broker_ids[slave_id] = broker_id_of(self.group, slave_id)
            return found

    def _end_at(self, moment: float) -> int:
        """The master's end as it was at ``moment`` (its last sample then; the oldest kept if none)."""
        ends = self._ends
        if not ends:
            return 0
        before = bisect.bisect_right(ends, moment, key=_SAMPLED_AT)  # the samples taken at or before it
        return ends[before - 1][1] if before else ends[0][1]

    def on_slave_closed(self, progress: SlaveProgress) -> None:
        """A slave's connection ended: a member leaves the set at once (unless it reconnected)."""
        tracker = self.tracker
        broker_id = broker_id_of(self.group, progress.slave_id)
        if tracker is None or broker_id is None:
            return
        if any(other.slave_id == progress.slave_id for other in self.replicas.slaves.values()):
            return  # a newer connection of the same slave is up
        self._send(tracker.on_disconnect(broker_id, trio.current_time()))
        self.changed()

    def tick(self, now: float) -> None:
        tracker = self.tracker
        if tracker is not None:
            self._feed_acks(now)
            self._send(tracker.tick(now))


@dataclasses.dataclass
class ControlledOptions:
    """What a controller-mode broker adds to a classic broker's configuration."""

    group: str
    controllers: list[str]
    timings: ControllerTimings = dataclasses.field(default_factory=ControllerTimings)


class ControlledBroker(Broker):
    """See the module."""

    def __init__(self, config: BrokerConfig, options: ControlledOptions):
        if config.role is BrokerRole.SLAVE:
            raise ValueError("role SLAVE: a controller-mode broker's role is the controllers' to decide; "
                             "give SYNC_MASTER or ASYNC_MASTER (how it acknowledges once made master)")
        # How it acknowledges as master: ASYNC_MASTER once its own log holds a write. The put path
        # still runs as SYNC_MASTER (every put asks the tracker's confirm_offset), so no put is
        # answered without the lease even before the lease task fences.
        self.master_role = config.role
        config = dataclasses.replace(config, role=BrokerRole.SYNC_MASTER, master_ha=None, in_sync_replicas=1,
                                     min_in_sync_replicas=0, ha_listen=_fixed_port(config.effective_ha_listen),
                                     ha_reconnect_backoff_min_ms=min(config.ha_reconnect_backoff_min_ms, RECONNECT_BACKOFF_MIN_MS))  # fmt: skip
        self.options = options
        self.timings = options.timings.validate()
        self._proposals_send, self._proposals_receive = trio.open_memory_channel(PROPOSALS_QUEUED_MAX)
        replicas = ReplicaSet()
        replicator = SyncStateSetReplicator(options.group, replicas, log_end=self._log_end, propose=self._queue_proposal)
        super().__init__(config, role_state=RoleState(BrokerRole.SLAVE, None), replicator=replicator)
        self.replicas = replicas
        self.sync_set = replicator
        self.client: ControllerClient | None = None
        self.broker_id: int | None = None
        self.controller_role = agent.Role.NONE
        self.following: int | None = None  # the master's broker id, as a slave
        self.view: cp.GroupView | None = None  # the group as the last answer showed it
        self._lease_changed = trio.Event()  # a lease renewed or a tracker started: the lease task looks again
        self._role_moved = trio.Event()  # set (and replaced) at each promotion or change of master: wait_role_change
        self._unavailable_logged = False
        self._own_fence: str | None = None  # the fence this module set (lifted by a lease); others stay
        self.producer_follower = ProducerFollower(self)  # the producer table as a slave follows its log

    # -- requests from clients: the controller decides the role -------------------------------

    async def promote(self, role: BrokerRole, *, fence_reason: str = "", epoch: int | None = None) -> None:
        raise ValueError(f"a controller-mode broker (group {self.options.group}) is promoted by its controller, not by hand")

    async def demote(self, master_ha) -> None:
        raise ValueError(f"a controller-mode broker (group {self.options.group}) is demoted by its controller, not by hand")

    async def fence(self, fence: bool, reason: str) -> None:
        raise ValueError(f"a controller-mode broker (group {self.options.group}) is fenced by its lease, not by hand")

    # -- lifetime ------------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        ssl_context = None
        if self.config.tls_ca is not None:
            ssl_context = transport.client_ssl_context(ca=self.config.tls_ca, cert=self.config.tls_cert, key=self.config.tls_key)
        self.client = ControllerClient(self.options.controllers, secret=self.config.secret, ssl_context=ssl_context)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(super().run)
                nursery.start_soon(self._control)
                nursery.start_soon(self._send_proposals)
                nursery.start_soon(self._lease_task)
                nursery.start_soon(self.producer_follower.run)
                task_status.started(self.addresses())
        finally:
            with trio.CancelScope(shield=True):
                await self.client.aclose()

    def attach_store(self, store) -> None:
        super().attach_store(store)
        truncate = store.truncate

        def truncate_and_forget(offset: int) -> None:
            """The store's truncate; the producer table searched past ``offset`` is thrown away."""
            self.producer_follower.truncated(offset)
            truncate(offset)

        store.truncate = truncate_and_forget  # every cut of this store passes here (HA handshake, promotion)

    async def _rebuild_producer_table(self) -> None:
        """Before taking writes as master: the table this broker kept as a slave, completed
        (``ProducerFollower.rebuild``); the promotion holds the store's maintenance lock already."""
        await self.producer_follower.rebuild(super()._rebuild_producer_table)

    def addresses(self) -> dict:
        return {**super().addresses(), "group": self.options.group, "controllers": ",".join(self.options.controllers)}

    async def _register(self) -> None:
        identity = self.store.identity.store_id if self.store.identity is not None else self.config.store
        while True:
            try:
                answer = await self.client.register(group=self.options.group, identity=identity,
                                                    client_address=format_address(self.listen_address),
                                                    ha_address=format_address(self.config.effective_ha_listen))  # fmt: skip
            except ControllerUnavailable as error:
                self._say_unavailable(error)
                await trio.sleep(REGISTER_RETRY_SECONDS)
                continue
            if answer.ok:
                break
            LOGGER.error("group %s: the controller refused the registration: %s", self.options.group, answer.reason)
            await trio.sleep(REGISTER_RETRY_SECONDS)
        self.broker_id = answer.broker_id
        self.view = answer.view
        self.config = dataclasses.replace(self.config, slave_id=slave_id_of(self.options.group, self.broker_id))
        LOGGER.warning("group %s: registered as broker %d with controller %s", self.options.group, self.broker_id,
                       self.client.leader)  # fmt: skip
        lost_tail = self.lost_tail()
        if lost_tail is not None:
            LOGGER.error("group %s: the log ends at %d, before its epoch %d's start %d (a power loss cut what this store "
                         "held then, or it had not caught up to that epoch from its master): the controllers will not "
                         "elect it on this log; it catches up from a member whose log covers %d", self.options.group,
                         self.store.commit_log.max_offset, self.store.epochs.last_epoch, lost_tail, lost_tail)  # fmt: skip

    async def _control(self) -> None:
        """Register, then heartbeat every interval and carry out what each answer means."""
        await self._register()
        interval = self.timings.broker_heartbeat_interval_seconds
        while True:
            started = trio.current_time()
            if not await self._heartbeat():
                await trio.sleep_until(started + interval)
        raise AssertionError("unreachable")

    async def _heartbeat(self) -> bool:
        """One heartbeat and what its answer means; True when the role changed (a new master
        asks for its lease at once, rather than an interval after the answer it was promoted by,
        whose lease the promotion's work may have used up)."""
        try:
            answer, sent_at = await self.client.heartbeat(group=self.options.group, broker_id=self.broker_id,
                                                          epoch=self.store.epochs.last_epoch,
                                                          max_offset=self.store.commit_log.max_offset,
                                                          lost_tail=self.lost_tail())  # fmt: skip
        except ControllerUnavailable as error:
            self._say_unavailable(error)
            return False
        if self._unavailable_logged:
            LOGGER.warning("group %s: controller leader %s answers again", self.options.group, self.client.leader)
            self._unavailable_logged = False
        if not answer.ok:  # REFUSED: the controller does not know this broker (its state was lost): register again
            LOGGER.error("group %s: heartbeat refused: %s; registering again", self.options.group, answer.reason)
            await self._register()
            return False
        self.view = view = answer.view
        heard = HeartbeatAnswer(view.group, self.broker_id, view.master_id, view.master_client_address, view.master_ha_address,
                                view.epoch, frozenset(view.sync_state_set), view.sync_state_set_epoch,
                                lease=bool(view.lease))  # fmt: skip
        local = agent.LocalState(self.broker_id, self.controller_role, self.store.epochs.last_epoch,
                                 self.store.commit_log.max_offset, self.following)  # fmt: skip
        effects = agent.plan(local, heard, sent_at)
        for effect in effects:
            await self._carry_out_effect(effect, heard)
        tracker = self.sync_set.tracker
        if tracker is not None:
            tracker.on_heartbeat(frozenset(view.sync_state_set), view.sync_state_set_epoch, master_epoch=view.epoch)
            self.sync_set.changed()
        return any(isinstance(effect, agent.Promote | agent.FollowMaster) for effect in effects)

    def lost_tail(self) -> int | None:
        """The start of the log's last epoch when it is past the log's end: a power loss cut bytes
        this store held when that epoch began (the epoch file is fsynced, the log's tail may not
        be), or, outside the SyncStateSet, a slave has adopted its master's history and not caught
        up to that epoch yet. The controller never elects it on that log (docs/design/controller.md);
        it clears as the log reaches the entry, or when a new epoch opens."""
        entry = self.store.epochs.last
        end = self.store.commit_log.max_offset
        return entry.start_offset if entry is not None and entry.start_offset > end else None

    def _say_unavailable(self, error: ControllerUnavailable) -> None:
        if not self._unavailable_logged:
            LOGGER.error("group %s: %s", self.options.group, error)
            self._unavailable_logged = True

    async def _carry_out_effect(self, effect: agent.Effect, heard: HeartbeatAnswer) -> None:
        match effect:
            case agent.Promote(epoch=epoch):
                await self._become_master(epoch, heard)
            case agent.FollowMaster(master_id=master_id, ha_address=ha_address, client_address=client_address):
                await self._follow(master_id, ha_address, client_address)
            case agent.RenewLease(sent_at=sent_at):
                if self.sync_set.tracker is not None:
                    self.sync_set.tracker.renew(sent_at)
                    self._lease_changed.set()
            case agent.Fence(reason=reason):
                if self.sync_set.tracker is not None:
                    self.sync_set.tracker.lease_until = -math.inf  # no master named: the lease ends now, not later
                self._fence(reason)
            case agent.Unfence():
                self._lease_changed.set()
            case _:
                raise AssertionError(f"unknown effect {effect!r}")

    async def _become_master(self, epoch: int, heard: HeartbeatAnswer) -> None:
        """Serve as master in ``epoch``: promoted from a slave (or from nothing yet), or a master
        named again in a newer epoch (its HA port closes so that its slaves hand-shake anew)."""
        self.sync_set.stop()
        if self.role_state.is_slave:
            await Broker.promote(self, BrokerRole.SYNC_MASTER, fence_reason=LEASE_FENCE, epoch=epoch)
            self._own_fence = LEASE_FENCE
        else:
            if self.role_state.fenced_by is not None:  # any fence of an older epoch ends with the newer one
                self.role_state.lift_fence(self.role_state.fenced_by)
            self._fence(LEASE_FENCE)
            await self._carry_out([role_effects.StopHAService(), role_effects.FailAckWaits()])
            async with self.store_tasks.maintenance, self.store_tasks.warming:
                if epoch != self.store.epochs.last_epoch:
                    self.store.open_epoch(epoch)
            await self._carry_out([role_effects.StartHAService()])
            LOGGER.warning("named master again: epoch %d from offset %d", epoch, self.store.commit_log.max_offset)
        entry = self.store.epochs.last
        assert entry is not None and entry.epoch == epoch, (entry, epoch)
        tracker = SyncStateSetTracker(self.options.group, self.broker_id, epoch, epoch_start_offset=entry.start_offset,
                                      master_end=self.store.commit_log.max_offset, sync_state_set=heard.sync_state_set,
                                      sync_state_set_epoch=heard.sync_state_set_epoch, timings=self.timings,
                                      now=trio.current_time(),
                                      asynchronous=self.master_role is BrokerRole.ASYNC_MASTER)  # fmt: skip
        self.sync_set.start(tracker)
        self.controller_role = agent.Role.MASTER
        self.following = None
        self._lease_changed.set()
        self._role_did_move()

    async def _follow(self, master_id: int, ha_address: str, client_address: str | None) -> None:
        was_master = not self.role_state.is_slave
        self.sync_set.stop()
        await Broker.follow(self, parse_address(ha_address))
        if was_master:
            self.producer_follower.scanned_to = None  # the demotion cleared the table: a slave builds it anew
        if client_address:
            self.role_state.master_client_address = client_address
        self.controller_role = agent.Role.SLAVE
        self.following = master_id
        self._role_did_move()
        LOGGER.warning("group %s: following master %d at %s%s", self.options.group, master_id, ha_address,
                       " (no longer master)" if was_master else "")  # fmt: skip

    def _role_did_move(self) -> None:
        moved, self._role_moved = self._role_moved, trio.Event()
        moved.set()

    async def wait_role_change(self) -> None:
        """Until the next promotion or change of master (the tasks a role has no use for sleep
        through the other role: the tracker's timer on a slave, the producer-table follower on
        a master)."""
        await self._role_moved.wait()

    def _fence(self, reason: str) -> None:
        """Refuse writes now and end the puts waiting for acks (stored here, not confirmed);
        a lease lifts it (``_lease_task``)."""
        if self.role_state.is_slave:
            return
        if self.role_state.fenced_by is None or self.role_state.fenced_by == self._own_fence:
            self.role_state.fence(reason)
            self._own_fence = reason
            LOGGER.warning("fenced: %s", reason)
        self.put_service.fail_ack_waits()

    async def _lease_task(self) -> None:
        """Fence the master when its lease runs out (at that moment), lift the fence when a
        lease is granted again; between, sleep until the lease's end or a change."""
        while True:
            tracker = self.sync_set.tracker
            deadline = math.inf
            if tracker is not None and not self.role_state.is_slave:
                now = trio.current_time()
                if tracker.lease_holds(now):
                    deadline = tracker.lease_until
                    if self.role_state.fenced_by is not None and self.role_state.fenced_by == self._own_fence:
                        self.role_state.lift_fence(self._own_fence)
                        LOGGER.warning("lease granted (epoch %d): taking writes", tracker.epoch)
                    self.sync_set.changed()  # waiters held while there was no lease
                elif self.role_state.fenced_by is None:
                    self._fence(LEASE_FENCE)
            with trio.move_on_at(deadline):
                await self._lease_changed.wait()
            self._lease_changed = trio.Event()
        raise AssertionError("unreachable")

    def _queue_proposal(self, proposal: AlterSyncStateSet) -> None:
        try:
            self._proposals_send.send_nowait(proposal)
        except trio.WouldBlock:
            pass  # the tracker sends it again (sync_set_proposal_retry_seconds)

    async def _send_proposals(self) -> None:
        """SyncStateSet changes to the controller, one at a time; only an answer from its state
        machine (accepted or refused) settles one. Also the tracker's timer."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tick)
            async for proposal in self._proposals_receive:
                await self._send_proposal(proposal)
        raise AssertionError("unreachable")

    async def _send_proposal(self, proposal: AlterSyncStateSet) -> None:
        tracker = self.sync_set.tracker
        if tracker is None or tracker.epoch != proposal.epoch:
            return
        if proposal.new_set == {proposal.master_id} and not await self._flush_before_standing_alone():
            return  # not proposed: the tracker sends it again
        LOGGER.info("group %s: proposing SyncStateSet %s (set epoch %d)", proposal.group, sorted(proposal.new_set),
                    proposal.sync_state_set_epoch)  # fmt: skip
        try:
            answer = await self.client.alter_sync_state_set(group=proposal.group, master_id=proposal.master_id,
                                                            epoch=proposal.epoch, sync_state_set_epoch=proposal.sync_state_set_epoch,
                                                            sync_state_set=proposal.new_set)  # fmt: skip
        except ControllerUnavailable as error:
            LOGGER.warning("group %s: SyncStateSet proposal unanswered: %s", proposal.group, error)
            return  # still in flight: the tracker sends it again
        if self.sync_set.tracker is not tracker:
            return  # no longer master in that epoch
        if answer.ok:
            tracker.on_answer(proposal, True, frozenset(answer.view.sync_state_set), answer.view.sync_state_set_epoch,
                              master_epoch=answer.view.epoch)
            LOGGER.warning("group %s: SyncStateSet now %s (set epoch %d)", proposal.group, sorted(tracker.sync_state_set),
                           tracker.sync_state_set_epoch)  # fmt: skip
        elif answer.status == cp.STATUS_REFUSED:
            LOGGER.warning("group %s: SyncStateSet %s refused: %s", proposal.group, sorted(proposal.new_set), answer.reason)
            view = answer.view  # the controller's set as it stands (a refusal changed nothing)
            if view is not None:
                tracker.on_answer(proposal, False, frozenset(view.sync_state_set), view.sync_state_set_epoch, master_epoch=view.epoch)
            else:  # settled as refused: the set as it was; the next heartbeat shows the controller's
                tracker.on_answer(proposal, False, tracker.sync_state_set, tracker.sync_state_set_epoch, master_epoch=tracker.epoch)
        self.sync_set.changed()

    async def _flush_before_standing_alone(self) -> bool:
        """Before the set shrinks to this master alone, its log is flushed: after that it is the
        only member holding the writes acknowledged while others were in the set, and one it
        lost to a power loss would then be held only by brokers outside the set, which no clean
        election picks (its epoch starts below the cut, so it reports no lost tail). Until the
        shrink is accepted the master still waits for the old set, so a slave that died
        acknowledges nothing more; one that lags but acks goes on (docs/design/controller.md).
        False when the flush failed (the proposal waits for the tracker's retry)."""
        async with self.store_tasks.maintenance:
            flushed = await self.store_tasks._run_step("flush", self.store.flush_commitlog, 0)
        return flushed is not FAILED

    async def _tick(self) -> None:
        """The tracker's timer, every heartbeat interval while serving as master (a slave has no
        tracker: it waits for a promotion instead of waking ten times a second for nothing)."""
        interval = self.timings.broker_heartbeat_interval_seconds
        while True:
            if self.sync_set.tracker is None:
                await self.wait_role_change()
                continue
            await trio.sleep(interval)
            self.sync_set.tick(trio.current_time())
        raise AssertionError("unreachable")

    # -- status --------------------------------------------------------------------------------

    def status(self) -> dict:
        status = super().status()
        tracker = self.sync_set.tracker
        view = self.view
        now = trio.current_time()
        status.update({
            "group": self.options.group,
            "broker_id": self.broker_id,
            "master_role": self.master_role.value,
            "controller_role": self.controller_role.value,
            "controller_leader": self.client.leader if self.client is not None else None,
            "sync_state_set": sorted(tracker.sync_state_set) if tracker is not None else (list(view.sync_state_set) if view else []),
            "sync_state_set_epoch": tracker.sync_state_set_epoch if tracker is not None else (view.sync_state_set_epoch if view else 0),
            "sync_state_set_proposed": sorted(tracker.proposal.new_set) if tracker is not None and tracker.proposal else None,
            "confirm_offset": tracker.ack_watermark() if tracker is not None else None,
            "lease_seconds_left": round(max(0.0, tracker.lease_until - now), 3) if tracker is not None else 0.0,
            "controller_epoch": view.epoch if view else 0,
            "controller_master_id": view.master_id if view else None,
            "lost_tail": self.lost_tail() if self.store is not None else None,
        })  # fmt: skip
        if status.get("role") == BrokerRole.SYNC_MASTER.value and self.master_role is BrokerRole.ASYNC_MASTER:
            status["role"] = self.master_role.value  # serving as master: it acknowledges as ASYNC_MASTER
        return status


def _fixed_port(address: Address) -> Address:
    """``address`` with port 0 replaced by a free port (the controller hands the HA address to
    slaves, so it must not change across promotions); any other port as given."""
    host, port = address
    if port != 0:
        return address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return host, probe.getsockname()[1]
