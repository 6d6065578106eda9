"""Classic HA behind the put path's Replicator protocol (hasvc/replicator.py)."""

from hasvc.replicator import ClassicReplicator, Replicator
from hasvc.state.replication import Admission, ReplicaSet, SlaveProgress


class _Service:
    def __init__(self):
        self.pushes = 0

    def push(self):
        self.pushes += 1


def replicator(in_sync_replicas=1, log_end=1000):
    replicas = ReplicaSet()
    end = [log_end]
    return ClassicReplicator(replicas, in_sync_replicas=in_sync_replicas, max_gap=500, log_end=lambda: end[0]), replicas, end


def test_classic_ha_is_a_replicator():
    assert isinstance(replicator()[0], Replicator)
    assert not isinstance(ReplicaSet(), Replicator)


def test_appends_are_pushed_only_while_an_ha_service_is_attached():
    classic, _, _ = replicator()
    classic.appended()  # a slave, or a master before its HA port opens: nothing to push to
    service = _Service()
    classic.attach(service)
    classic.appended()
    classic.detach()
    classic.appended()
    assert service.pushes == 1


def test_reports_move_the_replicated_offset_and_listeners_hear_it():
    classic, replicas, end = replicator(in_sync_replicas=2)
    heard = []
    classic.subscribe(heard.append)
    for connection_id in (1, 2):
        replicas.add(SlaveProgress(connection_id, f"s{connection_id}", "a", 0.0))
        replicas.on_report(connection_id, 0, master_max_offset=end[0], now=0.0)
    replicas.on_report(1, 800, master_max_offset=end[0], now=1.0)
    classic.on_report()
    replicas.on_report(2, 600, master_max_offset=end[0], now=1.0)
    classic.on_report()
    assert heard == [0, 600]  # what both slaves have
    assert classic.replicated_offset() == 600


def test_admission_and_in_sync_count_measure_against_the_local_logs_end():
    classic, replicas, end = replicator()
    assert classic.admit(100) is Admission.SLAVE_NOT_AVAILABLE and classic.in_sync_count() == 0
    replicas.add(SlaveProgress(1, "s1", "a", 0.0))
    replicas.on_report(1, 0, master_max_offset=end[0], now=0.0)
    replicas.on_report(1, 700, master_max_offset=end[0], now=0.0)
    assert classic.in_sync_count() == 1  # 300 behind, within the 500 gap
    end[0] = 1300
    assert classic.in_sync_count() == 0  # the log moved on: 600 behind
    assert classic.admit(1100) is Admission.WAIT and classic.admit(1300) is Admission.SLAVE_NOT_AVAILABLE
    assert classic.shortfall(1300) == ("stored on the master only: in_sync_replicas 1 slave(s) needed within "
                                       "ha_max_gap_not_in_sync 500 bytes of the put's end 1300, 0 there (1 connected)")  # fmt: skip
