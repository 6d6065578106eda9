"""System tests through a lossy TCP proxy, and over TLS."""

import random
import shutil
import socket
import threading
import time

import pytest
import trio

from commitlog.inspect import verify
from hasvc import client as hc
from tests.cluster import SEGMENT, Cluster, caught_up, log_digest, self_signed_certificate, send_many, status, wait_until


class LossyProxy:
    """Forwards TCP connections to ``target``, delaying chunks and, while ``lossy``, cutting
    connections at random points (possibly in the middle of a frame). Bounded: at most
    ``cuts_max`` cuts, then it only forwards."""

    def __init__(self, target: str, *, seed: int, cut_probability: float = 0.05, delay_max: float = 0.01, cuts_max: int = 25):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.random = random.Random(seed)
        self.cut_probability = cut_probability
        self.delay_max = delay_max
        self.cuts_max = cuts_max
        self.cuts = 0
        self.lossy = True
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._closing = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                downstream, _ = self.listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                continue
            with self._lock:
                self._sockets += [downstream, upstream]
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                with self._lock:
                    cut = self.lossy and self.cuts < self.cuts_max and self.random.random() < self.cut_probability
                    delay = self.random.random() * self.delay_max
                    prefix = self.random.randrange(len(data) + 1)
                    if cut:
                        self.cuts += 1
                if delay:
                    time.sleep(delay)
                if cut:
                    sink.sendall(data[:prefix])
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self) -> None:
        self._closing = True
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass


@pytest.mark.parametrize("seed", [1, 2])
def test_replication_through_a_lossy_proxy_converges_without_corruption(tmp_path, seed):
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    proxy = None
    try:
        master = cluster.start_master(role="async", ha_transfer_batch_size=64 * 1024)
        proxy = LossyProxy(master.ha_address, seed=seed)
        slave = cluster.start_slave(proxy.address, ha_reconnect_backoff_min_ms=50, ha_reconnect_backoff_max_ms=200,
                                    ha_send_heartbeat_interval_ms=200)  # fmt: skip
        for _ in range(5):
            results = trio.run(send_many, master.address, 1500, 16)
            assert {r.status for r in results.values()} == {"PUT_OK"}
        wait_until(lambda: proxy.cuts >= 5, message="the proxy cut connections", timeout=60)
        proxy.lossy = False
        wait_until(lambda: caught_up(master, slave), message="slave converged", timeout=90)
        end = status(master)["max_offset"]
        assert log_digest(cluster.store("master"), 0, end) == log_digest(cluster.store("slave"), 0, end)
        assert slave.stop() == 0
        report = verify(cluster.store("slave"))
        assert report.corrupt_offset is None and report.max_offset == end
        assert slave.log().count("replication connected") >= 2
    finally:
        if proxy:
            proxy.close()
        cluster.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_tls_on_both_ports(tmp_path):
    key, cert = self_signed_certificate(tmp_path)
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    try:
        master, slave = cluster.start_guarded_pair(["--tls-cert", cert, "--tls-key", key, "--tls-ca", cert])

        def acked_by_slave():
            with hc.BlockingClient(master.address, tls_ca=cert) as client:
                return client.status()["slaves"]

        wait_until(acked_by_slave, message="slave connected over TLS")
        with hc.BlockingClient(master.address, tls_ca=cert) as client:
            result = client.send("T", b"over tls")
        assert result.status == "PUT_OK"
        with hc.BlockingClient(slave.address, tls_ca=cert) as client:
            assert bytes(client.read_record(result.offset).body) == b"over tls"
        with pytest.raises(hc.ClientError):
            hc.BlockingClient(master.address)  # plain TCP against a TLS port
    finally:
        cluster.close()
