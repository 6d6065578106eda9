"""The ports' queued-bytes and muted-connection gauges, read from the metrics endpoint of real
processes on loopback: a peer that never reads makes them rise, and they fall once it is gone.
On the HA port, a fake slave that handshakes and reports but never reads the frames: the master
stays small, the real slave keeps replicating, and the fake is closed after
``ha_send_stalled_timeout_seconds``. Through the proxy, a consumer that opens a ReceiveMessage
stream and never reads it. No timings are asserted; waits are bounded by the harness."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import threading
import urllib.request

import pytest
import trio

from hasvc.protocol import ha, wire
from hasvc.tools.partition import LOOPBACK, free_port
from tests.cluster import BrokerProcess, Cluster, send_many, status, wait_until
from tests.system.test_hostile_clients import RssWatch, _host_port, _receive, _send_one, preface, read_flooder, rss_bytes

# What the master may grow by while a slave holds its frames unread (measured: 0-2 MiB; its writer
# waits for the socket and holds no copy of a frame).
HA_STALL_GROWTH_MAX_BYTES = 64 * 1024 * 1024
# The fake slave's receive buffer: small, so the master's socket is full after a few frames.
STALLED_RECEIVE_BUFFER_SIZE = 4096
# What a consumer that never reads is offered through the proxy: 32 messages of 1 MiB, more than
# grpc's HTTP/2 windows take in.
PROXY_MESSAGES = 32
PROXY_BODY_SIZE = 1024 * 1024


def gauges(port: int) -> dict[str, float]:
    """The unlabelled samples of the metrics endpoint on ``port``, by name."""
    text = urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=10).read().decode()
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


class StalledSlave:
    """A slave that handshakes, reports its (empty) log's end every 0.2 s, and never reads a frame."""

    def __init__(self, ha_address: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STALLED_RECEIVE_BUFFER_SIZE)
        self.sock.settimeout(10)
        self.sock.connect(_host_port(ha_address))
        preface(self.sock, wire.PORT_KIND_HA)
        self.sock.sendall(ha.encode_slave_hello(ha.SlaveHello("stalled", "", 0)))
        (length,) = ha.LENGTH.unpack(_receive(self.sock, ha.LENGTH.size))
        answer = ha.decode_master_hello(_receive(self.sock, length))
        assert answer.status == ha.STATUS_OK, answer.reason
        self._stop = threading.Event()
        self.closed_by_master = False
        self._thread = threading.Thread(target=self._report, daemon=True)
        self._thread.start()

    def _report(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.sock.sendall(ha.REPORT.pack(0))
            except OSError:  # the master closed us
                self.closed_by_master = True
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_a_slave_that_never_reads_is_counted_closed_after_its_timeout_and_the_real_slave_replicates(cluster) -> None:
    port = free_port()
    master = cluster.start_master(role="sync", metrics_listen=f"{LOOPBACK}:{port}", ha_send_stalled_timeout_seconds=5)
    slave = cluster.start_slave(master.ha_address)
    trio.run(functools.partial(send_many, master.address, 2000, 32, size=4000))  # 8 MiB of log to send
    before = rss_bytes(master.pid)
    with RssWatch(master.pid) as watch:
        stalled = StalledSlave(master.ha_address)
        try:
            shown = wait_until(lambda: (g := gauges(port))["hasvc_ha_connections_muted"] == 1 and g, message="the stalled slave counted")
            assert 0 < shown["hasvc_ha_bytes_queued"] <= 1024 * 1024 + ha.TRANSFER_HEADER.size  # one frame at most
            # SYNC_MASTER: every put is acknowledged by the real slave meanwhile.
            statuses = trio.run(functools.partial(send_many, master.address, 200, 8, size=4000))
            assert {result.status for result in statuses.values()} == {"PUT_OK"}
            end = status(master)["max_offset"]
            wait_until(lambda: status(slave)["max_offset"] == end, message="the real slave caught up")
            # Reporting all the while, it is closed by the master, not by the report watchdog.
            wait_until(lambda: stalled.closed_by_master, message="the stalled slave closed")
            settled = wait_until(lambda: (g := gauges(port))["hasvc_ha_connections_muted"] == 0 and g, message="gauges back")
            assert settled["hasvc_ha_bytes_queued"] == 0 and settled["hasvc_ha_connections_closed_stalled"] >= 1
            during = watch.largest
        finally:
            stalled.close()
    print(f"master VmRSS: {before / 2**20:.0f} MiB before, at most {during / 2**20:.0f} MiB with the slave stalled")
    assert during - before < HA_STALL_GROWTH_MAX_BYTES
    assert _send_one(master.address) == "PUT_OK"


def test_a_slave_that_never_reads_and_then_closes_leaves_the_gauges_at_zero(cluster) -> None:
    port = free_port()
    master = cluster.start_master(role="async", metrics_listen=f"{LOOPBACK}:{port}")  # the default timeout: 30 s
    trio.run(functools.partial(send_many, master.address, 2000, 32, size=4000))
    stalled = StalledSlave(master.ha_address)
    try:
        wait_until(lambda: gauges(port)["hasvc_ha_connections_muted"] == 1, message="the stalled slave counted")
    finally:
        stalled.close()
    settled = wait_until(lambda: (g := gauges(port))["hasvc_ha_connections_muted"] == 0 and g, message="gauges back")
    assert settled["hasvc_ha_bytes_queued"] == 0 and settled["hasvc_ha_connections_closed_stalled"] == 0


def test_a_client_that_never_reads_shows_on_the_metrics_endpoint_until_it_closes(cluster) -> None:
    port = free_port()
    master = cluster.start_master(role="async", metrics_listen=f"{LOOPBACK}:{port}")
    trio.run(functools.partial(send_many, master.address, 1300, 32, size=4000))  # 5 MiB of log to READ
    with contextlib.closing(read_flooder(master.address)):
        shown = wait_until(lambda: (g := gauges(port))["hasvc_client_connections_muted"] == 1 and g, message="the flooder muted")
        assert shown["hasvc_client_bytes_queued"] > 8 * 1024 * 1024  # muted: above half of client_answer_bytes_max
    # Unmuted is not gone: the kernel may take enough of the queue to unmute the connection (at
    # half of client_answer_bytes_max) before the master notices the close, so both must settle.
    settled = wait_until(lambda: (g := gauges(port))["hasvc_client_connections_muted"] == 0 and g["hasvc_client_bytes_queued"] == 0 and g,
                         message="the flooder gone: nothing muted, nothing queued")
    assert settled["hasvc_client_connections_muted"] == 0


def test_a_consumer_that_never_reads_its_messages_shows_on_the_proxys_metrics_until_it_cancels(tmp_path) -> None:
    pb = pytest.importorskip("hasvc.proxy.pb")
    import grpc

    cluster = Cluster(tmp_path, segment_size=32 * 1024 * 1024)
    try:
        master = cluster.start_master(role="async")
        port = free_port()
        command = [sys.executable, "-m", "hasvc.cli", "proxy", "--listen", f"{LOOPBACK}:0", "--brokers", master.address,
                   "--invisible-min-seconds", "1", "--metrics-listen", f"{LOOPBACK}:{port}"]  # fmt: skip
        proxy = BrokerProcess("proxy", command, os.path.join(cluster.root, "proxy.log"))
        cluster.brokers.append(proxy)
        metadata = (("x-mq-client-id", f"gauges@{os.getpid()}"),)
        with grpc.insecure_channel(proxy.address) as channel:
            messaging = pb.service_grpc.MessagingServiceStub(channel)
            for number in range(PROXY_MESSAGES):
                message = pb.definition.Message(body=bytes(PROXY_BODY_SIZE))
                message.topic.name = "Unread"
                message.system_properties.message_id = f"01{os.getpid():016X}00000000{number:08X}"
                message.system_properties.message_type = pb.definition.NORMAL
                sent = messaging.SendMessage(pb.service.SendMessageRequest(messages=[message]), metadata=metadata, timeout=30)
                assert sent.status.code == pb.Code.OK, sent.status
            request = pb.service.ReceiveMessageRequest(group=pb.definition.Resource(name="Unread"), batch_size=32)
            request.message_queue.topic.name = "Unread"
            request.invisible_duration.seconds = 60
            call = messaging.ReceiveMessage(request, timeout=60, metadata=metadata)
            assert next(call).status.code == pb.Code.OK  # then nothing more is read
            shown = wait_until(lambda: (g := gauges(port))["hasvc_proxy_streams_muted"] == 1 and g, message="the stream muted")
            assert shown["hasvc_proxy_bytes_queued"] >= PROXY_BODY_SIZE
            call.cancel()
            settled = wait_until(lambda: (g := gauges(port))["hasvc_proxy_streams_muted"] == 0 and g, message="the stream gone")
            assert settled["hasvc_proxy_bytes_queued"] == 0
    finally:
        cluster.close()


def test_stalled_connections_on_the_metrics_port_show_on_it_until_they_close(cluster) -> None:
    from hasvc.metrics_http import METRICS_CONNECTIONS_MAX

    port = free_port()
    cluster.start_master(role="async", metrics_listen=f"{LOOPBACK}:{port}")
    sockets = []
    try:
        for _ in range(METRICS_CONNECTIONS_MAX - 2):  # a request begun and never finished
            sock = socket.create_connection((LOOPBACK, port), timeout=10)
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            sockets.append(sock)
        wait_until(lambda: gauges(port)["hasvc_metrics_connections"] == METRICS_CONNECTIONS_MAX - 1, message="counted")  # and the scrape's
        for _ in range(4):
            sock = socket.create_connection((LOOPBACK, port), timeout=10)
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            sockets.append(sock)
        shown = wait_until(lambda: (g := gauges(port))["hasvc_metrics_connections_evicted_total"] > 0 and g, message="evicted")
        assert shown["hasvc_metrics_connections"] <= METRICS_CONNECTIONS_MAX
    finally:
        for sock in sockets:
            sock.close()
    wait_until(lambda: gauges(port)["hasvc_metrics_connections"] == 1, message="only the scrape's left")
