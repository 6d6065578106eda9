"""A master that restarts after an abnormal exit opens a new epoch at its recovered end, so a
slave that holds bytes the master lost cuts them instead of keeping them beside the master's new
bytes at the same offsets (found by the classic simulation, seed 22; see hasvc.state.succession).

The power loss is made by hand: after SIGKILL the tail of the master's segment file is zeroed, as
a page cache that never reached the disk would leave it; recovery cuts it."""

import functools
import os

import trio

from commitlog.checkpoint import StoreCheckpoint
from tests.cluster import caught_up, log_digest, send_many, status, wait_until


def _zero_tail(store: str, start: int) -> None:
    """Zero the commit log's bytes from ``start`` on (one segment: the test stays below 1 MiB), and
    bring the checkpoint's flushed offset down to ``start``: bytes the checkpoint says were flushed
    survive a power loss, and losing them would be damage, which recovery refuses to cut."""
    path = os.path.join(store, "commitlog", f"{0:020d}")
    size = os.path.getsize(path)
    with open(path, "r+b") as file:
        file.seek(start)
        file.write(b"\0" * (size - start))
    checkpoint = StoreCheckpoint.open(os.path.join(store, "checkpoint"))
    checkpoint.master_flushed_offset = min(checkpoint.master_flushed_offset, start)
    checkpoint.flush()


def test_a_master_restarted_after_a_power_loss_opens_an_epoch_and_its_slave_cuts_what_it_lost(cluster):
    master = cluster.start_master(role="async")
    slave = cluster.start_slave(master.ha_address)
    trio.run(send_many, master.address, 200, 8)
    wait_until(lambda: caught_up(master, slave), message="slave caught up")
    before = status(master)
    slave_end = before["max_offset"]
    old_epoch = before["epoch"]
    assert slave.stop() == 0
    master.kill()
    _zero_tail(cluster.store("master"), slave_end - 3000)  # the last ~3 KB never reached the disk

    master = cluster.start_master(role="async")
    restarted = status(master)
    recovered_end = restarted["epochs"][-1][1]
    assert restarted["epoch"] == old_epoch + 1 and recovered_end <= slave_end - 3000
    assert "did not exit cleanly: epoch" in master.log()
    trio.run(functools.partial(send_many, size=500), master.address, 200, 8)  # new bytes where the slave holds old ones
    assert status(master)["max_offset"] > slave_end

    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: caught_up(master, slave), message="slave caught up with the restarted master")
    assert f"truncated the log to {recovered_end}" in slave.log()
    end = status(master)["max_offset"]
    assert log_digest(cluster.store("master"), 0, end) == log_digest(cluster.store("slave"), 0, end)
    assert status(slave)["epochs"] == status(master)["epochs"]


def test_a_master_restarted_after_a_clean_stop_keeps_its_epoch(cluster):
    master = cluster.start_master(role="async")
    trio.run(send_many, master.address, 20, 4)
    epochs = status(master)["epochs"]
    assert master.stop() == 0
    master = cluster.start_master(role="async")
    assert status(master)["epochs"] == epochs
