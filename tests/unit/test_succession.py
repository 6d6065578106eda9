"""hasvc.state.succession: who takes over from a dead master, and the epoch of a restarting master."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hasvc.state.succession import Candidate, choose_successor, epoch_on_start, qualifies


def test_the_most_advanced_slave_that_reaches_the_confirmed_position_is_promoted():
    dead = Candidate("m", 3, 900)  # power loss: it kept less than the slaves
    slaves = [Candidate("a", 3, 1000), Candidate("b", 3, 1200)]
    assert choose_successor(dead, slaves, confirmed_offset=1000, prefer_restart=False).name == "b"


def test_a_slave_behind_the_confirmed_position_is_not_promoted_when_the_old_master_holds_it():
    # seed 93's shape: the only slave restarted after losing its tail and has not caught up
    dead = Candidate("m", 3, 5000)
    slaves = [Candidate("s", 3, 933)]
    choice = choose_successor(dead, slaves, confirmed_offset=4000, prefer_restart=False)
    assert (choice.name, choice.restart, choice.keeps_all) == ("m", True, True)


def test_a_slave_in_an_older_epoch_does_not_qualify():
    assert not qualifies(Candidate("s", 2, 10_000), confirmed_offset=100, newest_epoch=3)
    dead = Candidate("m", 3, 10_000)
    assert choose_successor(dead, [Candidate("s", 2, 20_000)], confirmed_offset=100, prefer_restart=False).restart


def test_when_nothing_holds_every_acknowledged_byte_the_longest_log_wins_and_says_so():
    dead = Candidate("m", 3, 800)
    choice = choose_successor(dead, [Candidate("s", 3, 900)], confirmed_offset=1000, prefer_restart=True)
    assert (choice.name, choice.restart, choice.keeps_all) == ("s", False, False)


def test_a_master_that_cannot_restart_and_no_slave_is_an_error():
    with pytest.raises(ValueError, match="no broker can take over"):
        choose_successor(None, [], confirmed_offset=0, prefer_restart=False)


positions = st.tuples(st.integers(1, 4), st.integers(0, 2000))


@given(st.one_of(st.none(), positions), st.lists(positions, max_size=4), st.integers(0, 2000), st.booleans())
def test_the_choice_keeps_every_acknowledged_byte_whenever_some_broker_can(dead, slaves, confirmed, prefer_restart):
    if dead is None and not slaves:
        return
    dead = Candidate("m", *dead) if dead else None
    slaves = [Candidate(f"s{i}", *position) for i, position in enumerate(slaves)]
    choice = choose_successor(dead, slaves, confirmed_offset=confirmed, prefer_restart=prefer_restart)
    everyone = ([dead] if dead else []) + slaves
    newest = max(c.last_epoch for c in everyone)
    chosen = dead if choice.restart else next(c for c in slaves if c.name == choice.name)
    assert choice.keeps_all == any(qualifies(c, confirmed_offset=confirmed, newest_epoch=newest) for c in everyone)
    if choice.keeps_all:
        assert qualifies(chosen, confirmed_offset=confirmed, newest_epoch=newest)
    assert chosen.position == max(c.position for c in everyone) or choice.keeps_all


def test_a_master_opens_a_new_epoch_only_after_an_abnormal_exit():
    assert epoch_on_start(None, clean_exit=False) is None  # a new store: the first epoch is drawn
    assert epoch_on_start(7, clean_exit=True) is None
    assert epoch_on_start(7, clean_exit=False) == 8


def test_a_dead_master_that_keeps_its_epoch_is_not_restarted_below_a_slave_of_that_epoch():
    # A clean stop, then the log lost flushed bytes and the loss was accepted: restarted in the
    # same epoch it would write other bytes where the slave holds that epoch's.
    dead, slave = Candidate("m", 3, 700), Candidate("s", 3, 900)
    kept = choose_successor(dead, [slave], confirmed_offset=600, prefer_restart=True, opens_epoch=False)
    assert (kept.name, kept.restart, kept.keeps_all) == ("s", False, True)
    # After a crash it opens a new epoch at its end, and the slave cuts what it alone held.
    assert choose_successor(dead, [slave], confirmed_offset=600, prefer_restart=True).restart
    # A slave of an older epoch does not stop it.
    assert choose_successor(dead, [Candidate("s", 2, 900)], confirmed_offset=600, prefer_restart=True,
                            opens_epoch=False).restart  # fmt: skip


def test_a_candidate_reaches_only_the_epochs_its_log_holds():
    # a slave that adopted its master's table at the handshake but holds bytes of epoch 1 only
    assert Candidate.of("s", [(1, 0), (2, 2468), (4, 2993)], 280).position == (1, 280)
    assert Candidate.of("m", [(1, 0), (5, 280)], 280).position == (5, 280)  # a new epoch opened at its end
    assert Candidate.of("new", [], 0).position == (0, 0)
    behind, ahead = Candidate.of("b", [(1, 0), (4, 2993)], 280), Candidate.of("a", [(1, 0), (3, 2529)], 2874)
    assert choose_successor(ahead, [behind], confirmed_offset=2993, prefer_restart=False).name == "a"
