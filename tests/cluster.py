"""A small harness for system tests: real `hasvc master` / `hasvc slave` processes on loopback,
and what the tests ask of them (status, sends, catch-up, log digests).

Ports are chosen by the OS (port 0) and read from each broker's READY line; every process is
stopped by its PID (SIGTERM, then SIGKILL) when the cluster closes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest
import trio

from hasvc import client as hc
from hasvc.testing.launch import ReadyProcess
from hasvc.tools import drill


class BrokerProcess(ReadyProcess):
    """A broker (or proxy) started from a full command line; READY read, stopped by PID."""

    def __init__(self, name: str, command: list[str], log_path: str, env: dict | None = None):
        super().__init__(name, command, log_path, env=env)


class Cluster:
    def __init__(self, root, *, segment_size: int = 1024 * 1024, secret: bytes | None = None):
        self.root = str(root)
        self.segment_size = segment_size
        self.secret_file = None
        if secret is not None:
            self.secret_file = os.path.join(self.root, "secret")
            with open(self.secret_file, "wb") as file:
                file.write(secret)
        self.brokers: list[BrokerProcess] = []

    def store(self, name: str) -> str:
        return os.path.join(self.root, name)

    def _start(self, kind: str, name: str, args: list[str], settings: dict, env: dict | None = None) -> BrokerProcess:
        command = [sys.executable, "-m", "hasvc.cli", kind, "--store", self.store(name), "--listen", "127.0.0.1:0",
                   "--ha-listen", "127.0.0.1:0", "--set", f"commitlog_segment_size={self.segment_size}", *args]  # fmt: skip
        if self.secret_file:
            command += ["--secret-file", self.secret_file]
        # Tests must not depend on how full the machine's disk is: a CI disk above 75 % would make
        # retention delete segments regardless of age, and above 85 % refuse every write.
        settings = {"disk_max_used_space_ratio": 1.0, "disk_clean_ratio": 1.0, **settings}
        for key, value in settings.items():
            command += ["--set", f"{key}={value}"]
        broker = BrokerProcess(name, command, os.path.join(self.root, f"{name}.log"), env={**os.environ, **env} if env else None)
        self.brokers.append(broker)
        return broker

    def start_master(self, name: str = "master", *, role: str = "sync", flush: str = "async", **settings) -> BrokerProcess:
        return self._start("master", name, ["--role", role, "--flush", flush], settings)

    def start_slave(self, master_ha: str, name: str = "slave", env: dict | None = None, **settings) -> BrokerProcess:
        """``env``: variables added to this process's environment (``HASVC_NO_SPLICE=1``...)."""
        return self._start("slave", name, ["--master-ha", master_ha], settings, env)

    def start_guarded_pair(self, guard: list[str]) -> tuple[BrokerProcess, BrokerProcess]:
        """A SYNC_MASTER and its slave with ``guard`` (TLS and secret options) on both; started
        with the command line itself, since the settings form knows no such options."""
        base = ["--listen", "127.0.0.1:0", "--ha-listen", "127.0.0.1:0", "--set", f"commitlog_segment_size={self.segment_size}", *guard]
        master = BrokerProcess("m", [sys.executable, "-m", "hasvc.cli", "master", "--store", self.store("m"), "--role", "sync", *base],
                               os.path.join(self.root, "m.log"))  # fmt: skip
        self.brokers.append(master)
        slave = BrokerProcess("s", [sys.executable, "-m", "hasvc.cli", "slave", "--store", self.store("s"),
                                    "--master-ha", master.ha_address, *base], os.path.join(self.root, "s.log"))  # fmt: skip
        self.brokers.append(slave)
        return master, slave

    def close(self) -> None:
        for broker in self.brokers:
            if broker.alive:
                broker.stop()


def start_dledger_group(root, size: int, *, group: str, segment_size: int = 1024 * 1024, extra_args=(),
                        member_args=None) -> dict:  # fmt: skip
    """``size`` ``hasvc node`` members (n0, n1, ...) of ``group`` under ``root``, with the drill's
    etcd-like timing and ``extra_args``; member -> ``hasvc.tools.drill_dledger.Node``, each started
    (READY comes once its ports listen, before any election). ``member_args(member)``: more
    arguments for that member."""
    from hasvc.tools.drill_dledger import ETCD_LIKE_SETTINGS, Node
    from hasvc.tools.partition import LOOPBACK, free_port

    members = [f"n{i}" for i in range(size)]
    peers = ";".join(f"{member}-{LOOPBACK}:{free_port()}" for member in members)
    nodes = {}
    for member in members:
        args = ["--store", os.path.join(root, member), "--listen", f"{LOOPBACK}:{free_port()}", "--group", group,
                "--peers", peers, "--self", member, "--set", f"commitlog_segment_size={segment_size}",
                "--set", "disk_max_used_space_ratio=1.0", *extra_args]  # a leader refuses writes above it: not the CI disk's fill  # fmt: skip
        for setting in ETCD_LIKE_SETTINGS:
            args += ["--set", setting]
        if member_args is not None:
            args += member_args(member)
        nodes[member] = Node(str(root), member, args)
    for node in nodes.values():
        node.start()
    return nodes


def self_signed_certificate(directory) -> tuple[str, str]:
    """(key, cert): a self-signed certificate for 127.0.0.1, made with the openssl command."""
    key, cert = os.path.join(directory, "key.pem"), os.path.join(directory, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)  # fmt: skip
    return key, cert


def certificate_authority(directory, names) -> tuple[str, dict[str, tuple[str, str]]]:
    """(the CA's certificate, name -> (key, cert)): a CA made with the openssl command and, for
    each name, a certificate for 127.0.0.1 that it signed (mutual TLS between members)."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ca_key, ca_cert = os.path.join(directory, "ca-key.pem"), os.path.join(directory, "ca.pem")
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca_cert, "-days", "1", "-subj", "/CN=hasvc test CA")
    extensions = os.path.join(directory, "san.ext")
    with open(extensions, "w") as file:
        file.write("subjectAltName=IP:127.0.0.1\n")
    issued = {}
    for name in names:
        key, request, cert = (os.path.join(directory, f"{name}-{part}.pem") for part in ("key", "req", "cert"))
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", request, "-subj", f"/CN={name}")
        run("x509", "-req", "-in", request, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "1",
            "-extfile", extensions)  # fmt: skip
        issued[name] = (key, cert)
    return ca_cert, issued


@contextlib.contextmanager
def small_tmpfs(directory, size: str):
    """A tmpfs of ``size`` at ``directory``, unmounted afterwards; the test is skipped where this
    cannot be done (not root, no mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    os.makedirs(directory, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield str(directory)
    finally:
        subprocess.run(["umount", str(directory)], check=False)


def wait_until(predicate, *, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value (system tests wait for processes this way)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message}")
        time.sleep(interval)


# -- what the system tests ask of a running cluster -----------------------------------------------

SEGMENT = 1024 * 1024


def status(broker, secret=None) -> dict:
    with hc.BlockingClient(broker.address, secret) as client:
        return client.status()


def slave_acking(master) -> bool:
    """The master lists the slave and has its first report: a SYNC_MASTER put can wait for it
    (until then it is SLAVE_NOT_AVAILABLE)."""
    slaves = status(master)["slaves"]
    return bool(slaves) and slaves[0]["ack_offset"] >= 0


def log_digest(store: str, start: int, end: int) -> str:
    return drill.log_digest(store, end, SEGMENT, start=start)


def consume_queue_files(store: str) -> dict:
    return drill.queue_file_digests(store)


async def send_many(address: str, count: int, concurrency: int = 64, *, topic: str = "Sys", size: int = 300, secret=None):
    statuses = {}
    async with hc.connect(address, secret) as client:
        async def worker(start: int):
            for i in range(start, count, concurrency):
                result = await client.send(topic, f"m{i}:".encode() + b"x" * size, tags=f"t{i % 3}", queue_id=i % 4)
                statuses[i] = result

        async with trio.open_nursery() as nursery:
            for start in range(concurrency):
                nursery.start_soon(worker, start)
    return statuses


def caught_up(master, slave) -> bool:
    m, s = status(master), status(slave)
    return m["max_offset"] == s["max_offset"] and s["dispatched_offset"] == s["max_offset"]
