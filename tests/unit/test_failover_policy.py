"""The failover client's choice and retry policy (hasvc.state.failover)."""

from hasvc.state.failover import Backoff, Next, SendOutcome, after_send, choose_master, outcome_of


def test_the_master_with_the_newest_epoch_wins_and_slaves_fenced_or_silent_brokers_never_do():
    statuses = [
        ("a:1", {"role": "SYNC_MASTER", "epoch": 7}),  # a deposed master that has not learnt it yet
        ("b:1", {"role": "SYNC_MASTER", "epoch": 8}),
        ("c:1", {"role": "SLAVE", "epoch": 9}),
        ("d:1", {"role": "ASYNC_MASTER", "epoch": 10, "fenced_by": "slave s knows epoch 11"}),
        ("e:1", None),
    ]
    assert choose_master(statuses) == ("b:1", {"role": "SYNC_MASTER", "epoch": 8})
    assert choose_master([("c:1", {"role": "SLAVE"}), ("e:1", None)]) is None
    assert choose_master([]) is None


def test_equal_epochs_choose_by_address_not_by_comparing_statuses():
    assert choose_master([("a:1", {"role": "SYNC_MASTER", "epoch": 3}), ("b:1", {"role": "SYNC_MASTER", "epoch": 3})])[0] == "b:1"


def test_backoff_doubles_up_to_its_maximum_and_stops_at_the_deadline():
    backoff = Backoff(0.05, 0.3)
    pauses = [backoff.next_pause(now=0.0, deadline=10.0) for _ in range(5)]
    assert pauses == [0.05, 0.1, 0.2, 0.3, 0.3]
    assert backoff.next_pause(now=9.8, deadline=10.0) is None


def test_after_a_send():
    assert outcome_of("PUT_OK") is SendOutcome.STORED and outcome_of("FLUSH_SLAVE_TIMEOUT") is SendOutcome.STORED
    assert outcome_of("SERVICE_NOT_AVAILABLE") is SendOutcome.NOT_MASTER
    assert after_send(SendOutcome.STORED, retry=True, now=0.0, deadline=1.0) is Next.RETURN
    assert after_send(SendOutcome.NOT_MASTER, retry=True, now=0.0, deadline=1.0) is Next.FIND_MASTER
    assert after_send(SendOutcome.FAILED, retry=True, now=0.0, deadline=1.0) is Next.FIND_MASTER
    # without retries, or past the deadline, the caller gets what happened
    assert after_send(SendOutcome.NOT_MASTER, retry=False, now=0.0, deadline=1.0) is Next.RETURN
    assert after_send(SendOutcome.FAILED, retry=False, now=0.0, deadline=1.0) is Next.RAISE
    assert after_send(SendOutcome.FAILED, retry=True, now=2.0, deadline=1.0) is Next.RAISE
    assert after_send(SendOutcome.NOT_MASTER, retry=True, now=2.0, deadline=1.0) is Next.RETURN
