"""CPU per message of the proxy's send path, by process (docs/design/proxy.md).

    PYTHONPATH=TREE python scripts/dev/proxy_cpu.py producer SENDERS SECONDS [ROUNDS]
    PYTHONPATH=TREE python scripts/dev/proxy_cpu.py consumer COUNT SECONDS [ROUNDS]
    PYTHONPATH=TREE python scripts/dev/proxy_cpu.py trio-send TASKS COUNT [ROUNDS]

Both start ``hasvc bench proxy``'s cluster (a SYNC_MASTER master, its slave, the proxy and the
null proxy, from the hasvc code on PYTHONPATH) in a temporary directory and print one JSON line
per round. CPU is user + system time from /proc/PID/stat (every thread) divided by the messages
sent; on a shared machine it moves much less than rates do, so it is the figure to compare two
builds by (alternate them, a fresh cluster each).

* ``producer``: the official Producer (``hasvc.tools.bench.proxy_client``, HOME a temporary
  directory) with SENDERS threads for SECONDS through the null proxy, then through the proxy: the
  rate and CPU a message of each proxy, the master, the slave and the client (getrusage of children).
* ``consumer``: a backlog of COUNT 1 KiB messages (hasvc's client, straight to the master, on the
  four queues of a new topic), then the official SimpleConsumer and the official PushConsumer
  (``proxy_client``'s ``consume`` and ``push``, at most SECONDS each) each draining it in a new
  group through the proxy: the rate, the CPU a consumed message of the proxy (also by thread: the
  gRPC loop ``main``, the trio side ``trio``, grpc's own threads ``grpc``), the master, the slave
  and the client. Progress records and acks are what a consumed message costs the brokers.
  Then ``one_at_a_time``: a SimpleConsumer acknowledging each message of a further backlog of at
  most ONE_AT_A_TIME_COUNT before the next (``proxy_client``'s ``consume-one``): its rate and mean
  ack call, which any holding back of acks in the proxy would slow down.
* ``trio-send``: the proxy's trio side alone, without gRPC: ``Gateway.send`` of COUNT messages with
  v1 message ids (the official clients') from TASKS trio tasks of this process, through the
  gateway's FailoverClient to the master; this process's CPU a send, the master's and the slave's.
"""

import json
import os
import resource
import sys
import tempfile
import time

import trio

from hasvc import client as hc
from hasvc.tools.bench import proxy as bench
from hasvc.tools.bench import proxy_client

ONE_AT_A_TIME_COUNT = 1000  # latency-bound (~2 ms an ack): a larger backlog only takes longer
PROGRESS_TOPIC = "%HASVC_PROXY_PROGRESS"  # hasvc.proxy.gateway's, spelled out: the script also measures older trees


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU of a proxy's threads by role: ``main`` (the gRPC loop), ``trio`` (the other threads
    named like the main one: Python threads, the gateway's trio loop above all) and ``grpc``
    (grpc's C-core threads: event_engine, grpc_global_timer, ...)."""
    totals = {"main": 0.0, "trio": 0.0, "grpc": 0.0}
    with open(f"/proc/{pid}/comm") as file:
        main_name = file.read().strip()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as file:
                head, _, rest = file.read().rpartition(")")
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        fields, name = rest.split(), head.partition("(")[2]
        role = "main" if int(task) == pid else "trio" if name == main_name else "grpc"
        totals[role] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return totals


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def per_message(before: dict, after: dict, count: int) -> dict:
    return {name: round((after[name] - before[name]) / max(count, 1) * 1e6) for name in before}


def produce(root: str, endpoint: str, senders: int, seconds: float, topic: str, pids: dict) -> dict:
    before = {name: cpu_seconds(pid) for name, pid in pids.items()} | {"client": children_cpu_seconds()}
    result = bench._official(endpoint, root, "produce", senders, seconds, 1024, topic)
    after = {name: cpu_seconds(pid) for name, pid in pids.items()} | {"client": children_cpu_seconds()}
    return {"rate": round(result["rate"]), "count": result["count"], "errors": result["errors"],
            "cpu_us": per_message(before, after, result["count"])}  # fmt: skip


async def write_backlog(master: str, topic: str, count: int) -> None:
    body = b"x" * 1024
    todo = iter(range(count))
    async with hc.connect(master) as client:

        async def sender() -> None:
            for index in todo:
                result = await client.send(topic, body, queue_id=index % 4)
                assert result.ok, result

        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(sender)


def progress_records(master: str) -> int:
    """How many event records the proxy has written to its progress topic (queue 0)."""
    with hc.BlockingClient(master) as client:
        return max(0, client.pull(PROGRESS_TOPIC, 0, 0, count_max=1).max_queue_offset)


def consume(root: str, endpoint: str, mode: str, seconds: float, topic: str, group: str, count: int, pids: dict, master: str) -> dict:
    """One official consumer (``consume``: SimpleConsumer, ``push``: PushConsumer) draining
    ``count`` messages of ``topic`` in a new group: CPU a consumed message, the proxy's by thread,
    and the progress records written a consumed message."""
    proxy = pids["proxy"]
    records = progress_records(master)
    before = ({name: cpu_seconds(pid) for name, pid in pids.items()} | {"client": children_cpu_seconds()}
              | {f"proxy_{role}": value for role, value in thread_cpu_seconds(proxy).items()})  # fmt: skip
    result = bench._official(endpoint, root, mode, 1, seconds, 1024, topic, group, count)
    after = ({name: cpu_seconds(pid) for name, pid in pids.items()} | {"client": children_cpu_seconds()}
             | {f"proxy_{role}": value for role, value in thread_cpu_seconds(proxy).items()})  # fmt: skip
    return {"rate": round(result["rate"]), "count": result["count"], "errors": result["errors"],
            "duplicates": result["duplicates"], "client_cpu_percent": round(result["client_cpu_percent"]),
            **({"ack_ms": round(result["ack_ms"], 2)} if "ack_ms" in result else {}),
            "records_per_message": round((progress_records(master) - records) / max(result["count"], 1), 3),
            "cpu_us": per_message(before, after, result["count"])}  # fmt: skip


async def trio_send(master: str, tasks: int, count: int, pids: dict) -> dict:
    from hasvc.proxy import gateway
    from hasvc.proxy.pb import Code, definition

    client_id = f"proxy-cpu-{os.getpid()}-{time.time_ns()}"  # a new producer id: sequences start at 0
    messages = []
    for sequence in range(count + 1):
        message = definition.Message()
        message.topic.name, message.body = "ProxyCpu", b"x" * 1024
        message.system_properties.message_id = f"01AABBCCDDEEFF0001{int(time.time()):08X}{sequence:08X}"
        message.system_properties.message_type = definition.NORMAL
        messages.append(message)
    async with hc.connect_cluster([master], retry_sends=True) as cluster:
        gate = gateway.Gateway(cluster, gateway.GatewayConfig())
        await gate.send(client_id, messages[0])  # connects
        todo = iter(messages[1:])
        before = {name: cpu_seconds(pid) for name, pid in pids.items()} | {"trio_side": time.process_time()}
        started = time.monotonic()

        async def sender() -> None:
            for message in todo:
                outcome = await gate.send(client_id, message)
                assert outcome.code == Code.OK, outcome

        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(sender)
        elapsed = time.monotonic() - started
        after = {name: cpu_seconds(pid) for name, pid in pids.items()} | {"trio_side": time.process_time()}
    return {"rate": round(count / elapsed), "count": count, "cpu_us": per_message(before, after, count)}


def main() -> None:
    mode, first, second = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    with tempfile.TemporaryDirectory(prefix="hasvc-proxy-cpu-") as root:
        processes, master, proxy, null = bench._start(root)
        slave = next(p for p in processes if p.name == "slave")
        brokers = {"master": master.pid, "slave": slave.pid}
        try:
            for index in range(rounds):
                if mode == "producer":
                    row = {"senders": first,
                           "null_proxy": produce(root, null.ready["listen"], first, second, f"CpuNull{index}", {"null_proxy": null.pid}),
                           "proxy": produce(root, proxy.ready["listen"], first, second, f"Cpu{index}", {"proxy": proxy.pid, **brokers})}  # fmt: skip
                    row["gateway_cost"] = round(1 - row["proxy"]["rate"] / row["null_proxy"]["rate"], 3)
                elif mode == "consumer":
                    topic, count = f"CpuConsume{index}", first
                    trio.run(write_backlog, master.ready["listen"], topic, count)
                    pids = {"proxy": proxy.pid, **brokers}
                    row = {"count": count,
                           "simple": consume(root, proxy.ready["listen"], "consume", second, topic, f"CpuSimple{index}", count, pids,
                                             master.ready["listen"]),
                           "push": consume(root, proxy.ready["listen"], "push", second, topic, f"CpuPush{index}", count, pids,
                                           master.ready["listen"])}  # fmt: skip
                    if not hasattr(proxy_client, "consume_one"):  # a tree from before the mode: its proxy_client lacks it
                        print(json.dumps(row), flush=True)
                        continue
                    one, one_count = f"CpuOne{index}", min(count, ONE_AT_A_TIME_COUNT)
                    trio.run(write_backlog, master.ready["listen"], one, one_count)
                    row["one_at_a_time"] = consume(root, proxy.ready["listen"], "consume-one", second, one, f"CpuOne{index}", one_count,
                                                   pids, master.ready["listen"])  # fmt: skip
                elif mode == "trio-send":
                    row = {"tasks": first, **trio.run(trio_send, master.ready["listen"], first, int(second), brokers)}
                else:
                    raise SystemExit(f"unknown mode {mode!r}: producer, consumer or trio-send")
                print(json.dumps(row), flush=True)
        finally:
            for process in processes:
                process.stop()
        with open(proxy.log_path) as log:  # what the proxy said when it stopped (its counters)
            stopping = [line.strip() for line in log if "stopping:" in line]
        print(json.dumps({"proxy_stopping": stopping[-1] if stopping else ""}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from usage import help_or_usage

    help_or_usage(__doc__, arguments_min=3)
    main()
