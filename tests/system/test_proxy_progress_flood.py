"""A flood of acknowledgements while the brokers cannot store them: real master and proxy processes
on loopback, raw gRPC calls. The master is stopped (SIGSTOP) so the proxy's progress writer waits
for it; acks of thousands of in-flight deliveries arrive at once. The proxy queues at most
``progress_events_queued_max`` events, refuses the rest TOO_MANY_REQUESTS (counted in its metrics,
beside the limit itself), stays small, and once the master runs again every ack a client retries
is answered OK. Receives, which do not wait for their deliveries to be stored, meet the same limit
while a SYNC_MASTER's slave is stopped, and every message still comes to every group once it runs.
No timings are asserted; waits are bounded by the harness."""

from __future__ import annotations

import os
import signal
import sys
import uuid

import pytest

from tests.cluster import BrokerProcess, Cluster, wait_until
from tests.system.test_hostile_clients import RssWatch, rss_bytes
from tests.system.test_port_gauges import gauges

pb = pytest.importorskip("hasvc.proxy.pb")
grpc = pytest.importorskip("grpc")
Code, definition, service = pb.Code, pb.definition, pb.service

LIMIT = 200  # progress_events_queued_max for the test: well below the flood
# Channels the flood spreads over: an ack taken waits for the brokers and holds its stream, and a
# connection holds at most streams_per_connection_max (1,024) of them.
CHANNELS = 8
GROUPS = 10  # each receives every message: GROUPS x MESSAGES deliveries to acknowledge
MESSAGES = 200
# What the proxy may grow by while the flood waits (measured: 22 MiB, mostly grpc's streams; 50 MiB
# without the limit, where every ack holds its call until the brokers answer). At this size of flood
# the gauges, not the RSS, are what tells the limit is there.
FLOOD_GROWTH_MAX_BYTES = 64 * 1024 * 1024
METADATA = (("x-mq-client-id", f"flood@{os.getpid()}@{uuid.uuid4().hex[:8]}"),)


def ack_request(group: str, topic: str, handle: str):
    entry = service.AckMessageEntry(message_id="m", receipt_handle=handle)
    return service.AckMessageRequest(group=definition.Resource(name=group), topic=definition.Resource(name=topic), entries=[entry])


def code_of(call) -> int | None:
    """The answer's code; None for a call the transport failed (a burst of streams beyond what the
    connection allows is refused with RST_STREAM REFUSED_STREAM before the client knows the limit;
    under load a few were seen CANCELLED): the client retries it."""
    if call.exception() is not None:
        assert call.exception().code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), call.exception()
        return None
    return call.result().status.code


def send_messages(messaging, topic: str) -> None:
    """MESSAGES messages ``flood <n>``, 50 a call."""
    for first in range(0, MESSAGES, 50):
        messages = []
        for number in range(first, first + 50):
            message = definition.Message(body=b"flood %d" % number)
            message.topic.name = topic
            message.system_properties.message_id = f"01{os.getpid():016X}00000000{number:08X}"
            message.system_properties.message_type = definition.NORMAL
            messages.append(message)
        sent = messaging.SendMessage(service.SendMessageRequest(messages=messages), metadata=METADATA, timeout=30)
        assert sent.status.code == Code.OK, sent.status


def receive_all(messaging, group: str, topic: str) -> list[str]:
    request = service.ReceiveMessageRequest(group=definition.Resource(name=group), batch_size=32)
    request.message_queue.topic.name = topic
    request.invisible_duration.seconds = 600  # current for the whole test
    request.long_polling_timeout.seconds = 1
    handles: list[str] = []
    while len(handles) < MESSAGES:
        answers = list(messaging.ReceiveMessage(request, timeout=30, metadata=METADATA))
        handles += [a.message.system_properties.receipt_handle for a in answers if a.HasField("message")]
    return handles


def test_a_flood_of_acks_while_the_master_is_stopped_is_bounded_refused_and_retried_once_it_drains(tmp_path) -> None:
    cluster = Cluster(tmp_path, segment_size=8 * 1024 * 1024)
    master = cluster.start_master(role="async")
    command = [sys.executable, "-m", "hasvc.cli", "proxy", "--listen", "127.0.0.1:0", "--brokers", master.address,
               "--queues", "1", "--invisible-min-seconds", "1", "--metrics-listen", "127.0.0.1:0",
               "--set", f"progress_events_queued_max={LIMIT}"]  # fmt: skip
    proxy = BrokerProcess("proxy", command, os.path.join(cluster.root, "proxy.log"))
    cluster.brokers.append(proxy)
    port = int(proxy.ready["metrics_listen"].rsplit(":", 1)[1])
    topic = f"Flood-{uuid.uuid4().hex[:8]}"
    stopped = False
    try:
        with grpc.insecure_channel(proxy.address) as channel:
            messaging = pb.service_grpc.MessagingServiceStub(channel)
            send_messages(messaging, topic)
            handles = [(f"G{g}", handle) for g in range(GROUPS) for handle in receive_all(messaging, f"G{g}", topic)]
            before = gauges(port)
            assert before["hasvc_proxy_progress_events_queued_max"] == LIMIT

            os.kill(master.pid, signal.SIGSTOP)  # the progress writer's next put waits for it
            stopped = True
            with RssWatch(proxy.pid) as watch:
                start = rss_bytes(proxy.pid)
                flood = [grpc.insecure_channel(proxy.address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(CHANNELS)]
                stubs = [pb.service_grpc.MessagingServiceStub(c) for c in flood]
                calls = [stubs[index % CHANNELS].AckMessage.future(ack_request(group, topic, handle), metadata=METADATA, timeout=300)
                         for index, (group, handle) in enumerate(handles)]  # fmt: skip

                def settled():  # every ack was either taken (acked) or refused
                    g = gauges(port)
                    settled.queued_max = max(settled.queued_max, g["hasvc_proxy_progress_events_queued"])
                    taken = g["hasvc_proxy_messages_acked_total"] - before["hasvc_proxy_messages_acked_total"]
                    unsent = sum(call.done() and call.exception() is not None for call in calls)  # see code_of
                    return taken + g["hasvc_proxy_progress_refused_total"] + unsent >= len(handles) and g

                settled.queued_max = 0
                flooded = wait_until(settled, timeout=240, interval=0.1, message="every ack taken or refused")
            assert settled.queued_max <= LIMIT and flooded["hasvc_proxy_progress_events_queued"] <= LIMIT
            assert watch.largest - start < FLOOD_GROWTH_MAX_BYTES, (start, watch.largest)

            os.kill(master.pid, signal.SIGCONT)
            stopped = False
            codes = [code_of(call) for call in calls]
            # taken: stored (OK), or not stored in time while the master was stopped (PROXY_TIMEOUT, to
            # be retried: a loaded machine may take longer than the request timeout to flood)
            assert set(codes) <= {Code.OK, Code.PROXY_TIMEOUT, Code.TOO_MANY_REQUESTS, None}, set(codes)
            refused = codes.count(Code.TOO_MANY_REQUESTS)
            assert refused == flooded["hasvc_proxy_progress_refused_total"] > 0
            retry = [pair for pair, code in zip(handles, codes) if code != Code.OK]

            def retried():  # an honest client retries what was refused until the queue has room
                nonlocal retry
                answers = [messaging.AckMessage(ack_request(group, topic, handle), metadata=METADATA, timeout=60) for group, handle in retry]
                retry = [pair for pair, answer in zip(retry, answers) if answer.status.code != Code.OK]
                return not retry

            wait_until(retried, timeout=120, interval=0.2, message="every refused ack retried OK")
            for group in range(GROUPS):  # everything is acknowledged: nothing comes back
                request = service.ReceiveMessageRequest(group=definition.Resource(name=f"G{group}"), batch_size=32)
                request.message_queue.topic.name = topic
                request.invisible_duration.seconds = 10
                answers = list(messaging.ReceiveMessage(request, timeout=30, metadata=METADATA))
                assert [a.status.code for a in answers if a.HasField("status")] == [Code.MESSAGE_NOT_FOUND]
            for flood_channel in flood:
                flood_channel.close()
        assert gauges(port)["hasvc_proxy_progress_events_queued"] == 0
    finally:
        if stopped:
            os.kill(master.pid, signal.SIGCONT)
        cluster.close()


def test_receives_while_the_slave_is_stopped_are_refused_beyond_the_limit_and_every_message_comes_once_it_runs(tmp_path) -> None:
    """Receives do not wait for their deliveries to be stored: with a SYNC_MASTER whose slave is
    stopped, every progress record waits for the slave timeout while consumers keep receiving."""
    cluster = Cluster(tmp_path, segment_size=8 * 1024 * 1024)
    master = cluster.start_master(role="sync")
    slave = cluster.start_slave(master.ha_address)
    command = [sys.executable, "-m", "hasvc.cli", "proxy", "--listen", "127.0.0.1:0", "--brokers", f"{master.address},{slave.address}",
               "--queues", "1", "--invisible-min-seconds", "1", "--metrics-listen", "127.0.0.1:0",
               "--set", f"progress_events_queued_max={LIMIT}"]  # fmt: skip
    proxy = BrokerProcess("proxy", command, os.path.join(cluster.root, "proxy.log"))
    cluster.brokers.append(proxy)
    port = int(proxy.ready["metrics_listen"].rsplit(":", 1)[1])
    topic = f"Slow-{uuid.uuid4().hex[:8]}"
    stopped = False
    try:
        with grpc.insecure_channel(proxy.address) as channel:
            messaging = pb.service_grpc.MessagingServiceStub(channel)
            send_messages(messaging, topic)
            os.kill(slave.pid, signal.SIGSTOP)  # each progress record now waits for the slave timeout
            stopped = True
            request = service.ReceiveMessageRequest(batch_size=32)
            request.message_queue.topic.name = topic
            request.invisible_duration.seconds = 600
            calls = []
            for group in range(GROUPS):
                request.group.name = f"S{group}"
                calls += [messaging.ReceiveMessage(request, timeout=120, metadata=METADATA) for _ in range(MESSAGES // 32 + 1)]
            answers = [list(call) for call in calls]  # each call's responses, all at once (futures, in effect)
            statuses = [a.status.code for answer in answers for a in answer if a.HasField("status")]
            g = gauges(port)
            assert g["hasvc_proxy_progress_events_queued"] <= LIMIT
            assert statuses.count(Code.TOO_MANY_REQUESTS) == g["hasvc_proxy_progress_refused_total"] > 0
            os.kill(slave.pid, signal.SIGCONT)
            stopped = False
            delivered: dict[int, list[bytes]] = {}  # an honest consumer retries: every message comes, once
            for call_index, answer in enumerate(answers):
                group = call_index // (MESSAGES // 32 + 1)
                delivered.setdefault(group, []).extend(a.message.body for a in answer if a.HasField("message"))
            for group in range(GROUPS):
                request.group.name = f"S{group}"
                request.long_polling_timeout.seconds = 1

                def rest(group=group):
                    delivered[group].extend(a.message.body for a in messaging.ReceiveMessage(request, timeout=30, metadata=METADATA)
                                            if a.HasField("message"))  # fmt: skip
                    return len(delivered[group]) >= MESSAGES

                wait_until(rest, timeout=120, interval=0.1, message=f"group S{group} received every message")
                assert sorted(delivered[group]) == sorted(b"flood %d" % n for n in range(MESSAGES))
    finally:
        if stopped:
            os.kill(slave.pid, signal.SIGCONT)
        cluster.close()
