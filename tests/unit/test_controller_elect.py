"""The controller leader's elections and lease grants (``hasvc.state.controller.elect``)."""

import dataclasses

from hasvc.state.controller.config import ControllerTimings
from hasvc.state.controller.elect import ElectionTracker
from hasvc.state.controller.state import AlterSyncStateSet, ControllerState, Elect, Register

TIMINGS = ControllerTimings()
TIMEOUT = TIMINGS.broker_heartbeat_timeout_seconds
LEASE = TIMINGS.master_lease_seconds


def _state(members: int = 3, *, master: int | None = 1, sync_set=(1, 2, 3)) -> ControllerState:
    state = ControllerState()
    for number in range(1, members + 1):
        state.apply(Register("g", f"store-{number}", f"h{number}:1", f"h{number}:2"))
    if master is not None:
        assert state.apply(Elect("g", master, 0, "first")).accepted
        if set(sync_set) != {master}:
            assert state.apply(AlterSyncStateSet("g", master, 1, 1, frozenset(sync_set))).accepted
    return state


def _tracker(now: float = 0.0, **changes) -> ElectionTracker:
    tracker = ElectionTracker(dataclasses.replace(TIMINGS, **changes))
    tracker.became_leader(now)
    return tracker


def test_the_first_member_heartbeating_becomes_the_first_master():
    state, tracker = _state(master=None), _tracker()
    assert tracker.decide(state, 0.1) == []
    tracker.heartbeat("g", 2, 0, 0, 0.1)
    assert tracker.decide(state, 0.1) == [Elect("g", 2, 0, "first master of the group", master_end=0)]
    assert tracker.decide(state, 0.15) == []  # decided once


def test_a_first_election_among_stores_that_hold_data_takes_the_most_advanced():
    state, tracker = _state(master=None), _tracker()
    tracker.heartbeat("g", 1, 4, 100, 0.1)
    tracker.heartbeat("g", 3, 4, 300, 0.1)
    assert tracker.decide(state, 0.1)[0].new_master_id == 3


def test_a_lapsed_master_gives_way_to_the_best_alive_set_member():
    state, tracker = _state(), _tracker()
    tracker.heartbeat("g", 1, 1, 500, 0.0)
    tracker.heartbeat("g", 2, 1, 400, 0.5)
    tracker.heartbeat("g", 3, 1, 450, 0.5)
    assert tracker.decide(state, TIMEOUT) == []  # not silent for longer than the timeout yet
    [elect] = tracker.decide(state, TIMEOUT + 0.01)
    assert (elect.new_master_id, elect.expected_epoch) == (3, 1)
    assert "master 1 lapsed" in elect.reason and "UNCLEAN" not in elect.reason


def test_ties_go_to_the_lowest_id_and_the_epoch_counts_before_the_offset():
    state, tracker = _state(), _tracker()
    tracker.heartbeat("g", 2, 1, 400, 0.5)
    tracker.heartbeat("g", 3, 1, 400, 0.5)
    assert tracker.decide(state, 0.8)[0].new_master_id == 2
    state2, tracker2 = _state(), _tracker()
    tracker2.heartbeat("g", 2, 2, 10, 0.5)  # a newer epoch, shorter log
    tracker2.heartbeat("g", 3, 1, 900, 0.5)
    assert tracker2.decide(state2, 0.8)[0].new_master_id == 2


def test_only_members_of_the_set_are_elected_unless_unclean():
    state = _state(sync_set=(1, 2))
    tracker = _tracker()
    tracker.heartbeat("g", 3, 1, 999, 0.5)  # alive but outside the set
    [elect] = tracker.decide(state, 0.8)
    assert elect.new_master_id is None and "no member of the SyncStateSet [1, 2] is alive" in elect.reason
    unclean = _tracker(allow_unclean_election=True)
    unclean.heartbeat("g", 3, 1, 999, 0.5)
    [elect] = unclean.decide(state, 0.8)
    assert elect.new_master_id == 3 and "UNCLEAN" in elect.reason


def test_a_new_leader_counts_silence_from_when_it_took_office():
    state, tracker = _state(), _tracker(now=10.0)  # the master's last heartbeat went to the old leader
    tracker.heartbeat("g", 2, 1, 400, 10.1)
    assert tracker.decide(state, 10.0 + TIMEOUT) == []
    assert tracker.decide(state, 10.0 + TIMEOUT + 0.01)[0].new_master_id == 2


def test_an_unapplied_decision_is_proposed_again_after_a_timeout():
    state, tracker = _state(), _tracker()
    tracker.heartbeat("g", 2, 1, 400, 0.5)
    first = tracker.decide(state, 0.75)
    assert first and tracker.decide(state, 0.8) == []
    tracker.heartbeat("g", 2, 1, 400, 1.4)
    assert tracker.decide(state, 0.76 + TIMEOUT) == first


def test_two_slaves_down_then_the_master_gives_no_master_until_a_set_member_is_back_9897():
    """apache/rocketmq#9897's shape: both slaves dead while still in the set, then the master dies.
    Nobody alive in the set: no master (not a dead slave, not an unclean pick); the first set
    member back is elected."""
    state, tracker = _state(), _tracker()
    tracker.heartbeat("g", 1, 1, 500, 0.0)
    [nobody] = tracker.decide(state, TIMEOUT + 0.01)
    assert nobody.new_master_id is None
    assert state.apply(nobody).accepted
    assert state.groups["g"].sync_state_set == {1, 2, 3} and state.groups["g"].epoch == 1
    tracker.heartbeat("g", 3, 1, 480, 2.0)
    [back] = tracker.decide(state, 2.0)
    assert (back.new_master_id, back.expected_epoch) == (3, 1)


def test_the_answer_names_the_master_and_grants_it_a_lease_only():
    state, tracker = _state(), _tracker()
    answer = tracker.answer(state, "g", 1, 0.1)
    assert answer.lease and answer.master_id == 1 and answer.master_ha_address == "h1:2"
    assert answer.sync_state_set == {1, 2, 3} and answer.epoch == 1 and answer.sync_state_set_epoch == 2
    assert not tracker.answer(state, "g", 2, 0.1).lease


def test_no_lease_for_a_master_decided_lapsed():
    state, tracker = _state(), _tracker()
    tracker.heartbeat("g", 2, 1, 400, 0.5)
    assert tracker.decide(state, 0.75)  # master 1 lapsed: Elect proposed, not yet applied
    tracker.heartbeat("g", 1, 1, 500, 0.76)  # it speaks again
    assert not tracker.answer(state, "g", 1, 0.76).lease


def test_a_switched_over_master_gets_its_lease_only_after_the_old_ones_runs_out():
    state, tracker = _state(), _tracker()
    assert tracker.answer(state, "g", 1, 1.0).lease
    assert state.apply(Elect("g", 2, 1, "operator switchover")).accepted
    assert not tracker.answer(state, "g", 2, 1.0 + LEASE - 0.01).lease
    assert tracker.answer(state, "g", 2, 1.0 + LEASE).lease


def test_a_new_leader_grants_the_current_master_at_once():
    state, tracker = _state(), _tracker(now=5.0)
    assert tracker.answer(state, "g", 1, 5.0).lease


def test_nothing_is_decided_or_granted_when_not_leader():
    state, tracker = _state(), ElectionTracker(TIMINGS)
    assert tracker.decide(state, 100.0) == []
    assert not tracker.answer(state, "g", 1, 100.0).lease


def test_a_restarted_master_with_a_shorter_log_gives_way_to_the_longest_of_its_set():
    """It lost unflushed bytes (a power loss): a slave of the set holds more of its epoch. Not
    named again in its epoch, no lease meanwhile; the longest log is elected into a new one."""
    state, tracker = _state(), _tracker()
    tracker.heartbeat("g", 2, 1, 900, 0.1)  # before the restart: the slaves' ends cannot grow after it
    tracker.heartbeat("g", 3, 1, 800, 0.1)
    state.apply(Register("g", "store-1", "h1:1", "h1:2"))  # the master's process started again
    assert state.groups["g"].master_restarted
    tracker.heartbeat("g", 1, 1, 700, 0.2)
    assert not tracker.answer(state, "g", 1, 0.2).lease
    assert tracker.decide(state, 0.2) == []  # the slaves' ends are from before the restart was noticed
    tracker.heartbeat("g", 2, 1, 900, 0.3)
    assert tracker.decide(state, 0.3) == []  # broker 3 is alive and not heard since
    tracker.heartbeat("g", 3, 1, 800, 0.3)
    [elect] = tracker.decide(state, 0.35)
    assert (elect.new_master_id, elect.expected_epoch) == (2, 1) and "restarted" in elect.reason
    assert not tracker.answer(state, "g", 1, 0.35).lease
    assert state.apply(elect).accepted and not state.groups["g"].master_restarted
    assert state.groups["g"].epoch == 2


def test_a_restarted_master_with_the_longest_log_is_elected_again_into_a_new_epoch():
    state, tracker = _state(sync_set=(1, 2)), _tracker()
    state.apply(Register("g", "store-1", "h1:1", "h1:2"))
    for broker_id, end in ((1, 900), (2, 900), (3, 950)):  # 3 is outside the set: its end does not count
        tracker.heartbeat("g", broker_id, 1, end, 0.1)
    [elect] = tracker.decide(state, 0.1)
    assert (elect.new_master_id, elect.expected_epoch) == (1, 1)
    state.apply(elect)
    assert (state.groups["g"].master_id, state.groups["g"].epoch) == (1, 2)
    assert tracker.answer(state, "g", 1, 0.2).lease


def test_a_restarted_slave_is_marked_until_it_leaves_the_set_and_the_mark_survives_a_snapshot():
    state = _state()
    state.apply(Register("g", "store-2", "h2:1", "h2:2"))
    assert state.groups["g"].restarted == {2} and not state.groups["g"].master_restarted
    assert ControllerState.restore(state.snapshot()).groups["g"].restarted == {2}
    assert state.apply(AlterSyncStateSet("g", 1, 1, 2, frozenset({1, 3}))).accepted
    assert state.groups["g"].restarted == frozenset()  # out of the set; back in only once caught up


def test_after_a_lapse_a_set_with_a_restarted_member_elects_only_on_log_ends_heard_since():
    """The master lapsed while a slave of its set had restarted (a power loss may have cut its
    tail): the controller compares log ends heard after it noticed, and elects the restarted one
    only when every member of the set was heard since."""
    state, tracker = _state(), _tracker(now=5.0)
    state.apply(Register("g", "store-2", "h2:1", "h2:2"))
    tracker.heartbeat("g", 2, 1, 300, 5.1)  # restarted, its tail cut
    tracker.heartbeat("g", 3, 1, 500, 5.2)
    assert tracker.decide(state, 5.75) == []  # the master lapsed; 3's end is from before: wait for it
    tracker.heartbeat("g", 2, 1, 300, 5.8)
    tracker.heartbeat("g", 3, 1, 500, 5.8)
    [elect] = tracker.decide(state, 5.81)
    assert elect.new_master_id == 3


def test_a_restarted_member_is_not_elected_while_a_member_of_the_set_is_not_heard():
    state, tracker = _state(sync_set=(1, 2, 3)), _tracker(now=5.0)
    state.apply(Register("g", "store-2", "h2:1", "h2:2"))
    [elect] = tracker.decide(state, 5.75)  # nobody heard since this leader took office
    assert elect.new_master_id is None
    state.apply(elect)
    tracker.heartbeat("g", 2, 1, 300, 5.8)  # the only one heard: 1 and 3 are down or cut off
    assert tracker.decide(state, 5.81) == []  # 3 may hold what 2 lost
    assert tracker.answer(state, "g", 2, 5.81).master_id is None
    tracker.heartbeat("g", 3, 1, 200, 6.0)  # back, with less: 2 is the longest log after all
    tracker.heartbeat("g", 2, 1, 300, 6.0)
    tracker.heartbeat("g", 1, 1, 250, 6.0)
    [elect] = tracker.decide(state, 6.01)
    assert elect.new_master_id == 2


def test_a_restarted_master_is_named_by_nobody_until_elected_again():
    """A power loss may have cut its epoch's entry from its table: named master in that epoch it
    would open it again at another offset."""
    state, tracker = _state(), _tracker()
    state.apply(Register("g", "store-1", "h1:1", "h1:2"))
    for broker_id in (1, 2, 3):
        answer = tracker.answer(state, "g", broker_id, 0.1)
        assert (answer.master_id, answer.master_ha_address, answer.lease) == (None, None, False)


def _set_of_one_after_failover() -> tuple[ControllerState, ElectionTracker]:
    """Broker 1 was master of epoch 1 with the set {1, 2}; it lapsed and 2, caught up to 2,120,
    was elected in epoch 2 with the set {2} (its epoch file: epoch 2 starts at 2,120). Then a
    power loss cut 2's log to 1,696 and it registered again (restarted)."""
    state = _state(sync_set=(1, 2))
    assert state.apply(Elect("g", 2, 1, "master 1 lapsed")).accepted
    assert state.groups["g"].sync_state_set == {2}
    state.apply(Register("g", "store-2", "h2:1", "h2:2"))
    assert state.groups["g"].master_restarted
    return state, _tracker(now=0.0)


def test_a_set_of_one_that_lost_the_tail_of_its_epoch_gives_way_to_the_member_whose_log_covers_it():
    """Without the report (or the rule) broker 2, the only member of its set, is elected again on
    its cut log (epoch 3 opens at 1,696) and broker 1, rejoining, cuts [1,696, 2,120): acknowledged
    writes lost. With it, 1 (outside the set, its log covering 2,120) is elected."""
    state, tracker = _set_of_one_after_failover()
    blind = _tracker(now=0.0)  # the same heartbeats without lost_tail: the case the rule closes
    for each, lost_tail in ((tracker, 2120), (blind, None)):
        assert each.decide(state, 0.05) == []  # notices the restart: ends heard from now on count
        each.heartbeat("g", 2, 2, 1696, 0.1, lost_tail=lost_tail)
        each.heartbeat("g", 1, 1, 2120, 0.1)
        each.heartbeat("g", 3, 1, 900, 0.1)  # lagging: does not cover 2,120
    [wrong] = blind.decide(state, 0.15)
    assert wrong.new_master_id == 2  # the loss the design describes
    assert not tracker.answer(state, "g", 2, 0.15).lease and tracker.answer(state, "g", 2, 0.15).master_id is None
    [elect] = tracker.decide(state, 0.15)
    assert (elect.new_master_id, elect.expected_epoch) == (1, 2)
    assert "lost the tail it held when epoch 2 began, up to 2120" in elect.reason and "UNCLEAN" not in elect.reason
    assert state.apply(elect).accepted
    assert (state.groups["g"].master_id, state.groups["g"].epoch, state.groups["g"].sync_state_set) == (1, 3, {1})


def test_a_lost_tail_waits_for_a_member_that_covers_it_and_for_every_member_to_be_heard():
    state, tracker = _set_of_one_after_failover()
    assert tracker.decide(state, 0.05) == []
    tracker.heartbeat("g", 2, 2, 1696, 0.1, lost_tail=2120)
    assert tracker.decide(state, 0.1) == []  # 1 and 3 not heard: never 2 on its cut log
    tracker.heartbeat("g", 1, 1, 2000, 0.2)  # short of 2,120
    assert tracker.decide(state, 0.25) == []  # 3 not heard: it may hold what 2 lost
    tracker.heartbeat("g", 3, 0, 5000, 0.3)  # long, but not of this history (its last epoch is older)
    assert tracker.decide(state, 0.35) == []
    tracker.heartbeat("g", 3, 1, 2200, 0.4)  # a slave of 1's epoch reaching past 2,120
    [elect] = tracker.decide(state, 0.45)
    assert elect.new_master_id == 3


def test_a_lost_tail_is_not_covered_while_a_member_outside_the_set_is_down():
    state, tracker = _set_of_one_after_failover()
    assert tracker.decide(state, 0.05) == []
    tracker.heartbeat("g", 2, 2, 1696, 0.1, lost_tail=2120)
    tracker.heartbeat("g", 1, 1, 2120, 0.1)
    tracker.heartbeat("g", 3, 2, 2500, 0.1)  # a slave of 2 in epoch 2, once in its set: it may hold more
    tracker.heartbeat("g", 2, 2, 1696, 0.9, lost_tail=2120)
    tracker.heartbeat("g", 1, 1, 2120, 0.9)
    assert tracker.decide(state, 0.9) == []  # 3 lapsed
    tracker.heartbeat("g", 3, 2, 2500, 1.0)
    [elect] = tracker.decide(state, 1.0)
    assert elect.new_master_id == 3  # its epoch is 2's: the longest of that history


def test_an_unclean_election_prefers_a_member_without_a_lost_tail():
    state, tracker = _set_of_one_after_failover()
    tracker = _tracker(now=0.0, allow_unclean_election=True)
    assert tracker.decide(state, 0.05) == []
    tracker.heartbeat("g", 2, 2, 1696, 0.1, lost_tail=2120)
    tracker.heartbeat("g", 1, 1, 1800, 0.1)  # does not cover 2,120: not clean
    tracker.heartbeat("g", 3, 1, 900, 0.1)
    assert tracker.decide(state, 0.15) == []  # the master is alive: the unclean rule is for a lapsed one
    tracker.heartbeat("g", 1, 1, 1800, 0.9)
    tracker.heartbeat("g", 3, 1, 900, 0.9)
    [elect] = tracker.decide(state, 0.9)  # 2 lapsed
    assert elect.new_master_id == 1 and "UNCLEAN" in elect.reason


def test_a_heartbeat_whose_epoch_starts_within_its_log_reports_no_lost_tail():
    tracker = _tracker()
    tracker.heartbeat("g", 2, 2, 2120, 0.1, lost_tail=2120)
    assert tracker.lost_tail("g", 2) is None
    tracker.heartbeat("g", 2, 2, 2119, 0.2, lost_tail=2120)
    assert tracker.lost_tail("g", 2) == 2120


def test_a_set_of_one_whose_power_failed_before_it_opened_its_epoch_gives_way_to_a_longer_log_of_its_history():
    """Broker 2 is elected at 2,120 (its heartbeat then; the Elect entry records it) and loses
    power before its promotion wrote the epoch: its log ends at 1,696 and its last epoch is still
    1, so it reports no lost tail. The controller compares it with the members of epoch 1's
    history: 1 reaches 2,120."""
    state, tracker = _state(sync_set=(1, 2)), _tracker(now=0.0)
    tracker.heartbeat("g", 2, 1, 2120, 0.0)
    elect = tracker.stamped(Elect("g", 2, 1, "master 1 lapsed"))
    assert elect.master_end == 2120
    assert state.apply(elect).accepted and state.groups["g"].master_end == 2120
    assert ControllerState.restore(state.snapshot()).groups["g"].master_end == 2120
    state.apply(Register("g", "store-2", "h2:1", "h2:2"))  # restarted, never promoted
    intact = _tracker(now=0.0)  # after a process kill its log is whole: elected again, as before
    for each, end in ((tracker, 1696), (intact, 2120)):
        assert each.decide(state, 0.05) == []
        each.heartbeat("g", 2, 1, end, 0.1)
        each.heartbeat("g", 1, 1, 2120, 0.1)
        each.heartbeat("g", 3, 1, 900, 0.1)
    [elect] = tracker.decide(state, 0.15)
    assert elect.new_master_id == 1 and "up to 2120" in elect.reason
    [elect] = intact.decide(state, 0.15)
    assert elect.new_master_id == 2


def _elected_at(end: int, reason: str) -> tuple[ControllerState, ElectionTracker]:
    """Broker 2, a slave of 1 in epoch 1's set {1, 2}, elected into epoch 2 at ``end`` (its
    last heartbeat, stamped on the Elect)."""
    state, tracker = _state(sync_set=(1, 2)), _tracker(now=0.0)
    tracker.heartbeat("g", 2, 1, end, 0.0)
    assert state.apply(tracker.stamped(Elect("g", 2, 1, reason))).accepted
    return state, tracker


def _hear(tracker: ElectionTracker, now: float, *beats: tuple[int, int, int]) -> None:
    """Heartbeats of group g at ``now``: (broker id, last epoch, log end) each."""
    for broker_id, epoch, end in beats:
        tracker.heartbeat("g", broker_id, epoch, end, now)


class _Blind(ElectionTracker):
    __slots__ = ()

    def lost_end(self, name, group, broker_id):
        return None if (group.master_end or 0) <= self.liveness(name, broker_id).max_offset else group.master_end


def test_a_set_of_one_that_lost_writes_acknowledged_after_its_election_gives_way_to_the_old_master():
    """Broker 2 is elected by an operator's switchover at 2,120 (its heartbeat then); broker 1's
    lease still holds, and it acknowledges writes up to 2,400 that 2, its slave until it hears of
    its election, holds. Then 2's power fails before its promotion wrote the epoch: its log ends at
    2,300, above the end it was elected with. Nothing was acknowledged in the unopened epoch 2, so
    the old master's log holds every acknowledged write: 1, the longest of epoch 1's history, is
    elected once every member is heard since the restart (3 down may hold more); a member with
    an older last epoch and a longer log (a branch epoch 1 cut) does not count."""
    state, tracker = _elected_at(2120, "an operator's switchover")
    state.apply(Register("g", "store-2", "h2:1", "h2:2"))  # restarted, never promoted
    blind = _Blind(TIMINGS)  # the rule before: 2's end is above the one it was elected with
    blind.became_leader(0.0)
    for each in (tracker, blind):
        assert each.decide(state, 0.05) == []
        each.heartbeat("g", 2, 1, 2300, 0.1)
        each.heartbeat("g", 1, 1, 2400, 0.1)
    [wrong] = blind.decide(state, 0.15)
    assert wrong.new_master_id == 2  # on 2,300: 1, rejoining, would cut acknowledged [2,300, 2,400)
    assert tracker.decide(state, 0.15) == []  # 3 not heard since the restart
    tracker.heartbeat("g", 3, 0, 9000, 0.2)  # an older history: its length proves nothing
    [elect] = tracker.decide(state, 0.25)
    assert (elect.new_master_id, elect.expected_epoch) == (1, 2) and "up to 2400" in elect.reason
    assert "UNCLEAN" not in elect.reason


def test_a_restarted_set_of_one_that_never_opened_its_epoch_is_elected_when_no_member_of_its_history_is_longer():
    """As above, but 1's log ends at 2,300 too (and 3, of epoch 1's history, lags): 2 lost
    nothing anyone could hold, and is elected again."""
    state, tracker = _elected_at(2120, "master 1 lapsed")
    state.apply(Register("g", "store-2", "h2:1", "h2:2"))
    assert tracker.decide(state, 0.05) == []
    _hear(tracker, 0.1, (2, 1, 2300), (1, 1, 2300), (3, 1, 1000))
    [elect] = tracker.decide(state, 0.15)
    assert elect.new_master_id == 2


def test_an_end_heard_before_a_truncation_does_not_keep_the_group_without_a_master():
    """Broker 2, master of epoch 1 with writes past what 1 held, is switched over from at 1,600
    (1 elected) and, following 1, cuts its unacknowledged tail; the controller last heard it at
    2,000, before the cut. 1 restarts after a power loss at 1,800; 2 is elected into epoch 3 on
    that stale 2,000 (``master_end``), is killed and restarts at 1,700 in epoch 2. Nobody holds
    2,000 and nothing was lost: 1, the longest of epoch 2's history, is elected (the rule before
    compared with ``master_end`` and waited for a log of 2,000 for good)."""
    state, tracker = _state(sync_set=(1, 2), master=2), _tracker(now=0.0)
    tracker.heartbeat("g", 1, 1, 1600, 0.0)
    assert state.apply(tracker.stamped(Elect("g", 1, 1, "an operator's switchover"))).accepted
    tracker.heartbeat("g", 2, 1, 2000, 0.1)
    assert state.apply(tracker.stamped(Elect("g", 2, 2, "master 1 lapsed"))).accepted
    assert state.groups["g"].master_end == 2000
    state.apply(Register("g", "store-2", "h2:1", "h2:2"))
    assert tracker.decide(state, 0.15) == []
    _hear(tracker, 0.2, (2, 2, 1700), (1, 2, 1800), (3, 0, 0))
    [elect] = tracker.decide(state, 0.25)
    assert (elect.new_master_id, elect.expected_epoch) == (1, 3)


def test_the_cover_of_an_unopened_set_of_one_counts_only_members_heard_since_the_latest_restart():
    """The cover is computed from the restart this leader noticed last; after a restart in a later
    epoch (not yet noticed: no pass of ``decide`` since) heartbeats from before it prove nothing,
    and the operator's ELECT path, which asks without a pass, hears "unknown"."""
    from hasvc.state.controller.elect import LOST_END_UNKNOWN

    state, tracker = _elected_at(2120, "an operator's switchover")
    state.apply(Register("g", "store-2", "h2:1", "h2:2"))  # 2 restarted, never promoted
    assert tracker.decide(state, 0.05) == []  # notices the restart
    _hear(tracker, 0.1, (2, 1, 2300), (1, 1, 2400), (3, 1, 1000))
    assert tracker.lost_end("g", state.groups["g"], 2) == 2400  # 1, of epoch 1's history, holds more
    assert state.apply(tracker.stamped(Elect("g", 2, 2, "an operator's switchover"))).accepted  # epoch 3, set {2}
    state.apply(Register("g", "store-2", "h2:1", "h2:2"))  # 2 restarts again before it opens epoch 3
    group = state.groups["g"]
    assert (group.epoch, group.sync_state_set, group.restarted) == (3, {2}, {2})
    assert tracker.lost_end("g", group, 2) == LOST_END_UNKNOWN
