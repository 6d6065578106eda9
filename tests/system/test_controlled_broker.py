"""Controller mode end to end: a ``hasvc controller`` and ``hasvc broker`` processes on loopback.

The controller elects the first master; SYNC_MASTER writes are acknowledged only once the slave
holds them (and refused as SLAVE_NOT_AVAILABLE once the slave is gone and the set shrank); a
SIGKILLed master is replaced by its slave with no command from anyone, in a higher epoch, and the
old master, restarted, follows it, cuts only what the new master never had and converges byte
for byte; nothing acknowledged is lost (proved from the stores, reopened after a clean stop).
"""

from __future__ import annotations

import os
import signal

import pytest
import trio

from commitlog.config import StoreConfig
from commitlog.store import MessageStore
from hasvc import client as hc
from hasvc.testing.controlled_group import ControlledGroup
from hasvc.tools.drill import log_digest, queue_file_digests
from tests.system.controller_nodes import numbered_in_store, rejoin_and_stop, start_master_and_slave


TOPIC = "Orders"


@pytest.fixture
def controlled(tmp_path):
    groups = []

    def start(controllers: int = 1, secret: bytes | None = None, **settings) -> ControlledGroup:
        group = ControlledGroup(tmp_path, controllers=controllers, settings=settings, secret=secret)
        groups.append(group)
        return group

    yield start
    for group in groups:
        group.close()


def _send(address: str, body: bytes) -> hc.SendResult:
    with hc.BlockingClient(address) as client:
        return client.send(TOPIC, body)


def test_first_master_elected_and_sync_writes_wait_for_the_slave(controlled):
    group = controlled()
    master, slave = start_master_and_slave(group)
    status = group.status(master)
    assert status["group"] == "g" and status["broker_id"] >= 1 and status["epoch"] >= 1
    assert sorted(group.status(master)["sync_state_set"]) == sorted([status["broker_id"], group.status(slave)["broker_id"]])

    for number in range(20):
        result = _send(group.address(master), b"m%d" % number)
        assert result.status == "PUT_OK", result
        # acknowledged once the slave has it: the slave's log already reaches past its start
        assert group.status(slave)["max_offset"] > result.offset

    group.kill(slave)
    master_id = status["broker_id"]
    group.wait(lambda: group.status(master)["sync_state_set"] == [master_id], "the dead slave out of the SyncStateSet")
    result = _send(group.address(master), b"alone")
    assert result.status == "SLAVE_NOT_AVAILABLE", result  # stored on the master only: min_in_sync_replicas 2

    group.restart(slave)
    group.wait(lambda: group.in_sync(master, [slave]), "the slave back in the SyncStateSet")
    assert _send(group.address(master), b"again").status == "PUT_OK"

    with hc.BlockingClient(group.address(slave)) as client:  # the controller decides: no promote by hand
        with pytest.raises(hc.ClientError, match="controller"):
            client.promote(sync=True)


async def _producer(client: hc.FailoverClient, numbers, acked: dict) -> None:
    for number in numbers:
        try:
            result = await client.send(TOPIC, b"m%d:" % number + b"x" * 100, queue_id=number % 4)
        except hc.ClientError:
            continue  # no master within the client's failover time: not acknowledged
        if result.status == "PUT_OK":
            acked[number] = result.offset


def test_master_sigkill_slave_takes_over_and_old_master_rejoins(controlled):
    # min_in_sync_replicas 1: the new master acknowledges alone until the old one is back
    group = controlled(min_in_sync_replicas=1)
    old, new = start_master_and_slave(group)
    old_epoch = group.status(old)["epoch"]
    acked: dict[int, int] = {}

    async def write_through_the_failover() -> None:
        addresses = [group.address("a"), group.address("b")]
        async with hc.connect_cluster(addresses, retry_sends=True) as client:
            async with trio.open_nursery() as nursery:
                for producer in range(4):
                    nursery.start_soon(_producer, client, range(producer, 400, 4), acked)
                await trio.sleep(0.5)
                await trio.to_thread.run_sync(group.kill, old)  # SIGKILL under load; nobody promotes anyone

    trio.run(write_through_the_failover)
    assert group.master() == new
    new_status = group.status(new)
    assert new_status["epoch"] > old_epoch
    assert _send(group.address(new), b"after").status == "PUT_OK"

    end = rejoin_and_stop(group, old, new)  # it comes back as the new master's slave

    # From disk, each store reopened: the same end, byte-identical logs and queues, every
    # acknowledged message present once at its acknowledged offset.
    for name in ("a", "b"):
        with MessageStore.open(group.store(name), StoreConfig(commitlog_segment_size=group.segment_size)) as store:
            assert store.commit_log.max_offset == end
    assert log_digest(group.store("a"), end, group.segment_size) == log_digest(group.store("b"), end, group.segment_size)
    assert queue_file_digests(group.store("a")) == queue_file_digests(group.store("b"))
    found = numbered_in_store(group.store(new), TOPIC)
    assert acked, "no write was acknowledged"
    assert all(found.get(number) == [offset] for number, offset in acked.items())
    assert all(len(offsets) == 1 for offsets in found.values())  # nothing stored twice (idempotent retries)
    assert os.path.exists(os.path.join(group.store(old), "identity"))


def test_a_master_cut_off_from_its_controller_stops_acknowledging_until_it_hears_again(controlled):
    group = controlled(min_in_sync_replicas=1)
    group.start_broker("a")
    master = group.master()
    epoch = group.status(master)["epoch"]
    assert _send(group.address(master), b"before").status == "PUT_OK"

    group.controllers.kill("c0")  # the master is reachable by clients, its controller is not
    fenced = group.wait(lambda: (s := group.status(master)) is not None and s.get("fenced_by") and s, "the lease to run out")
    assert fenced["lease_seconds_left"] == 0 and "lease" in fenced["fenced_by"]
    result = _send(group.address(master), b"unleased")
    assert result.status == "SERVICE_NOT_AVAILABLE", result  # refused, not stored: clients look for another master

    group.controllers.start("c0")  # the same controller back: it names the same master, whose lease resumes
    assert group.master() == master
    assert group.status(master)["epoch"] == epoch
    assert _send(group.address(master), b"after").status == "PUT_OK"


def test_a_controller_leader_sigkill_keeps_the_master_and_its_epoch(controlled):
    group = controlled(controllers=3)
    master, slave = start_master_and_slave(group)
    epoch = group.status(master)["epoch"]
    leader = group.controllers.leader()
    acked: dict[int, int] = {}

    async def write_through_the_controller_failover() -> None:
        async with hc.connect_cluster([group.address("a"), group.address("b")], retry_sends=True) as client:
            async with trio.open_nursery() as nursery:
                for producer in range(2):
                    nursery.start_soon(_producer, client, range(producer, 300, 2), acked)
                await trio.sleep(0.3)
                await trio.to_thread.run_sync(group.controllers.kill, leader)

    trio.run(write_through_the_controller_failover)
    assert group.controllers.leader() != leader
    assert group.master() == master and group.status(master)["epoch"] == epoch  # no broker election
    group.wait(lambda: group.status(master)["controller_leader"] == group.controllers.address(group.controllers.leader()),
               "the master heartbeating to the new controller leader")  # fmt: skip
    assert _send(group.address(master), b"after").status == "PUT_OK"
    assert max(acked) > 250, "writes stopped"  # the last producers' numbers were acknowledged


def test_a_send_retried_on_the_new_master_is_answered_with_its_original_offsets(controlled):
    # the new master's producer table is the one it kept as a slave, completed at its promotion
    group = controlled(min_in_sync_replicas=1)
    old, new = start_master_and_slave(group)
    sent = {}
    with hc.BlockingClient(group.address(old)) as client:
        for sequence in range(0, 40, 4):
            results = client.send_batch(TOPIC, [b"p%d" % (sequence + i) for i in range(4)], producer_id="p-1", first_sequence=sequence)
            assert all(r.status == "PUT_OK" for r in results), results
            sent[sequence] = [r.offset for r in results]
    group.kill(old)
    assert group.master() == new
    end = group.status(new)["max_offset"]
    with hc.BlockingClient(group.address(new)) as client:
        for sequence in (0, 36):  # the first batch (long kept) and the last (read at the promotion)
            results = client.send_batch(TOPIC, [b"p%d" % (sequence + i) for i in range(4)], producer_id="p-1", first_sequence=sequence)
            assert [r.offset for r in results] == sent[sequence] and all(r.status == "PUT_OK" for r in results), results
    status = group.status(new)
    assert status["max_offset"] == end and status["duplicate_sends"] == 2  # answered, not stored again


def test_a_master_paused_past_the_heartbeat_timeout_serves_again_in_a_new_epoch(controlled):
    # alone in its group: the controller finds nobody else to elect, names no master, then this
    # one again in the next epoch once it heartbeats; it opens that epoch while still master
    group = controlled(min_in_sync_replicas=1)
    group.start_broker("a")
    assert group.master() == "a"
    epoch = group.status("a")["epoch"]
    assert _send(group.address("a"), b"before").status == "PUT_OK"
    os.kill(group.brokers["a"].pid, signal.SIGSTOP)
    try:
        group.wait(lambda: '"master_id": null' in _controller_groups(group), "the controller to name no master")
    finally:
        os.kill(group.brokers["a"].pid, signal.SIGCONT)
    group.wait(lambda: (s := group.status("a")) is not None and s["epoch"] > epoch and not s.get("fenced_by"),
               "the master serving again in a newer epoch")  # fmt: skip
    status = group.status("a")
    assert [e for e, _start in status["epochs"]][-2:] == [epoch, status["epoch"]]
    assert _send(group.address("a"), b"after").status == "PUT_OK"


def _controller_groups(group: ControlledGroup) -> str:
    import json

    return json.dumps(group.controllers.status("c0")["groups"])


def test_a_group_with_a_secret_refuses_a_client_without_it(controlled):
    group = controlled(secret=b"s3cret-for-every-port", min_in_sync_replicas=1)
    group.start_broker("a")
    assert group.master() == "a"  # registered and elected through the authenticated controller port
    with hc.BlockingClient(group.address("a"), b"s3cret-for-every-port") as client:
        assert client.send(TOPIC, b"signed").status == "PUT_OK"
    with pytest.raises(hc.ClientError):
        with hc.BlockingClient(group.address("a")) as client:
            client.send(TOPIC, b"unsigned")
