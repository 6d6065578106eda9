"""Failover with real processes: promote a slave, bring the old master back as a slave (its
unreplicated tail is cut), refuse unrelated stores, fence a master that sees a newer epoch."""

import functools

import trio

from hasvc import client as hc
from tests.cluster import caught_up, log_digest, send_many, slave_acking, status, wait_until


def test_promote_then_the_old_master_rejoins_and_its_unreplicated_tail_is_cut(cluster):
    master = cluster.start_master(role="sync", slave_timeout_ms=500)
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="slave acking")
    acked = trio.run(send_many, master.address, 300, 8)
    assert {r.status for r in acked.values()} == {"PUT_OK"}
    wait_until(lambda: caught_up(master, slave), message="slave caught up")
    replicated_end = status(master)["max_offset"]
    old_epoch = status(master)["epoch"]

    slave.kill()  # the slave goes away...
    tail = trio.run(send_many, master.address, 10, 2)  # ...so these stay on the master only
    assert {r.status for r in tail.values()} == {"SLAVE_NOT_AVAILABLE"}
    assert status(master)["max_offset"] > replicated_end
    master.kill()  # SIGKILL: the master is lost with its unreplicated tail
    slave = cluster.start_slave(master.ha_address, name="slave")  # the slave comes back; its master is gone

    with hc.BlockingClient(slave.address) as client:
        promoted = client.promote(sync=False)
    assert promoted["role"] == "ASYNC_MASTER" and promoted["epoch"] == old_epoch + 1
    assert promoted["epochs"][-1] == [old_epoch + 1, replicated_end]
    after = trio.run(send_many, slave.address, 100, 8)
    assert {r.status for r in after.values()} == {"PUT_OK"}

    rejoined = cluster.start_slave(promoted["ha_listen"], name="master")  # the old master's store
    wait_until(lambda: caught_up(slave, rejoined), message="old master caught up as a slave")
    assert f"truncated the log to {replicated_end}" in rejoined.log()
    end = status(slave)["max_offset"]
    assert log_digest(cluster.store("master"), 0, end) == log_digest(cluster.store("slave"), 0, end)
    assert status(rejoined)["epoch"] == old_epoch + 1
    with hc.BlockingClient(slave.address) as client:  # every acknowledged write survived, where it was acked
        for i in (0, 150, 299):
            record = client.read_record(acked[i].offset)
            assert bytes(record.body).startswith(f"m{i}:".encode())


def test_a_store_from_another_cluster_is_refused(cluster):
    first = cluster.start_master("first", role="async")
    trio.run(send_many, first.address, 20, 4)
    first_end = status(first)["max_offset"]
    first.stop()
    other = cluster.start_master("other", role="async")
    trio.run(send_many, other.address, 20, 4)
    stranger = cluster.start_slave(other.ha_address, name="first")  # first's store, other's master
    wait_until(lambda: "no consistent point" in stranger.log(), message="refusal")
    assert status(stranger)["max_offset"] == first_end  # nothing cut, nothing overwritten
    assert "replication refused" in stranger.log()


def test_a_master_that_meets_a_newer_epoch_is_fenced(cluster):
    master = cluster.start_master(role="async")
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: status(master)["slaves"], message="slave connected")
    trio.run(send_many, master.address, 20, 4)
    wait_until(lambda: caught_up(master, slave), message="caught up")
    master.stop()
    with hc.BlockingClient(slave.address) as client:
        new_ha = client.promote(sync=False)["ha_listen"]
    old = cluster.start_master(role="async")  # the old master comes back as a master: split brain
    with hc.BlockingClient(old.address) as client:
        assert client.send("T", b"before it learns").ok
    witness = cluster.start_slave(new_ha, name="witness")
    wait_until(lambda: status(witness)["epoch"] == status(slave)["epoch"], message="witness learned the new epoch")
    witness.stop()
    returning = cluster.start_slave(old.ha_address, name="witness")  # carries the newer epoch to the old master
    wait_until(lambda: "fenced" in old.log(), message="old master fenced")
    with hc.BlockingClient(old.address) as client:
        result = client.send("T", b"after")
        assert result.status == "SERVICE_NOT_AVAILABLE" and "fenced" in result.reason
        assert "fenced_by" in client.status()
    assert returning.alive


def test_a_live_master_demoted_after_a_promotion_cuts_its_divergent_tail(cluster):
    a = cluster.start_master("a", role="sync", slave_timeout_ms=500)
    b = cluster.start_slave(a.ha_address, name="b")
    wait_until(lambda: status(a)["slaves"] and status(a)["slaves"][0]["ack_offset"] >= 0, message="b acking")
    assert {r.status for r in trio.run(send_many, a.address, 50, 4).values()} == {"PUT_OK"}
    wait_until(lambda: caught_up(a, b), message="b caught up")
    with hc.BlockingClient(b.address) as client:
        b_ha = client.promote(sync=False)["ha_listen"]  # b takes over while a still runs
    fork = status(b)["max_offset"]
    divergent = trio.run(send_many, a.address, 5, 1)  # a's producers did not notice yet
    assert {r.status for r in divergent.values()} <= {"SLAVE_NOT_AVAILABLE", "FLUSH_SLAVE_TIMEOUT"}
    assert {r.status for r in trio.run(send_many, b.address, 20, 4).values()} == {"PUT_OK"}
    with hc.BlockingClient(a.address) as client:
        assert client.demote(b_ha)["role"] == "SLAVE"
        assert client.send("T", b"to a slave").status == "SERVICE_NOT_AVAILABLE"
    wait_until(lambda: caught_up(b, a), message="a caught up as b's slave")
    assert f"truncated the log to {fork}" in a.log()
    end = status(b)["max_offset"]
    assert log_digest(cluster.store("a"), 0, end) == log_digest(cluster.store("b"), 0, end)


async def produce_until_failure(address: str, acked: dict, *, concurrency: int = 16, limit: int = 100_000) -> None:
    """Numbered sends until the broker goes away; ``acked[i] = offset`` for every PUT_OK."""
    counter = iter(range(limit))
    try:
        async with hc.connect(address) as client:
            async def worker():
                for i in counter:
                    try:
                        result = await client.send("Drill", f"m{i}:".encode() + b"p" * 200, queue_id=i % 4)
                    except hc.ClientError:
                        return
                    if result.status == "PUT_OK":
                        acked[i] = result.offset

            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(worker)
    except hc.ClientError:
        pass


def test_sigkill_master_under_sync_load_then_promote_loses_no_acknowledged_write(cluster):
    import threading

    from commitlog.inspect import iter_records

    master = cluster.start_master(role="sync", slave_timeout_ms=2000)
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="slave acking")
    acked: dict[int, int] = {}
    killer = threading.Timer(1.5, master.kill)  # SIGKILL in the middle of the load
    killer.start()
    trio.run(produce_until_failure, master.address, acked)
    killer.join()
    assert len(acked) > 100
    with hc.BlockingClient(slave.address) as client:
        client.promote(sync=False)
    after = trio.run(functools.partial(send_many, slave.address, 40, 8, topic="Drill", size=50))  # on the live promoted slave
    assert {r.status for r in after.values()} == {"PUT_OK"}
    slave.stop()  # read its log from disk, as the drill does
    seen: dict[int, int] = {}
    duplicates = 0
    places = []  # each record's place in its queue: a promoted slave continues after the replicated ones
    for offset, record, crc_ok in iter_records(cluster.store("slave")):
        assert crc_ok
        places.append((record.topic, record.queue_id, record.queue_offset))
        if bytes(record.body).endswith(b"x"):
            continue  # one of the writes after the promotion
        number = int(bytes(record.body).split(b":", 1)[0][1:])
        duplicates += number in seen
        seen[number] = offset
    lost = [i for i, offset in acked.items() if seen.get(i) != offset]
    assert lost == [] and duplicates == 0
    assert len(set(places)) == len(places)


def test_a_three_round_drill_loses_nothing_in_sync_mode(tmp_path):
    import json
    import subprocess
    import sys

    report = tmp_path / "drill.json"
    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "drill", "--rounds", "3", "--producers", "4", "--seed", "3",
                           "--report", str(report)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    assert data["ok"] and data["lost"] == 0 and data["acknowledged"] > 0 and len(data["rounds"]) == 3
    assert all(r["identical"] and r["epochs_agree"] and r["files_agree"] and r["duplicated"] == 0 for r in data["rounds"])


def test_the_readme_main_job_runs_end_to_end():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "demo", "--no-keep"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "summary: OK" in done.stdout and "0 lost, 0 duplicated" in done.stdout
    assert "SLAVE" in done.stdout and "logs byte-identical: True" in done.stdout


def test_the_readme_main_job_in_dledger_mode_runs_end_to_end():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "demo", "--dledger", "--no-keep"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "summary: OK" in done.stdout and "0 lost, 0 duplicated" in done.stdout
    assert "nobody promoted it" in done.stdout and "identical on every member: True" in done.stdout
    assert "LEADER" in done.stdout and "FOLLOWER" in done.stdout
