"""CPU per put of a local SYNC_MASTER pair's master and slave under scripts/hasvc_load.c.

    python scripts/dev/cpu_per_put.py TREE CONNECTIONS PRODUCERS SECONDS [ROUNDS] [BATCH] [--load PATH]

Starts a master and a slave from the hasvc code in TREE (as scripts/bench_peers does: SYNC_MASTER,
ASYNC_FLUSH, page_cache_keep_size 256 MiB on both), runs ``hasvc_load 127.0.0.1 PORT CONNECTIONS
PRODUCERS BATCH SECONDS 1024`` ROUNDS times, and prints one JSON line per round: acked/s, p50/p99
in microseconds, and each process's CPU (user + system from /proc/PID/stat, every thread) divided
by the requests answered. On a shared machine CPU per put moves much less than rates do, so it is
the figure to compare two builds by (alternate them, a fresh pair each). Builds the load generator
(cached, as `hasvc bench sync-write` does: `build_c_load`) unless --load names one.
"""

import json
import os
import subprocess
import sys


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the process so far."""
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pair import start_pair, take_load_option  # noqa: E402


def main() -> None:
    args = sys.argv[1:]
    load = take_load_option(args)
    tree, connections, producers, seconds = args[0], int(args[1]), int(args[2]), float(args[3])
    rounds = int(args[4]) if len(args) > 4 else 1
    batch = args[5] if len(args) > 5 else "1"
    pair, load, host, port = start_pair(os.path.abspath(tree), load)
    try:
        for _ in range(rounds):
            before = {name: cpu_seconds(pid) for name, pid in pair.pids.items()}
            done = subprocess.run([load, host, port, str(connections), str(producers), batch, str(seconds), "1024"],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            after = {name: cpu_seconds(pid) for name, pid in pair.pids.items()}
            data = json.loads(done.stdout)
            requests = data["requests"]
            print(json.dumps({
                "tree": tree, "connections": connections, "producers": producers, "acked_per_second": round(data["acked"] / data["seconds"]),
                "p50_us": data["p50_us"], "p99_us": data["p99_us"],
                **{f"{name}_cpu_us_per_put": round(1e6 * (sum(after[name]) - sum(before[name])) / requests, 1) for name in pair.pids},
                # of which in the kernel (system calls, the loopback's TCP work, page faults)
                **{f"{name}_sys_us_per_put": round(1e6 * (after[name][1] - before[name][1]) / requests, 1) for name in pair.pids},
                "statuses": data["statuses"],
            }), flush=True)  # fmt: skip
    finally:
        pair.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from usage import help_or_usage

    help_or_usage(__doc__, arguments_min=4)
    main()
