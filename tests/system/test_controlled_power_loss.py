"""A master that lost unflushed bytes it acknowledged (a power loss, emulated: the stopped master's
log cut past its last acknowledged writes) and restarts before the controller noticed its
silence is not named master again in its epoch: the controller elects its slave, which holds
every acknowledged write, into a new epoch; the old master follows and catches up; nothing
acknowledged is lost (proved from the stores)."""

from __future__ import annotations

from hasvc import client as hc
from hasvc.testing.controlled_group import ControlledGroup
from tests.system.controller_nodes import cut_log, numbered_in_store, start_master_and_slave

TOPIC = "Orders"
MESSAGES = 40
LOST = 10  # the last acknowledged messages the master's power loss takes
# Long enough that the master restarts and registers before the controller would elect on its
# silence (the rule under test is the restart's, not the lapse's).
HEARTBEAT_TIMEOUT_SECONDS = 30


def test_a_master_restarted_after_a_power_loss_gives_way_to_the_slave_that_holds_more(tmp_path):
    timeout = f"broker_heartbeat_timeout_seconds={HEARTBEAT_TIMEOUT_SECONDS}"
    group = ControlledGroup(tmp_path, settings={"broker_heartbeat_timeout_seconds": HEARTBEAT_TIMEOUT_SECONDS},
                            controller_args=("--set", timeout))  # fmt: skip
    try:
        master, slave = start_master_and_slave(group)
        epoch = group.status(master)["epoch"]
        acked = {}
        with hc.BlockingClient(group.address(master)) as client:
            for number in range(MESSAGES):
                result = client.send(TOPIC, b"m%d" % number)
                assert result.status == "PUT_OK", result
                acked[number] = result.offset
        group.kill(master)
        cut_log(group.store(master), acked[MESSAGES - LOST])
        group.restart(master)
        assert group.master(excluding=master) == slave  # not the restarted master, in its epoch or any
        assert group.status(slave)["epoch"] > epoch
        group.wait(lambda: group.in_sync(slave, [master]), "the old master caught up as the new one's slave")
        assert group.status(master)["role"] == "SLAVE"
        end = group.status(slave)["max_offset"]
        for name in ("a", "b"):
            group.brokers[name].stop()
        for name in ("a", "b"):
            found = numbered_in_store(group.store(name), TOPIC)
            assert all(found.get(number) == [offset] for number, offset in acked.items()), (name, found)
        assert end > acked[MESSAGES - 1]
    finally:
        group.close()
