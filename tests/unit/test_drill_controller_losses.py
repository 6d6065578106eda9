"""How ``hasvc drill --mode controller`` counts a missing PUT_OK message (``split_losses``): lost
(the drill fails) in a SYNC_MASTER run and for any message the new master should hold; an
accepted loss, reported apart, only in an ASYNC_MASTER run's master fault and only for what the
old master alone acknowledged (at or past where the new epoch starts)."""

from hasvc.tools.drill_controller import split_losses

ACKED = {1: 0, 2: 100, 3: 200, 4: 300}  # message -> acknowledged offset
EPOCHS = [[1, 0], [2, 250]]  # the new master's history: epoch 2 starts at 250


def test_a_sync_run_counts_every_missing_message_lost():
    assert split_losses({3, 4}, ACKED, EPOCHS, epoch_before=1, accepted=False) == ({3, 4}, set())


def test_an_async_master_fault_accepts_only_the_old_masters_tail():
    # 4 (at 300) is past where epoch 2 starts: only the old master had it; 2 (at 100) is before,
    # in what the new master received: its loss is a real one
    assert split_losses({2, 4}, ACKED, EPOCHS, epoch_before=1, accepted=True) == ({2}, {4})


def test_no_new_epoch_means_nothing_is_accepted():
    assert split_losses({4}, ACKED, EPOCHS, epoch_before=2, accepted=True) == ({4}, set())


def test_the_first_new_epoch_bounds_the_tail_when_a_round_had_several():
    epochs = [[1, 0], [2, 150], [3, 250]]
    assert split_losses({2, 3, 4}, ACKED, epochs, epoch_before=1, accepted=True) == ({2}, {3, 4})
