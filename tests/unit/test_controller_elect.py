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
    assert tracker.decide(state, 0.1) == [Elect("g", 2, 0, "first master of the group")]
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
