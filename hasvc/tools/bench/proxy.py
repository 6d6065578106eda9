"""``hasvc bench proxy``: the official client through the gateway, beside hasvc's own client.

One run on loopback: a SYNC_MASTER master and a slave, the proxy in front of them, and a second
proxy whose sends store nothing (``--null-sends``: the official client's own ceiling through the
same gRPC layers). For each number of senders: the official Python client producing 1 KiB
messages through the null proxy and through the real one, and hasvc's own client (trio tasks on
one connection) against the same master; then consumers, each in its own group: the official
SimpleConsumer and PushConsumer each draining what the official client produced through the proxy,
beside hasvc's client pulling it. The gateway's cost is the real
proxy's rate against the null one's (the issue's target: at most 30 % below).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import trio

from hasvc import client as hc
from hasvc.tools.bench.store import envelope, write_json
from hasvc.tools.bench.sync_write import process_cpu_seconds
from hasvc.tools.drill import Process

CLIENT_TIMEOUT_MARGIN_SECONDS = 60.0


def _official(endpoint: str, home: str, mode: str, senders: int, seconds: float, size: int, topic: str, group: str = "",
              want: int = 0, servers: dict[str, Process] | None = None, credentials: tuple[str, str] | None = None) -> dict:  # fmt: skip
    """One run of the official client (``proxy_client``) in a child process. With ``servers``,
    each one's CPU over the whole run (the client's start and end included) divided by the
    messages the run counted: ``cpu_us_per_message`` by name."""
    servers = servers or {}
    before = {name: process_cpu_seconds(process.pid) for name, process in servers.items()}
    command = [sys.executable, "-m", "hasvc.tools.bench.proxy_client", endpoint, mode, str(senders), str(seconds), str(size), topic,
               group, str(want)]  # fmt: skip
    env = {**os.environ, "HOME": home}
    if credentials is not None:
        env["HASVC_BENCH_ACCESS_KEY"], env["HASVC_BENCH_SECRET_KEY"] = credentials
    done = subprocess.run(command, env=env, capture_output=True, text=True,
                          timeout=seconds + CLIENT_TIMEOUT_MARGIN_SECONDS)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"official client ({mode}) failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if servers and result["count"]:
        result["cpu_us_per_message"] = {name: 1e6 * (process_cpu_seconds(process.pid) - before[name]) / result["count"]
                                        for name, process in servers.items()}  # fmt: skip
    return result


async def _own_produce(address: str, senders: int, seconds: float, size: int, topic: str) -> dict:
    count = 0
    body = b"x" * size
    async with hc.connect(address) as client:
        stop = trio.current_time() + seconds

        async def sender(index: int) -> None:
            nonlocal count
            while trio.current_time() < stop:
                result = await client.send(topic, body, queue_id=index % 4)
                count += result.ok

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for index in range(senders):
                nursery.start_soon(sender, index)
        elapsed = trio.current_time() - started
    return {"count": count, "seconds": elapsed, "rate": count / elapsed, "errors": 0}


async def _own_consume(address: str, topic: str) -> dict:
    count = 0
    async with hc.connect(address) as client:
        started = trio.current_time()
        for queue_id in range(4):
            offset = 0
            while (pulled := await client.pull(topic, queue_id, offset, count_max=1024)).records:
                count += len(pulled.records)
                offset = pulled.next_queue_offset
        elapsed = trio.current_time() - started
    return {"count": count, "seconds": elapsed, "rate": count / elapsed if elapsed else 0.0, "errors": 0}


def _start(root: str) -> tuple[list[Process], Process, Process, Process]:
    master = Process(root, "master", ["master", "--store", f"{root}/m", "--listen", "127.0.0.1:0", "--ha-listen", "127.0.0.1:0",
                                      "--role", "sync", "--set", "disk_max_used_space_ratio=1.0"])  # fmt: skip
    slave = Process(root, "slave", ["slave", "--store", f"{root}/s", "--listen", "127.0.0.1:0", "--ha-listen", "127.0.0.1:0",
                                    "--master-ha", master.ready["ha_listen"], "--set", "disk_max_used_space_ratio=1.0"])  # fmt: skip
    brokers = f"{master.ready['listen']},{slave.ready['listen']}"
    deadline = time.monotonic() + 30
    with hc.BlockingClient(master.ready["listen"]) as client:
        while not [s for s in client.status()["slaves"] if s["ack_offset"] >= 0]:
            if time.monotonic() > deadline:
                raise RuntimeError("the slave did not connect")
            time.sleep(0.05)
    proxy = Process(root, "proxy", ["proxy", "--listen", "127.0.0.1:0", "--brokers", brokers])
    null = Process(root, "null-proxy", ["proxy", "--listen", "127.0.0.1:0", "--brokers", brokers, "--null-sends"])
    return [null, proxy, slave, master], master, proxy, null


def _cpu_line(row: dict) -> str:
    """Where each official run's CPU went: the client process (% of a core over its window; the
    load generator at its limit near 100 %) and the servers' CPU per message."""
    parts = []
    for name, label in (("official_null", "null send"), ("official_proxy", "send"), ("official_consume", "simple"),
                        ("official_push", "push")):  # fmt: skip
        run = row[name]
        servers = ", ".join(f"{server} {us:,.0f}" for server, us in run.get("cpu_us_per_message", {}).items())
        parts.append(f"{label}: client {run.get('client_cpu_percent', 0):.0f} %" + (f", µs/msg {servers}" if servers else ""))
    return "CPU  " + "; ".join(parts)


def run_bench(*, senders: list[int], seconds: float, size: int, json_path: str | None, echo=print) -> dict:
    runs = []
    with tempfile.TemporaryDirectory(prefix="hasvc-bench-proxy-") as root:
        processes, master, proxy, null = _start(root)
        gateway = {"loop": proxy.ready.get("loop"), "send_lane": proxy.ready.get("send_lane")}
        echo(f"proxy on {gateway['loop']}, send lane {'on' if gateway['send_lane'] else 'off'}")
        try:
            slave = processes[2]
            behind = {"proxy": proxy, "master": master, "slave": slave}
            for count in senders:
                topic = f"BenchProxy{count}"
                row = {"senders": count,
                       "official_null": _official(null.ready["listen"], root, "produce", count, seconds, size, f"{topic}Null",
                                                  servers={"proxy": null}),
                       "official_proxy": _official(proxy.ready["listen"], root, "produce", count, seconds, size, topic, servers=behind),
                       "hasvc": trio.run(_own_produce, master.ready["listen"], count, seconds, size, f"{topic}Own")}  # fmt: skip
                produced = row["official_proxy"]["count"]
                row["official_consume"] = _official(proxy.ready["listen"], root, "consume", 1, seconds * 4, size, topic, f"G{count}",
                                                    servers=behind)  # fmt: skip
                row["official_push"] = _official(proxy.ready["listen"], root, "push", 1, seconds * 4, size, topic, f"P{count}", produced,
                                                 servers=behind)  # fmt: skip
                row["hasvc_consume"] = trio.run(_own_consume, master.ready["listen"], topic)
                row["gateway_cost"] = 1 - row["official_proxy"]["rate"] / row["official_null"]["rate"]
                runs.append(row)
                echo(f"{count:3d} senders  official via proxy {row['official_proxy']['rate']:8.0f} msgs/s   "
                     f"via null proxy {row['official_null']['rate']:8.0f}   gateway cost {row['gateway_cost']:6.1%}   "
                     f"hasvc client {row['hasvc']['rate']:8.0f}   consume: simple {row['official_consume']['rate']:7.0f} "
                     f"push {row['official_push']['rate']:7.0f} hasvc {row['hasvc_consume']['rate']:8.0f} msgs/s")  # fmt: skip
                echo("             " + _cpu_line(row))
        finally:
            for process in processes:
                process.stop()
    result = envelope("proxy", {"senders": senders, "seconds": seconds, "size": size}, runs=runs, gateway=gateway)
    write_json(json_path, result)
    return result


# The account the ACL comparison's proxy admits (every topic and group, both actions).
ACL_ACCOUNT = ("bench", "bench-secret-key")
ACL_FILE = f"""[[account]]
access_key = "{ACL_ACCOUNT[0]}"
secret_key = "{ACL_ACCOUNT[1]}"
topics = ["*"]
groups = ["*"]
actions = ["pub", "sub"]
"""


def run_acl_bench(*, senders: list[int], seconds: float, size: int, pairs: int, json_path: str | None, echo=print) -> dict:
    """The official client producing through a proxy without ``--acl`` and through one with it
    (every call signed and checked), in ``pairs`` alternating pairs per number of senders, in front
    of the same master and slave: medians and the ratio (ACL on / off)."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="hasvc-bench-proxy-acl-") as root:
        processes, master, proxy, null = _start(root)
        acl_path = os.path.join(root, "acl.toml")
        with open(acl_path, "w") as file:
            file.write(ACL_FILE)
        brokers = ",".join(process.ready["listen"] for process in (master, processes[2]))
        guarded = Process(root, "acl-proxy", ["proxy", "--listen", "127.0.0.1:0", "--brokers", brokers, "--acl", acl_path])
        processes.insert(0, guarded)
        try:
            for count in senders:
                off, on = [], []
                for pair in range(pairs):
                    topic = f"BenchAcl{count}P{pair}"
                    off.append(_official(proxy.ready["listen"], root, "produce", count, seconds, size, f"{topic}Off")["rate"])
                    on.append(_official(guarded.ready["listen"], root, "produce", count, seconds, size, f"{topic}On",
                                        credentials=ACL_ACCOUNT)["rate"])  # fmt: skip
                    echo(f"{count:3d} senders  pair {pair + 1}: ACL off {off[-1]:8.0f} msgs/s   ACL on {on[-1]:8.0f} msgs/s")
                ratios = sorted(b / a for a, b in zip(off, on, strict=True) if a)
                row = {"senders": count, "acl_off": off, "acl_on": on, "median_off": statistics.median(off),
                       "median_on": statistics.median(on), "ratio_median": statistics.median(ratios) if ratios else None}  # fmt: skip
                runs.append(row)
                echo(f"{count:3d} senders  median ACL off {row['median_off']:8.0f}   on {row['median_on']:8.0f}   "
                     f"on/off per pair: median {row['ratio_median']:.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})")  # fmt: skip
        finally:
            for process in processes:
                process.stop()
    result = envelope("proxy-acl", {"senders": senders, "seconds": seconds, "size": size, "pairs": pairs}, runs=runs)
    write_json(json_path, result)
    return result
