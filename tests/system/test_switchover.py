"""``hasvc switchover``: a planned switch of a classic pair under load loses and duplicates nothing
and leaves both logs identical (checked from the stores on disk by the drill's checks)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hasvc.tools.drill_switchover import SwitchoverDrill
from hasvc.tools.switchover import SwitchoverError, check_pair, slave_has_everything
from tests.cluster import caught_up, log_digest, slave_acking, status, wait_until

PRODUCERS = 16


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_switchover_under_16_producers_loses_and_duplicates_nothing(tmp_path, mode):
    """Back and forth, with 16 failover clients retrying refused sends: every PUT_OK on disk once
    at its offset, nothing cut from the old master, logs, queues and epochs identical. Under
    ASYNC_MASTER too: the fence and the wait for the slave's last byte make it as safe as SYNC."""
    drill = SwitchoverDrill(producers=PRODUCERS, mode=mode, seed=7, root=str(tmp_path), echo=lambda *_: None)
    try:
        master = drill.start("a", master_ha=None)
        slave = drill.start("b", master_ha=master.ready["ha_listen"])
        for number in (1, 2):
            report, master, slave = drill.run_round(number, master, slave)
            checks = report.checks
            assert checks.acked > 0 and checks.lost == 0 and checks.duplicated == 0, report
            assert checks.identical and checks.epochs_agree and checks.files_agree, report
            assert report.cut_bytes == 0 and report.rejoined, report
            # the new master took writes only with its slave back: no put answered "stored, not replicated"
            assert report.answers.get("SLAVE_NOT_AVAILABLE", 0) == 0 and report.answers["PUT_OK"] > 0, report
            assert status(master)["role"] != "SLAVE" and status(slave)["role"] == "SLAVE"
    finally:
        drill.close(keep=False)


def test_the_command_switches_the_pair_and_back(cluster):
    master = cluster.start_master()
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="the slave's first report")
    for i in range(5):
        subprocess.run([sys.executable, "-m", "hasvc.cli", "send", master.address, "--topic", "T", f"m{i}"], check=True,
                       capture_output=True)  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "switchover", master.address, "--to", slave.address],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{slave.address}: SYNC_MASTER" in done.stdout and f"{master.address}: SLAVE of" in done.stdout
    new, old = status(slave), status(master)
    assert new["role"] == "SYNC_MASTER" and old["role"] == "SLAVE" and new["epoch"] == old["epoch"]
    wait_until(lambda: caught_up(slave, master), message="the old master to catch up")
    end = status(slave)["max_offset"]
    assert log_digest(slave.ready["store"], 0, end) == log_digest(master.ready["store"], 0, end)
    assert "dropped" not in master.log()
    back = subprocess.run([sys.executable, "-m", "hasvc.cli", "switchover", slave.address, "--to", master.address, "--role", "async"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert back.returncode == 0, back.stdout + back.stderr
    assert status(master)["role"] == "ASYNC_MASTER" and status(slave)["role"] == "SLAVE"
    listed = json.loads(subprocess.run([sys.executable, "-m", "hasvc.cli", "status", f"{master.address},{slave.address}", "--json"],
                                       capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert [item["role"] for item in listed] == ["ASYNC_MASTER", "SLAVE"]


def test_a_slave_promoted_fenced_takes_no_write_until_the_fence_is_lifted(cluster):
    """The switchover's last step: the new master is fenced from its first moment as master
    (PROMOTE with a fence reason) and takes writes only once FENCE lifts it."""
    from hasvc import client as hc

    master = cluster.start_master(role="async")
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="the slave's first report")
    with hc.BlockingClient(slave.address) as client:
        promoted = client.promote(sync=False, fence_reason="until the old master rejoins")
        assert promoted["role"] == "ASYNC_MASTER" and promoted["fenced_by"] == "until the old master rejoins"
        refused = client.send("T", b"early")
        assert refused.status == "SERVICE_NOT_AVAILABLE" and "until the old master rejoins" in refused.reason
        with pytest.raises(hc.ClientError, match="not fenced by 'another reason'"):
            client.fence("another reason", fence=False)
        assert "fenced_by" not in client.fence("until the old master rejoins", fence=False)
        assert client.send("T", b"after").status == "PUT_OK"


MASTER = {"role": "SYNC_MASTER", "ha_listen": "127.0.0.1:10912", "max_offset": 500,
          "slaves": [{"address": "127.0.0.1:10921", "ack_offset": 400}]}  # fmt: skip
SLAVE = {"role": "SLAVE", "listen": "127.0.0.1:10921", "master_ha": "127.0.0.1:10912", "master_connected": True}


def test_the_slave_has_everything_only_when_its_ack_reaches_the_masters_end():
    assert not slave_has_everything(MASTER, "127.0.0.1:10921")
    assert slave_has_everything({**MASTER, "max_offset": 400}, "127.0.0.1:10921")
    assert not slave_has_everything({**MASTER, "max_offset": 400}, "127.0.0.1:10999")  # another slave's ack proves nothing


@pytest.mark.parametrize(("master", "slave", "message"), [
    ({**MASTER, "role": "SLAVE"}, SLAVE, "is a slave, not a master"),
    ({**MASTER, "fenced_by": "met epoch 9"}, SLAVE, "fenced already"),
    (MASTER, {**SLAVE, "role": "ASYNC_MASTER"}, "not a slave"),
    (MASTER, {**SLAVE, "master_ha": "127.0.0.1:20912"}, "replicates from 127.0.0.1:20912"),
    (MASTER, {**SLAVE, "master_connected": False}, "not connected"),
    ({**MASTER, "mode": "dledger"}, SLAVE, "transfer-leader"),
])  # fmt: skip
def test_a_switchover_refuses_a_pair_it_cannot_switch(master, slave, message):
    with pytest.raises(SwitchoverError, match=message):
        check_pair("M", master, "S", slave)
    check_pair("M", MASTER, "S", SLAVE)
