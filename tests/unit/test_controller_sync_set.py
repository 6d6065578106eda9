"""The master's SyncStateSet tracker (``hasvc.state.controller.sync_set``): shrink, expand, the
pending union (apache/rocketmq#5663), a dead slave out in one step (apache/rocketmq#9897), one
proposal in flight, admission and the lease."""

import dataclasses

from hasvc.state.controller.config import ControllerTimings
from hasvc.state.controller.state import AlterSyncStateSet
from hasvc.state.controller.sync_set import SyncStateSetTracker

TIMINGS = ControllerTimings()


def _tracker(members=(1,), *, set_epoch=1, end=100, min_in_sync=2, now=0.0, asynchronous=False) -> SyncStateSetTracker:
    timings = dataclasses.replace(TIMINGS, min_in_sync_replicas=min_in_sync)
    tracker = SyncStateSetTracker("g", 1, 3, epoch_start_offset=40, master_end=end, sync_state_set=frozenset(members),
                                  sync_state_set_epoch=set_epoch, timings=timings, now=now, asynchronous=asynchronous)  # fmt: skip
    tracker.renew(now)
    return tracker


def test_a_caught_up_slave_is_proposed_in():
    tracker = _tracker()
    assert tracker.on_ack(2, 60, 100, 0.01) is None  # behind the confirm offset (the master's end, alone)
    assert tracker.on_ack(2, 100, 100, 0.02) == AlterSyncStateSet("g", 1, 3, 1, frozenset({1, 2}))


def test_a_slave_below_the_epoch_start_is_not_proposed_in():
    tracker = SyncStateSetTracker("g", 1, 3, epoch_start_offset=100, master_end=100, sync_state_set=frozenset({1}),
                                  sync_state_set_epoch=1, timings=TIMINGS, now=0.0)  # fmt: skip
    tracker.on_append(100)
    assert tracker._to_expand() == frozenset()  # noqa: SLF001 -- nothing acked yet, the end is the start
    assert tracker.on_ack(2, 100, 100, 0.0) is not None


def test_expansion_pending_waits_for_the_union_of_old_and_new_sets_5663():
    """apache/rocketmq#5663: slave 2 is being added; a write acknowledged before the controller
    applies the expansion must be on slave 2 too, since slave 2 may be elected from then on."""
    tracker = _tracker(members=(1, 3))
    tracker.on_ack(3, 100, 100, 0.0)
    proposal = tracker.on_ack(2, 100, 100, 0.0)
    assert proposal.new_set == {1, 2, 3}
    tracker.on_append(110)  # a write W at 100..110
    tracker.on_ack(3, 110, 110, 0.01)
    assert tracker.counted_members() == {1, 2, 3}
    assert tracker.confirm_offset(0.01) == 100  # not 110: slave 2 lacks W
    tracker.on_answer(proposal, True, proposal.new_set, 2, master_epoch=3)
    assert tracker.sync_state_set == {1, 2, 3} and tracker.proposal is None
    assert tracker.confirm_offset(0.02) == 100
    tracker.on_ack(2, 110, 110, 0.02)
    assert tracker.confirm_offset(0.02) == 110


def test_a_lost_answer_keeps_the_union_and_the_same_proposal_is_sent_again():
    tracker = _tracker(members=(1,))
    proposal = tracker.on_ack(2, 100, 100, 0.0)
    tracker.on_append(120)
    assert tracker.ack_watermark() == 100  # the union, though unanswered
    assert tracker.tick(0.1) is None  # in flight, not yet due again
    assert tracker.tick(TIMINGS.sync_set_proposal_retry_seconds) == proposal
    # the first copy was applied: the retry is refused and the answer shows the set it made
    tracker.on_answer(proposal, False, frozenset({1, 2}), 2, master_epoch=3)
    assert tracker.sync_state_set == {1, 2} and tracker.sync_state_set_epoch == 2


def test_a_refused_proposal_ends_and_the_set_stays():
    tracker = _tracker(members=(1, 2), set_epoch=4)
    tracker.on_ack(2, 100, 100, 0.0)
    proposal = tracker.on_disconnect(2, 0.1)
    tracker.on_answer(proposal, False, frozenset({1, 2}), 4, master_epoch=3)  # refused, the set epoch unmoved
    assert tracker.proposal is None and tracker.sync_state_set == {1, 2}


def test_an_answer_of_another_master_epoch_says_nothing_of_our_set():
    tracker = _tracker(members=(1, 2))
    tracker.on_ack(2, 100, 100, 0.0)
    proposal = tracker.on_disconnect(2, 0.1)
    tracker.on_answer(proposal, False, frozenset({3}), 5, master_epoch=4)  # another master's set
    assert tracker.sync_state_set == {1, 2} and tracker.proposal is not None
    tracker.on_heartbeat(frozenset({3}), 6, master_epoch=4)
    assert tracker.sync_state_set == {1, 2}


def test_a_shrink_takes_effect_only_once_accepted():
    tracker = _tracker(members=(1, 2))
    tracker.on_ack(2, 100, 100, 0.0)
    tracker.on_append(150)
    proposal = tracker.on_disconnect(2, 0.1)
    assert proposal.new_set == {1}
    assert tracker.confirm_offset(0.1) == 100  # slave 2 may still be elected: still waited for
    tracker.on_answer(proposal, True, frozenset({1}), 2, master_epoch=3)
    assert tracker.ack_watermark() == 150
    assert not tracker.admit()  # fewer than min_in_sync_replicas in the set: writes are refused
    assert tracker.confirm_offset(0.1) is None  # and waiters are not released by the master alone


def test_while_a_set_of_the_master_alone_is_pending_nothing_past_its_flush_is_released():
    """The driver flushes the log to where it stood at the proposal before sending it; a lagging
    slave that still acks meanwhile releases nothing past that (after the shrink the master alone
    holds what was acknowledged, and an unflushed write would be held only outside the set)."""
    tracker = _tracker(members=(1, 2), min_in_sync=1)
    tracker.on_ack(2, 100, 100, 0.0)
    tracker.on_append(200)
    tracker.on_ack(2, 150, 200, 1.0)  # connected, never caught up again
    proposal = tracker.tick(TIMINGS.sync_set_lag_seconds_max + 0.01)
    assert proposal.new_set == {1} and tracker.alone_from == 200
    tracker.on_append(300)
    now = TIMINGS.sync_set_lag_seconds_max + 0.02
    tracker.renew(now)
    tracker.on_ack(2, 300, 300, now)
    assert tracker.ack_watermark() == 300 and tracker.confirm_offset(now) == 200
    tracker.on_answer(proposal, True, frozenset({1}), 2, master_epoch=3)
    assert tracker.confirm_offset(now) == 300  # alone (min_in_sync_replicas 1): its own end


def test_a_lagging_slave_is_proposed_out_after_the_lag_bound():
    tracker = _tracker(members=(1, 2))
    tracker.on_ack(2, 100, 100, 0.0)
    tracker.on_append(200)
    tracker.on_ack(2, 150, 200, 1.0)  # connected, but never caught up again
    assert tracker.tick(TIMINGS.sync_set_lag_seconds_max - 0.01) is None
    assert tracker.tick(TIMINGS.sync_set_lag_seconds_max + 0.01).new_set == {1}


def test_two_slaves_down_leave_the_set_in_bounded_steps_9897():
    """apache/rocketmq#9897: with both slaves dead, a removeConnection race kept them in the set and
    every SYNC_MASTER write waited for FLUSH_SLAVE_TIMEOUT. Here each closed connection proposes the
    shrink at once: two controller round trips, no lag bound waited out."""
    tracker = _tracker(members=(1, 2, 3), min_in_sync=1)
    tracker.on_ack(2, 100, 100, 0.0)
    tracker.on_ack(3, 100, 100, 0.0)
    tracker.on_append(130)
    first = tracker.on_disconnect(2, 0.10)
    assert first.new_set == {1, 3}
    assert tracker.on_disconnect(3, 0.11) is None  # one proposal in flight
    assert tracker.confirm_offset(0.11) == 100  # both still in the controller's set: waited for
    tracker.on_answer(first, True, first.new_set, 2, master_epoch=3)
    second = tracker.tick(0.12)
    assert second == AlterSyncStateSet("g", 1, 3, 2, frozenset({1}))
    tracker.on_answer(second, True, second.new_set, 3, master_epoch=3)
    assert tracker.sync_state_set == {1}
    assert tracker.confirm_offset(0.13) == 130  # min_in_sync_replicas 1: the master alone acknowledges
    assert TIMINGS.sync_set_lag_seconds_max > 0.13


def test_a_set_member_that_never_connects_is_proposed_out_after_the_lag_bound():
    tracker = _tracker(members=(1, 2), now=5.0)  # a restarted master: the set from the controller
    assert tracker.tick(5.0 + TIMINGS.sync_set_lag_seconds_max) is None
    assert tracker.tick(5.1 + TIMINGS.sync_set_lag_seconds_max).new_set == {1}


def test_a_newer_set_in_a_heartbeat_answer_settles_the_proposal():
    tracker = _tracker(members=(1,))
    tracker.on_ack(2, 100, 100, 0.0)
    tracker.on_heartbeat(frozenset({1}), 1, master_epoch=3)  # not yet applied: still pending
    assert tracker.proposal is not None
    tracker.on_heartbeat(frozenset({1, 2}), 2, master_epoch=3)
    assert tracker.proposal is None and tracker.sync_state_set == {1, 2}


def test_the_lease_counts_from_the_heartbeat_send():
    tracker = _tracker(members=(1, 2))
    tracker.on_ack(2, 100, 100, 0.0)
    tracker.renew(1.0)
    assert tracker.lease_holds(1.0 + TIMINGS.master_lease_seconds - 0.001)
    assert not tracker.lease_holds(1.0 + TIMINGS.master_lease_seconds)
    assert tracker.confirm_offset(1.0 + TIMINGS.master_lease_seconds) is None
    tracker.renew(0.5)  # an older answer does not shorten it
    assert tracker.lease_holds(1.3)


def test_admission_counts_the_accepted_set_only():
    tracker = _tracker(members=(1,))
    assert not tracker.admit()
    proposal = tracker.on_ack(2, 100, 100, 0.0)  # expansion pending
    assert not tracker.admit()
    tracker.on_answer(proposal, True, frozenset({1, 2}), 2, master_epoch=3)
    assert tracker.admit()


def test_an_async_master_acknowledges_its_own_end_while_the_lease_holds():
    """ASYNC_MASTER: a write is acknowledged once the master holds it, members or not, whatever
    min_in_sync_replicas; the lease still gates it, and the set moves on the same rules."""
    tracker = _tracker(members=(1, 2), asynchronous=True)
    tracker.on_ack(2, 100, 100, 0.0)
    tracker.on_append(130)  # slave 2 lacks 100..130
    assert tracker.ack_watermark() == 100
    assert tracker.confirm_offset(0.01) == 130
    shrink = tracker.tick(TIMINGS.sync_set_lag_seconds_max + 0.01)
    assert shrink == AlterSyncStateSet("g", 1, 3, 1, frozenset({1}))  # the lag bound still shrinks
    tracker.on_answer(shrink, True, frozenset({1}), 2, master_epoch=3)
    tracker.renew(TIMINGS.sync_set_lag_seconds_max)
    assert tracker.admit()  # a set of one below min_in_sync_replicas 2: still taken
    assert tracker.confirm_offset(TIMINGS.sync_set_lag_seconds_max + 0.02) == 130
    assert tracker.confirm_offset(TIMINGS.sync_set_lag_seconds_max + TIMINGS.master_lease_seconds) is None  # no lease
    sync = _tracker(members=(1,))
    sync.on_append(130)
    assert not sync.admit() and sync.confirm_offset(0.01) is None  # SYNC_MASTER's promise, for contrast


def test_a_late_answer_to_an_older_proposal_does_not_settle_the_one_in_flight():
    """Seed 558 of the simulation: the answer to an accepted expansion came late, after a
    heartbeat had shown its set and the next proposal (a shrink) was in flight. Taken as the
    answer to the shrink, it ended it while it could still apply."""
    tracker = _tracker(members=(1,))
    expansion = tracker.on_ack(2, 100, 100, 0.0)
    tracker.on_heartbeat(frozenset({1, 2}), 2, master_epoch=3)  # applied; its own answer is late
    shrink = tracker.on_disconnect(2, 0.1)
    assert shrink.new_set == {1} and shrink.sync_state_set_epoch == 2
    tracker.on_answer(expansion, True, frozenset({1, 2}), 2, master_epoch=3)
    assert tracker.proposal == shrink
    tracker.on_answer(expansion, False, frozenset({1, 2}), 2, master_epoch=3)  # a late refused copy
    assert tracker.proposal == shrink
    tracker.on_answer(shrink, False, frozenset({1, 2}), 2, master_epoch=3)
    assert tracker.proposal is None


# -- the tracker against a controller that applies, refuses, loses and reorders --------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hasvc.state.controller.state import ControllerState, Elect, Register  # noqa: E402

_OPS = st.lists(st.tuples(st.sampled_from(["ack", "append", "disconnect", "tick", "apply", "answer", "heartbeat"]),
                          st.integers(2, 4), st.integers(0, 30), st.integers(0, 10)), max_size=80)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(_OPS)
def test_every_member_of_the_controllers_set_is_always_waited_for(ops):
    """Whatever the controller applies, refuses, loses or answers late and out of order, the
    members the master waits for include every member of the controller's set: any of them may
    be elected, so none may lack an acknowledged write (the #5663 rule, and shrinks only once
    accepted)."""
    controller = ControllerState()
    for number in range(1, 5):
        controller.apply(Register("g", f"s{number}", f"h{number}:1", f"h{number}:2"))
    controller.apply(Elect("g", 1, 0, "first"))
    tracker = SyncStateSetTracker("g", 1, 1, epoch_start_offset=0, master_end=0, sync_state_set=frozenset({1}),
                                  sync_state_set_epoch=1, timings=TIMINGS, now=0.0)  # fmt: skip
    now, acks, sent, answers = 0.0, {}, [], []
    for op, slave, amount, pick in ops:
        now += 0.05
        if op == "ack":
            acks[slave] = min(tracker.master_end, acks.get(slave, 0) + amount)
            proposal = tracker.on_ack(slave, acks[slave], tracker.master_end, now)
        elif op == "append":
            tracker.on_append(tracker.master_end + amount)
            proposal = None
        elif op == "disconnect":
            proposal = tracker.on_disconnect(slave, now)
        elif op == "tick":
            now += amount / 10
            proposal = tracker.tick(now)
        elif op == "apply" and sent:
            command = sent.pop(pick % len(sent))
            answer = controller.apply(command)
            if pick % 3:  # else the answer is lost
                group = answer.group
                answers.append((command, answer.accepted, group.sync_state_set, group.sync_state_set_epoch))
            proposal = None
        elif op == "answer" and answers:
            command, accepted, new_set, set_epoch = answers.pop(pick % len(answers))
            tracker.on_answer(command, accepted, new_set, set_epoch, master_epoch=1)
            proposal = tracker.tick(now)
        elif op == "heartbeat":
            group = controller.groups["g"]
            tracker.on_heartbeat(group.sync_state_set, group.sync_state_set_epoch, master_epoch=1)
            proposal = tracker.tick(now)
        else:
            proposal = None
        if proposal is not None:
            sent.append(proposal)
            if pick % 4 == 0:
                sent.append(proposal)  # sent twice (a retry whose first copy was not lost)
        truth = controller.groups["g"].sync_state_set
        assert truth <= tracker.counted_members(), (truth, tracker.counted_members(), tracker.proposal)
        assert tracker.ack_watermark() <= min([acks.get(s, 0) for s in truth - {1}], default=tracker.master_end)
