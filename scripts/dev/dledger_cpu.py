"""CPU per message of each member of a local DLedger group, and of its load generator, under
scripts/hasvc_load.c; and whether the machine's cores were saturated meanwhile.

    python scripts/dev/dledger_cpu.py TREE PRODUCERS SECONDS [ROUNDS] [BATCH] [--connections 1] [--nodes 3]
        [--flush async|sync] [--load PATH] [--set NAME=VALUE ...]

Starts ``hasvc node`` x nodes from the hasvc code in TREE (``LocalGroup``, as ``hasvc bench
sync-write --mode dledger`` does: etcd-like timing, 1 KiB), runs ``hasvc_load 127.0.0.1 PORT
CONNECTIONS PRODUCERS BATCH SECONDS 1024`` against the leader ROUNDS times (one connection by
default, as the bench), and prints one JSON line per round: acked msgs/s, p50/p99 in
microseconds, each member's and the load generator's CPU (user + system from /proc, every
thread) in microseconds per acknowledged message and in % of one core over the window, their
sum, and the whole machine's busy share over the window from /proc/stat (``machine_busy_percent``,
100 % = every core busy; other helpers' work included) with ``uptime``'s 1-minute load. Per
member also: its system time per message, its worker threads' CPU per message (the entry files'
syncs), and its main thread's time runnable but waiting for a core (% of the window, from
schedstat), its sleeps and preemptions per message (voluntary and involuntary context switches):
a main thread whose CPU plus runqueue wait is near 100 % never waits for anything but a core.

Why: the group's three members and the load generator share this machine's cores. If their sum
is near the cores' capacity, CPU per message (on any of them: followers' too) is what bounds the
rate; if the group leaves a core idle while the leader is below 100 %, a pass's latency is. CPU
per message moves far less between runs on a shared machine than rates do: compare two builds
by it, alternately, a fresh group each (TREE: a `git archive` of a commit with the C module
built or copied in). ``--set NAME=VALUE`` (repeatable): a setting given to every member, as
``hasvc node --set`` (e.g. ``page_cache_keep_size=268435456``).
"""

import json
import os
import re
import resource
import subprocess
import sys
import time

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def system_seconds(pid: int) -> float:
    """The kernel's part of ``cpu_seconds`` (system calls, page faults, writeback started by msync)."""
    with open(f"/proc/{pid}/stat") as file:
        return int(file.read().rsplit(")", 1)[1].split()[12]) / CLOCK_TICKS


def thread_cpu_seconds(pid: int) -> float:
    """CPU of every thread of ``pid`` but its main thread: the worker threads (the entry files'
    syncs, consume-queue flushes); threads that ended meanwhile are not counted."""
    total = 0.0
    for task in os.listdir(f"/proc/{pid}/task"):
        if int(task) == pid:
            continue
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


def schedule(pid: int) -> tuple[float, int, int, float, int]:
    """Of ``pid``'s main thread (seconds runnable but waiting for a core, voluntary context
    switches -- sleeps --, involuntary ones -- preemptions), then of every thread (the first
    two) (/proc/PID/task/*/schedstat and status)."""
    main_waited, main_sleeps, main_preempted, waited, sleeps = 0.0, 0, 0, 0.0, 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as file:
                task_waited = int(file.read().split()[1]) / 1e9
            with open(f"/proc/{pid}/task/{task}/status") as file:
                status = file.read()
            task_sleeps = int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))
            task_preempted = int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))
        except FileNotFoundError:  # a worker thread that ended meanwhile
            continue
        waited, sleeps = waited + task_waited, sleeps + task_sleeps
        if int(task) == pid:
            main_waited, main_sleeps, main_preempted = task_waited, task_sleeps, task_preempted
    return main_waited, main_sleeps, main_preempted, waited, sleeps


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every core since boot (/proc/stat's first line)."""
    with open("/proc/stat") as file:
        fields = [int(value) for value in file.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - idle, total


def take_option(args: list[str], name: str, default: str | None) -> str | None:
    if name not in args:
        return default
    index = args.index(name)
    value = args[index + 1]
    del args[index : index + 2]
    return value


def main() -> None:
    args = sys.argv[1:]
    load = take_option(args, "--load", None)
    nodes = int(take_option(args, "--nodes", "3"))
    flush = take_option(args, "--flush", "async")
    connections = int(take_option(args, "--connections", "1"))
    settings = {}
    while (setting := take_option(args, "--set", None)) is not None:
        name, _, value = setting.partition("=")
        settings[name] = value
    tree, producers, seconds = os.path.abspath(args[0]), int(args[1]), float(args[2])
    rounds = int(args[3]) if len(args) > 3 else 1
    batch = int(args[4]) if len(args) > 4 else 1
    sys.path.insert(0, tree)
    os.chdir(tree)  # the members' `python -m hasvc.cli` runs TREE's code
    from hasvc.tools.bench.sync_write import LocalGroup, build_c_load

    load = load or build_c_load()
    if load is None:
        raise SystemExit("a C compiler (cc) is needed to build scripts/hasvc_load.c")
    group = LocalGroup(nodes=nodes, flush=flush, settings=settings)
    try:
        host, _, port = group.master["listen"].rpartition(":")
        pids = group.pids
        for _ in range(rounds):
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            waits_before = {name: schedule(pid) for name, pid in pids.items()}
            system_before = {name: system_seconds(pid) for name, pid in pids.items()}
            threads_before = {name: thread_cpu_seconds(pid) for name, pid in pids.items()}
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            machine_before = machine_ticks()
            started = time.perf_counter()
            done = subprocess.run([load, host, port, str(connections), str(producers), str(batch), str(seconds), "1024"],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            elapsed = time.perf_counter() - started
            machine_after = machine_ticks()
            after = {name: cpu_seconds(pid) for name, pid in pids.items()}
            system = {name: system_seconds(pid) - system_before[name] for name, pid in pids.items()}
            threads = {name: thread_cpu_seconds(pid) - threads_before[name] for name, pid in pids.items()}
            waits = {name: [a - b for a, b in zip(schedule(pid), waits_before[name])] for name, pid in pids.items()}
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
            after["load generator"] = (used.ru_utime + used.ru_stime) - (children.ru_utime + children.ru_stime)
            before["load generator"] = 0.0
            data = json.loads(done.stdout)
            messages = max(data["acked"], 1)
            spent = {name: after[name] - before[name] for name in after}
            busy = (machine_after[0] - machine_before[0]) / max(machine_after[1] - machine_before[1], 1)
            print(json.dumps({
                "tree": tree, "settings": settings, "connections": connections, "producers": producers, "batch": batch, "flush": flush,
                "acked_per_second": round(data["acked"] / data["seconds"]), "p50_us": data["p50_us"], "p99_us": data["p99_us"],
                "cpu_us_per_message": {name: round(1e6 * value / messages, 2) for name, value in spent.items()},
                "cpu_percent": {name: round(100 * value / elapsed, 1) for name, value in spent.items()},
                "system_us_per_message": {name: round(1e6 * value / messages, 2) for name, value in system.items()},
                "worker_threads_us_per_message": {name: round(1e6 * value / messages, 2) for name, value in threads.items()},
                "main_thread_runqueue_wait_percent": {name: round(100 * value[0] / elapsed, 1) for name, value in waits.items()},
                # running or waiting for a core: near 100 %, the main thread never waited for work
                "main_thread_runnable_percent": {name: round(100 * (spent[name] - threads[name] + value[0]) / elapsed, 1)
                                                 for name, value in waits.items()},
                "main_thread_sleeps_per_message": {name: round(value[1] / messages, 3) for name, value in waits.items()},
                "main_thread_preemptions_per_message": {name: round(value[2] / messages, 3) for name, value in waits.items()},
                "runqueue_wait_percent": {name: round(100 * value[3] / elapsed, 1) for name, value in waits.items()},
                "sleeps_per_message": {name: round(value[4] / messages, 3) for name, value in waits.items()},
                "group_and_load_percent": round(100 * sum(spent.values()) / elapsed, 1),
                "machine_busy_percent": round(100 * busy, 1), "cores": os.cpu_count(),
                "load_average_1m": os.getloadavg()[0], "statuses": data["statuses"],
            }), flush=True)  # fmt: skip
    finally:
        group.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from usage import help_or_usage

    help_or_usage(__doc__, arguments_min=3)
    main()
