"""``hasvc bench sync-write``: acknowledged writes per second against a master with a slave.

Starts a master and a slave as separate processes on loopback (temporary stores, free ports), a
DLedger group (``--mode dledger``), a controller-managed pair (``--mode controller``: one
``hasvc controller`` and two ``hasvc broker --controllers``, the elected master SYNC_MASTER
against its SyncStateSet; run it alternately with a plain pair to compare), or
targets a running master (``--master``), then runs ``producers`` concurrent producers for
``duration`` seconds: each sends one request at a time (one message, or a batch of ``batch``) and
records its latency. ``runs`` repetitions; the table shows medians with min–max, and the CPU
used by every process involved (read from /proc), so a saturated load generator shows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time

import trio

from hasvc import client as hc
from hasvc.testing.launch import ReadyProcess, hasvc_command
from hasvc.tools.bench.store import Summary, envelope

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclasses.dataclass
class RunResult:
    acked: int
    requests: int
    seconds: float
    percentiles_us: dict[str, float]  # p50_us, p99_us, p999_us of request latency
    statuses: dict[str, int]  # messages by status name
    cpu_percent: dict[str, float]

    def summary(self, size: int, batch: int) -> dict:
        return {
            "acked_per_second": self.acked / self.seconds,
            "mb_per_second": self.acked * size / self.seconds / 1e6,
            "requests": self.requests,
            **self.percentiles_us,
            "statuses": self.statuses,
            "cpu_percent": self.cpu_percent,
            "seconds": self.seconds,
        }


def percentiles(latencies_us: list[float]) -> dict[str, float]:
    ordered = sorted(latencies_us) or [0.0]

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {"p50_us": at(0.50), "p99_us": at(0.99), "p999_us": at(0.999)}


# The C load generator (scripts/hasvc_load.c, the counterpart of scripts/redis_load.c): a Python
# client costs ~50 us of CPU per request on this machine, as much as the master spends on it, and
# the two share 2 cores. Built once per source version into the user's cache directory.
# the repository root is three packages up (hasvc/tools/bench/)
LOAD_SOURCE = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 3, "scripts", "hasvc_load.c"))


def build_c_load() -> str | None:
    """The built C load generator, compiling it on first use; None when the source (a checkout's
    scripts/) or a C compiler is missing."""
    if not os.path.exists(LOAD_SOURCE) or shutil.which("cc") is None:
        return None
    with open(LOAD_SOURCE, "rb") as file:
        digest = hashlib.sha256(file.read()).hexdigest()[:16]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hasvc")
    target = os.path.join(cache, f"hasvc_load-{digest}")
    if not os.path.exists(target):
        os.makedirs(cache, exist_ok=True)
        partial = f"{target}.{os.getpid()}"
        done = subprocess.run(["cc", "-O2", "-o", partial, LOAD_SOURCE, "-lpthread"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {LOAD_SOURCE} failed: {done.stderr.strip()}")
        os.replace(partial, target)
    return target


def choose_load_generator(kind: str, secret) -> tuple[str, str | None]:
    """("c", binary) or ("python", None) for ``kind`` auto|c|python. The C one speaks no HMAC
    preface, so a secret means Python."""
    if kind == "python" or (kind == "auto" and secret is not None):
        return "python", None
    if kind == "c" and secret is not None:
        raise RuntimeError("the C load generator does not support a cluster secret; use --load-generator python")
    try:
        binary = build_c_load()
    except RuntimeError:
        if kind == "c":
            raise
        binary = None  # auto: a compiler that fails on it means the Python client
    if binary is None:
        if kind == "c":
            raise RuntimeError(f"the C load generator needs {LOAD_SOURCE} and a C compiler (cc)")
        return "python", None
    return "c", binary


async def _load(address: str, *, producers: int, connections: int, size: int, batch: int, duration: float, secret) -> tuple[int, list[float], dict[str, int]]:
    body = os.urandom(size)
    bodies = [body] * batch
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    acked = 0
    async with trio.open_nursery() as outer:
        clients = []
        for _ in range(connections):
            clients.append(await outer.start(_client_holder, address, secret))
        deadline = trio.current_time() + duration

        async def producer(index: int) -> None:
            nonlocal acked
            client = clients[index % connections]
            queue_id = index % 4
            while trio.current_time() < deadline:
                started = time.perf_counter()
                if batch == 1:
                    results = [await client.send("BenchTopic", body, queue_id=queue_id)]
                else:
                    results = await client.send_batch("BenchTopic", bodies, queue_id=queue_id)
                latencies.append((time.perf_counter() - started) * 1e6)
                status = results[0].status
                statuses[status] = statuses.get(status, 0) + len(results)
                if status == "PUT_OK":
                    acked += len(results)

        async with trio.open_nursery() as nursery:
            for index in range(producers):
                nursery.start_soon(producer, index)
        outer.cancel_scope.cancel()
    return acked, latencies, statuses


async def _client_holder(address, secret, *, task_status=trio.TASK_STATUS_IGNORED):
    async with hc.connect(address, secret) as client:
        task_status.started(client)
        await trio.sleep_forever()


def run_once(address: str, pids: dict[str, int], *, producers: int, connections: int, size: int, batch: int, duration: float,
             secret=None, load_binary: str | None = None) -> RunResult:  # fmt: skip
    """One run against ``address``: with ``load_binary`` (the C load generator) in a child
    process, else with the Python client in this one. CPU of every process in ``pids`` and of
    the load generator, in % of one core."""
    before = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
    if load_binary is not None:
        host, _, port = address.rpartition(":")
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run([load_binary, host, port, str(connections), str(producers), str(batch), str(duration), str(size)],
                              capture_output=True, text=True)  # fmt: skip
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"load generator failed: {done.stderr.strip()}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        data = json.loads(done.stdout)
        load_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        acked, requests, statuses = data["acked"], data["requests"], data["statuses"]
        latency = {key: data[key] for key in ("p50_us", "p99_us", "p999_us")}
    else:
        own_before = time.process_time()
        started = time.perf_counter()
        acked, latencies, statuses = trio.run(lambda: _load(address, producers=producers, connections=connections, size=size,
                                                             batch=batch, duration=duration, secret=secret))  # fmt: skip
        seconds = time.perf_counter() - started
        load_cpu = time.process_time() - own_before
        requests, latency = len(latencies), percentiles(latencies)
    cpu = {name: 100 * (process_cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}
    cpu["load generator"] = 100 * load_cpu / seconds
    return RunResult(acked, requests, seconds, latency, statuses, cpu)


class LocalPair:
    """A master and a slave process with temporary stores, stopped by PID on exit."""

    def __init__(self, *, role: str, flush: str, slave_flush_before_ack: bool = False, settings: dict[str, str] | None = None):
        """``settings``: more options by config name, given to both (``--set NAME=VALUE``)."""
        self.root = tempfile.mkdtemp(prefix="hasvc-bench-")
        self.processes: list[ReadyProcess] = []
        both = [arg for name, value in (settings or {}).items() for arg in ("--set", f"{name}={value}")]
        self.master = self._start(["master", "--role", role, "--flush", flush, *both], "master")
        slave_args = ["slave", "--master-ha", self.master["ha_listen"], *both]
        if slave_flush_before_ack:
            slave_args += ["--set", "flush_before_ack=true"]
        self.slave = self._start(slave_args, "slave")

    def _start(self, args: list[str], name: str) -> dict:
        command = hasvc_command(*args, "--store", os.path.join(self.root, name), "--listen", "127.0.0.1:0",
                                "--ha-listen", "127.0.0.1:0")  # fmt: skip
        try:
            process = ReadyProcess(name, command, os.path.join(self.root, f"{name}.log"))
        except RuntimeError:
            self.close()
            raise
        self.processes.append(process)
        return process.ready

    def wait_connected(self, timeout: float = 30.0) -> None:
        """Until the master has the slave's first report: before it, a SYNC_MASTER put is
        answered SLAVE_NOT_AVAILABLE (a run's first requests were, now and then)."""
        deadline = time.monotonic() + timeout
        with hc.BlockingClient(self.master["listen"]) as client:
            while not any(slave["ack_offset"] >= 0 for slave in client.status()["slaves"]):
                if time.monotonic() > deadline:
                    raise RuntimeError("the slave did not connect")
                time.sleep(0.05)

    @property
    def pids(self) -> dict[str, int]:
        return {"master": self.processes[0].pid, "slave": self.processes[1].pid}

    def close(self) -> None:
        for process in self.processes:
            process.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class LocalGroup:
    """A DLedger group of ``nodes`` ``hasvc node`` processes with temporary stores, etcd-like
    election timing; ``master`` is the leader once it plays SYNC_MASTER. Stopped by PID on exit.
    ``flush`` "sync": an entry counts toward the quorum once fsynced (etcd's promise)."""

    def __init__(self, *, nodes: int, flush: str, settings: dict[str, str] | None = None):
        from hasvc.tools.drill_dledger import ETCD_LIKE_SETTINGS, Node
        from hasvc.tools.partition import free_port

        self.root = tempfile.mkdtemp(prefix="hasvc-bench-dledger-")
        members = [f"n{i}" for i in range(nodes)]
        peers = ";".join(f"{member}-127.0.0.1:{free_port()}" for member in members)
        extra = [*ETCD_LIKE_SETTINGS, *(f"{name}={value}" for name, value in (settings or {}).items())]
        self.nodes = []
        for member in members:
            args = ["--store", os.path.join(self.root, member), "--listen", "127.0.0.1:0", "--group", "bench",
                    "--peers", peers, "--self", member, "--flush", flush]  # fmt: skip
            for setting in extra:
                args += ["--set", setting]
            node = Node(self.root, member, args)
            self.nodes.append(node)
            node.start()
        self.master = {"listen": self._leader()}

    def _leader(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                with hc.BlockingClient(node.client_address) as client:
                    if client.status()["role"] == "SYNC_MASTER":
                        return node.client_address
            time.sleep(0.05)
        raise RuntimeError("no leader took writes")

    def wait_connected(self) -> None:
        pass  # the leader plays SYNC_MASTER only once a quorum follows it

    @property
    def pids(self) -> dict[str, int]:
        leader = self.master["listen"]
        return {("leader " if node.client_address == leader else "") + node.member: node.pid for node in self.nodes}

    def close(self) -> None:
        import shutil

        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class LocalControlledPair:
    """One controller and two ``hasvc broker --controllers`` processes with temporary stores: the
    controller elects one broker master and the other follows it; ``master`` is the elected one
    once the other is in its SyncStateSet (before, a put is answered SLAVE_NOT_AVAILABLE). The
    brokers get the same options as a plain pair's (``flush``, ``settings``), so the two can be
    compared. Stopped by PID on exit."""

    GROUP = "bench"

    def __init__(self, *, flush: str, slave_flush_before_ack: bool = False, settings: dict[str, str] | None = None):
        """``slave_flush_before_ack``: given to both brokers (either may be the slave; a master ignores it)."""
        from hasvc.testing.controller_group import ControllerGroup

        self.root = tempfile.mkdtemp(prefix="hasvc-bench-controller-")
        self.processes: list[ReadyProcess] = []
        both = [arg for name, value in (settings or {}).items() for arg in ("--set", f"{name}={value}")]
        if slave_flush_before_ack:
            both += ["--set", "flush_before_ack=true"]
        try:
            self.controllers = ControllerGroup(os.path.join(self.root, "controllers"), 1)
        except RuntimeError:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        controller = self.controllers.addresses[0]
        for name in ("a", "b"):
            command = hasvc_command("broker", "--controllers", controller, "--group", self.GROUP, "--flush", flush,
                                    "--store", os.path.join(self.root, name), "--listen", "127.0.0.1:0",
                                    "--ha-listen", "127.0.0.1:0", *both)  # fmt: skip
            try:
                self.processes.append(ReadyProcess(f"broker {name}", command, os.path.join(self.root, f"{name}.log")))
            except RuntimeError:
                self.close()
                raise
        self.master = {"listen": ""}

    def wait_connected(self, timeout: float = 60.0) -> None:
        """Until one broker serves as master, unfenced, with the other in its SyncStateSet."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self.processes:
                with hc.BlockingClient(process.address) as client:
                    status = client.status()
                if (status["role"] != "SLAVE" and not status.get("fenced_by") and len(status["sync_state_set"]) == 2
                        and status.get("sync_state_set_proposed") is None):  # fmt: skip
                    self.master = {"listen": process.address}
                    self._master_pid = process.pid
                    return
            time.sleep(0.05)
        raise RuntimeError(f"no master with its slave in the SyncStateSet within {timeout:.0f} s; logs under {self.root}")

    @property
    def pids(self) -> dict[str, int]:
        slave = next(process.pid for process in self.processes if process.pid != self._master_pid)
        return {"master": self._master_pid, "slave": slave, "controller": self.controllers.processes["c0"].pid}

    def close(self) -> None:
        for process in self.processes:
            process.stop()
        self.controllers.close()
        shutil.rmtree(self.root, ignore_errors=True)


# Given to the local brokers (``page_cache_keep_size``), as scripts/bench_peers gives its hasvc
# processes: flushed log pages more than this far behind are dropped from the page cache. On this
# project's VMs (virtio-balloon free page reporting hands free memory back to the host) a page the
# cache never held costs a host fault on its first write; a local DLedger group at 64 x 32 writes
# ~300 MB/s over its three members, and within one bench (3 x 5 s) its members' CPU a message rose
# as the page cache grew into such memory (docs/design/put-path.md). Durability is unchanged: only
# flushed pages are dropped.
PAGE_CACHE_KEEP_SIZE = 256 * 1024 * 1024


def bench_sync_write(*, producers: int, connections: int, size: int, batch: int, duration: float, runs: int, role: str,
                     flush: str, master: str | None, slave_flush_before_ack: bool, secret=None, load_generator: str = "auto",
                     nodes: int = 3, page_cache_keep_size: int = PAGE_CACHE_KEEP_SIZE, echo=print) -> dict:  # fmt: skip
    """``role`` sync/async: a classic pair; "dledger": a group of ``nodes`` (``flush`` sync: the
    quorum fsyncs before a put is acknowledged); "controller": a controller-managed pair. ``page_cache_keep_size``: given to the local
    brokers (0: the store's default, nothing dropped)."""
    load_kind, load_binary = choose_load_generator(load_generator, secret)
    pair = None
    if master is None:
        settings = {"page_cache_keep_size": str(page_cache_keep_size)} if page_cache_keep_size else None
        if role == "dledger":
            pair = LocalGroup(nodes=nodes, flush=flush, settings=settings)
        elif role == "controller":
            pair = LocalControlledPair(flush=flush, slave_flush_before_ack=slave_flush_before_ack, settings=settings)
        else:
            pair = LocalPair(role=role, flush=flush, slave_flush_before_ack=slave_flush_before_ack, settings=settings)
        try:
            pair.wait_connected()
        except BaseException:
            pair.close()
            raise
        address, pids = pair.master["listen"], pair.pids
    else:
        address, pids = master, {}
    try:
        results = [
            run_once(address, pids, producers=producers, connections=connections, size=size, batch=batch,
                     duration=duration, secret=secret, load_binary=load_binary).summary(size, batch)
            for _ in range(runs)
        ]  # fmt: skip
    finally:
        if pair is not None:
            pair.close()

    summary = {key: Summary.of([r[key] for r in results]) for key in ("acked_per_second", "mb_per_second", "p50_us", "p99_us", "p999_us")}
    statuses: dict[str, int] = {}
    for result in results:
        for name, count in result["statuses"].items():
            statuses[name] = statuses.get(name, 0) + count
    cpu = {name: statistics.median(r["cpu_percent"][name] for r in results) for name in results[0]["cpu_percent"]}
    echo(f"sync-write: {producers} producers over {connections} connection(s), {size} B bodies, batch {batch}, "
         f"role {role}, flush {flush}{', slave flushes before ack' if slave_flush_before_ack else ''}, "
         f"{runs} x {duration:.0f} s, {load_kind} load generator"
         f"{f', page cache kept {page_cache_keep_size >> 20} MiB behind the flush' if master is None and page_cache_keep_size else ''}"
         "; medians (min–max)")  # fmt: skip
    echo(f"  acked msgs/s  {summary['acked_per_second'].text()}")
    echo(f"  MB/s          {summary['mb_per_second'].text(digits=1)}")
    echo(f"  latency us    p50 {summary['p50_us'].text()}  p99 {summary['p99_us'].text()}  p99.9 {summary['p999_us'].text()}")
    echo(f"  statuses      {statuses}")
    echo(f"  cpu %         {', '.join(f'{name} {value:.0f}' for name, value in cpu.items())}")
    settings = {"producers": producers, "connections": connections, "size": size, "batch": batch, "duration": duration,
                "runs": runs, "role": role, "flush": flush, "slave_flush_before_ack": slave_flush_before_ack,
                "target": master or {"dledger": "local DLedger group", "controller": "local controller-managed pair"}.get(role, "local pair"),
                "nodes": nodes if role == "dledger" else None, "load_generator": load_kind,
                "page_cache_keep_size": page_cache_keep_size if master is None else None}  # fmt: skip
    return envelope(
        "sync-write", settings,
        summary={key: dataclasses.asdict(value) for key, value in summary.items()},
        **{key: value.median for key, value in summary.items()},
        statuses=statuses, cpu_percent=cpu, runs=results,
    )  # fmt: skip
