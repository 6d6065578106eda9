import pytest

from hasvc.state.replication import Admission, ReplicaSet, ReplicationViolation, SlaveProgress


def replica_set(*ids):
    replicas = ReplicaSet()
    for connection_id in ids:
        replicas.add(SlaveProgress(connection_id, f"s{connection_id}", f"127.0.0.1:{connection_id}", 0.0))
    return replicas


def test_first_report_is_the_request_offset_and_later_ones_acknowledge():
    replicas = replica_set(1)
    assert replicas.on_report(1, 0, master_max_offset=100, now=1.0) is True
    assert replicas.on_report(1, 60, master_max_offset=100, now=2.0) is False
    progress = replicas.slaves[1]
    assert (progress.request_offset, progress.ack_offset) == (0, 60)


def test_a_report_beyond_the_master_is_a_violation_and_changes_nothing():
    replicas = replica_set(1)
    replicas.on_report(1, 50, master_max_offset=100, now=1.0)
    with pytest.raises(ReplicationViolation, match="beyond the master's end 100"):
        replicas.on_report(1, 10**12, master_max_offset=100, now=2.0)
    assert replicas.slaves[1].ack_offset == 50
    assert replicas.ack_watermark(1) == 50


def test_a_report_going_backwards_is_a_violation():
    replicas = replica_set(1)
    replicas.on_report(1, 0, master_max_offset=100, now=1.0)
    replicas.on_report(1, 80, master_max_offset=100, now=1.0)
    with pytest.raises(ReplicationViolation, match="went back from 80 to 20"):
        replicas.on_report(1, 20, master_max_offset=100, now=1.0)


def test_watermark_is_the_kth_highest_ack():
    replicas = replica_set(1, 2, 3)
    for connection_id, offset in ((1, 90), (2, 40), (3, 70)):
        replicas.on_report(connection_id, offset, master_max_offset=100, now=0.0)
    assert [replicas.ack_watermark(k) for k in (1, 2, 3, 4)] == [90, 70, 40, -1]
    replicas.remove(1)
    assert replicas.ack_watermark(2) == 40


def test_admission_needs_enough_slaves_within_the_gap():
    replicas = replica_set(1)
    assert replicas.admit(next_offset=10, max_gap=100, replicas=1) is Admission.SLAVE_NOT_AVAILABLE
    replicas.on_report(1, 0, master_max_offset=10, now=0.0)
    assert replicas.admit(next_offset=10, max_gap=100, replicas=1) is Admission.WAIT
    assert replicas.admit(next_offset=500, max_gap=100, replicas=1) is Admission.SLAVE_NOT_AVAILABLE
    assert replicas.admit(next_offset=10, max_gap=100, replicas=2) is Admission.SLAVE_NOT_AVAILABLE


def test_lag_in_bytes_and_seconds_since_caught_up():
    replicas = replica_set(1)
    replicas.on_report(1, 100, master_max_offset=100, now=5.0)
    progress = replicas.slaves[1]
    assert replicas.lag(progress, master_max_offset=100, now=9.0) == (0, 0.0)
    assert replicas.lag(progress, master_max_offset=150, now=9.0) == (50, 4.0)


def test_lag_of_a_slave_never_caught_up_counts_from_its_connection_not_the_clocks_zero():
    replicas = ReplicaSet()
    replicas.add(SlaveProgress(1, "s1", "127.0.0.1:1", 0.0, caught_up_at=1000.0))  # connected at 1000
    progress = replicas.slaves[1]
    assert replicas.lag(progress, master_max_offset=500, now=1003.0) == (500, 3.0)  # before its first report
    replicas.on_report(1, 100, master_max_offset=500, now=1004.0)
    assert replicas.lag(progress, master_max_offset=500, now=1006.0) == (400, 6.0)
    replicas.on_report(1, 500, master_max_offset=500, now=1007.0)
    assert replicas.lag(progress, master_max_offset=600, now=1010.0) == (100, 3.0)


def test_ready_count_measures_the_gap_from_the_puts_end():
    replicas = replica_set(1, 2)
    replicas.on_report(1, 100, master_max_offset=100, now=0.0)
    replicas.on_report(2, 20, master_max_offset=100, now=0.0)
    assert replicas.ready_count(next_offset=100, max_gap=100) == 2
    assert replicas.ready_count(next_offset=120, max_gap=100) == 1  # slave 2 is 100 behind the put's end
    assert replicas.admit(next_offset=120, max_gap=100, replicas=2) is Admission.SLAVE_NOT_AVAILABLE
