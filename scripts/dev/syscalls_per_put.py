"""System calls per put of a local SYNC_MASTER pair's master and slave, by call.

    python scripts/dev/syscalls_per_put.py TREE CONNECTIONS PRODUCERS SECONDS [BATCH] [--load PATH]

Starts a master and a slave from the hasvc code in TREE (as scripts/dev/cpu_per_put.py does), warms
them up with one second of ``hasvc_load``, then attaches ``strace -f -c`` to both for one run of
``hasvc_load 127.0.0.1 PORT CONNECTIONS PRODUCERS BATCH SECONDS 1024`` and prints each process's
system calls per request, by call. Like Python calls (scripts/dev/calls_per_put.py) and unlike rates
or CPU time, the count does not depend on how busy the machine is: at one writer it repeats to
the hundredth. Rates under strace mean nothing. Needs strace (and ptrace permission).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

WARMUP_SECONDS = "1"
ATTACH_SECONDS = 1.0  # strace's attach to every thread, before the measured run starts


def strace_counts(path: str) -> dict[str, int]:
    """Calls by system call from ``strace -c`` output (the errors column may be empty)."""
    counts = {}
    with open(path) as file:
        for line in file:
            fields = line.split()
            if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
                counts[fields[-1]] = int(fields[3])
    return counts


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pair import start_pair, take_load_option  # noqa: E402


def main() -> None:
    args = sys.argv[1:]
    load = take_load_option(args)
    tree, connections, producers, seconds = os.path.abspath(args[0]), args[1], args[2], args[3]
    batch = args[4] if len(args) > 4 else "1"
    work = tempfile.mkdtemp(prefix="syscalls-per-put-")
    pair, load, host, port = start_pair(tree, load)
    try:
        subprocess.run([load, host, port, connections, producers, batch, WARMUP_SECONDS, "1024"], capture_output=True, check=True)
        tracers = {name: subprocess.Popen(["strace", "-f", "-c", "-o", os.path.join(work, name), "-p", str(pid)], stderr=subprocess.DEVNULL)
                   for name, pid in pair.pids.items()}  # fmt: skip
        time.sleep(ATTACH_SECONDS)
        done = subprocess.run([load, host, port, connections, producers, batch, seconds, "1024"], capture_output=True, text=True, check=True)
        for tracer in tracers.values():
            os.kill(tracer.pid, signal.SIGINT)
        for tracer in tracers.values():
            tracer.wait()
        requests = json.loads(done.stdout)["requests"]
        print(f"{connections} connection(s), {producers} producer(s), batch {batch}: {requests} requests under strace")
        for name in pair.pids:
            counts = strace_counts(os.path.join(work, name))
            by_call = ", ".join(f"{call} {count / requests:.2f}" for call, count in sorted(counts.items(), key=lambda item: -item[1])
                                if count / requests >= 0.01)  # fmt: skip
            print(f"  {name:6} {sum(counts.values()) / requests:6.2f} system calls a request: {by_call}")
    finally:
        pair.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from usage import help_or_usage

    help_or_usage(__doc__, arguments_min=4)
    main()
