"""Where one sender's time goes through the proxy (docs/design/proxy.md, "Where one sender's time goes").

    PYTHONPATH=TREE python scripts/dev/proxy_path.py [SECONDS] [ROUNDS]

Starts ``hasvc bench proxy``'s cluster (a SYNC_MASTER master, its slave, the proxy and the null
proxy, from the hasvc code on PYTHONPATH) in a temporary directory and prints one JSON line per
round with, side by side:

* ``null`` and ``proxy``: the official Producer with one sender for SECONDS through the null proxy
  and through the proxy (``hasvc.tools.bench.proxy_client``): the rate and the mean cycle (µs a
  message); ``extra_us`` is what the real proxy adds to a message's cycle.
* ``lane_back_to_back`` and ``lane_paced``: the master's SYNC_MASTER round trip as the proxy's send
  lane sees it (``hasvc.proxy.lane.SendLane`` in this process, on uvloop, the proxy's own
  SEND_IDEMPOTENT requests with a 1 KiB body), first back to back, then with the CPUs left idle
  between requests for as long as the official client and gRPC take between two sends through the
  proxy (the null proxy's cycle): p50 and mean µs, and the master's and slave's CPU a put from
  /proc/PID/stat. On a VM whose idle vCPUs halt, the paced figure is what a one-sender proxy pays.

Nothing here asserts anything; it measures, on a shared machine, for comparing builds and for
reading where the time goes.
"""

import asyncio
import json
import os
import sys
import tempfile
import time

from hasvc.proxy.lane import SendLane
from hasvc.protocol import client as cp
from hasvc.tools.bench import proxy as bench

LANE_COUNT = 2000  # requests a lane measurement sends (the paced one takes ~2 s)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Cluster:
    """What the lane reads of the failover client: the master's address and a generation."""

    def __init__(self, address: str):
        self.address, self.generation = address, 0


async def lane_round_trips(master: str, pids: dict, count: int, pause_seconds: float) -> dict:
    lane = SendLane(_Cluster(master), secret=None, tls_ca=None)
    producer_id = f"proxy-path-{os.getpid()}-{time.time_ns()}"

    def request(sequence: int) -> cp.SendRequest:
        return cp.SendRequest("ProxyPath", sequence % 4, [b"x" * 1024], [b"UNIQ_KEY\x01proxy-path\x02"], 0,
                              int(time.time() * 1000), producer_id, sequence)  # fmt: skip

    try:
        while await lane.send(request(0)) is None:  # the first send connects
            await asyncio.sleep(0.05)
        latencies = []
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        started = time.monotonic()
        for sequence in range(1, count + 1):
            sent = time.perf_counter()
            results = await lane.send(request(sequence))
            latencies.append(time.perf_counter() - sent)
            assert results is not None and results[0].status == "PUT_OK", results
            if pause_seconds:
                time.sleep(pause_seconds)  # the loop's thread sleeps: the CPUs go idle, as between a proxy's sends
        elapsed = time.monotonic() - started
        after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    finally:
        lane.close()
    latencies.sort()
    return {"p50_us": round(1e6 * latencies[len(latencies) // 2]), "mean_us": round(1e6 * sum(latencies) / count),
            "rate": round(count / elapsed),
            "cpu_us": {name: round(1e6 * (after[name] - before[name]) / count) for name in pids}}  # fmt: skip


def official(root: str, endpoint: str, seconds: float, topic: str) -> dict:
    result = bench._official(endpoint, root, "produce", 1, seconds, 1024, topic)
    return {"rate": round(result["rate"]), "cycle_us": round(1e6 / result["rate"]) if result["rate"] else None,
            "errors": result["errors"]}  # fmt: skip


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    import uvloop

    with tempfile.TemporaryDirectory(prefix="hasvc-proxy-path-") as root:
        processes, master, proxy, null = bench._start(root)
        slave = next(p for p in processes if p.name == "slave")
        pids = {"master": master.pid, "slave": slave.pid}
        try:
            for index in range(rounds):
                row = {"load": os.getloadavg()[0],
                       "null": official(root, null.ready["listen"], seconds, f"PathNull{index}"),
                       "proxy": official(root, proxy.ready["listen"], seconds, f"Path{index}")}  # fmt: skip
                row["extra_us"] = row["proxy"]["cycle_us"] - row["null"]["cycle_us"]
                row["lane_back_to_back"] = uvloop.run(lane_round_trips(master.ready["listen"], pids, LANE_COUNT, 0.0))
                pause = row["null"]["cycle_us"] / 1e6
                row["lane_paced"] = uvloop.run(lane_round_trips(master.ready["listen"], pids, LANE_COUNT, pause))
                print(json.dumps(row), flush=True)
        finally:
            for process in processes:
                process.stop()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from usage import help_or_usage

    help_or_usage(__doc__, arguments_min=0)
    main()
