"""The handshake's epoch relation, decided once for both ends (hasvc.state.handshake)."""

from commitlog.epoch import EpochEntry
from hasvc.protocol import ha
from hasvc.state.handshake import LogView, admit_slave, reconcile

SEGMENT = 1000


def log(epochs, *, min_offset=0, max_offset=0):
    return LogView(tuple(EpochEntry(e, s) for e, s in epochs), min_offset, max_offset, SEGMENT)


def hello(max_offset, epochs=(), slave_id="s1"):
    return ha.SlaveHello(slave_id, "127.0.0.1:1", max_offset, tuple(epochs))


def master_hello(view, *, status=ha.STATUS_OK, segment_size=SEGMENT, reason=""):
    return ha.MasterHello(status, view.max_offset, view.min_offset, segment_size, view.epoch_pairs(), reason)


def test_a_slave_of_the_same_history_is_admitted_and_told_the_masters_log():
    master = log([(7, 0), (8, 500)], max_offset=900)
    admission = admit_slave(hello(600, [(7, 0), (8, 500)]), master)
    assert admission.admitted and not admission.fence_epoch
    answer = admission.master_hello(master)
    assert (answer.status, answer.max_offset, answer.segment_size, answer.epochs) == (ha.STATUS_OK, 900, SEGMENT, ((7, 0), (8, 500)))


def test_an_empty_slave_is_admitted():
    assert admit_slave(hello(0), log([(7, 0)], max_offset=900)).admitted


def test_a_slave_of_another_history_is_refused_and_nobody_is_fenced():
    admission = admit_slave(hello(300, [(3, 0)]), log([(7, 0)], max_offset=900))
    assert "not from this cluster" in admission.refusal and not admission.fence_epoch
    assert admission.master_hello(log([(7, 0)], max_offset=900)).status == ha.STATUS_REFUSED


def test_a_slave_that_knows_a_newer_epoch_fences_the_master():
    admission = admit_slave(hello(600, [(7, 0), (9, 600)]), log([(7, 0)], max_offset=900))
    assert not admission.admitted
    assert admission.fence_epoch == 9 and "newer than ours 7" in admission.fence_reason


def test_a_slave_without_history_beyond_the_masters_end_is_refused():
    assert "beyond the master's end 900" in admit_slave(hello(1200), log([(7, 0)], max_offset=900)).refusal


def test_a_slave_ending_below_the_masters_oldest_byte_is_refused():
    refusal = admit_slave(hello(100, [(7, 0)]), log([(7, 0)], min_offset=500, max_offset=900)).refusal
    assert "oldest retained offset is 500" in refusal


def test_reconcile_cuts_an_old_masters_tail_and_adopts_the_new_history():
    local = log([(7, 0)], max_offset=800)
    master = log([(7, 0), (8, 600)], max_offset=900)
    answer = reconcile(local, 800, master_hello(master))
    assert not answer.refusal
    assert answer.truncate_to == 600  # what this log wrote under epoch 7 past 600 the master does not have
    assert answer.epochs == (EpochEntry(7, 0), EpochEntry(8, 600)) and answer.master_epoch == 8


def test_reconcile_keeps_a_log_that_is_a_prefix_of_the_masters():
    answer = reconcile(log([(7, 0)], max_offset=300), 300, master_hello(log([(7, 0)], max_offset=900)))
    assert answer.truncate_to is None and not answer.refusal


def test_reconcile_refuses_another_history_but_remembers_its_epoch():
    answer = reconcile(log([(3, 0)], max_offset=300), 300, master_hello(log([(7, 0)], max_offset=900)))
    assert "not from this cluster" in answer.refusal and answer.truncate_to is None and answer.master_epoch == 7


def test_reconcile_refuses_a_master_that_refused_or_whose_segments_differ():
    master = log([(7, 0)], max_offset=900)
    refused = reconcile(log([], max_offset=0), 0, master_hello(master, status=ha.STATUS_REFUSED, reason="no"))
    assert refused.refusal == "master refused replication: no" and refused.master_epoch == 0
    other = reconcile(log([], max_offset=0), 0, master_hello(master, segment_size=2 * SEGMENT))
    assert "master segments are 2000 bytes, ours 1000" in other.refusal


def test_both_ends_agree_on_every_small_history_pair():
    """The master admits a related slave exactly when the slave accepts that master (for slaves
    that know no newer epoch): one relation, asked from both ends."""
    histories = [[], [(1, 0)], [(1, 0), (2, 300)], [(2, 0)], [(1, 0), (3, 300)]]
    for slave_epochs in histories:
        for master_epochs in histories:
            for slave_end in (0, 200, 400):
                master = log(master_epochs, max_offset=500)
                slave = log(slave_epochs, max_offset=slave_end)
                admission = admit_slave(hello(slave_end, slave_epochs), master)
                if admission.fence_epoch:
                    continue
                answer = reconcile(slave, slave_end, master_hello(master))
                related = "not from this cluster"
                assert (related in admission.refusal) == (related in answer.refusal), (slave_epochs, master_epochs, slave_end)


def test_reconcile_never_cuts_a_slave_to_a_master_that_lost_bytes_of_its_own_epoch():
    """The master's log ends inside the epoch it still writes in, below where the slave holds that
    epoch: the master lost bytes it had (a damaged store cut, a lost disk). The slave keeps them."""
    slave = log([(7, 0), (8, 500)], max_offset=2000)
    master = log([(7, 0), (8, 500)], max_offset=1200)
    answer = reconcile(slave, 2000, master_hello(master))
    assert answer.master_shrank and answer.truncate_to is None and answer.epochs is None
    assert "ends at 1200 inside its epoch 8, which our log holds to 2000" in answer.refusal
    assert "hasvc store repair" in answer.refusal and answer.master_epoch == 8


def test_reconcile_still_cuts_where_the_histories_diverge():
    """Bytes past the start of an epoch the slave never had are a divergence, however they came:
    a former master rejoining, or a master that crashed, lost its unflushed tail and opened a new
    epoch at its recovered end (test_master_restart_epoch)."""
    for slave_epochs, master_epochs, slave_end in (
        ([(7, 0)], [(7, 0), (8, 600)], 800),  # the old master of epoch 7 rejoins
        ([(7, 0), (8, 500)], [(7, 0), (8, 500), (9, 900)], 1000),  # the restarted master's new epoch 9
        ([(7, 0), (8, 500)], [(7, 0), (8, 500), (9, 900)], 900),  # nothing past the divergence: no cut
    ):
        answer = reconcile(log(slave_epochs, max_offset=slave_end), slave_end, master_hello(log(master_epochs, max_offset=1500)))
        assert not answer.refusal and not answer.master_shrank, (slave_epochs, master_epochs)
        assert answer.truncate_to == (master_epochs[-1][1] if slave_end > master_epochs[-1][1] else None)


def test_a_slave_at_or_behind_the_masters_end_in_its_epoch_follows_it():
    for slave_end in (0, 700, 1200):
        answer = reconcile(log([(7, 0), (8, 500)], max_offset=slave_end), slave_end,
                           master_hello(log([(7, 0), (8, 500)], max_offset=1200)))  # fmt: skip
        assert not answer.refusal and answer.truncate_to is None
