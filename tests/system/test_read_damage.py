"""A flipped byte in a stored record is never served: real brokers answer PULL and READ of it with
DAMAGED naming the offset, `hasvc read` says so in one line, the broker logs one ERROR line and
STATUS (and, for a classic broker, the metrics) list the damage. The byte is flipped in the
running broker's segment file (its mapping shares the page cache): the damage sits in a segment
no recovery scan would look at again."""

import os
import subprocess
import sys
import urllib.request

import trio

from hasvc import client as hc
from hasvc.tools.partition import LOOPBACK, free_port
from tests.cluster import Cluster, slave_acking, start_dledger_group, wait_until

SEGMENT = 64 * 1024  # small segments: the damaged record lies many segments below the log's end


def flip(path: str, position: int) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        value = file.read(1)[0]
        file.seek(position)
        file.write(bytes([value ^ 0x10]))


def hasvc(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hasvc.cli", *args], capture_output=True, text=True, timeout=60)


async def _send(address: str, count: int) -> list:
    async with hc.connect(address) as client:
        results = []
        for start in range(0, count, 100):
            results += await client.send_batch("T", [b"message %04d " % i * 20 for i in range(start, start + 100)], queue_id=0)
        return results


def test_a_classic_broker_refuses_a_damaged_record_on_pull_and_read_and_reports_it(tmp_path):
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    try:
        metrics = f"{LOOPBACK}:{free_port()}"
        master = cluster.start_master(role="async", metrics_listen=metrics)
        results = trio.run(_send, master.address, 1000)
        assert all(r.status == "PUT_OK" for r in results)
        damaged, size = results[100].offset, results[101].offset - results[100].offset
        segment = os.path.join(cluster.store("master"), "commitlog", f"{damaged // SEGMENT * SEGMENT:020d}")
        assert results[-1].offset > damaged + 3 * SEGMENT
        flip(segment, damaged % SEGMENT + 150)

        read = hasvc("read", master.address, "--offset", str(damaged))
        assert read.returncode == 1 and read.stdout == ""
        lines = read.stderr.strip().splitlines()
        assert len(lines) == 1 and f"DAMAGED: record at offset {damaged} is damaged (body CRC mismatch" in lines[0], read.stderr
        queue = hasvc("read", master.address, "--topic", "T")
        assert queue.returncode == 1
        assert len(queue.stdout.splitlines()) == 100  # every record before the damaged one
        assert f"DAMAGED: record at offset {damaged}" in queue.stderr
        with hc.BlockingClient(master.address) as client:
            assert client.read_record(results[101].offset).queue_offset == 101  # what follows is served
            status = client.status()
        assert status["damaged"] == [{"file": segment, "from": damaged, "to": damaged + size, "reason": "body CRC mismatch"}]
        errors = [line for line in master.log().splitlines() if " ERROR " in line]
        assert len(errors) == 1 and f"{segment} bytes [{damaged}, {damaged + size}): body CRC mismatch" in errors[0], errors
        text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
        assert "hasvc_damaged_ranges 1.0" in text
        # READ: the refused one; PULL: the one served short of the damage, and the refused one
        assert 'hasvc_damaged_reads_total{kind="READ"} 1.0' in text and 'hasvc_damaged_reads_total{kind="PULL"} 2.0' in text, text
    finally:
        cluster.close()


def test_a_dledger_member_refuses_a_damaged_record_on_pull_and_read_and_reports_it(tmp_path):
    nodes = start_dledger_group(tmp_path, 1, group="dmg", segment_size=SEGMENT)
    node = nodes["n0"]
    try:
        def leading() -> bool:
            with hc.BlockingClient(node.client_address) as client:
                return client.status()["role"] == "SYNC_MASTER"

        wait_until(leading, timeout=60, message="n0 leading")
        results = trio.run(_send, node.client_address, 500)
        assert all(r.status == "PUT_OK" for r in results)
        damaged = results[50].offset
        data = os.path.join(str(tmp_path), "n0", "dledger-n0", "data")
        files = sorted(int(name) for name in os.listdir(data))
        first = max(f for f in files if f <= damaged)
        flip(os.path.join(data, f"{first:020d}"), damaged - first + 150)

        read = hasvc("read", node.client_address, "--offset", str(damaged))
        assert read.returncode == 1 and f"DAMAGED: record at offset {damaged} is damaged" in read.stderr, read.stderr
        queue = hasvc("read", node.client_address, "--topic", "T")
        assert queue.returncode == 1 and len(queue.stdout.splitlines()) == 50
        with hc.BlockingClient(node.client_address) as client:
            damage = client.status()["damaged"]
        assert [(d["file"], d["from"], d["reason"]) for d in damage] == [(os.path.join(data, f"{first:020d}"), damaged, "body CRC mismatch")]
    finally:
        for member in nodes.values():
            member.kill()


def test_with_the_broker_check_off_the_client_library_still_refuses_a_damaged_record(tmp_path):
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    try:
        master = cluster.start_master(role="async", check_crc_on_read="false")
        results = trio.run(_send, master.address, 200)
        damaged = results[150].offset
        flip(os.path.join(cluster.store("master"), "commitlog", f"{damaged // SEGMENT * SEGMENT:020d}"), damaged % SEGMENT + 150)
        read = hasvc("read", master.address, "--offset", str(damaged))
        assert read.returncode == 1
        assert f"record at offset {damaged} failed its body CRC on arrival" in read.stderr, read.stderr
        queue = hasvc("read", master.address, "--topic", "T")
        assert queue.returncode == 1 and f"record at offset {damaged} failed its body CRC on arrival" in queue.stderr
        shown = queue.stdout.splitlines()
        assert len(shown) < 150 and "message 0150" not in queue.stdout  # the PULL that held it is refused whole
        with hc.BlockingClient(master.address) as client:
            assert client.status()["damaged"] == []  # the broker did not look
    finally:
        cluster.close()


def test_the_proxys_receive_refuses_a_damaged_record_naming_it(tmp_path):
    """The gRPC gateway receives through the client library's PULL: the messages before the
    damaged one are delivered, the receive that reaches it is answered INTERNAL_SERVER_ERROR
    naming the offset (never the damaged body)."""
    import pytest

    pb = pytest.importorskip("hasvc.proxy.pb")
    import grpc

    from tests.cluster import BrokerProcess

    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    try:
        master = cluster.start_master(role="async")
        with hc.BlockingClient(master.address) as client:
            results = client.send_batch("Damaged", [b"body %d " % i * 30 for i in range(5)], queue_id=0)
        damaged = results[2].offset
        flip(os.path.join(cluster.store("master"), "commitlog", f"{damaged // SEGMENT * SEGMENT:020d}"), damaged % SEGMENT + 150)
        proxy = BrokerProcess("proxy", [sys.executable, "-m", "hasvc.cli", "proxy", "--listen", "127.0.0.1:0",
                                        "--brokers", master.address, "--queues", "1"], os.path.join(cluster.root, "proxy.log"))  # fmt: skip
        cluster.brokers.append(proxy)
        channel = grpc.insecure_channel(proxy.address)
        messaging = pb.service_grpc.MessagingServiceStub(channel)
        request = pb.service.ReceiveMessageRequest(group=pb.definition.Resource(name="G"), batch_size=32)
        request.message_queue.topic.name = "Damaged"
        request.long_polling_timeout.seconds = 1
        request.invisible_duration.seconds = 30
        metadata = (("x-mq-client-id", "test-client@1@0@DAMAGED"),)
        first = list(messaging.ReceiveMessage(request, timeout=10, metadata=metadata))
        assert [r.message.body for r in first if r.HasField("message")] == [b"body 0 " * 30, b"body 1 " * 30]
        second = list(messaging.ReceiveMessage(request, timeout=10, metadata=metadata))
        channel.close()
        assert [r.status.code for r in second if r.HasField("status")] == [pb.Code.INTERNAL_SERVER_ERROR]
        assert f"record at offset {damaged} is damaged" in second[0].status.message
        assert not any(r.HasField("message") for r in second)
    finally:
        cluster.close()


def _segment_bytes(store: str, segment: int) -> bytes:
    with open(os.path.join(store, "commitlog", f"{segment:020d}"), "rb") as file:
        return file.read()


def _repaired(address: str) -> bool:
    with hc.BlockingClient(address) as client:
        status = client.status()
    return status["damaged"] == [] and status["repair"]["repaired_ranges"] >= 1


def _slave_caught_up(master, slave, end: int) -> bool:
    with hc.BlockingClient(slave.address) as client:
        return client.status()["max_offset"] >= end


def test_damage_found_in_a_serving_master_is_repaired_from_its_slave(tmp_path):
    """A read meets the damage on the master: refused (DAMAGED) and listed; the master fetches the
    range from the slave that holds it, checks it, rewrites it in place and serves the record
    again; the two logs are byte-identical, and nothing was cut."""
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    try:
        master = cluster.start_master(role="sync")
        slave = cluster.start_slave(master.ha_address)
        wait_until(lambda: slave_acking(master), message="the slave acking")
        results = trio.run(_send, master.address, 1000)
        assert all(r.status == "PUT_OK" for r in results)
        end = results[-1].offset + (results[-1].offset - results[-2].offset)
        wait_until(lambda: _slave_caught_up(master, slave, end), message="the slave holding everything")
        damaged = results[100].offset
        segment = damaged // SEGMENT * SEGMENT
        flip(os.path.join(cluster.store("master"), "commitlog", f"{segment:020d}"), damaged % SEGMENT + 150)
        read = hasvc("read", master.address, "--offset", str(damaged))
        assert read.returncode == 1 and "DAMAGED" in read.stderr, read.stderr
        wait_until(lambda: _repaired(master.address), timeout=60, message="the master repaired from its slave")
        with hc.BlockingClient(master.address) as client:
            assert client.read_record(damaged).queue_offset == 100
            assert client.status()["max_offset"] == end  # nothing cut
        assert _segment_bytes(cluster.store("master"), segment) == _segment_bytes(cluster.store("slave"), segment)
        assert "repaired " in master.log() and "checked clean" in master.log()
    finally:
        cluster.close()


def test_damage_the_scrub_finds_on_a_slave_is_repaired_from_its_master(tmp_path):
    """No reader at all: the slave's scrub finds the flipped byte, and the slave repairs the range
    from its master while it goes on replicating."""
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    try:
        master = cluster.start_master(role="sync")
        slave = cluster.start_slave(master.ha_address, scrub_bytes_per_second=str(64 * 1024 * 1024))
        wait_until(lambda: slave_acking(master), message="the slave acking")
        results = trio.run(_send, master.address, 1000)
        assert all(r.status == "PUT_OK" for r in results)
        end = results[-1].offset + (results[-1].offset - results[-2].offset)
        wait_until(lambda: _slave_caught_up(master, slave, end), message="the slave holding everything")
        damaged = results[300].offset
        segment = damaged // SEGMENT * SEGMENT
        flip(os.path.join(cluster.store("slave"), "commitlog", f"{segment:020d}"), damaged % SEGMENT + 150)
        wait_until(lambda: _repaired(slave.address), timeout=90, message="the slave's scrub finding it, and the repair")
        assert "scrub: damage in the log" in slave.log()
        assert _segment_bytes(cluster.store("master"), segment) == _segment_bytes(cluster.store("slave"), segment)
        assert all(r.status == "PUT_OK" for r in trio.run(_send, master.address, 100))  # replication goes on
    finally:
        cluster.close()
