"""The hops of one round trip of a whole load, seen from the kernel: a SYNC_MASTER pair or a
DLedger group under N writers on one connection, every process's system calls and context
switches recorded together by ``perf``, cut into the hops of each cycle.

    python scripts/dev/cycle_hops.py TREE classic|dledger [PRODUCERS] [--seconds 0.3] [--show 3] [--load PATH]

Starts the pair (as scripts/dev/cpu_per_put.py: SYNC_MASTER, ASYNC_FLUSH) or the group of three
(as scripts/dev/dledger_cpu.py: etcd-like timing, quorum in memory, page_cache_keep_size 256 MiB)
from TREE's code, drives it with the C load generator (scripts/hasvc_load.c: PRODUCERS writers,
default 64, 1 KiB, one connection), and after two seconds records ``perf record -a -e
raw_syscalls:sys_enter,raw_syscalls:sys_exit,sched:sched_switch,sched:sched_wakeup`` for
``--seconds``. A cycle starts where the load generator's write of a pass of requests returns; in
it the tool marks, the first time each happens, the master's or leader's (``L``) read of those
requests, its ``pwrite`` (start and end), its pushes (start, end), each slave's or follower's read
of a push and its acknowledgement, the leader's read of an acknowledgement, its answer and the
load generator's read of it. Prints the median time of each mark from the cycle's start, then
``--show`` cycles in full with every context switch on either core between two marks (who ran,
who was preempted: ``(R)`` runnable, ``(S)`` asleep).

Why: with many writers on one connection each pass holds every writer's request, so the load
runs in lock-step, one pass in flight, and its rate is the writers over the cycle's length.
Where that length goes -- the leader's own serial work, a follower's, a wake-up that waited for a
core -- is what CPU per message (scripts/dev/dledger_cpu.py) cannot say and what decides whether
a reordering can help. ``perf`` records in the kernel (no ptrace: the processes run at ~85 % of
their untraced rate, against ~65 % under ``perf trace`` or far less under ``strace``), so the
hops keep their proportions; compare the pair and the group in one window. Needs root, ``perf``
and ``cc``.
"""

import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

WARM_UP_SECONDS = 2.0
LOAD_SECONDS = 6  # the load generator's run: covers the warm-up and the recording
# A pass of requests (the load's write, the leader's read) and a push of its entries or records are
# told from acknowledgements and answers by their size: at least this much a writer (~1.1 KiB each),
# at most PASS_MIN_MAX (64 writers' pass is ~70 KiB; acknowledgements and a pass's answers are less).
PASS_MIN_A_WRITER = 900
PASS_MIN_MAX = 10000
ACK_SIZES = (8, 12, 55)  # a slave's report (8), its frame header read (12), a follower's PushResponse frame (55)
ANSWER_MAX = 10000  # a pass's answers (64 x 43 bytes)
SYSCALLS = {0: "read", 1: "write", 18: "pwrite", 19: "readv", 20: "writev", 45: "recvfrom", 44: "sendto"}
READS, WRITES = (0, 19, 45), (1, 20, 44)
# A line of ``perf script``: command, thread id, [cpu], timestamp, event, the rest. perf pads the
# timestamp to a width, so on a host up for a short while spaces come before it.
PERF_LINE = re.compile(r"\s*(.+?)\s+(\d+) \[(\d+)\]\s+([\d.]+):\s+(\S+): (.*)")


def take_option(args: list[str], name: str, default: str | None) -> str | None:
    if name in args:
        at = args.index(name)
        value = args[at + 1]
        del args[at : at + 2]
        return value
    return default


def record(tree: str, mode: str, producers: int, seconds: float, load: str | None, work: str) -> dict:
    """Run the load against a fresh pair or group and record it; the processes' roles by pid."""
    sys.path.insert(0, tree)
    os.chdir(tree)
    from hasvc.tools.bench.sync_write import LocalGroup, LocalPair, build_c_load

    load = load or build_c_load()
    if load is None:
        raise SystemExit("a C compiler (cc) is needed to build scripts/hasvc_load.c")
    if mode == "dledger":
        cluster = LocalGroup(nodes=3, flush="async", settings={"page_cache_keep_size": "268435456"})
    else:
        cluster = LocalPair(role="sync", flush="async")
        cluster.wait_connected()
    try:
        host, _, port = cluster.master["listen"].rpartition(":")
        generator = subprocess.Popen([load, host, port, "1", str(producers), "1", str(LOAD_SECONDS), "1024"],
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(WARM_UP_SECONDS)
        subprocess.run(["perf", "record", "-a", "-o", os.path.join(work, "perf.data"), "-e",
                        "raw_syscalls:sys_enter,raw_syscalls:sys_exit,sched:sched_switch,sched:sched_wakeup",
                        "--", "sleep", str(seconds)], capture_output=True, check=True)  # fmt: skip
        result = json.loads(generator.communicate()[0])
        roles = {}
        for name, pid in cluster.pids.items():
            roles[pid] = "L" if ("leader" in name or name == "master") else name.split()[-1]
        return {"roles": roles, "load": result}
    finally:
        cluster.close()


def events(work: str, roles: dict[int, str]) -> list[tuple]:
    """(time in us, who, kind, detail) of the recording, in time order; who: a role, "load", or
    the thread's command/tid."""
    script = subprocess.run(["perf", "script", "-i", os.path.join(work, "perf.data")], capture_output=True, text=True,
                            check=True).stdout  # fmt: skip
    found = []

    def who(command: str, tid: int) -> str:
        if tid in roles:
            return roles[tid]
        return "load" if command.startswith("hasvc_load") else f"{command}/{tid}"

    for line in script.splitlines():
        match = PERF_LINE.match(line)
        if match is None:
            continue
        command, tid, cpu, at, kind, rest = match.groups()
        at_us, name = float(at) * 1e6, who(command, int(tid))
        if kind == "raw_syscalls:sys_enter":
            call = re.match(r"NR (\d+) ", rest)
            if call:
                found.append((at_us, name, "enter", int(call.group(1))))
        elif kind == "raw_syscalls:sys_exit":
            call = re.match(r"NR (\d+) = (-?\d+)", rest)
            if call:
                found.append((at_us, name, "exit", (int(call.group(1)), int(call.group(2)))))
        elif kind == "sched:sched_switch":
            state = re.search(r"prev_state=(\S+)", rest).group(1)
            next_command, next_tid = re.search(r"next_comm=(.+?) next_pid=(\d+)", rest).groups()
            found.append((at_us, name, "switch", f"cpu{int(cpu)}: {name} ({state}) -> {who(next_command, int(next_tid))}"))
    found.sort(key=lambda event: event[0])
    return found


def marks(found: list[tuple], producers: int) -> list[tuple[float, str]]:
    """The hops' marks (time, name) of the recording (see the module)."""
    pass_min = min(PASS_MIN_MAX, PASS_MIN_A_WRITER * producers)
    out = []
    for at, name, kind, detail in found:
        if kind == "enter" and name == "L" and detail == 18:
            out.append((at, "L pwrite starts"))
        elif kind == "enter" and name == "L" and detail == 20:
            out.append((at, "L push starts"))
        if kind != "exit":
            continue
        call, returned = detail
        if name == "load":
            if call == 1 and returned >= pass_min:
                out.append((at, "load wrote requests"))
            elif call == 0 and 0 < returned <= ANSWER_MAX:
                out.append((at, "load read answers"))
        elif name == "L":
            if call in READS and returned >= pass_min:
                out.append((at, "L read requests"))
            elif call == 18:
                out.append((at, "L pwrite ends"))
            elif call == 20 and returned >= pass_min:
                out.append((at, "L push ends"))
            elif call in READS and returned in ACK_SIZES:
                out.append((at, "L read an ack"))
            elif call == 1 and 0 < returned <= ANSWER_MAX:
                out.append((at, "L wrote answers"))
        elif "/" not in name:  # a slave or follower
            if call in READS and (returned >= pass_min or returned == 12):
                out.append((at, f"{name} read a push"))
            elif call in WRITES and returned in ACK_SIZES:
                out.append((at, f"{name} acked"))
    return out


def main() -> None:
    args = sys.argv[1:]
    seconds = float(take_option(args, "--seconds", "0.3"))
    show = int(take_option(args, "--show", "3"))
    load = take_option(args, "--load", None)
    tree, mode = os.path.abspath(args[0]), args[1]
    producers = int(args[2]) if len(args) > 2 else 64
    if mode not in ("classic", "dledger"):
        raise SystemExit(f"the mode is classic or dledger, not {mode!r}")
    if shutil.which("perf") is None:
        raise SystemExit("perf is needed (linux-perf)")
    work = tempfile.mkdtemp(prefix="hasvc-cycle-hops-")
    try:
        recorded = record(tree, mode, producers, seconds, load, work)
        found = events(work, recorded["roles"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cycles, current = [], None
    for at, name in marks(found, producers):
        if name == "load wrote requests":
            if current is not None:
                cycles.append(current)
            current = (at, [])
        elif current is not None:
            current[1].append((at - current[0], name))
    firsts = collections.defaultdict(list)
    for _, seen in cycles:
        first: dict[str, float] = {}
        for offset, name in seen:
            first.setdefault(name, offset)
        for name, offset in first.items():
            firsts[name].append(offset)
    rate = recorded["load"]["acked"] / recorded["load"]["seconds"]
    print(f"{mode}, {producers} writers on one connection: {rate:,.0f} acked/s over the whole run (recorded part traced), "
          f"{len(cycles)} cycles recorded; each mark's median time from the load's write, in us (n: cycles that had it)")
    for name, offsets in sorted(firsts.items(), key=lambda item: statistics.median(item[1])):
        print(f"  {statistics.median(offsets):7.0f}  {name}  (n={len(offsets)})")
    for start, seen in cycles[len(cycles) // 2 : len(cycles) // 2 + show]:
        print("--- a cycle, with the context switches in it")
        end = start + (seen[-1][0] if seen else 0)
        lines = [(at - start, detail) for at, _, kind, detail in found if start <= at <= end and kind == "switch"]
        lines += [(offset, f"* {name}") for offset, name in seen]
        for offset, text in sorted(lines, key=lambda line: line[0]):
            print(f"  {offset:7.0f}  {text}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from usage import help_or_usage

    help_or_usage(__doc__, arguments_min=2)
    main()
