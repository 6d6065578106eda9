"""The proxy's process-wide budget of received messages its consumers have not read
(``receive_bytes_held_max``): real master and proxy processes, raw gRPC calls. A consumer opens a
ReceiveMessage stream of large messages and never reads it; while what it holds is at the budget,
a new receive (any group) is refused TOO_MANY_REQUESTS and counted; once the stream is cancelled
the budget is free and receives are served again. No timings are asserted."""

from __future__ import annotations

import os
import sys
import uuid

import pytest

from tests.cluster import BrokerProcess, Cluster, wait_until
from tests.system.test_port_gauges import gauges

pb = pytest.importorskip("hasvc.proxy.pb")
grpc = pytest.importorskip("grpc")
Code, definition, service = pb.Code, pb.definition, pb.service

BODY_SIZE = 1024 * 1024
MESSAGES = 32  # one receive's worth: more than grpc's HTTP/2 windows take in
BUDGET = BODY_SIZE  # receive_bytes_held_max here: one message a stream cannot hand over fills it
METADATA = (("x-mq-client-id", f"budget@{os.getpid()}@{uuid.uuid4().hex[:8]}"),)


def receive_request(group: str, topic: str):
    request = service.ReceiveMessageRequest(group=definition.Resource(name=group), batch_size=32)
    request.message_queue.topic.name = topic
    request.invisible_duration.seconds = 60
    return request


def test_while_unread_messages_fill_the_budget_new_receives_are_refused_and_served_once_it_is_free(tmp_path) -> None:
    cluster = Cluster(tmp_path, segment_size=64 * 1024 * 1024)
    try:
        master = cluster.start_master(role="async")
        command = [sys.executable, "-m", "hasvc.cli", "proxy", "--listen", "127.0.0.1:0", "--brokers", master.address,
                   "--invisible-min-seconds", "1", "--metrics-listen", "127.0.0.1:0",
                   "--set", f"receive_bytes_held_max={BUDGET}"]  # fmt: skip
        proxy = BrokerProcess("proxy", command, os.path.join(cluster.root, "proxy.log"))
        cluster.brokers.append(proxy)
        port = int(proxy.ready["metrics_listen"].rsplit(":", 1)[1])
        topic = f"Held-{uuid.uuid4().hex[:8]}"
        with grpc.insecure_channel(proxy.address) as channel:
            messaging = pb.service_grpc.MessagingServiceStub(channel)
            for number in range(MESSAGES):
                message = definition.Message(body=bytes(BODY_SIZE))
                message.topic.name = topic
                message.system_properties.message_id = f"01{os.getpid():016X}00000000{number:08X}"
                message.system_properties.message_type = definition.NORMAL
                sent = messaging.SendMessage(service.SendMessageRequest(messages=[message]), metadata=METADATA, timeout=30)
                assert sent.status.code == Code.OK, sent.status
            unread = messaging.ReceiveMessage(receive_request("Unread", topic), timeout=120, metadata=METADATA)
            assert next(unread).status.code == Code.OK  # then nothing more is read
            held = wait_until(lambda: (g := gauges(port))["hasvc_proxy_streams_muted"] == 1 and g, message="the stream muted")
            assert held["hasvc_proxy_receive_bytes_held"] >= BUDGET == held["hasvc_proxy_receive_bytes_held_max"]
            refused = list(messaging.ReceiveMessage(receive_request("Other", topic), timeout=30, metadata=METADATA))
            assert [r.status.code for r in refused] == [Code.TOO_MANY_REQUESTS]
            assert "receive_bytes_held_max" in refused[0].status.message
            assert gauges(port)["hasvc_proxy_receives_refused_total"] == 1
            unread.cancel()
            wait_until(lambda: gauges(port)["hasvc_proxy_receive_bytes_held"] == 0, message="the budget free")
            served = [r for r in messaging.ReceiveMessage(receive_request("Other", topic), timeout=30, metadata=METADATA)
                      if r.HasField("message")]  # fmt: skip
            assert len(served) >= 1
    finally:
        cluster.close()
