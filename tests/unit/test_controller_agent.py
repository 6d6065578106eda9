"""The broker's agent (``hasvc.state.controller.agent``): what a heartbeat answer means for the role."""

import pytest

from hasvc.state.controller.agent import (
    Fence,
    FollowMaster,
    LocalState,
    Promote,
    RenewLease,
    Role,
    Unfence,
    lease_change,
    plan,
)
from hasvc.state.controller.elect import HeartbeatAnswer


def _answer(master_id, epoch, *, broker_id=1, lease=False) -> HeartbeatAnswer:
    addresses = (f"h{master_id}:1", f"h{master_id}:2") if master_id is not None else (None, None)
    return HeartbeatAnswer("g", broker_id, master_id, *addresses, epoch, frozenset({master_id} - {None}), epoch, lease)


def test_a_slave_named_master_in_a_newer_epoch_promotes_then_renews():
    local = LocalState(1, Role.SLAVE, 3, 500, following=2)
    assert plan(local, _answer(1, 4, lease=True), 7.5) == [Promote(4), RenewLease(7.5)]


def test_a_restarted_broker_named_master_in_its_own_epoch_resumes_only_with_a_lease():
    """Without the lease the controller has not let it resume (it may have lost unflushed bytes
    it acknowledged): appending at a shorter end would make its epoch differ from its slaves'."""
    local = LocalState(1, Role.NONE, 4, 500)
    assert plan(local, _answer(1, 4), 1.0) == []
    assert plan(local, _answer(1, 4, lease=True), 1.0) == [Promote(4), RenewLease(1.0)]
    assert plan(local, _answer(1, 5), 1.0) == [Promote(5)]  # elected again, into a new epoch


def test_a_serving_master_only_renews_its_lease():
    local = LocalState(1, Role.MASTER, 4, 500)
    assert plan(local, _answer(1, 4, lease=True), 2.0) == [RenewLease(2.0)]
    assert plan(local, _answer(1, 4, lease=False), 2.0) == []


def test_a_master_reelected_in_a_newer_epoch_opens_it():
    local = LocalState(1, Role.MASTER, 4, 500)
    assert plan(local, _answer(1, 6, lease=True), 3.0) == [Promote(6), RenewLease(3.0)]


@pytest.mark.parametrize("role", [Role.MASTER, Role.NONE, Role.SLAVE])
def test_another_master_named_means_follow_it(role):
    local = LocalState(1, role, 4, 500, following=3 if role is Role.SLAVE else None)
    assert plan(local, _answer(2, 5), 1.0) == [FollowMaster(2, "h2:2", "h2:1")]


def test_a_slave_already_following_the_named_master_does_nothing():
    assert plan(LocalState(1, Role.SLAVE, 4, 500, following=2), _answer(2, 5), 1.0) == []


def test_no_master_named_fences_a_master_and_leaves_a_slave_following():
    assert plan(LocalState(1, Role.MASTER, 4, 500), _answer(None, 4), 1.0) == [
        Fence("the controller names no master of group 'g' in epoch 4")
    ]
    assert plan(LocalState(1, Role.SLAVE, 4, 500, following=2), _answer(None, 4), 1.0) == []


def test_an_answer_older_than_the_log_changes_nothing():
    assert plan(LocalState(1, Role.MASTER, 6, 500), _answer(2, 5), 1.0) == []
    assert plan(LocalState(1, Role.SLAVE, 6, 500, following=3), _answer(1, 5, lease=True), 1.0) == []


def test_lease_changes_are_reported_as_edges():
    assert lease_change(fenced=False, lease_holds=True) is None
    assert isinstance(lease_change(fenced=False, lease_holds=False), Fence)
    assert lease_change(fenced=True, lease_holds=True) == Unfence()
    assert lease_change(fenced=True, lease_holds=False) is None
