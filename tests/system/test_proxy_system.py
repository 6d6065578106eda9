"""System tests of ``hasvc proxy``: real master and slave (SYNC_MASTER), a real proxy process, and
the official RocketMQ 5 Python client (``rocketmq-python-client`` from PyPI) in its own process.

Raw gRPC calls (the generated stubs, in this process) cover what the official client checks for
itself before it would send (FIFO messages, oversize bodies) and the exact codes of bad input.
"""

import ast
import importlib.util
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
import uuid

import grpc
import pytest

from commitlog.inspect import iter_records
from hasvc import client as hc
from tests.cluster import BrokerProcess, Cluster, self_signed_certificate, start_dledger_group, wait_until

pb = pytest.importorskip("hasvc.proxy.pb")
Code = pb.Code
definition, service = pb.definition, pb.service

DRIVER = os.path.join(os.path.dirname(__file__), "rmq_driver.py")
DRIVER_TIMEOUT_SECONDS = 120


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("proxy"), segment_size=4 * 1024 * 1024)
    master = cluster.start_master(role="sync")
    slave = cluster.start_slave(master.ha_address)

    def acking():
        with hc.BlockingClient(master.address) as client:
            slaves = client.status()["slaves"]
        return slaves and slaves[0]["ack_offset"] >= 0

    wait_until(acking, message="slave acking")
    yield cluster, master, slave
    cluster.close()


def start_proxy(cluster, master, slave, name="proxy", *extra):
    command = [sys.executable, "-m", "hasvc.cli", "proxy", "--listen", "127.0.0.1:0",
               "--brokers", f"{master.address},{slave.address}", "--invisible-min-seconds", "1", *extra]  # fmt: skip
    process = BrokerProcess(name, command, os.path.join(cluster.root, f"{name}.log"))
    cluster.brokers.append(process)
    return process


@pytest.fixture(scope="module")
def proxy(pair):
    process = start_proxy(*pair, "proxy", "--metrics-listen", "127.0.0.1:0")
    yield process
    assert process.stop() == 0, process.log()[-3000:]


def drive(proxy_process, steps, home, *, endpoint=None, env=None):
    """Run the official client's steps in a child process; their results."""
    env = {**os.environ, "HOME": str(home), **(env or {})}
    done = subprocess.run([sys.executable, DRIVER, endpoint or proxy_process.address, json.dumps(steps)], env=env,
                          capture_output=True, text=True, timeout=DRIVER_TIMEOUT_SECONDS)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:] + "\nproxy log:\n" + proxy_process.log()[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def body_of(topic, i):
    return f"{topic}:{i}:".encode() + bytes(range(256)) + b"\x00end"


def stub(proxy_process):
    channel = grpc.insecure_channel(proxy_process.address)
    return channel, pb.service_grpc.MessagingServiceStub(channel)


MESSAGE_COUNTER = itertools.count()
PROCESS_PART = uuid.uuid4().hex[:16].upper()


def next_message_id():
    """A v1 message id as the official clients make them: the counter at the end increases."""
    return f"01{PROCESS_PART}00000000{next(MESSAGE_COUNTER):08X}"


def normal_message(topic, body=b"x", message_id=None, **system):
    message = definition.Message(body=body)
    message.topic.name = topic
    message.system_properties.message_id = message_id or next_message_id()
    message.system_properties.message_type = system.pop("message_type", definition.NORMAL)
    for key, value in system.items():
        setattr(message.system_properties, key, value)
    return message


CLIENT = (("x-mq-client-id", f"test-client@{os.getpid()}@0@{PROCESS_PART}"),)


# --- producing ---


def test_official_producer_sends_and_hasvc_reads_back_byte_for_byte(pair, proxy, tmp_path):
    topic = unique("Orders")
    count = 24
    (sent,) = drive(proxy, [{"op": "produce", "topic": topic, "count": count}], tmp_path)
    assert len({s["id"] for s in sent}) == count
    by_id = {s["id"]: s for s in sent}
    _, master, slave = pair
    found = {}
    for address in (master.address, slave.address):  # the slave has them too (SYNC_MASTER)
        with hc.BlockingClient(address) as client:
            wait_until(lambda: sum(len(client.pull(topic, q, 0, count_max=64).records) for q in range(4)) == count,  # noqa: B023
                       message="all messages in the queues")  # fmt: skip
            for queue_id in range(4):
                for record in client.pull(topic, queue_id, 0, count_max=64).records:
                    found.setdefault(address, {})[record.properties["UNIQ_KEY"]] = record
    for address, records in found.items():
        assert set(records) == set(by_id), address
        for message_id, record in records.items():
            i = by_id[message_id]["i"]
            assert bytes(record.body) == body_of(topic, i)
            assert record.tags == f"tag{i % 3}" and record.keys == f"key-{i}"
            assert record.properties["index"] == str(i) and record.properties["kind"] == "test"
            # the offset is the message's queue offset; the queue is the proxy's choice, not the
            # one the client's receipt names (as with RocketMQ's proxy: SendMessageRequest has none)
            assert record.queue_offset == by_id[message_id]["offset"]
    assert "send lane connected to " + master.address in proxy.log()  # the sends went from the gRPC loop
    assert proxy.ready["send_lane"] is True
    assert proxy.ready["loop"] == ("uvloop" if importlib.util.find_spec("uvloop") else "asyncio")


def test_without_the_send_lane_on_asyncios_loop_sends_cross_to_the_trio_side_and_a_retry_is_stored_once(pair, tmp_path):
    cluster, master, slave = pair
    process = start_proxy(cluster, master, slave, "proxy-no-lane", "--no-send-lane", "--loop", "asyncio")
    assert process.ready["loop"] == "asyncio" and process.ready["send_lane"] is False
    topic = unique("NoLane")
    channel, messaging = stub(process)
    messages = [normal_message(topic, body_of(topic, i)) for i in range(5)]
    answers = [messaging.SendMessage(service.SendMessageRequest(messages=[m]), metadata=CLIENT) for m in messages]
    again = messaging.SendMessage(service.SendMessageRequest(messages=[messages[0]]), metadata=CLIENT)
    channel.close()
    assert [a.status.code for a in answers + [again]] == [Code.OK] * 6
    assert again.entries[0].offset == answers[0].entries[0].offset
    with hc.BlockingClient(master.address) as client:
        bodies = sorted(bytes(r.body) for q in range(4) for r in client.pull(topic, q, 0).records)
    assert bodies == sorted(body_of(topic, i) for i in range(5))
    assert process.stop() == 0
    assert "send lane" not in process.log()


def test_a_retried_send_is_stored_once(pair, proxy):
    topic = unique("Retry")
    channel, messaging = stub(proxy)
    message = normal_message(topic, b"only once")
    first = messaging.SendMessage(service.SendMessageRequest(messages=[message]), metadata=CLIENT)
    again = messaging.SendMessage(service.SendMessageRequest(messages=[message]), metadata=CLIENT)
    channel.close()
    assert first.status.code == Code.OK and again.status.code == Code.OK
    assert first.entries[0].offset == again.entries[0].offset
    assert first.entries[0].message_id == again.entries[0].message_id == message.system_properties.message_id
    with hc.BlockingClient(pair[1].address) as client:
        bodies = [bytes(r.body) for q in range(4) for r in client.pull(topic, q, 0).records]
    assert bodies == [b"only once"]


def test_settings_are_answered_completely_and_routes_name_the_proxy(proxy):
    channel, messaging = stub(proxy)
    settings = definition.Settings(client_type=definition.PRODUCER)
    settings.publishing.topics.add(name="T")
    answers = messaging.Telemetry(iter([service.TelemetryCommand(settings=settings)]), metadata=CLIENT)
    (answer,) = list(answers)
    assert answer.status.code == Code.OK
    assert answer.settings.publishing.max_body_size == 4 * 1024 * 1024
    assert answer.settings.publishing.validate_message_type
    assert answer.settings.backoff_policy.max_attempts == 3
    subscription = definition.Settings(client_type=definition.SIMPLE_CONSUMER)
    subscription.subscription.group.name = "G"
    (answer,) = list(messaging.Telemetry(iter([service.TelemetryCommand(settings=subscription)]), metadata=CLIENT))
    assert answer.status.code == Code.OK and answer.settings.subscription.receive_batch_size == 32

    route = messaging.QueryRoute(service.QueryRouteRequest(topic=definition.Resource(name="T")), metadata=CLIENT)
    channel.close()
    assert route.status.code == Code.OK and len(route.message_queues) == 4
    host, port = proxy.address.rsplit(":", 1)
    for queue in route.message_queues:
        assert queue.permission == definition.READ_WRITE and queue.broker.id == 0
        assert list(queue.accept_message_types) == [definition.NORMAL]
        assert [(a.host, a.port) for a in queue.broker.endpoints.addresses] == [(host, int(port))]


def test_unsupported_types_and_bad_input_get_the_right_codes(proxy):
    channel, messaging = stub(proxy)

    def send(message):
        response = messaging.SendMessage(service.SendMessageRequest(messages=[message]), metadata=CLIENT)
        return response.status.code, response.status.message

    fifo = send(normal_message("Bad", message_type=definition.FIFO, message_group="g"))
    assert fifo[0] == Code.UNSUPPORTED and "FIFO" in fifo[1]
    assert send(normal_message("Bad", message_type=definition.TRANSACTION))[0] == Code.UNSUPPORTED
    delay = normal_message("Bad", message_type=definition.DELAY)
    delay.system_properties.delivery_timestamp.seconds = 2_000_000_000
    assert send(delay)[0] == Code.UNSUPPORTED
    assert send(normal_message("Bad", b"x" * (4 * 1024 * 1024 + 1)))[0] == Code.MESSAGE_BODY_TOO_LARGE
    assert send(normal_message("Bad", b""))[0] == Code.MESSAGE_BODY_EMPTY
    assert send(normal_message("no spaces allowed"))[0] == Code.ILLEGAL_TOPIC
    assert send(normal_message("%HASVC_PROXY_PROGRESS"))[0] == Code.ILLEGAL_TOPIC
    reserved = normal_message("Bad")
    reserved.user_properties["UNIQ_KEY"] = "mine"
    assert send(reserved)[0] == Code.ILLEGAL_MESSAGE_PROPERTY_KEY

    ack = messaging.AckMessage(service.AckMessageRequest(
        group=definition.Resource(name="G"), topic=definition.Resource(name="Bad"),
        entries=[service.AckMessageEntry(message_id="m", receipt_handle="not a handle")]), metadata=CLIENT)  # fmt: skip
    assert ack.entries[0].status.code == Code.INVALID_RECEIPT_HANDLE
    change = messaging.ChangeInvisibleDuration(service.ChangeInvisibleDurationRequest(
        group=definition.Resource(name="G"), topic=definition.Resource(name="Bad"), receipt_handle="hasvc1 0 0 ff",
        message_id="m", invisible_duration={"seconds": 5}), metadata=CLIENT)  # fmt: skip
    assert change.status.code == Code.INVALID_RECEIPT_HANDLE
    # and the proxy still serves
    assert send(normal_message(unique("After"), b"fine"))[0] == Code.OK
    channel.close()


def test_long_polling_answers_before_the_clients_deadline(proxy):
    channel, messaging = stub(proxy)
    request = service.ReceiveMessageRequest(group=definition.Resource(name=unique("G")), batch_size=1)
    request.message_queue.topic.name = unique("Empty")
    request.long_polling_timeout.seconds = 20
    request.invisible_duration.seconds = 30
    responses = list(messaging.ReceiveMessage(request, timeout=2.0, metadata=CLIENT))  # a deadline well before 20 s
    channel.close()
    assert [r.status.code for r in responses] == [Code.MESSAGE_NOT_FOUND]


# --- consuming ---


def test_two_groups_each_consume_every_message_exactly_once(proxy, tmp_path):
    topic = unique("Feed")
    count = 40
    steps = [{"op": "produce", "topic": topic, "count": count},
             {"op": "consume", "group": "A", "topic": topic, "want": count},
             {"op": "consume", "group": "B", "topic": topic, "want": count},
             {"op": "consume", "group": "A", "topic": topic, "want": 1, "rounds": 1, "await": 1}]  # fmt: skip
    sent, group_a, group_b, after = drive(proxy, steps, tmp_path)
    ids = sorted(s["id"] for s in sent)
    assert sorted(m["id"] for m in group_a) == ids
    assert sorted(m["id"] for m in group_b) == ids
    with urllib.request.urlopen(f"http://{proxy.ready['metrics_listen']}/metrics") as response:
        scraped = response.read().decode()
    assert 'hasvc_proxy_requests_total{code="OK",method="SendMessage"}' in scraped
    assert "hasvc_proxy_messages_acked_total" in scraped and "hasvc_proxy_inflight_messages" in scraped
    assert "hasvc_proxy_send_lane_sends_total" in scraped and "hasvc_proxy_send_lane_fallbacks_total" in scraped
    assert after == []  # everything acknowledged: nothing comes back
    by_id = {s["id"]: s["i"] for s in sent}
    for message in group_a:
        i = by_id[message["id"]]
        assert bytes.fromhex(message["body"]) == body_of(topic, i)
        assert message["tag"] == f"tag{i % 3}" and message["keys"] == [f"key-{i}"]
        assert message["props"] == {"index": str(i), "kind": "test"} and message["attempt"] == 1


def test_unacked_messages_come_back_and_a_stale_handle_is_refused(proxy, tmp_path):
    topic = unique("Redeliver")
    steps = [{"op": "produce", "topic": topic, "count": 3},
             {"op": "consume", "group": "R", "topic": topic, "want": 3, "invisible": 1, "ack": False, "slot": "first"},
             {"op": "consume", "group": "R", "topic": topic, "want": 3, "invisible": 30, "ack": False, "slot": "second"},
             {"op": "change", "slot": "second", "invisible": 30},
             {"op": "ack", "slot": "second_old"},
             {"op": "ack", "slot": "second"},
             {"op": "consume", "group": "R", "topic": topic, "want": 1, "rounds": 1, "await": 1}]  # fmt: skip
    sent, first, second, changed, stale_acks, acks, after = drive(proxy, steps, tmp_path)
    ids = sorted(s["id"] for s in sent)
    assert sorted(m["id"] for m in first) == ids and {m["attempt"] for m in first} == {1}
    assert sorted(m["id"] for m in second) == ids and {m["attempt"] for m in second} == {2}
    assert sorted(changed) == ids
    assert stale_acks == [Code.INVALID_RECEIPT_HANDLE] * 3
    assert acks == [None] * 3
    assert after == []


def test_progress_survives_a_proxy_sigkill(pair, tmp_path):
    cluster, master, slave = pair
    # snapshots every 4 events, so the restart loads one and replays the events after it
    first = start_proxy(cluster, master, slave, "proxy-a", "--snapshot-every-events", "4")
    topic = unique("Durable")
    count = 30
    steps = [{"op": "produce", "topic": topic, "count": count},
             {"op": "consume", "group": "D", "topic": topic, "want": 10, "invisible": 60}]  # fmt: skip
    sent, consumed = drive(first, steps, tmp_path)
    first.process.send_signal(signal.SIGKILL)
    first.kill()
    second = start_proxy(cluster, master, slave, "proxy-b", "--snapshot-every-events", "4")
    (rest,) = drive(second, [{"op": "consume", "group": "D", "topic": topic, "want": count - 10}], tmp_path)
    assert second.stop() == 0
    assert "progress snapshot stored" in first.log()
    replayed = [line for line in second.log().splitlines() if "progress replayed" in line]
    assert replayed and "[0, 0)" not in replayed[0], replayed  # a snapshot, then the events after it
    assert len(consumed) == 10
    assert sorted(m["id"] for m in consumed + rest) == sorted(s["id"] for s in sent)  # none acked came back


def test_a_receive_waiting_for_messages_gets_one_sent_meanwhile(proxy):
    import threading

    topic, group = unique("Wake"), unique("W")
    channel, messaging = stub(proxy)
    request = service.ReceiveMessageRequest(group=definition.Resource(name=group), batch_size=4)
    request.message_queue.topic.name = topic
    request.long_polling_timeout.seconds = 20
    request.invisible_duration.seconds = 30
    responses = []
    receiving = threading.Thread(target=lambda: responses.extend(messaging.ReceiveMessage(request, timeout=30, metadata=CLIENT)))
    receiving.start()
    sent = messaging.SendMessage(service.SendMessageRequest(messages=[normal_message(topic, b"wake up")]), metadata=CLIENT)
    receiving.join()
    channel.close()
    assert sent.status.code == Code.OK
    assert responses[0].status.code == Code.OK
    assert [r.message.body for r in responses if r.HasField("message")] == [b"wake up"]


def test_a_write_no_slave_acknowledged_is_not_ok_until_a_slave_has_it(tmp_path):
    cluster = Cluster(tmp_path, segment_size=4 * 1024 * 1024)
    try:
        master = cluster.start_master(role="sync")
        command = [sys.executable, "-m", "hasvc.cli", "proxy", "--listen", "127.0.0.1:0", "--brokers", master.address]
        proxy_process = BrokerProcess("proxy", command, os.path.join(cluster.root, "proxy.log"))
        cluster.brokers.append(proxy_process)
        channel, messaging = stub(proxy_process)
        message = normal_message(unique("Lonely"), b"needs a slave")
        alone = messaging.SendMessage(service.SendMessageRequest(messages=[message]), metadata=CLIENT)
        assert alone.status.code == Code.HA_NOT_AVAILABLE, alone.status
        cluster.start_slave(master.ha_address)

        def retried():
            answer = messaging.SendMessage(service.SendMessageRequest(messages=[message]), metadata=CLIENT)
            return answer if answer.status.code == Code.OK else None

        again = wait_until(retried, interval=0.2, message="the retry acknowledged once a slave has it")
        channel.close()
        assert again.entries[0].offset == alone.entries[0].offset  # stored once, acknowledged on the retry
    finally:
        cluster.close()


def test_push_consumer_consumes_every_message_and_a_failed_one_again(proxy, tmp_path):
    topic = unique("Pushed")
    (sent,) = drive(proxy, [{"op": "produce", "topic": topic, "count": 12}], tmp_path)
    failing = sent[0]["id"]
    (consumed,) = drive(proxy, [{"op": "push", "group": "P", "topic": topic, "want": 12, "fail_first": [failing], "linger": 1}], tmp_path)
    assert sorted(m["id"] for m in consumed) == sorted(s["id"] for s in sent)  # each once: acked after success
    assert [m["attempt"] for m in consumed if m["id"] == failing] == [2]


def produce_through(proxy_process, topic, home, *, writer_address, fault) -> list[str]:
    """An official Producer sends 150 messages through the proxy (errors tolerated); once 30 are in
    ``writer_address``'s queues, ``fault()`` runs. The message ids acknowledged to the Producer."""
    steps = [{"op": "produce", "topic": topic, "count": 150, "tolerate": True, "pause": 0.01}]
    producer = subprocess.Popen([sys.executable, DRIVER, proxy_process.address, json.dumps(steps)],
                                env={**os.environ, "HOME": str(home)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    try:
        with hc.BlockingClient(writer_address) as client:
            wait_until(lambda: sum(client.pull(topic, q, 0, count_max=1).max_queue_offset for q in range(4)) >= 30,
                       message="the producer under way")  # fmt: skip
        fault()
        out, err = producer.communicate(timeout=DRIVER_TIMEOUT_SECONDS)
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()
    assert producer.returncode == 0, err[-3000:] + proxy_process.log()[-3000:]
    (sent,) = json.loads(out.strip().splitlines()[-1])
    acked = [s["id"] for s in sent if "id" in s]
    assert len(acked) > 30, [s for s in sent if "error" in s]
    return acked


def test_no_send_acknowledged_to_the_official_client_is_lost_when_the_master_dies(tmp_path):
    """SIGKILL the master under an official Producer, promote the slave; the proxy follows it."""
    cluster = Cluster(tmp_path, segment_size=4 * 1024 * 1024)
    try:
        master = cluster.start_master(role="sync")
        slave = cluster.start_slave(master.ha_address)
        proxy_process = start_proxy(cluster, master, slave)
        topic = unique("Failover")

        def master_dies() -> None:
            master.kill()
            with hc.BlockingClient(slave.address) as client:
                client.promote(sync=False)  # no slave left to wait for

        acked = produce_through(proxy_process, topic, tmp_path, writer_address=master.address, fault=master_dies)
        with hc.BlockingClient(slave.address) as client:
            wait_until(lambda: (lambda s: s["dispatched_offset"] == s["max_offset"])(client.status()),  # noqa: B023
                       message="the new master's queues built")  # fmt: skip
            queued = [r.properties["UNIQ_KEY"] for q in range(4) for r in client.pull(topic, q, 0, count_max=1024).records]
        # the new master's log holds every acknowledged message, once
        logged = [r.properties["UNIQ_KEY"] for _, r, _ in iter_records(cluster.store("slave")) if r.topic == topic]
        assert not set(acked) - set(logged), len(set(acked) - set(logged))
        assert len(logged) == len(set(logged))
        # ...and its consume queues too: a promoted slave continues each queue after the replicated records
        assert not set(acked) - set(queued), len(set(acked) - set(queued))
    finally:
        cluster.close()


def test_no_send_acknowledged_to_the_official_client_is_lost_when_a_dledger_leader_dies(tmp_path):
    """A proxy in front of a 3-member DLedger group: SIGKILL the leader under an official
    Producer; the group elects a new leader with nobody promoting, the proxy follows it, and
    every acknowledged message is in the new leader's queues, once."""
    nodes = {}
    try:
        nodes = start_dledger_group(tmp_path, 3, group="px", segment_size=4 * 1024 * 1024)
        addresses = ",".join(node.client_address for node in nodes.values())

        def leader() -> str | None:
            for member, node in nodes.items():
                if node.alive:
                    with hc.BlockingClient(node.client_address) as client:
                        if client.status()["role"] == "SYNC_MASTER":
                            return member
            return None

        first = wait_until(leader, timeout=60, message="a leader")
        command = [sys.executable, "-m", "hasvc.cli", "proxy", "--listen", "127.0.0.1:0", "--brokers", addresses]
        proxy_process = BrokerProcess("proxy", command, str(tmp_path / "proxy.log"))
        try:
            topic = unique("Raft")
            acked = produce_through(proxy_process, topic, tmp_path, writer_address=nodes[first].client_address,
                                    fault=nodes[first].kill)  # fmt: skip
        finally:
            assert proxy_process.stop() == 0, proxy_process.log()[-3000:]
        second = wait_until(leader, timeout=60, message="a new leader")
        assert second != first
        with hc.BlockingClient(nodes[second].client_address) as client:
            queued = [r.properties["UNIQ_KEY"] for q in range(4) for r in client.pull(topic, q, 0, count_max=1024).records]
        assert not set(acked) - set(queued), len(set(acked) - set(queued))
        assert len(queued) == len(set(queued))  # retried sends stored once
        lane = ast.literal_eval(proxy_process.log().rsplit("send lane ", 1)[1].splitlines()[0])
        assert lane["connects"] >= 2 and lane["sent"] > 0, lane  # the send lane followed the new leader
    finally:
        for node in nodes.values():
            if node.alive:
                node.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_tls_listener_beside_the_plaintext_one(pair, tmp_path):
    key, cert = self_signed_certificate(tmp_path)
    proxy_process = start_proxy(*pair, "proxy-tls", "--tls-listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key)
    tls_address = proxy_process.ready["tls_listen"]
    with open(cert, "rb") as file:
        credentials = grpc.ssl_channel_credentials(root_certificates=file.read())
    with grpc.secure_channel(tls_address, credentials) as channel:
        messaging = pb.service_grpc.MessagingServiceStub(channel)
        request = service.QueryRouteRequest(topic=definition.Resource(name="T"))
        request.endpoints.addresses.add(host="127.0.0.1", port=int(tls_address.rsplit(":", 1)[1]))
        route = messaging.QueryRoute(request, metadata=CLIENT)
    assert route.status.code == Code.OK
    assert {f"{a.host}:{a.port}" for q in route.message_queues for a in q.broker.endpoints.addresses} == {tls_address}
    topic = unique("Secure")
    steps = [{"op": "produce", "topic": topic, "count": 3}, {"op": "consume", "group": "S", "topic": topic, "want": 3}]
    sent, consumed = drive(proxy_process, steps, tmp_path, endpoint=tls_address,
                           env={"RMQ_DRIVER_TLS": "1", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": cert})  # fmt: skip
    assert proxy_process.stop() == 0
    assert sorted(m["id"] for m in consumed) == sorted(s["id"] for s in sent)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_the_send_lane_reaches_brokers_behind_tls_and_a_secret(tmp_path):
    key, cert = self_signed_certificate(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("proxy-lane-test-secret\n")
    cluster = Cluster(tmp_path, segment_size=4 * 1024 * 1024)
    try:
        master, slave = cluster.start_guarded_pair(["--tls-cert", cert, "--tls-key", key, "--tls-ca", cert, "--secret-file", str(secret)])
        process = start_proxy(cluster, master, slave, "proxy-guarded", "--tls-ca", cert, "--secret-file", str(secret))
        topic = unique("Guarded")
        channel, messaging = stub(process)
        answers = [messaging.SendMessage(service.SendMessageRequest(messages=[normal_message(topic, b"m%d" % i)]), metadata=CLIENT)
                   for i in range(20)]  # fmt: skip
        channel.close()
        assert [a.status.code for a in answers] == [Code.OK] * 20, [a.status.message for a in answers]
        assert process.stop() == 0
        log = process.log()
        assert "send lane connected to " + master.address in log
        lane_sent = int(log.rsplit("send lane {'sent': ", 1)[1].split(",", 1)[0])
        assert lane_sent > 0  # the first sends went through trio while the lane connected; then the lane's
        with hc.BlockingClient(slave.address, secret="proxy-lane-test-secret", tls_ca=cert) as client:
            bodies = sorted(bytes(r.body) for q in range(4) for r in client.pull(topic, q, 0).records)
        assert bodies == sorted(b"m%d" % i for i in range(20))
    finally:
        cluster.close()


def test_a_message_given_up_on_goes_to_the_groups_dead_letter_topic(pair, proxy):
    topic, group = unique("Poison"), unique("DL")
    channel, messaging = stub(proxy)
    sent = messaging.SendMessage(service.SendMessageRequest(messages=[normal_message(topic, b"poison", tag="t")]), metadata=CLIENT)
    assert sent.status.code == Code.OK
    request = service.ReceiveMessageRequest(group=definition.Resource(name=group), batch_size=1)
    request.message_queue.topic.name = topic
    request.long_polling_timeout.seconds = 5
    request.invisible_duration.seconds = 30
    (message,) = [r.message for r in messaging.ReceiveMessage(request, timeout=10, metadata=CLIENT) if r.HasField("message")]
    forward = messaging.ForwardMessageToDeadLetterQueue(service.ForwardMessageToDeadLetterQueueRequest(
        group=definition.Resource(name=group), topic=definition.Resource(name=topic),
        receipt_handle=message.system_properties.receipt_handle, message_id=message.system_properties.message_id,
        delivery_attempt=17, max_delivery_attempts=17), metadata=CLIENT)  # fmt: skip
    assert forward.status.code == Code.OK
    again = messaging.ForwardMessageToDeadLetterQueue(service.ForwardMessageToDeadLetterQueueRequest(
        group=definition.Resource(name=group), topic=definition.Resource(name=topic),
        receipt_handle=message.system_properties.receipt_handle), metadata=CLIENT)  # fmt: skip
    assert again.status.code == Code.OK  # a retried forward: already acknowledged, not copied twice
    channel.close()
    with hc.BlockingClient(pair[1].address) as client:
        (dead,) = client.pull(f"%DLQ%{group}", 0, 0).records
    assert bytes(dead.body) == b"poison" and dead.tags == "t"
    assert dead.properties["UNIQ_KEY"] == message.system_properties.message_id


def test_one_ack_request_acknowledges_many_messages(proxy):
    topic, group = unique("Batch"), unique("B")
    channel, messaging = stub(proxy)
    messages = [normal_message(topic, f"m{i}".encode()) for i in range(5)]
    assert messaging.SendMessage(service.SendMessageRequest(messages=messages), metadata=CLIENT).status.code == Code.OK
    request = service.ReceiveMessageRequest(group=definition.Resource(name=group), batch_size=32)
    request.message_queue.topic.name = topic
    request.long_polling_timeout.seconds = 2
    request.invisible_duration.seconds = 30
    received = []
    while len(received) < 5:
        received += [r.message for r in messaging.ReceiveMessage(request, timeout=10, metadata=CLIENT) if r.HasField("message")]
    entries = [service.AckMessageEntry(message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle)
               for m in received]  # fmt: skip
    entries.append(service.AckMessageEntry(message_id="x", receipt_handle="hasvc1 3 999 1"))  # never delivered
    ack = messaging.AckMessage(service.AckMessageRequest(group=definition.Resource(name=group), topic=definition.Resource(name=topic),
                                                         entries=entries), metadata=CLIENT)  # fmt: skip
    request.long_polling_timeout.seconds = 1
    after = [r for r in messaging.ReceiveMessage(request, timeout=10, metadata=CLIENT) if r.HasField("message")]
    channel.close()
    assert ack.status.code == Code.MULTIPLE_RESULTS
    assert [e.status.code for e in ack.entries] == [Code.OK] * 5 + [Code.INVALID_RECEIPT_HANDLE]
    assert sorted(m.body for m in received) == [f"m{i}".encode() for i in range(5)] and after == []
