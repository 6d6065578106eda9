"""The controller-mode master's put-path replicator (``SyncStateSetReplicator``) over a replica set
and a SyncStateSet tracker, with trio's autojump clock: acks release writes only while the lease
holds; a slave acking under steady load or idle stays in the set; a lagging or closed one is
proposed out."""

from __future__ import annotations

import trio

from hasvc.broker.controlled import SyncStateSetReplicator, broker_id_of, slave_id_of
from hasvc.state.controller.config import ControllerTimings
from hasvc.state.controller.sync_set import SyncStateSetTracker
from hasvc.state.replication import ReplicaSet, SlaveProgress

GROUP = "g"
TIMINGS = ControllerTimings()


class Harness:
    def __init__(self, *, sync_state_set=frozenset({1, 2})) -> None:
        self.end = 1000
        self.replicas = ReplicaSet()
        self.proposals = []
        self.released = []
        self.replicator = SyncStateSetReplicator(GROUP, self.replicas, log_end=lambda: self.end, propose=self.proposals.append)
        self.replicator.subscribe(self.released.append)
        self.tracker = SyncStateSetTracker(GROUP, 1, 3, epoch_start_offset=0, master_end=self.end, sync_state_set=sync_state_set,
                                           sync_state_set_epoch=5, timings=TIMINGS, now=trio.current_time())  # fmt: skip
        self.replicator.start(self.tracker)
        self.slave = SlaveProgress(1, slave_id_of(GROUP, 2), "127.0.0.1:2", 0.0)
        self.replicas.add(self.slave)

    def append(self, size: int) -> None:
        self.end += size
        self.replicator.appended()

    def ack(self, offset: int) -> None:
        self.replicas.on_report(self.slave.connection_id, offset, master_max_offset=self.end, now=trio.current_time())
        self.replicator.on_report()


def test_slave_ids_name_their_group_and_broker():
    assert broker_id_of(GROUP, slave_id_of(GROUP, 7)) == 7
    assert broker_id_of("other", slave_id_of(GROUP, 7)) is None
    assert broker_id_of(GROUP, "slave@127.0.0.1:10921") is None  # a classic slave is not counted


async def test_acks_release_writes_only_while_the_lease_holds(autojump_clock):
    harness = Harness()
    harness.append(500)
    harness.ack(1500)
    assert harness.replicator.replicated_offset() == -1 and harness.released[-1] == -1  # no lease yet
    harness.tracker.renew(trio.current_time())
    harness.replicator.changed()
    assert harness.released[-1] == 1500
    await trio.sleep(TIMINGS.master_lease_seconds)  # the lease ran out: nothing more is released
    harness.append(100)
    harness.ack(1600)
    assert harness.replicator.replicated_offset() == -1 and harness.released[-1] == -1


async def test_a_slave_acking_under_steady_load_stays_in_the_set(autojump_clock):
    harness = Harness()
    for _ in range(1000):  # 5 s: its ack always trails the newest append by one frame in flight
        harness.append(100)
        harness.ack(harness.end - 100)
        harness.replicator.tick(trio.current_time())
        await trio.sleep(0.005)
    assert harness.proposals == []


async def test_an_idle_slave_that_holds_the_log_stays_in_the_set(autojump_clock):
    harness = Harness()
    harness.ack(harness.end)
    for _ in range(100):  # 10 s of ticks and no report (a slave reports every 5 s when idle)
        await trio.sleep(TIMINGS.broker_heartbeat_interval_seconds)
        harness.replicator.tick(trio.current_time())
    assert harness.proposals == []


async def test_a_lagging_slave_is_proposed_out(autojump_clock):
    harness = Harness()
    harness.ack(harness.end)
    for _ in range(300):  # 3 s of writes it does not acknowledge
        harness.append(100)
        harness.replicator.tick(trio.current_time())
        await trio.sleep(0.01)
    assert {tuple(sorted(p.new_set)) for p in harness.proposals} == {(1,)}  # sent again while unanswered


async def test_a_closed_slave_is_proposed_out_at_once_unless_it_reconnected(autojump_clock):
    harness = Harness()
    harness.ack(harness.end)
    again = SlaveProgress(2, slave_id_of(GROUP, 2), "127.0.0.1:2", 0.0)
    harness.replicas.add(again)
    harness.replicas.remove(harness.slave.connection_id)
    harness.replicator.on_slave_closed(harness.slave)
    assert harness.proposals == []  # the same slave is connected again
    harness.replicas.remove(again.connection_id)
    harness.replicator.on_slave_closed(again)
    assert [sorted(p.new_set) for p in harness.proposals] == [[1]]


class _Roles:
    """What ``ControlledBroker._tick`` uses of its broker: its timings, its replicator and the
    role-change event (the broker's own methods)."""

    from hasvc.broker.controlled import ControlledBroker as _Broker

    timings = TIMINGS
    _role_did_move = _Broker._role_did_move
    wait_role_change = _Broker.wait_role_change
    _tick = _Broker._tick

    def __init__(self, replicator: SyncStateSetReplicator) -> None:
        self.sync_set = replicator
        self._role_moved = trio.Event()


async def test_the_trackers_timer_runs_while_master_and_sleeps_through_a_slaves_time(autojump_clock):
    """The tracker's timer (``ControlledBroker._tick``) proposes a lagging slave out once its broker
    is master, after a demotion and a new promotion too; while a slave it is not called at all."""
    harness = Harness()
    replicator = harness.replicator
    calls = []
    tick = replicator.tick
    replicator.tick = lambda now: (calls.append(replicator.tracker is not None), tick(now))
    replicator.stop()  # a slave: no tracker
    roles = _Roles(replicator)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(roles._tick)
        await trio.sleep(3 * TIMINGS.sync_set_lag_seconds_max)
        assert calls == []  # a slave's timer sleeps until it is promoted
        for promotion in range(2):
            harness.proposals.clear()
            harness.tracker = SyncStateSetTracker(GROUP, 1, 3 + promotion, epoch_start_offset=0, master_end=harness.end,
                                                  sync_state_set=frozenset({1, 2}), sync_state_set_epoch=5, timings=TIMINGS,
                                                  now=trio.current_time())  # fmt: skip
            replicator.start(harness.tracker)
            roles._role_did_move()
            harness.append(100)  # the slave never acknowledges it: only the timer can see it lag
            await trio.sleep(TIMINGS.sync_set_lag_seconds_max + 1)
            assert {tuple(sorted(p.new_set)) for p in harness.proposals} == {(1,)}, promotion
            replicator.stop()  # demoted
            roles._role_did_move()
            await trio.sleep(TIMINGS.broker_heartbeat_interval_seconds)  # the timer's sleep in progress ends
            calls.clear()
            await trio.sleep(3 * TIMINGS.sync_set_lag_seconds_max)
            assert calls == []
        nursery.cancel_scope.cancel()
