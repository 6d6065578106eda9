"""Where one put's time goes in a SYNC_MASTER pair, one writer: the system calls of the master or
of the slave, timed by ``strace``, cut into the hops of a put.

    python scripts/dev/classic_hop_times.py TREE master|slave [SECONDS] [ROUNDS] [--load PATH]

Starts a master and a slave from TREE's code as scripts/dev/cpu_per_put.py does (SYNC_MASTER,
ASYNC_FLUSH), drives the master with the C load generator (scripts/hasvc_load.c: one writer,
1 KiB), and for SECONDS (default 3) traces the master or the slave with ``strace -f -tt -T``,
ROUNDS times (default 1, a new pair each). Prints, per round, the medians of the hops it finds
in the trace of the process's event loop (the thread that reads the frames):

    master: client frame read -> push written to the slave -> the slave's report read ->
            PUT_OK written; and after it: PUT_OK written -> the loop's next wait for readiness
            (the work after the answer), and how often the next frame had already arrived by
            then (that work then delays the next put)
    slave:  frame read -> pwrite -> report written; report written -> the next wait
            (``after_appends``: dispatch), and how often the next frame was already there

and the median count of each system call between two frames (what else runs a put). Why: the
wall-time figures of one writer move with the machine's load both ways (a busy machine's vCPUs do
not halt, which even lowers a bare relay's latency); the time between two system calls of one
process is that process's own work, which load distorts far less. strace slows each system call
(tens of us), so compare hops in A/B pairs of two trees, not as absolute figures; Python between
two calls is not slowed. Needs ``strace`` and ``cc``.
"""

import collections
import os
import statistics
import subprocess
import sys
import time

STRACE_ATTACH_SECONDS = 0.5  # strace attaches to every thread before the load starts
WARM_UP_SECONDS = 1.0
FRAME_SIZE_MIN = 1024  # a 1 KiB put's frame (client -> master, master -> slave) is at least this
REPORT_SIZE = 8  # a slave's report (hasvc/protocol/ha.py REPORT)
ANSWER_SIZE_MAX = 200  # a PUT_OK answer to one message is well under this
# A readiness wait that returned within this found its descriptor ready already (strace's own
# cost of an epoll_wait that does not block is ~5-15 us here).
WAIT_BLOCKED_MIN_SECONDS = 30e-6
_READS = ("read", "readv", "recvfrom")
_WRITES = ("write", "writev", "sendmsg", "sendto")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from raft_hop_times import _calls  # noqa: E402  (the trace's lines, parsed as for a DLedger member)


def _loop_calls(path: str, frame_read) -> list:
    """The calls of the thread that reads the frames (the event loop), in order."""
    calls = list(_calls(path))
    counts = collections.Counter(pid for pid, _, call, fd, result, _, text in calls if frame_read(call, result, text))
    if not counts:
        return []
    loop = counts.most_common(1)[0][0]
    return [each for each in calls if each[0] == loop]


def _median_counts(between: list[collections.Counter]) -> str:
    names = sorted({name for counter in between for name in counter})
    return ", ".join(f"{name} {statistics.median(counter[name] for counter in between):g}" for name in names)


def _after(calls: list, index: int) -> tuple[float, bool] | None:
    """From the call at ``index`` (an answer or a report written): (seconds to the start of the
    loop's next readiness wait, whether that wait found the next frame already there)."""
    end = calls[index][1] + calls[index][5]
    for _, at, call, _, _, inside, _ in calls[index + 1 :]:
        if call in ("epoll_wait", "epoll_pwait", "poll", "select"):
            return at - end, inside < WAIT_BLOCKED_MIN_SECONDS
    return None


def master_hops(path: str) -> tuple[dict[str, list[float]], str]:
    calls = _loop_calls(path, lambda call, result, text: call in _READS and result >= FRAME_SIZE_MIN)
    client = next((fd for _, _, call, fd, _, _, text in calls if call in _WRITES and "PUT_OK" in text), None)
    hops = {name: [] for name in ("frame read -> push written", "push written -> report read", "report read -> PUT_OK written",
                                  "frame read -> PUT_OK written", "PUT_OK written -> next wait", "next frame there already, % of puts")}  # fmt: skip
    between: list[collections.Counter] = []
    put = None
    for index, (_, at, call, fd, result, inside, text) in enumerate(calls):
        if fd == client and call in _READS and result >= FRAME_SIZE_MIN:
            if put is not None and put.get("answered"):
                between.append(put["counts"])
            put = {"frame": at + inside, "counts": collections.Counter()}
            continue
        if put is None:
            continue
        put["counts"][call] += 1
        if put.get("answered"):
            continue
        if call in _WRITES and fd != client and result >= FRAME_SIZE_MIN and "push" not in put:
            put["push"] = at + inside
        elif call in _READS and fd != client and 0 < result < FRAME_SIZE_MIN and "push" in put:
            put["report"] = at + inside
        elif fd == client and call in _WRITES and "PUT_OK" in text and "report" in put:
            after = _after(calls, index)
            for name, value in (("frame read -> push written", put["push"] - put["frame"]),
                                ("push written -> report read", put["report"] - put["push"]),
                                ("report read -> PUT_OK written", at + inside - put["report"]),
                                ("frame read -> PUT_OK written", at + inside - put["frame"])):  # fmt: skip
                hops[name].append(value)
            if after is not None:
                hops["PUT_OK written -> next wait"].append(after[0])
                hops["next frame there already, % of puts"].append(float(after[1]))
            put["answered"] = True
    return hops, _median_counts(between)


def slave_hops(path: str) -> tuple[dict[str, list[float]], str]:
    calls = _loop_calls(path, lambda call, result, text: call in _READS and result >= FRAME_SIZE_MIN)
    hops = {name: [] for name in ("frame read -> pwrite", "pwrite -> report written", "frame read -> report written",
                                  "report written -> next wait", "next frame there already, % of puts")}  # fmt: skip
    between: list[collections.Counter] = []
    frame = None
    for index, (_, at, call, _, result, inside, _) in enumerate(calls):
        if call in _READS and result >= FRAME_SIZE_MIN:
            if frame is not None and frame.get("reported"):
                between.append(frame["counts"])
            frame = {"read": at + inside, "counts": collections.Counter()}
            continue
        if frame is None:
            continue
        frame["counts"][call] += 1
        if frame.get("reported"):
            continue
        if call == "pwrite64" and "pwrite" not in frame:
            frame["pwrite"] = at
        elif call in _WRITES and result == REPORT_SIZE and "pwrite" in frame:
            after = _after(calls, index)
            for name, value in (("frame read -> pwrite", frame["pwrite"] - frame["read"]),
                                ("pwrite -> report written", at + inside - frame["pwrite"]),
                                ("frame read -> report written", at + inside - frame["read"])):  # fmt: skip
                hops[name].append(value)
            if after is not None:
                hops["report written -> next wait"].append(after[0])
                hops["next frame there already, % of puts"].append(float(after[1]))
            frame["reported"] = True
    return hops, _median_counts(between)


def one_round(tree: str, member: str, seconds: float, load: str | None) -> tuple[dict[str, list[float]], str]:
    from bench_pair import start_pair

    pair, load, host, port = start_pair(tree, load)
    trace = os.path.join(pair.root if hasattr(pair, "root") else "/tmp", f"classic-hops-{os.getpid()}.strace")
    try:
        command = [load, host, port, "1", "1", "1", str(WARM_UP_SECONDS), "1024"]
        subprocess.run(command, capture_output=True, check=True)
        tracer = subprocess.Popen(["strace", "-f", "-tt", "-T", "-p", str(pair.pids[member]), "-o", trace], stderr=subprocess.DEVNULL)
        try:
            time.sleep(STRACE_ATTACH_SECONDS)
            command[6] = str(seconds)
            subprocess.run(command, capture_output=True, check=True)
        finally:
            tracer.terminate()
            tracer.wait()
        return master_hops(trace) if member == "master" else slave_hops(trace)
    finally:
        pair.close()
        if os.path.exists(trace):
            os.remove(trace)


def main() -> None:
    from bench_pair import take_load_option

    args = sys.argv[1:]
    load = take_load_option(args)
    tree, member = os.path.abspath(args[0]), args[1]
    if member not in ("master", "slave"):
        raise SystemExit(f"the member is master or slave, not {member!r}")
    seconds = float(args[2]) if len(args) > 2 else 3.0
    rounds = int(args[3]) if len(args) > 3 else 1
    for number in range(rounds):
        hops, between = one_round(tree, member, seconds, load)
        count = max(map(len, hops.values()))
        print(f"{tree} {member}, round {number + 1}: {count} puts traced; medians, us:")
        for name, values in hops.items():
            if name.endswith("% of puts"):
                shown = f"{100 * statistics.mean(values):7.0f}%" if values else "       -"
            else:
                shown = f"{1e6 * statistics.median(values):8.0f}" if values else "       -"
            print(f"  {shown}  {name}")
        print(f"  system calls a put (medians): {between}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from usage import help_or_usage

    help_or_usage(__doc__, arguments_min=2)
    main()
