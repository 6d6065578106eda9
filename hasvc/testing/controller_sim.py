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
  broker's log is intact), power losses of a master (in seeds with ``min_in_sync_replicas`` >= 2,
  ``POWER_LOSS_SHARE`` of the kills of a master (or of a member elected and not yet promoted), a
  SyncStateSet of one included: a random part of
  what it appended since its last flush, every ``FLUSH_EVERY_SECONDS``, is gone when it restarts,
  its epoch table whole (the store's epoch file is fsynced), so a set of one elected on a slave's
  log may come back with its epoch starting past its end and report ``lost_tail``; the
  controller then elects the member outside the set whose log covers it), partitions (a broker alone, a broker with
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
* ASYNC_MASTER seeds (``ASYNC_SHARE``: a master acknowledges what its own log holds): a failover
  may lose acknowledged writes the new master had not received; they are counted as accepted
  losses, and must all have been acknowledged within ``sync_set_lag_seconds_max`` +
  ``ASYNC_LOSS_SLACK_SECONDS`` of each other (the lag bound: the SyncStateSet's promise); every
  other check above holds as it is (one acknowledging master per epoch, no slave cutting, and no
  final master lacking, an acknowledged write that is not an accepted loss);
* liveness, after faults stop and the network heals: the controller's master acknowledges
  writes within ``SETTLE_SECONDS`` (in its last ``SETTLE_PROGRESS_SECONDS``).

The modules: this one runs a seed (``ControllerSim``: the clock, the faults, the client, the
checks after every step); ``controller_sim_model`` holds the vocabulary (timings, messages, the
seed's report, ``ControllerChecker``, the mutations); ``controller_sim_nodes`` the actors
(``Broker``, ``Controllers``).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from typing import Any

from hasvc.state.controller.config import ControllerTimings
from hasvc.state.controller.elect import ElectionTracker
from hasvc.state.controller.sync_set import SyncStateSetTracker
from hasvc.testing.checker import SafetyViolation
from hasvc.testing.controller_sim_model import (_MUTATED, ASYNC_LOSS_SLACK_SECONDS, ASYNC_SHARE, CHAOS_SECONDS, CLIENT, CLIENT_RETRY_SECONDS, CONTROLLERS,
                                                DECIDE_EVERY_SECONDS, FLUSH_EVERY_SECONDS, GROUP, MUTATIONS, POWER_LOSS_SHARE,
                                                SETTLE_PROGRESS_SECONDS,
                                                SETTLE_SECONDS, TRANSFER_EVERY_SECONDS, UNCLEAN_SHARE, Ack, Bye,
                                                ControllerChecker, ControllerReply, ControllerRequest, Hello,
                                                HelloAnswer, Put, PutReply, SeedReport, Transfer)  # fmt: skip
from hasvc.testing.controller_sim_nodes import Broker, Controllers
from hasvc.testing.network import NetworkConfig, SimNetwork


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
        # ASYNC_MASTER brokers in some seeds, drawn apart so the other draws (and seeds) stay as they were
        self.asynchronous = random.Random(f"controller-sim-async-{seed}").random() < ASYNC_SHARE
        loss_span_max = self.timings.sync_set_lag_seconds_max + ASYNC_LOSS_SLACK_SECONDS if self.asynchronous else None
        self.checker = ControllerChecker(self.unclean, loss_span_max, self.timings.master_lease_seconds)
        self.crashes = self.elections = self.controller_changes = self.switchovers = 0
        self.power_losses = 0
        self.lost_tails = 0
        self.power_rng = random.Random(f"controller-sim-power-{seed}")  # apart: the other faults' draws stay
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
        self.broker_timer(broker, FLUSH_EVERY_SECONDS, broker.flush)

    def crash(self, broker: Broker, *, restart_after: float | None = None) -> None:
        self.crashes += 1
        group = self.controllers.state.groups.get(GROUP)
        elected = group is not None and broker.broker_id is not None and group.master_id == broker.broker_id
        promoted = broker.tracker is not None  # elected and not promoted: its epoch is not in its table yet
        power_loss = ((promoted or elected) and self.timings.min_in_sync_replicas >= 2
                      and self.power_rng.random() < POWER_LOSS_SHARE)  # fmt: skip
        if broker.tracker is not None:
            self.checker.on_kill(broker.tracker.epoch, self.now)
        broker.up = False
        broker.reset_process()  # its waiting writes are never answered: the client's retry notices
        if power_loss:
            self.power_losses += 1
            broker.lose_power(self.power_rng)
            unopened = (not promoted and group is not None and group.master_end is not None
                        and len(broker.log) < group.master_end)  # fmt: skip
            self.lost_tails += broker.lost_tail is not None or unopened
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
                          tuple(self.checker.failovers), self.power_losses, self.asynchronous,
                          len(self.checker.accepted_lost), self.lost_tails)  # fmt: skip

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
    sim.asynchronous = False
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
    power_losses = (f"{sum(report.asynchronous for report in reports)} seeds of ASYNC_MASTER brokers losing "
                    f"{sum(report.accepted_losses for report in reports)} acknowledged writes in failovers (accepted), "
                    f"{sum(report.power_losses for report in reports)} power losses of a master "
                    f"({sum(report.lost_tails for report in reports)} leaving a lost tail), ")  # fmt: skip
    if not times:
        return power_losses + "no failovers measured"
    p50, p99 = times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]
    return (f"{power_losses}{len(times)} failovers (master killed -> first write acknowledged in a newer epoch) "
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
