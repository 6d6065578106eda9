"""Where one put's time goes in a DLedger group with ``--flush sync``, one writer: the system calls
of one member, timed by ``strace``, cut into the hops of a put.

    python scripts/dev/raft_hop_times.py TREE leader|follower [SECONDS] [ROUNDS]

Starts three ``hasvc node`` members from TREE's code (``--flush sync``, etcd-like timing), drives
the leader with the C load generator (scripts/hasvc_load.c: one writer, 1 KiB), and for SECONDS
(default 3) traces the leader or one follower with ``strace -f -tt -T``, ROUNDS times (default 1,
a new group each). Prints, per round, the medians of the hops it finds in the trace:

    leader:   client frame read -> first push written -> last push written -> own msync (its
              length) -> the acknowledgement that commits read -> PUT_OK written
    follower: push read -> pwrite -> msync (its length) -> acknowledgement written

Why: a put at one writer crosses four processes and two fsyncs; the wall-time tools
(put_path_time.py) see one process's functions, not the order of its system calls. strace slows
each system call (tens of us), so read hops in A/B pairs of two trees, not as absolute figures;
Python between two calls is not slowed. Needs ``strace`` and ``cc``.
"""

import os
import re
import statistics
import subprocess
import sys
import time

STRACE_ATTACH_SECONDS = 0.5  # strace attaches to every thread before the load starts
WARM_UP_SECONDS = 1.0
_LINE = re.compile(r"^(\d+)\s+(\d+):(\d+):([\d.]+)\s+(\w+)\((\d+)?(.*?)(?:=\s*(-?\d+))?\s*(?:<([\d.]+)>)?$")


def _calls(path: str):
    """(pid, start seconds, call, fd, result, seconds inside, text) of each whole line of a trace."""
    with open(path) as file:
        for line in file:
            match = _LINE.match(line.rstrip())
            if match is None or "unfinished" in line or "resumed" in line:
                continue
            pid, hours, minutes, seconds, call, fd, text, result, inside = match.groups()
            yield (pid, int(hours) * 3600 + int(minutes) * 60 + float(seconds), call, fd, int(result or -1),
                   float(inside or 0), text)  # fmt: skip


def leader_hops(path: str) -> dict[str, list[float]]:
    calls = list(_calls(path))
    client = next((fd for _, _, call, fd, _, _, text in calls if call == "write" and "PUT_OK" in text), None)
    hops = {name: [] for name in ("frame -> first push", "first -> last push", "last push -> msync", "msync",
                                  "msync end -> committing ack read", "committing ack read -> PUT_OK",
                                  "frame -> PUT_OK")}  # fmt: skip
    put = None
    for _, at, call, fd, result, inside, text in calls:
        if fd == client and call in ("read", "readv", "recvfrom") and result > 0:
            put = {"frame": at + inside, "pushes": [], "acks": []}
        elif put is None:
            continue
        elif call == "writev" and fd != client:
            put["pushes"].append((at, at + inside))
        elif call == "msync" and "msync" not in put:
            put["msync"] = (at, inside)
        elif call == "read" and fd != client and 0 < result < 200:
            put["acks"].append(at + inside)
        elif fd == client and "PUT_OK" in text and put["pushes"] and "msync" in put and put["acks"]:
            ack = put["acks"][-1]
            (first, _), (_, last_end), (synced, length) = put["pushes"][0], put["pushes"][-1], put["msync"]
            for name, value in (("frame -> first push", first - put["frame"]), ("first -> last push", last_end - first),
                                ("last push -> msync", synced - last_end), ("msync", length),
                                ("msync end -> committing ack read", ack - synced - length),
                                ("committing ack read -> PUT_OK", at - ack), ("frame -> PUT_OK", at - put["frame"])):  # fmt: skip
                hops[name].append(value)
            put = None
    return hops


def follower_hops(path: str) -> dict[str, list[float]]:
    hops = {name: [] for name in ("push read -> pwrite", "pwrite -> msync", "msync", "msync end -> ack written",
                                  "push read -> ack written, less the msync")}  # fmt: skip
    pushes = {}  # pid -> the push being carried out
    for pid, at, call, _, result, inside, _ in _calls(path):
        push = pushes.get(pid)
        if call == "read" and result > 1024:
            pushes[pid] = {"read": at + inside}
        elif push is None:
            continue
        elif call == "pwrite64" and "pwrite" not in push:
            push["pwrite"] = at
        elif call == "msync" and "msync" not in push:
            push["msync"] = (at, inside)
        elif call == "writev" and 0 < result < 200 and "pwrite" in push and "msync" in push:
            (synced, length), read = push["msync"], push["read"]
            for name, value in (("push read -> pwrite", push["pwrite"] - read), ("pwrite -> msync", synced - push["pwrite"]),
                                ("msync", length), ("msync end -> ack written", at - synced - length),
                                ("push read -> ack written, less the msync", at - read - length)):  # fmt: skip
                hops[name].append(value)
            pushes[pid] = None
    return hops


def one_round(member: str, seconds: float, load: str) -> dict[str, list[float]]:
    from hasvc.tools.bench.sync_write import LocalGroup, run_once

    group = LocalGroup(nodes=3, flush="sync")
    trace = os.path.join(group.root, "strace.out")
    try:
        address, pids = group.master["listen"], group.pids
        run_once(address, pids, producers=1, connections=1, size=1024, batch=1, duration=WARM_UP_SECONDS, load_binary=load)
        pid = next(pid for name, pid in pids.items() if name.startswith("leader") == (member == "leader"))
        tracer = subprocess.Popen(["strace", "-f", "-tt", "-T", "-p", str(pid), "-o", trace], stderr=subprocess.DEVNULL)
        try:
            time.sleep(STRACE_ATTACH_SECONDS)
            run_once(address, pids, producers=1, connections=1, size=1024, batch=1, duration=seconds, load_binary=load)
        finally:
            tracer.terminate()
            tracer.wait()
        return leader_hops(trace) if member == "leader" else follower_hops(trace)
    finally:
        group.close()


def main() -> None:
    args = sys.argv[1:]
    tree, member = os.path.abspath(args[0]), args[1]
    if member not in ("leader", "follower"):
        raise SystemExit(f"the member is leader or follower, not {member!r}")
    seconds = float(args[2]) if len(args) > 2 else 3.0
    rounds = int(args[3]) if len(args) > 3 else 1
    sys.path.insert(0, tree)
    os.chdir(tree)  # the members' `python -m hasvc.cli` runs TREE's code
    from hasvc.tools.bench.sync_write import build_c_load

    load = build_c_load()
    if load is None:
        raise SystemExit("a C compiler (cc) is needed to build scripts/hasvc_load.c")
    for number in range(rounds):
        hops = one_round(member, seconds, load)
        count = max(map(len, hops.values()))
        print(f"{tree} {member}, round {number + 1}: {count} puts traced; medians, us:")
        for name, values in hops.items():
            shown = f"{1e6 * statistics.median(values):8.0f}" if values else "       -"
            print(f"  {shown}  {name}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from usage import help_or_usage

    help_or_usage(__doc__, arguments_min=2)
    main()
