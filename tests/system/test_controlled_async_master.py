"""Controller mode with ASYNC_MASTER brokers (``hasvc broker --controllers ... --set role=ASYNC_MASTER``):
real processes on loopback.

The master answers PUT_OK once its own log holds a write, so writes are acknowledged while its
only slave is stopped (SIGSTOP: the SyncStateSet shrinks to the master, and SYNC_MASTER would
answer SLAVE_NOT_AVAILABLE there); the slave, resumed, catches up and joins the set again, and a
SIGKILLed master is still replaced by it, nobody promoting anyone, with every write acknowledged
before it caught up present on the new master (proved from the stores after a clean stop).
"""

from __future__ import annotations

import os
import signal

import pytest

from commitlog.inspect import iter_records
from hasvc import client as hc
from hasvc.testing.controlled_group import ControlledGroup
from hasvc.tools.drill import log_digest
from tests.system.controller_nodes import rejoin_and_stop

TOPIC = "Orders"


@pytest.fixture
def async_group(tmp_path):
    group = ControlledGroup(tmp_path, settings={"role": "ASYNC_MASTER"})
    yield group
    for process in group.brokers.values():  # a slave left stopped by a failing test is resumed, then killed
        if process.alive:
            os.kill(process.pid, signal.SIGCONT)
    group.close()


def _send(address: str, body: bytes) -> hc.SendResult:
    with hc.BlockingClient(address) as client:
        return client.send(TOPIC, body)


def test_async_master_acknowledges_with_its_slave_stopped_and_still_fails_over(async_group):
    group = async_group
    group.start_broker("a")
    group.start_broker("b")
    old = group.master()
    new = "b" if old == "a" else "a"
    group.wait(lambda: group.in_sync(old, [new]), "the slave in the SyncStateSet")
    status = group.status(old)
    assert status["master_role"] == "ASYNC_MASTER" and status["role"] == "ASYNC_MASTER"
    assert group.status(new)["master_role"] == "ASYNC_MASTER" and group.status(new)["role"] == "SLAVE"
    old_id, new_id = status["broker_id"], group.status(new)["broker_id"]

    acked: dict[bytes, int] = {}
    os.kill(group.brokers[new].pid, signal.SIGSTOP)  # the slave receives and acknowledges nothing
    try:
        for number in range(20):
            result = _send(group.address(old), b"stopped-%d" % number)
            assert result.status == "PUT_OK", result  # the master's own log holds it: acknowledged
            acked[b"stopped-%d" % number] = result.offset
        # the lag bound takes the stopped slave out of the set; writes go on being acknowledged
        group.wait(lambda: group.status(old)["sync_state_set"] == [old_id], "the stopped slave out of the SyncStateSet")
        result = _send(group.address(old), b"alone")
        assert result.status == "PUT_OK", result  # SYNC_MASTER: SLAVE_NOT_AVAILABLE (min_in_sync_replicas 2)
        acked[b"alone"] = result.offset
    finally:
        os.kill(group.brokers[new].pid, signal.SIGCONT)

    group.wait(lambda: group.in_sync(old, [new]), "the resumed slave caught up and back in the SyncStateSet")
    assert sorted(group.status(old)["sync_state_set"]) == sorted([old_id, new_id])
    old_epoch = group.status(old)["epoch"]

    group.kill(old)  # SIGKILL; nobody promotes anyone
    assert group.master(excluding=old) == new
    assert group.status(new)["epoch"] > old_epoch
    result = _send(group.address(new), b"after")
    assert result.status == "PUT_OK", result  # a lone ASYNC_MASTER acknowledges
    acked[b"after"] = result.offset

    end = rejoin_and_stop(group, old, new)
    assert log_digest(group.store("a"), end, group.segment_size) == log_digest(group.store("b"), end, group.segment_size)
    found = {bytes(record.body): offset for offset, record, crc_ok in iter_records(group.store(new))
             if crc_ok and record.topic == TOPIC}  # fmt: skip
    assert {body: found.get(body) for body in acked} == acked  # every acknowledged write, at its offset


def test_a_controller_mode_broker_refuses_role_slave(tmp_path):
    from click.testing import CliRunner

    from hasvc.cli import main

    result = CliRunner().invoke(main, ["broker", "--controllers", "127.0.0.1:1", "--group", "g", "--store",
                                       str(tmp_path / "s"), "--listen", "127.0.0.1:0", "--set", "role=SLAVE"])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "controllers' to decide" in result.output and "Traceback" not in result.output
