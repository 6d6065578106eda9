"""A put's refusal, waits and final status (hasvc.state.puts)."""

from commitlog.record import PutMessageStatus as S
from hasvc.config import BrokerRole
from hasvc.state.puts import PutTracker, WaitPlan, final_status
from hasvc.state.replication import Admission
from hasvc.state.role import RoleState

SYNC_MASTER = RoleState(BrokerRole.SYNC_MASTER, None)
ASYNC_MASTER = RoleState(BrokerRole.ASYNC_MASTER, None)


def tracker(*, sync_flush=False, in_sync_replicas=1, min_in_sync_replicas=0):
    return PutTracker(sync_flush=sync_flush, in_sync_replicas=in_sync_replicas, min_in_sync_replicas=min_in_sync_replicas,
                      flush_timeout_seconds=5.0, ack_timeout_seconds=3.0)  # fmt: skip


def never():
    raise AssertionError("not asked")


def test_a_slave_or_a_fenced_master_refuses_before_counting_slaves():
    refusal = tracker(min_in_sync_replicas=1).refusal(RoleState(BrokerRole.SLAVE, ("m", 1)), never)
    assert refusal.status is S.SERVICE_NOT_AVAILABLE and "m:1" in refusal.reason
    fenced = RoleState(BrokerRole.SYNC_MASTER, None)
    fenced.fence("slave s1 knows epoch 9")
    assert tracker().refusal(fenced, never).reason == "this broker is fenced: slave s1 knows epoch 9"


def test_too_few_slaves_in_sync_refuse_with_the_counts():
    refusal = tracker(min_in_sync_replicas=2).refusal(SYNC_MASTER, lambda: 1)
    assert refusal.status is S.IN_SYNC_REPLICAS_NOT_ENOUGH
    assert refusal.reason == "1 slave(s) in sync, fewer than min_in_sync_replicas 2; not stored"
    assert tracker(min_in_sync_replicas=2).refusal(SYNC_MASTER, lambda: 2) is None
    assert tracker().refusal(SYNC_MASTER, never) is None  # no minimum: slaves are not counted


def test_which_puts_wait():
    assert tracker().must_wait(SYNC_MASTER) and not tracker().must_wait(ASYNC_MASTER)
    assert tracker(sync_flush=True).must_wait(ASYNC_MASTER)
    assert not tracker(in_sync_replicas=0).must_wait(SYNC_MASTER)


def test_a_sync_master_put_waits_for_acks_unless_already_replicated_or_no_slave_is_close():
    rules = tracker(sync_flush=True)
    assert rules.plan(100, role=SYNC_MASTER, replicated_to=50, admit=lambda: Admission.WAIT, shortfall=never) == WaitPlan(True, True)
    assert rules.plan(100, role=SYNC_MASTER, replicated_to=100, admit=never, shortfall=never) == WaitPlan(True, False)
    plan = rules.plan(100, role=SYNC_MASTER, replicated_to=50, admit=lambda: Admission.SLAVE_NOT_AVAILABLE, shortfall=lambda: "1 needed, 0 there")
    assert (plan.flush, plan.ack, plan.status, plan.reason) == (True, False, S.SLAVE_NOT_AVAILABLE, "1 needed, 0 there")
    assert rules.plan(100, role=ASYNC_MASTER, replicated_to=-1, admit=never, shortfall=never) == WaitPlan(True, False)


def test_deadlines_are_now_plus_the_timeouts():
    assert (tracker().flush_deadline(10.0), tracker().ack_deadline(10.0)) == (15.0, 13.0)


def test_final_status_says_what_is_known_and_a_flush_timeout_wins():
    assert final_status(S.PUT_OK, "", flushed=True, acked=True) == (S.PUT_OK, "")
    assert final_status(S.PUT_OK, "", flushed=None, acked=None) == (S.PUT_OK, "")
    assert final_status(S.PUT_OK, "", flushed=None, acked=False)[0] is S.FLUSH_SLAVE_TIMEOUT
    assert final_status(S.PUT_OK, "", flushed=False, acked=False)[0] is S.FLUSH_DISK_TIMEOUT
    assert final_status(S.SLAVE_NOT_AVAILABLE, "r", flushed=True, acked=None) == (S.SLAVE_NOT_AVAILABLE, "r")
    assert final_status(S.SLAVE_NOT_AVAILABLE, "r", flushed=False, acked=None)[0] is S.FLUSH_DISK_TIMEOUT
