"""hasvc side by side with Redis and PostgreSQL replication, on loopback, in one run.

    scripts/bench_peers [--duration S] [--runs N] [--out docs/performance.md] [--chart docs/benchmarks.png]

(``scripts/bench_peers`` installs what is missing, builds the Redis load generator and runs this.)

Every point writes 1 KiB payloads at 1, 16 and 64 concurrent writers for ``duration`` seconds,
``runs`` times; tables show medians with min–max. Equal promises are compared:

- Redis ``SET`` + ``WAIT 1 1000``: in the replica's memory, synced nowhere
  = hasvc SYNC_MASTER with ASYNC_FLUSH. Also 32 ``SET``s + one ``WAIT`` per round trip
  = hasvc 32-message batches.
- PostgreSQL ``synchronous_commit=remote_write``: fsynced on the primary, in the standby's OS cache
  = hasvc SYNC_MASTER + SYNC_FLUSH.
- PostgreSQL ``synchronous_commit=on``: fsynced on both = hasvc SYNC_MASTER + SYNC_FLUSH + the
  slave flushing before it acknowledges.
- hasvc ASYNC_MASTER for reference (a write returns before any slave has it).

The runs of points compared with each other alternate (peer, hasvc, hasvc, peer, ...; at one
writer the trio relay floor too, and hasvc and the relay floor again with their processes
polling 200 us before they sleep (``busy_poll_us``, off in every other point); at 16 and 64
writers hasvc with a connection per writer too),
so that each ratio compares the same minutes of a machine others share. Every load generator's
CPU is reported beside its figure, and a WARNING names any at or above 70 % of one core.

Ceilings measured in the same run: loopback TCP (1 MiB ``send``, ``os.sendfile``) and a minimal
trio request/reply (16-byte request, 16-byte reply) at 1 and 64 connections, and the trio relay
floor: one writer's 1 KiB request through a trio "master" and a trio "slave" that do nothing but
forward and answer (the hops of a SYNC_MASTER put, without its work). The CPU of every
process involved is read from /proc. Every process started is stopped by its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hasvc import busy_poll  # noqa: E402
from hasvc.tools.bench.catch_up import loopback_ceiling  # noqa: E402
from hasvc.tools.bench.sync_write import LocalGroup, LocalPair, build_c_load, percentiles, process_cpu_seconds, run_once  # noqa: E402

SIZE = 1024
CONCURRENCY = (1, 16, 64)
BATCH = 32
PG_STANDBY = "standby"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(runs: list[dict]) -> dict:
    result = {}
    for key in ("acked_per_second", "p50_us", "p99_us"):
        values = [r[key] for r in runs]
        result[key] = statistics.median(values)
        result[key + "_min"] = min(values)
        result[key + "_max"] = max(values)
    result["cpu_percent"] = {name: statistics.median(r["cpu_percent"][name] for r in runs) for name in runs[0]["cpu_percent"]}
    result["runs"] = runs
    return result


def stop_process(process: subprocess.Popen) -> None:
    """A peer's process (started here with Popen): SIGTERM by PID, SIGKILL after 30 s. (The
    launcher's ``ReadyProcess.stop`` is for hasvc processes; these are plain Popen objects.)"""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

# -- Redis -------------------------------------------------------------------------------------


class RedisPair:
    def __init__(self, root: str):
        self.root = root
        self.port, self.replica_port = free_port(), free_port()
        common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no"]
        self.master = self._start(["--port", str(self.port), *common], "redis-master")
        self.replica = self._start(["--port", str(self.replica_port), *common, "--replicaof", "127.0.0.1", str(self.port)], "redis-replica")
        deadline = time.monotonic() + 30
        while "master_link_status:up" not in self.cli(self.replica_port, "INFO", "replication"):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis replica did not connect")
            time.sleep(0.1)

    def _start(self, args: list[str], name: str) -> subprocess.Popen:
        with open(os.path.join(self.root, name + ".log"), "wb") as log:
            process = subprocess.Popen(["redis-server", *args, "--dir", self.root], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        port = args[1]
        while True:
            try:
                if "PONG" in subprocess.run(["redis-cli", "-p", port, "PING"], capture_output=True, text=True).stdout:
                    return process
            except OSError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{name} did not start (see {self.root}/{name}.log)")
            time.sleep(0.1)

    def cli(self, port: int, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True).stdout

    def run(self, load: str, connections: int, batch: int, duration: float, threads: int = 1) -> dict:
        pids = {"redis master": self.master.pid, "redis replica": self.replica.pid}
        before = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
        started = time.perf_counter()
        child_before = os.times()
        done = subprocess.run([load, "127.0.0.1", str(self.port), str(connections), str(batch), str(duration), str(SIZE), str(threads)],
                              capture_output=True, text=True, timeout=duration + 60)  # fmt: skip
        seconds = time.perf_counter() - started
        child_after = os.times()
        if done.returncode != 0:
            raise RuntimeError(f"redis_load failed: {done.stderr.strip()}")
        data = json.loads(done.stdout)
        cpu = {name: 100 * (process_cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}
        load_cpu = (child_after.children_user + child_after.children_system) - (child_before.children_user + child_before.children_system)
        cpu["load generator"] = 100 * load_cpu / seconds
        return {"acked_per_second": data["acked"] / data["seconds"], "p50_us": data["p50_us"], "p99_us": data["p99_us"],
                "not_replicated": data["not_replicated"], "cpu_percent": cpu}  # fmt: skip

    def close(self) -> None:
        for process in (self.replica, self.master):
            stop_process(process)


# -- etcd --------------------------------------------------------------------------------------


ETCD_MEMBERS = 3
ETCD_CONNECTIONS_MAX = 8  # etcd's benchmark: --conns (shared round-robin by --clients goroutines)


class EtcdGroup:
    """Three etcd members on loopback, data on disk (a put is acknowledged once a quorum has it in
    its fsynced WAL, etcd's promise), etcd's default timing (heartbeat 100 ms, election 1 000 ms)."""

    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.client_ports = [free_port() for _ in range(ETCD_MEMBERS)]
        peer_ports = [free_port() for _ in range(ETCD_MEMBERS)]
        cluster = ",".join(f"e{i}=http://127.0.0.1:{port}" for i, port in enumerate(peer_ports))
        self.members = []
        for i in range(ETCD_MEMBERS):
            client, peer = f"http://127.0.0.1:{self.client_ports[i]}", f"http://127.0.0.1:{peer_ports[i]}"
            args = ["etcd", "--name", f"e{i}", "--data-dir", os.path.join(root, f"etcd{i}"), "--listen-client-urls", client,
                    "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", cluster, "--initial-cluster-state", "new", "--logger", "zap",
                    "--log-outputs", "stderr"]  # fmt: skip
            with open(os.path.join(root, f"etcd{i}.log"), "wb") as log:
                self.members.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
        self.endpoints = ",".join(f"127.0.0.1:{port}" for port in self.client_ports)
        deadline = time.monotonic() + 30
        while subprocess.run(["etcdctl", "--endpoints", self.endpoints, "endpoint", "health"], capture_output=True,
                             env={**os.environ, "ETCDCTL_API": "3"}).returncode != 0:  # fmt: skip
            if time.monotonic() > deadline or any(m.poll() is not None for m in self.members):
                raise RuntimeError(f"etcd did not start (see {root}/etcd*.log)")
            time.sleep(0.2)

    def version(self) -> str:
        return subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout.split()[2]

    def run(self, load: str, clients: int, duration: float) -> dict:
        pids = {f"etcd {i}": member.pid for i, member in enumerate(self.members)}
        before = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
        started = time.perf_counter()
        child_before = os.times()
        conns = min(clients, ETCD_CONNECTIONS_MAX)
        done = subprocess.run([load, self.endpoints, str(conns), str(clients), str(duration), str(SIZE)],
                              capture_output=True, text=True, timeout=duration + 60)  # fmt: skip
        seconds = time.perf_counter() - started
        child_after = os.times()
        if done.returncode != 0:
            raise RuntimeError(f"etcd_load failed: {done.stderr.strip()}")
        data = json.loads(done.stdout)
        cpu = {name: 100 * (process_cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}
        load_cpu = (child_after.children_user + child_after.children_system) - (child_before.children_user + child_before.children_system)
        cpu["load generator"] = 100 * load_cpu / seconds
        return {"acked_per_second": data["acked"] / data["seconds"], "p50_us": data["p50_us"], "p99_us": data["p99_us"],
                "failed": data["failed"], "cpu_percent": cpu}  # fmt: skip

    def close(self) -> None:
        for member in self.members:
            stop_process(member)


# -- PostgreSQL --------------------------------------------------------------------------------


def pg_bin() -> str:
    for candidate in sorted(
        [os.path.join("/usr/lib/postgresql", v, "bin") for v in os.listdir("/usr/lib/postgresql")] if os.path.isdir("/usr/lib/postgresql") else [],
        reverse=True,
    ) + ["/usr/local/bin", "/usr/local/pgsql/bin"]:  # fmt: skip
        if os.path.exists(os.path.join(candidate, "initdb")):
            return candidate
    raise RuntimeError("PostgreSQL's initdb was not found under /usr/lib/postgresql/*/bin or /usr/local/bin")


class PostgresPair:
    """A primary and a synchronous standby (streaming replication), run as the postgres user when
    we are root (PostgreSQL refuses to run as root)."""

    def __init__(self, root: str):
        self.bin = pg_bin()
        self.root = os.path.join(root, "pg")
        os.makedirs(self.root)
        os.chmod(root, 0o755)
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.root, "postgres", "postgres")
        self.port, self.standby_port = free_port(), free_port()
        self.primary_dir, self.standby_dir = os.path.join(self.root, "primary"), os.path.join(self.root, "standby")
        self._run("initdb", "-D", self.primary_dir, "-U", "postgres", "--auth", "trust")
        with open(os.path.join(self.primary_dir, "postgresql.conf"), "a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                f"wal_level = replica\nmax_wal_senders = 4\nsynchronous_standby_names = '{PG_STANDBY}'\n"
                "shared_buffers = 256MB\nmax_connections = 200\nfsync = on\n"
            )
        with open(os.path.join(self.primary_dir, "pg_hba.conf"), "a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 trust\n")
        self._run("pg_ctl", "-D", self.primary_dir, "-l", os.path.join(self.root, "primary.log"), "-w", "start")
        self.started = [self.primary_dir]
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-D", self.standby_dir, "-X", "stream", "-R")
        with open(os.path.join(self.standby_dir, "postgresql.auto.conf"), "a") as conf:
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={self.port} user=postgres application_name={PG_STANDBY}'\n")
        with open(os.path.join(self.standby_dir, "postgresql.conf"), "a") as conf:
            conf.write(f"port = {self.standby_port}\n")
        self._run("pg_ctl", "-D", self.standby_dir, "-l", os.path.join(self.root, "standby.log"), "-w", "start")
        self.started.append(self.standby_dir)
        deadline = time.monotonic() + 30
        while self.sql("SELECT sync_state FROM pg_stat_replication").strip() != "sync":
            if time.monotonic() > deadline:
                raise RuntimeError("the PostgreSQL standby did not become synchronous")
            time.sleep(0.2)
        self.sql("CREATE TABLE messages (body text NOT NULL)")
        self.script = os.path.join(self.root, "insert.sql")
        with open(self.script, "w") as file:
            file.write(f"INSERT INTO messages (body) VALUES ('{'m' * SIZE}');\n")
        if self.as_user:
            shutil.chown(self.script, "postgres", "postgres")

    def _run(self, tool: str, *args: str) -> str:
        done = subprocess.run([*self.as_user, os.path.join(self.bin, tool), *args], capture_output=True, text=True, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def sql(self, query: str) -> str:
        return self._run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-At", "-c", query)

    def pids(self) -> dict[str, int]:
        def postmaster(directory: str) -> int:
            with open(os.path.join(directory, "postmaster.pid")) as file:
                return int(file.readline())

        return {"pg primary": postmaster(self.primary_dir), "pg standby": postmaster(self.standby_dir)}

    def _tree_cpu(self, pid: int) -> float:
        """CPU seconds of a postmaster and its backends (children, alive now)."""
        total = process_cpu_seconds(pid)
        for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split():
            try:
                total += process_cpu_seconds(int(child))
            except (FileNotFoundError, ProcessLookupError):
                pass
        return total

    def run(self, commit: str, clients: int, duration: float, *, jobs: int, protocol: str) -> dict:
        logs = os.path.join(self.root, f"log-{commit}-{clients}-{time.monotonic_ns()}")
        os.makedirs(logs)
        if self.as_user:
            shutil.chown(logs, "postgres", "postgres")
        pids = self.pids()
        env = {**os.environ, "PGOPTIONS": f"-c synchronous_commit={commit}"}
        command = [*self.as_user, "env", f"PGOPTIONS={env['PGOPTIONS']}", os.path.join(self.bin, "pgbench"), "-n",
                   "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-c", str(clients), "-j", str(min(clients, jobs)),
                   "-M", protocol, "-T", str(int(round(duration))), "-f", self.script, "-l", "--log-prefix", os.path.join(logs, "tx"), "postgres"]  # fmt: skip
        # backends are forked per connection: sample the postmaster trees just after pgbench connects
        before_generator = os.times()
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=logs)
        time.sleep(min(0.5, duration / 4))
        before = {name: self._tree_cpu(pid) for name, pid in pids.items()}
        sampled = time.perf_counter()
        time.sleep(max(0.0, duration - 1.0))
        after = {name: self._tree_cpu(pid) for name, pid in pids.items()}
        window = time.perf_counter() - sampled
        stdout, stderr = process.communicate(timeout=duration + 120)
        seconds = time.perf_counter() - started
        after_generator = os.times()
        if process.returncode != 0:
            raise RuntimeError(f"pgbench failed: {stderr.strip()}")
        latencies = []
        for name in os.listdir(logs):
            with open(os.path.join(logs, name)) as file:
                latencies += [int(line.split()[2]) for line in file if line.strip()]
        shutil.rmtree(logs, ignore_errors=True)
        latencies.sort()
        tps = next(float(line.split("=")[1].split()[0]) for line in stdout.splitlines() if line.startswith("tps ="))
        cpu = {name: 100 * (after[name] - before[name]) / window for name in pids}
        generator = (after_generator.children_user + after_generator.children_system) - (before_generator.children_user + before_generator.children_system)
        cpu["load generator"] = 100 * generator / seconds
        return {"acked_per_second": tps, "p50_us": latencies[len(latencies) // 2], "p99_us": latencies[int(0.99 * len(latencies))],
                "cpu_percent": cpu}  # fmt: skip

    def close(self) -> None:
        for directory in reversed(self.started):
            subprocess.run([*self.as_user, os.path.join(self.bin, "pg_ctl"), "-D", directory, "-m", "immediate", "stop"],
                           capture_output=True)  # fmt: skip


# -- hasvc -------------------------------------------------------------------------------------


# Given to every hasvc process (the classic pairs and the DLedger groups' members, whose entry
# files honour it since branch dl33). page_cache_keep_size: flushed log pages more than 256 MiB
# behind are dropped from the page cache; on this VM a write into a page the cache never held
# costs ~4x the CPU of one into a page it freed lately, and 64 x 32 writes fell from ~230k to
# ~130k acked/s within 30 s of a pair's life without it (StoreConfig.page_cache_keep_size).
HASVC_SETTINGS = {"page_cache_keep_size": str(256 * 1024 * 1024)}
# One more one-writer point: hasvc/busy_poll.py's polling (200 us: a lone put's answer comes back
# ~60-100 us after the master's send on this VM, past the kernel's suggested 50), beside the relay
# floor polling the same way.
POLLING_US = 200
POLLING_LABEL = f"hasvc SYNC_MASTER, ASYNC_FLUSH, busy_poll_us={POLLING_US}, 1 msg/request"
# Before its first measured point every system is warmed up by its heaviest shape (64 writers, 32
# writes a round trip where it has batches), so that the points measure each in its steady state
# rather than the first minutes of a fresh process: on this VM memory the guest has not touched
# lately costs ~4-10x to fill (docs/design/put-path.md, "The page cache"), and a fresh hasvc pair writes
# into such pages until its drop-behind (page_cache_keep_size) recycles them, Redis until its key
# space (redis_load cycles 10,000 keys a connection) is allocated, PostgreSQL and etcd as their
# files grow. hasvc pairs and groups write WARM_UP_BYTES (past the drop-behind); the peers run
# WARM_UP_SECONDS. Nothing of a warm-up is reported.
WARM_UP_BYTES = int(HASVC_SETTINGS["page_cache_keep_size"]) + 64 * 1024 * 1024
WARM_UP_SECONDS = 4.0
WARM_UP_RUNS_MAX = 20  # 1 s runs of a hasvc warm-up: a slow pair stops there, warm enough


def hasvc_warm_up(target, load_binary: str) -> None:
    """Write WARM_UP_BYTES into a classic pair or DLedger group (``target``: LocalPair/LocalGroup)."""
    target.wait_connected()
    written, started = 0, time.monotonic()
    for _ in range(WARM_UP_RUNS_MAX):
        result = run_once(target.master["listen"], target.pids, producers=64, connections=1, size=SIZE, batch=BATCH,
                          duration=1.0, load_binary=load_binary)  # fmt: skip
        written += result.acked * SIZE
        if written >= WARM_UP_BYTES:
            break
    print(f"warm-up: {written / 2**20:,.0f} MiB written in {time.monotonic() - started:.1f} s", flush=True)


def hasvc_run(pair: LocalPair, producers: int, batch: int, duration: float, load_binary: str, *, connections: int = 1) -> dict:
    pair.wait_connected()
    result = run_once(pair.master["listen"], pair.pids, producers=producers, connections=connections, size=SIZE, batch=batch,
                      duration=duration, load_binary=load_binary)  # fmt: skip
    summary = result.summary(SIZE, batch)
    return {"acked_per_second": summary["acked_per_second"], "p50_us": summary["p50_us"], "p99_us": summary["p99_us"],
            "statuses": summary["statuses"], "cpu_percent": summary["cpu_percent"]}  # fmt: skip


# -- trio request/reply ceiling ----------------------------------------------------------------


async def _echo_server() -> None:
    async def handle(stream):
        try:
            while True:
                data = await stream.receive_some(16)
                if not data:
                    return
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(listeners[0].socket.getsockname()[1], flush=True)
    await trio.serve_listeners(handle, listeners)


async def _echo_load(port: int, connections: int, duration: float) -> int:
    count = 0
    deadline = trio.current_time() + duration

    async def one():
        nonlocal count
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        request = b"x" * 16
        async with stream:
            while trio.current_time() < deadline:
                await stream.send_all(request)
                received = 0
                while received < 16:
                    received += len(await stream.receive_some(16 - received))
                count += 1

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(one)
    return count


def trio_ceiling(connections: int, duration: float) -> dict:
    server = subprocess.Popen([sys.executable, __file__, "--echo-server"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        before = process_cpu_seconds(server.pid)
        own = time.process_time()
        started = time.perf_counter()
        count = trio.run(_echo_load, port, connections, duration)
        seconds = time.perf_counter() - started
        return {"acked_per_second": count / seconds,
                "cpu_percent": {"server": 100 * (process_cpu_seconds(server.pid) - before) / seconds,
                                "load generator": 100 * (time.process_time() - own) / seconds}}  # fmt: skip
    finally:
        stop_process(server)


# -- trio relay floor --------------------------------------------------------------------------
# The hops of a SYNC_MASTER put with nothing done at any of them: a client sends a 1 KiB request
# to a trio "master", which forwards it behind a 12-byte header to a trio "slave", waits for its
# 8-byte reply, then answers the client with 16 bytes. Its p50 at one writer is the least a put
# through two trio processes can take on this machine; hasvc's p50 minus it is hasvc's own work.

RELAY_FRAME = 12 + SIZE
RELAY_ANSWER = 16


async def _receive_exactly(sock, count: int) -> bytes:
    """Read the descriptor directly, waiting in trio only when the kernel has nothing: one
    scheduler pass per hop, the least trio allows (hasvc's transport reads the same way)."""
    parts = []
    while count:
        try:
            data = os.read(sock.fileno(), count)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        if not data:
            raise EOFError("peer closed")
        parts.append(data)
        count -= len(data)
    return b"".join(parts)


async def _send_all(sock, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(sock.fileno(), view) :]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)


async def _accept_one():
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)
    connection, _ = await listener.accept()
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.close()
    return connection


async def _relay_slave(frame_size: int = RELAY_FRAME) -> None:
    connection = await _accept_one()
    try:
        while True:
            frame = await _receive_exactly(connection, frame_size)
            await _send_all(connection, frame[:8])
    except (EOFError, OSError):
        pass


async def _relay_master(slave_port: int, frame_size: int = RELAY_FRAME) -> None:
    slave = trio.socket.socket()
    await slave.connect(("127.0.0.1", slave_port))
    slave.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client = await _accept_one()
    answer = bytes(RELAY_ANSWER)
    try:
        while True:
            request = await _receive_exactly(client, frame_size)
            await _send_all(slave, request)
            await _receive_exactly(slave, 8)
            await _send_all(client, answer)
    except (EOFError, OSError):
        pass


def trio_relay_floor(duration: float, busy_poll_us: int = 0, size: int = SIZE) -> dict:
    """One writer (a blocking socket, as cheap a client as Python has) through the relay;
    ``busy_poll_us``: its two processes poll before they sleep, as hasvc's brokers can; ``size``:
    the request's bytes (32 KiB: the floor of a 32-message request; scripts/dev/relay_floor.py)."""
    polling = ["--busy-poll-us", str(busy_poll_us), "--relay-size", str(size)]
    slave = subprocess.Popen([sys.executable, __file__, "--relay-slave", *polling], stdout=subprocess.PIPE, text=True)
    master = None
    try:
        slave_port = int(slave.stdout.readline())
        master = subprocess.Popen([sys.executable, __file__, "--relay-master", str(slave_port), *polling], stdout=subprocess.PIPE, text=True)
        port = int(master.stdout.readline())
        before = {name: process_cpu_seconds(p.pid) for name, p in (("master", master), ("slave", slave))}
        own = time.process_time()
        latencies = []
        request = bytes(12 + size)
        with socket.create_connection(("127.0.0.1", port)) as connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            started = time.perf_counter()
            end = started + duration
            while (sent := time.perf_counter()) < end:
                connection.sendall(request)
                received = 0
                while received < RELAY_ANSWER:
                    data = connection.recv(RELAY_ANSWER - received)
                    if not data:
                        raise EOFError("relay master closed")
                    received += len(data)
                latencies.append((time.perf_counter() - sent) * 1e6)
            seconds = time.perf_counter() - started
        cpu = {f"relay {name}": 100 * (process_cpu_seconds(p.pid) - before[name]) / seconds
               for name, p in (("master", master), ("slave", slave))}  # fmt: skip
        cpu["load generator"] = 100 * (time.process_time() - own) / seconds
        return {"acked_per_second": len(latencies) / seconds, **percentiles(latencies), "cpu_percent": cpu}
    finally:
        for process in (master, slave):
            if process is not None:
                stop_process(process)


# -- the report --------------------------------------------------------------------------------

# A load generator at or above this share of one core may be what sets its point's pace rather
# than the system it drives: Redis' thread-per-connection generator ran at 80-86 % in runs up to
# 15 and held Redis 20-35 % below what it does (issue 18). Every point at or above it is named
# in the report. The trio ceilings are excluded: their Python client is part of what they measure.
LOAD_GENERATOR_CPU_MAX = 70.0


def fmt_rate(point: dict) -> str:
    return f"{point['acked_per_second']:,.0f} ({point['acked_per_second_min']:,.0f}–{point['acked_per_second_max']:,.0f})"


def fmt_latency(point: dict) -> str:
    return f"{point['p50_us'] / 1000:.2f} / {point['p99_us'] / 1000:.2f}"


def fmt_cpu(point: dict) -> str:
    return ", ".join(f"{name} {value:.0f}" for name, value in point["cpu_percent"].items())


def generator_cpu(point: dict) -> float | None:
    return point.get("cpu_percent", {}).get("load generator")


def overloaded_generators(results: dict) -> list[str]:
    """The points whose load generator used LOAD_GENERATOR_CPU_MAX or more of a core (median)."""
    return [f"{name} ({cpu:.0f} %)" for name, point in results.items()
            if not name.startswith("trio") and (cpu := generator_cpu(point)) is not None and cpu >= LOAD_GENERATOR_CPU_MAX]  # fmt: skip


DLEDGER_FSYNCED = "hasvc DLedger, 3 members, quorum fsynced"
DLEDGER_IN_MEMORY = "hasvc DLedger, 3 members, quorum in memory"
# The classic SYNC_MASTER pair measured again beside the in-memory DLedger group, their runs
# alternating as every other comparison's are: the classic points of the Redis comparison were
# measured minutes earlier, and this VM's speed drifts by a third within minutes (stop 34: the same
# build's classic 64-writer point 69-83k acked/s at 04:46 UTC, 58-62k at 04:55).
CLASSIC_BESIDE_DLEDGER = "hasvc SYNC_MASTER, ASYNC_FLUSH, beside DLedger"

COMPARISONS = [
    ("hasvc SYNC_MASTER, ASYNC_FLUSH, 1 msg/request", "redis SET+WAIT", "in the replica's memory, synced nowhere"),
    ("hasvc SYNC_MASTER, ASYNC_FLUSH, 32 msgs/request", "redis 32xSET+WAIT", "same, 32 writes per round trip"),
    ("hasvc SYNC_MASTER, SYNC_FLUSH", "postgres remote_write", "fsynced on the primary, in the standby's OS cache"),
    ("hasvc SYNC_MASTER, SYNC_FLUSH, slave flushes", "postgres on", "fsynced on both"),
    (DLEDGER_FSYNCED, "etcd put, 3 members, WAL fsynced", "fsynced by a quorum of 3 (Raft)"),
    (DLEDGER_IN_MEMORY, f"{CLASSIC_BESIDE_DLEDGER}, 1 msg/request", "in a quorum's / the slave's memory (DLedger ÷ classic, runs alternating)"),
    (f"{DLEDGER_IN_MEMORY}, {BATCH} msgs/request", f"{CLASSIC_BESIDE_DLEDGER}, {BATCH} msgs/request", "same, 32 messages a request"),
]


# The generated part of docs/performance.md lies between these two lines; the prose around them is
# written by hand and kept when the tables are generated again.
BEGIN_MARKER = "<!-- generated by scripts/bench_peers: begin -->"
END_MARKER = "<!-- generated by scripts/bench_peers: end -->"
NEW_REPORT_TITLE = "# hasvc beside Redis, PostgreSQL and etcd replication"  # a file without the markers yet


def report_header(settings: dict, versions: dict, status: str) -> list[str]:
    lines = []
    if status:
        lines += [f"**{status}**", ""]
    command = " ".join(filter(None, ("scripts/bench_peers", settings["args"])))
    lines += [f"Generated by `{command}` on {settings['date']} "
              f"({settings['machine']}); every point {settings['runs']} runs of {settings['duration']:.0f} s, "
              "medians with min–max; 1 KiB payloads; master/primary and slave/replica/standby on loopback, on the same "
              "2 cores as the load generators. CPU is percent of one core, medians. Load average (1 min) "
              f"{settings['load_before']} at the start" + (f", {settings['load_after']} at the end" if "load_after" in settings else "")
              + ": anything else running on the machine shares its cores, so compare ratios within a run.", "",
              "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".", ""]  # fmt: skip
    lines += ["The ratios below are what this run measured, hasvc ÷ peer on equal promises, each side driven by a C "
              "load generator whose CPU is shown beside it. hasvc's master is CPU-bound on per-request Python and trio "
              "work (see the CPU column), Redis and PostgreSQL are C.", ""]
    return lines


def report_tables(results: dict) -> list[str]:
    """One table per comparison (hasvc beside the peer that makes the same promise), then every point."""
    lines = []
    for ours, theirs, promise in COMPARISONS:
        rows = [(n, results[f"{ours} @{n}"], results[f"{theirs} @{n}"]) for n in CONCURRENCY
                if f"{ours} @{n}" in results and f"{theirs} @{n}" in results]  # fmt: skip
        if not rows:
            continue
        lines += [f"### {ours.removeprefix('hasvc ')} vs {theirs.removeprefix('hasvc ')}", "", f"Promise: {promise}.", "",
                  "| writers | hasvc acked/s | peer acked/s | hasvc ÷ peer | hasvc p50 / p99 ms | peer p50 / p99 ms | load generators' CPU % (hasvc / peer) |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for n, a, b in rows:
            ratio = a["acked_per_second"] / b["acked_per_second"] if b["acked_per_second"] else float("inf")
            lines.append(f"| {n} | {fmt_rate(a)} | {fmt_rate(b)} | {ratio:.2f}× | {fmt_latency(a)} | {fmt_latency(b)} | "
                         f"{generator_cpu(a):.0f} / {generator_cpu(b):.0f} |")  # fmt: skip
        lines.append("")
    if lines:
        lines.pop()
    overloaded = overloaded_generators(results)
    if overloaded:
        lines += ["", f"**WARNING: a load generator used {LOAD_GENERATOR_CPU_MAX:.0f} % of a core or more at these points, "
                  "which may then measure the load generator rather than the system: " + "; ".join(overloaded) + ".**"]  # fmt: skip
    else:
        lines += ["", f"Every load generator stayed below {LOAD_GENERATOR_CPU_MAX:.0f} % of one core at every point (medians; "
                  "the CPU column below)."]  # fmt: skip
    lines += ["", "### Every point", "", "| system | writers | acked/s | p50 / p99 ms | CPU % |", "|---|---:|---:|---:|---|"]
    systems = list(dict.fromkeys(name.rsplit(" @", 1)[0] for name in results if "@" in name and not name.startswith("trio")))
    for name, point in sorted(((name, point) for name, point in results.items() if "@" in name and not name.startswith("trio")),
                              key=lambda item: (systems.index(item[0].rsplit(" @", 1)[0]), int(item[0].rsplit(" @", 1)[1]))):  # fmt: skip
        system, n = name.rsplit(" @", 1)
        lines.append(f"| {system} | {n} | {fmt_rate(point)} | {fmt_latency(point) if 'p50_us' in point else '–'} | {fmt_cpu(point)} |")
    lines += ["", "### Ceilings of this machine (same run)", "", "| measure | result |", "|---|---:|"]
    for name in ("loopback send", "loopback sendfile"):
        if name in results:
            lines.append(f"| {name} (1 MiB writes, one stream) | {results[name]['bytes_per_s'] / 1e6:,.0f} MB/s |")
    for n in (1, 64):
        key = f"trio request/reply @{n}"
        if key in results:
            lines.append(f"| trio 16-byte request/reply, {n} connection(s) | {results[key]['acked_per_second']:,.0f} /s |")
    floor, redis_one = results.get("trio relay floor @1"), results.get("redis SET+WAIT @1")
    if floor is not None:
        versus = f"; {floor['p50_us'] / redis_one['p50_us']:.1f}× Redis SET+WAIT's p50 at one writer" if redis_one else ""
        lines.append(f"| trio relay floor, one writer (client → master → slave → master → client, 1 KiB, no work) | "
                     f"p50 {floor['p50_us'] / 1000:.2f} ms{versus} |")  # fmt: skip
    polling_floor, polling = results.get("trio relay floor, polling @1"), results.get(f"{POLLING_LABEL} @1")
    if polling_floor is not None:
        versus = f"; hasvc polling the same way: p50 {polling['p50_us'] / 1000:.2f} ms, {polling['p50_us'] / polling_floor['p50_us']:.2f}× it" if polling else ""
        lines.append(f"| the relay floor, its processes polling {POLLING_US} µs before they sleep (`busy_poll_us`) | "
                     f"p50 {polling_floor['p50_us'] / 1000:.2f} ms{versus} |")  # fmt: skip
    return lines


def report_settings(settings: dict) -> list[str]:
    return ["### Settings", "",
            "- Redis: `--save '' --appendonly no` (no disk at all, as `WAIT` promises nothing about disks); load from "
            f"`scripts/redis_load.c` ({settings['redis_threads']} thread(s), each one epoll loop over its share of the "
            "connections, plain sockets speaking RESP; each connection keeps one round trip in flight: `SET` ×1 or ×32 "
            "then `WAIT 1 1000`, pipelined; a write counts when `WAIT` reports a replica). `redis-benchmark` cannot "
            "express this: it repeats one command per client, `WAIT` is refused in scripts and answers at once inside "
            "`MULTI`.",
            "- PostgreSQL: `wal_level=replica`, `synchronous_standby_names='standby'`, `fsync=on`, "
            "`shared_buffers=256MB`; `synchronous_commit` set per session through `PGOPTIONS`; pgbench "
            f"`-c N -j min(N,{settings['pgbench_jobs']}) -M {settings['pgbench_protocol']}` (pgbench's threads each "
            "run an event loop over their clients) running one `INSERT` of a 1 KiB text row per transaction into an "
            "unindexed table; latencies from pgbench's per-transaction log.",
            "- hasvc: a master and a slave process (`hasvc master/slave`, defaults otherwise, but for "
            + ", ".join(f"`{name}={value}`" for name, value in HASVC_SETTINGS.items())
            + " on both: see docs/design/put-path.md, 'The page cache'); load from "
            "`scripts/hasvc_load.c` (C, one thread with an epoll loop over its connections as in `redis_load.c`, each writer one `SEND` of 1 or 32 messages in "
            "flight on 4 queues, a write counts when its response says `PUT_OK`). Every writer's requests share one "
            "connection (the client protocol multiplexes, as hasvc's Python client does), except in the rows marked "
            "\"a connection per writer\".",
            f"- Warm-up: before its first point, each system runs its heaviest shape unmeasured, so that every point "
            f"measures it in its steady state rather than a fresh process filling memory the VM has not touched lately: "
            f"Redis, PostgreSQL and etcd for {WARM_UP_SECONDS:.0f} s at 64 writers (Redis: 32 `SET`s a round trip, which "
            f"writes its whole cycling key space), each hasvc pair and DLedger group {WARM_UP_BYTES // 2**20} MiB at 64 "
            "writers × 32 messages (past its 256 MiB drop-behind). In-memory DLedger is compared with a classic pair "
            "of its own, their runs alternating.", ""]  # fmt: skip


def write_report(results: dict, path: str, chart: str | None, settings: dict, versions: dict, status: str = "") -> None:
    """The generated part of docs/performance.md, written between BEGIN_MARKER and END_MARKER (the
    rest of the file is kept); a file without them gets a title and the markers. Called after every
    point, so a run that stops half-way leaves what it measured (``status`` says so at the top)."""
    lines = report_header(settings, versions, status) + report_tables(results) + [""]
    if chart is not None:
        lines += [f"![throughput and p99 latency by concurrency]({os.path.relpath(chart, os.path.dirname(path) or '.')})", ""]
    lines += report_settings(settings)
    before, after = NEW_REPORT_TITLE + "\n\n", "\n"
    if os.path.exists(path):
        with open(path) as file:
            previous = file.read()
        if BEGIN_MARKER in previous and END_MARKER in previous.split(BEGIN_MARKER, 1)[1]:
            before, rest = previous.split(BEGIN_MARKER, 1)
            after = rest.split(END_MARKER, 1)[1]
    generated = BEGIN_MARKER + "\n\n" + "\n".join(lines).rstrip("\n") + "\n\n" + END_MARKER
    with open(path + ".tmp", "w") as file:
        file.write(before + generated + after)
    os.replace(path + ".tmp", path)


def write_json(results: dict, path: str, settings: dict, versions: dict, status: str = "") -> None:
    with open(path + ".tmp", "w") as file:
        json.dump({"settings": settings, "versions": versions, "status": status or "complete", "results": results}, file, indent=1)
    os.replace(path + ".tmp", path)


def draw_chart(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = sorted({name.rsplit(" @", 1)[0] for name in results if "@" in name and "trio" not in name and CLASSIC_BESIDE_DLEDGER not in name})
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for system in systems:
        points = [(n, results[f"{system} @{n}"]) for n in CONCURRENCY if f"{system} @{n}" in results]
        xs = [n for n, _ in points]
        left.plot(xs, [p["acked_per_second"] for _, p in points], marker="o", label=system)
        right.plot(xs, [p["p99_us"] / 1000 for _, p in points], marker="o", label=system)
    for axis, title in ((left, "acknowledged writes/s (1 KiB)"), (right, "p99 latency, ms")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xticks(list(CONCURRENCY), [str(n) for n in CONCURRENCY])
        axis.set_xlabel("concurrent writers")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


# -- main --------------------------------------------------------------------------------------


def preflight(skip: set[str], redis_load: str | None, etcd_load: str | None = None) -> list[str]:
    """What the run will need, checked before the first measurement (a run takes ~10 minutes)."""
    problems = []
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        problems.append("matplotlib is missing (it draws docs/benchmarks.png): install the bench extra, "
                        "pip install -e '.[bench]' (scripts/bench_peers does so in .venv)")  # fmt: skip
    if "redis" not in skip:
        problems += [f"{tool} is not on the PATH (apt-get install redis-server, or --skip redis)"
                     for tool in ("redis-server", "redis-cli") if shutil.which(tool) is None]  # fmt: skip
        if redis_load is None and shutil.which("cc") is None:
            problems.append("a C compiler (cc) is needed to build scripts/redis_load.c (or --redis-load BINARY)")
    if "postgres" not in skip:
        try:
            pg_bin()
        except (RuntimeError, OSError) as error:
            problems.append(f"{error} (apt-get install postgresql, or --skip postgres)")
    if "etcd" not in skip:
        problems += [f"{tool} is not on the PATH (apt-get install etcd-server etcd-client, or --skip etcd)"
                     for tool in ("etcd", "etcdctl") if shutil.which(tool) is None]  # fmt: skip
        if etcd_load is None or not os.access(etcd_load, os.X_OK):
            problems.append("--etcd-load names no executable (scripts/bench_peers builds it from scripts/etcd_load.go; or --skip etcd)")
    if "hasvc" not in skip and shutil.which("cc") is None:
        problems.append("a C compiler (cc) is needed to build scripts/hasvc_load.c (or --skip hasvc)")
    return problems


def memory_gib() -> int:
    with open("/proc/meminfo") as file:
        return round(int(file.readline().split()[1]) / 2**20)  # MemTotal, kB


def load_average() -> str:
    with open("/proc/loadavg") as file:
        return file.read().split()[0]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per point")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "performance.md"),
                        help="the report: its generated part between the markers is rewritten, the rest kept")
    parser.add_argument("--chart", default=None, help="the chart (default: benchmarks.png beside --out)")
    parser.add_argument("--json", default=None, help="also write every result here (rewritten after every point)")
    parser.add_argument("--redis-load", default=None, help="the built redis_load binary")
    parser.add_argument("--redis-load-threads", type=int, default=1, help="threads of redis_load, each an epoll loop (1 or 2)")
    parser.add_argument("--pgbench-jobs", type=int, default=os.cpu_count() or 2, help="pgbench -j is min(clients, this)")
    parser.add_argument("--pgbench-protocol", default="prepared", choices=("simple", "extended", "prepared"), help="pgbench -M")
    parser.add_argument("--etcd-load", default=None, help="the built etcd_load binary (scripts/etcd_load.go)")
    parser.add_argument("--skip", default="", help="comma-separated: redis, postgres, hasvc, etcd, dledger, ceilings")
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--relay-slave", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--relay-master", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--busy-poll-us", type=int, default=0, help=argparse.SUPPRESS)  # the relay's processes
    parser.add_argument("--relay-size", type=int, default=SIZE, help=argparse.SUPPRESS)  # their request's bytes
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.echo_server:
        trio.run(_echo_server)
        return 0
    busy_poll.install(args.busy_poll_us)
    if args.relay_slave:
        trio.run(_relay_slave, 12 + args.relay_size)
        return 0
    if args.relay_master is not None:
        trio.run(_relay_master, args.relay_master, 12 + args.relay_size)
        return 0
    skip = set(filter(None, args.skip.split(",")))
    problems = preflight(skip, args.redis_load, args.etcd_load)
    if problems:
        print("bench_peers cannot run:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    root = tempfile.mkdtemp(prefix="hasvc-bench-peers-")
    results: dict[str, dict] = {}
    versions = {"python": platform.python_version(), "trio": trio.__version__}
    started = time.monotonic()
    chart = args.chart or os.path.join(os.path.dirname(args.out), "benchmarks.png")
    # paths of binaries the shell script built, and of the outputs: not settings (and no machine's paths in the docs)
    built = ("--redis-load", "--etcd-load", "--out", "--json", "--chart")
    shown = [arg for i, arg in enumerate(sys.argv[1:]) if arg not in built and (i == 0 or sys.argv[i] not in built)]
    settings = {"args": " ".join(shown), "date": time.strftime("%Y-%m-%d"), "runs": args.runs, "duration": args.duration,
                "machine": f"{os.cpu_count()} cores, {memory_gib()} GiB, {platform.platform()}", "load_before": load_average(),
                "redis_threads": args.redis_load_threads, "pgbench_jobs": args.pgbench_jobs,
                "pgbench_protocol": args.pgbench_protocol}  # fmt: skip

    def publish(status: str) -> None:
        write_report(results, args.out, None, settings, versions, status)
        if args.json:
            write_json(results, args.json, settings, versions, status)

    def points(measures: list[tuple[str, Callable[[], dict]]]) -> None:
        """The runs of points compared with each other, alternating (A B, B A, A B, ...): on a
        machine whose other load comes and goes, a ratio is only as good as the two sides'
        sharing the same minutes."""
        runs: dict[str, list[dict]] = {name: [] for name, _ in measures}
        for index in range(args.runs):
            for name, measure in measures if index % 2 == 0 else measures[::-1]:
                runs[name].append(measure())
        for name, _ in measures:
            results[name] = p = summarize(runs[name])
            print(f"{name:<52} {fmt_rate(p):>28} acked/s  p50/p99 {fmt_latency(p)} ms  cpu {fmt_cpu(p)}", flush=True)
            if overloaded_generators({name: p}):
                print(f"WARNING: {name}: the load generator used {generator_cpu(p):.0f} % of a core (>= {LOAD_GENERATOR_CPU_MAX:.0f} %)", flush=True)
        publish(f"Run in progress: {len(results)} points so far; the tables fill in as they are measured.")

    try:
        measure_all(args, skip, root, versions, results, points)
    except BaseException as error:
        publish(f"This run stopped early ({type(error).__name__}: {error}); the tables hold what it measured before that.")
        raise
    finally:
        shutil.rmtree(root, ignore_errors=True)
    settings["load_after"] = load_average()
    publish("")
    try:
        draw_chart(results, chart)
    except Exception as error:  # the report and the JSON are written already; say why the chart is not
        print(f"the chart was not drawn ({type(error).__name__}: {error}); {args.out} and the JSON are complete", file=sys.stderr)
        return 1
    write_report(results, args.out, chart, settings, versions)
    for name in overloaded_generators(results):
        print(f"WARNING: load generator at or above {LOAD_GENERATOR_CPU_MAX:.0f} % of a core: {name}")
    print(f"wrote {args.out} and {chart} in {time.monotonic() - started:.0f} s; load average {settings['load_before']} -> {settings['load_after']}")
    return 0


def measure_all(args: argparse.Namespace, skip: set[str], root: str, versions: dict, results: dict, points) -> None:
    """Every point: the machine's ceilings, then each peer beside the hasvc mode that makes its
    promise, their runs alternating (``points``), then hasvc's ASYNC_MASTER alone."""
    if "ceilings" not in skip:
        measure_ceilings(args, root, results)
    hasvc_load = None
    if "hasvc" not in skip:
        hasvc_load = build_c_load()
        if hasvc_load is None:
            raise RuntimeError("scripts/hasvc_load.c cannot be built: a C compiler (cc) is needed")

    def hasvc(pair: LocalPair, n: int, batch: int, connections: int = 1) -> Callable[[], dict]:
        return lambda: hasvc_run(pair, n, batch, args.duration, hasvc_load, connections=connections)

    with contextlib.ExitStack() as stack:
        redis = load = None
        if "redis" not in skip:
            versions["redis"] = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2].removeprefix("v=")
            load = args.redis_load or os.path.join(root, "redis_load")
            if args.redis_load is None:
                subprocess.run(["cc", "-O2", "-o", load, os.path.join(ROOT, "scripts", "redis_load.c"), "-lpthread"], check=True)
            redis = RedisPair(root)
            stack.callback(redis.close)
            redis.run(load, max(CONCURRENCY), BATCH, WARM_UP_SECONDS, args.redis_load_threads)  # every key written once
        pair = stack.enter_context(hasvc_pair(hasvc_load, role="sync", flush="async")) if hasvc_load else None
        label = "hasvc SYNC_MASTER, ASYNC_FLUSH"
        for batch, peer in ((1, "redis SET+WAIT"), (BATCH, "redis 32xSET+WAIT")):
            for n in CONCURRENCY:
                group = []
                if redis is not None:
                    group.append((f"{peer} @{n}", lambda n=n, batch=batch: redis.run(load, n, batch, args.duration, args.redis_load_threads)))
                if pair is not None:
                    group.append((f"{label}, {'1 msg' if batch == 1 else f'{batch} msgs'}/request @{n}", hasvc(pair, n, batch)))
                    if batch == 1 and n > 1:
                        # Redis' load opens a connection per writer; hasvc's multiplexes. This row
                        # shows what a connection per writer costs hasvc's master.
                        group.append((f"{label}, a connection per writer @{n}", hasvc(pair, n, 1, connections=n)))
                if batch == 1 and n == 1 and "ceilings" not in skip:
                    group.append(("trio relay floor @1", lambda: trio_relay_floor(args.duration)))
                if batch == 1 and n == 1 and pair is not None:
                    # The latency a broker can buy with a core to spare (busy_poll_us), beside the
                    # relay floor with the same polling: the like-for-like ratio.
                    group.append((f"{POLLING_LABEL} @1", lambda: hasvc_polling_run(args.duration, hasvc_load)))
                    if "ceilings" not in skip:
                        group.append(("trio relay floor, polling @1", lambda: trio_relay_floor(args.duration, POLLING_US)))
                if group:
                    points(group)
    with contextlib.ExitStack() as stack:
        postgres = None
        if "postgres" not in skip:
            postgres = PostgresPair(root)
            stack.callback(postgres.close)
            versions["postgresql"] = postgres.sql("SHOW server_version").strip()
            postgres.run("remote_write", max(CONCURRENCY), WARM_UP_SECONDS, jobs=args.pgbench_jobs, protocol=args.pgbench_protocol)
        for commit, label, flushes in (("remote_write", "hasvc SYNC_MASTER, SYNC_FLUSH", False),
                                       ("on", "hasvc SYNC_MASTER, SYNC_FLUSH, slave flushes", True)):  # fmt: skip
            with contextlib.ExitStack() as inner:
                pair = inner.enter_context(hasvc_pair(hasvc_load, role="sync", flush="sync", slave_flush_before_ack=flushes)) if hasvc_load else None
                for n in CONCURRENCY:
                    group = []
                    if postgres is not None:
                        group.append((f"postgres {commit} @{n}", lambda n=n, commit=commit: postgres.run(
                            commit, n, args.duration, jobs=args.pgbench_jobs, protocol=args.pgbench_protocol)))  # fmt: skip
                    if pair is not None:
                        group.append((f"{label} @{n}", hasvc(pair, n, 1)))
                    if group:
                        points(group)
    if hasvc_load:
        with hasvc_pair(hasvc_load, role="async", flush="async") as pair:
            for n in CONCURRENCY:
                points([(f"hasvc ASYNC_MASTER, ASYNC_FLUSH @{n}", hasvc(pair, n, 1))])
    measure_raft(args, skip, root, versions, points, hasvc_load)


def measure_raft(args: argparse.Namespace, skip: set[str], root: str, versions: dict, points, hasvc_load: str | None) -> None:
    """etcd, three members on loopback (its promise: a quorum's fsynced WAL), driven by its own
    client library the way etcd's benchmark tool does (scripts/etcd_load.go), beside a DLedger
    group of three ``hasvc node``s with etcd-like timing that makes the same promise (``--flush
    sync``: an entry counts toward the quorum once fsynced), their runs alternating; then the
    DLedger group with its default promise (a quorum has the entry in memory, as SYNC_MASTER with
    ASYNC_FLUSH), one message and 32 per request, beside a classic SYNC_MASTER pair of its own,
    their runs alternating (``CLASSIC_BESIDE_DLEDGER``)."""
    dledger = hasvc_load is not None and "dledger" not in skip
    with contextlib.ExitStack() as stack:
        etcd = fsynced = None
        if "etcd" not in skip:
            etcd = EtcdGroup(os.path.join(root, "etcd"))
            stack.callback(etcd.close)
            versions["etcd"] = etcd.version()
            etcd.run(args.etcd_load, max(CONCURRENCY), WARM_UP_SECONDS)
        if dledger:
            fsynced = LocalGroup(nodes=3, flush="sync", settings=HASVC_SETTINGS)
            stack.callback(fsynced.close)
            hasvc_warm_up(fsynced, hasvc_load)
        for n in CONCURRENCY:
            group = []
            if etcd is not None:
                group.append((f"etcd put, 3 members, WAL fsynced @{n}", lambda n=n: etcd.run(args.etcd_load, n, args.duration)))
            if fsynced is not None:
                group.append((f"{DLEDGER_FSYNCED} @{n}", lambda n=n: hasvc_run(fsynced, n, 1, args.duration, hasvc_load)))
            if group:
                points(group)
    if dledger:
        with contextlib.ExitStack() as stack:
            in_memory = LocalGroup(nodes=3, flush="async", settings=HASVC_SETTINGS)
            stack.callback(in_memory.close)
            hasvc_warm_up(in_memory, hasvc_load)
            classic = stack.enter_context(hasvc_pair(hasvc_load, role="sync", flush="async"))
            for batch, ns in ((1, CONCURRENCY), (BATCH, (16, 64))):
                suffix = "" if batch == 1 else f", {batch} msgs/request"
                classic_suffix = suffix or ", 1 msg/request"
                for n in ns:
                    points([(f"{DLEDGER_IN_MEMORY}{suffix} @{n}", lambda n=n, batch=batch: hasvc_run(in_memory, n, batch, args.duration, hasvc_load)),
                            (f"{CLASSIC_BESIDE_DLEDGER}{classic_suffix} @{n}", lambda n=n, batch=batch: hasvc_run(classic, n, batch, args.duration, hasvc_load))])  # fmt: skip


def hasvc_polling_run(duration: float, load_binary: str) -> dict:
    """One writer against a pair of its own whose brokers poll ``POLLING_US`` before they sleep."""
    with hasvc_pair(load_binary, role="sync", flush="async", busy_poll_us=POLLING_US) as pair:
        return hasvc_run(pair, 1, 1, duration, load_binary)


@contextlib.contextmanager
def hasvc_pair(load_binary: str, *, busy_poll_us: int = 0, **settings) -> Iterator[LocalPair]:
    """A classic pair with ``HASVC_SETTINGS``, warmed up (``hasvc_warm_up``)."""
    pair = LocalPair(**settings, settings={**HASVC_SETTINGS, **({"busy_poll_us": str(busy_poll_us)} if busy_poll_us else {})})
    try:
        hasvc_warm_up(pair, load_binary)
        yield pair
    finally:
        pair.close()


def measure_ceilings(args: argparse.Namespace, root: str, results: dict) -> None:
    """Loopback TCP and the trio request/reply ceilings (the relay floor runs beside the one-writer points)."""
    total = 2 << 30
    results["loopback send"] = {"bytes_per_s": statistics.median(loopback_ceiling(total)[0] for _ in range(args.runs))}
    blob = os.path.join(root, "blob")
    with open(blob, "wb") as file:
        file.write(os.urandom(256 << 20))
    results["loopback sendfile"] = {"bytes_per_s": statistics.median(loopback_ceiling(total, files=[blob])[0] for _ in range(args.runs))}
    os.unlink(blob)
    for name in ("loopback send", "loopback sendfile"):
        print(f"{name:<52} {results[name]['bytes_per_s'] / 1e6:,.0f} MB/s", flush=True)
    for n in (1, 64):
        runs = [trio_ceiling(n, args.duration) for _ in range(args.runs)]
        results[f"trio request/reply @{n}"] = {
            "acked_per_second": statistics.median(r["acked_per_second"] for r in runs),
            "cpu_percent": {k: statistics.median(r["cpu_percent"][k] for r in runs) for k in runs[0]["cpu_percent"]},
        }  # fmt: skip
        print(f"trio request/reply @{n:<33} {results[f'trio request/reply @{n}']['acked_per_second']:,.0f} /s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
