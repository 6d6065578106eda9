"""A SyncStateSet of one that loses the tail of its own epoch (docs/design/controller.md, "A
restarted member"): S, caught up as a slave, is elected when its master M dies, with the set {S};
its epoch file says the new epoch starts at S's end X. A power loss (emulated: the stopped S's
log zeroed below X) cuts S's log to Y < X, its epoch file whole. S restarts and reports the lost
tail (STATUS ``lost_tail``); the controller does not elect it on that log (before the fix it did,
into a new epoch at Y, and M, rejoining, cut [Y, X): acknowledged writes lost) but M, outside
the set, once heard with a log covering X; S follows M and catches up; nothing acknowledged is
lost (proved from the stores). The same when the power failed before S's promotion wrote its epoch
(emulated: the entry removed too): S then reports nothing, and the controller compares its end
with the one it was elected with (the Elect entry records it)."""

from __future__ import annotations

import pytest

from commitlog.epoch import EpochFile
from hasvc import client as hc
from hasvc.testing.controlled_group import ControlledGroup
from tests.system.controller_nodes import cut_log, numbered_in_store, start_master_and_slave

TOPIC = "Orders"
MESSAGES = 40
LOST = 10  # the last acknowledged messages the power loss takes from S


@pytest.mark.parametrize("before_promotion", [False, True], ids=["epoch-kept", "epoch-lost"])
def test_a_set_of_one_that_lost_the_tail_of_its_epoch_gives_way_to_the_member_that_holds_it(tmp_path, before_promotion):
    group = ControlledGroup(tmp_path)
    try:
        old, new = start_master_and_slave(group)
        acked = {}
        with hc.BlockingClient(group.address(old)) as client:
            for number in range(MESSAGES):
                result = client.send(TOPIC, b"m%d" % number)
                assert result.status == "PUT_OK", result
                acked[number] = result.offset
        group.wait(lambda: group.in_sync(old, [new]), "the slave holding every acknowledged write")
        epoch = group.status(old)["epoch"]
        group.kill(old)
        assert group.master(excluding=old) == new
        status = group.status(new)
        assert status["epoch"] > epoch and status["sync_state_set"] == [status["broker_id"]]  # a set of one
        start = status["max_offset"]  # where its epoch starts: every acknowledged write is below
        assert start > acked[MESSAGES - 1]
        group.kill(new)
        cut_log(group.store(new), acked[MESSAGES - LOST])
        if before_promotion:  # its epoch's entry never written: it acknowledged nothing in that epoch
            epochs = EpochFile.open(group.store(new))
            assert epochs.last.epoch == status["epoch"] and epochs.last.start_offset == start
            epochs.replace(epochs.entries[:-1])
        group.restart(new)  # alone: it must not be elected on its cut log
        group.wait(lambda: (group.status(new) or {}).get("max_offset") == acked[MESSAGES - LOST], "the restarted set of one")
        assert group.status(new)["lost_tail"] == (None if before_promotion else start)
        group.restart(old)
        assert group.master() == old  # outside the set, its log covers the lost tail
        assert group.status(old)["epoch"] > status["epoch"]
        group.wait(lambda: group.in_sync(old, [new]), "the set of one caught up as the old master's slave")
        assert group.status(new)["lost_tail"] is None
        for name in (old, new):
            group.brokers[name].stop()
        for name in (old, new):
            found = numbered_in_store(group.store(name), TOPIC)
            assert all(found.get(number) == [offset] for number, offset in acked.items()), (name, found)
    finally:
        group.close()


def test_a_master_flushes_its_log_before_its_set_shrinks_to_itself_alone(tmp_path):
    """After the shrink it is the only member holding what was acknowledged while the slave was
    in the set; a power loss of that unflushed tail would leave it only on the slave, outside the
    set, with nothing reported (its epoch starts below the cut). Flushing is otherwise rare here
    (every 10 minutes), so only the shrink's own flush puts the writes on disk."""
    rare = 600_000
    group = ControlledGroup(tmp_path, settings={"flush_interval_commitlog_ms": rare,
                                                "flush_commitlog_thorough_interval_ms": rare})  # fmt: skip
    try:
        master, slave = start_master_and_slave(group)
        with hc.BlockingClient(group.address(master)) as client:
            for number in range(MESSAGES):
                result = client.send(TOPIC, b"m%d" % number)
                assert result.status == "PUT_OK", result
        end = group.status(master)["max_offset"]
        assert group.status(master)["flushed_offset"] < end  # the rare flush has not run
        group.kill(slave)
        alone = [group.status(master)["broker_id"]]
        group.wait(lambda: group.status(master)["sync_state_set"] == alone, "the set shrunk to the master alone")
        assert group.status(master)["flushed_offset"] >= end
    finally:
        group.close()
