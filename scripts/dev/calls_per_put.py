"""Python function calls per put, by process, of a local SYNC_MASTER pair or DLedger group.

    .venv/bin/python scripts/dev/calls_per_put.py [--mode classic|controller|dledger] [--nodes 3|5] [--flush async|sync]
        [--producers 1] [--connections 1] [--batch 1] [--seconds 3] [--top 12] [--json FILE] [--keep DIR]

Starts the brokers from this checkout (``hasvc master``/``slave``, a ``hasvc controller`` and two
``hasvc broker --controllers``, or ``hasvc node`` x nodes with the
benchmark's etcd-like timing), each under a ``cProfile`` that this script switches on for the
measured window only (SIGUSR2 on, SIGUSR1 off and dump; hooked in by a ``sitecustomize`` in a
temporary directory put first on the brokers' PYTHONPATH, so no hasvc code changes), drives
them with the C load generator (scripts/hasvc_load.c) after one second of warm-up, and prints
for each process the Python calls made by its main thread per request and per message, with the
functions called most. An idle window of the same length is profiled first and its calls (timers,
heartbeats, flush tickers) are subtracted, function by function, so the figure does not depend on
how many puts a second a busy machine let through -- mostly: the loaded window's own background
differs (a flush ticker that finds work, timers that fire more often per put when puts are slow),
so at one writer compare builds at similar rates; with many writers the per-put part dominates. Builtins (``len``, ``max``, a method of ``list``) are counted apart: a call
of one costs tens of nanoseconds, a Python function's call some hundreds. ``--keep DIR`` leaves
the profiles there (``PID.prof``, for ``python -m pstats``).

Why: on this project's shared 2-core machines a rate or a CPU time swings 2-4x between two runs
of the same build, but the number of Python calls a put costs does not. At one writer nothing is
batched and the count repeats to the call; with many writers the per-message functions still
do, and what varies is per pass (how many puts a read, a proposal or a push carries). Compare two
builds by it (``PYTHONPATH`` stays as given: run the script from each tree). Wall time under the
profiler means nothing; the profiled processes run ~2x slower.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hooked_brokers import ROOT, add_shape_arguments, signal_window, start_hooked  # noqa: E402

from hasvc.tools.bench.sync_write import build_c_load, run_once  # noqa: E402

SITECUSTOMIZE = '''\
import os
if os.environ.get("HASVC_CALLS_PROFILE"):
    import cProfile, signal
    _profile = cProfile.Profile()

    def _on(*_):
        _profile.enable()

    def _off(*_):
        _profile.disable()
        path = os.path.join(os.environ["HASVC_CALLS_PROFILE"], "%d.prof" % os.getpid())
        _profile.dump_stats(path + ".part")
        os.replace(path + ".part", path)

    signal.signal(signal.SIGUSR2, _on)
    signal.signal(signal.SIGUSR1, _off)
'''
WARMUP_SECONDS = 1.0


def function_name(key: tuple) -> str:
    filename, line, name = key
    if filename == "~":
        return name  # a builtin: "<built-in method builtins.len>"
    for prefix in (ROOT + os.sep, sys.prefix + os.sep):
        if filename.startswith(prefix):
            filename = filename[len(prefix):]
    if "site-packages" + os.sep in filename:
        filename = filename.split("site-packages" + os.sep, 1)[1]
    return f"{filename}:{line}({name})"


def call_counts(path: str) -> dict[tuple, int]:
    import pstats

    return {key: value[1] for key, value in pstats.Stats(path).stats.items()}  # value[1]: calls


def summarize(idle: dict[tuple, int], both: dict[tuple, int], requests: int, messages: int, top: int) -> dict:
    """Calls of the loaded window: the second dump (idle and loaded windows) less the first."""
    loaded = {key: count - idle.get(key, 0) for key, count in both.items()}
    python = {key: count for key, count in loaded.items() if key[0] != "~"}
    calls = sum(python.values())
    builtin_calls = sum(count for key, count in loaded.items() if key[0] == "~")
    idle_calls = sum(count for key, count in idle.items() if key[0] != "~")
    ranked = sorted(python.items(), key=lambda item: -item[1])[:top]
    return {
        "calls": calls,
        "calls_per_request": calls / requests,
        "calls_per_message": calls / messages,
        "builtin_calls_per_request": builtin_calls / requests,
        "idle_calls": idle_calls,
        "top": [{"function": function_name(key), "per_request": count / requests} for key, count in ranked],
    }


def profile_window(pids: dict[str, int], paths: dict[str, str], window) -> dict:
    """Profile every process while ``window()`` runs; each one's call counts since its profile
    began (cProfile keeps counting across windows), and ``window()``'s result as "result"."""
    result = signal_window(pids, paths, window)
    return {**{name: call_counts(path) for name, path in paths.items()}, "result": result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_arguments(parser, producers=1)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", default=None)
    parser.add_argument("--keep", default=None, help="leave the profiles (PID.prof) in this directory")
    args = parser.parse_args()

    load = build_c_load()
    if load is None:
        print("a C compiler (cc) is needed to build scripts/hasvc_load.c", file=sys.stderr)
        return 2
    cluster, work = start_hooked(args, SITECUSTOMIZE, {"HASVC_CALLS_PROFILE": "{work}"}, prefix="hasvc-calls-")
    try:
        address, pids = cluster.master["listen"], cluster.pids
        shape = dict(producers=args.producers, connections=args.connections, size=1024, batch=args.batch, load_binary=load)
        run_once(address, pids, duration=WARMUP_SECONDS, **shape)
        paths = {name: os.path.join(work, f"{pid}.prof") for name, pid in pids.items()}
        idle = profile_window(pids, paths, lambda: time.sleep(args.seconds))  # timers, heartbeats
        both = profile_window(pids, paths, lambda: run_once(address, pids, duration=args.seconds, **shape))
        result = both.pop("result")
        report = {
            "settings": vars(args),
            "requests": result.requests,
            "messages": result.acked,
            "processes": {name: summarize(idle[name], both[name], result.requests, max(result.acked, 1), args.top)
                          for name in paths},  # fmt: skip
        }
    finally:
        cluster.close()
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            for name in os.listdir(work):
                if name.endswith(".prof"):
                    os.replace(os.path.join(work, name), os.path.join(args.keep, name))
        shutil.rmtree(work, ignore_errors=True)
    if result.requests == 0 or result.acked < result.requests * args.batch:
        print(f"warning: {result.requests} requests, {result.acked} messages acknowledged ({result.statuses})", file=sys.stderr)
    print(f"{args.mode}, {args.producers} producer(s) over {args.connections} connection(s), batch {args.batch}, "
          f"flush {args.flush}: {result.requests:,} requests, {result.acked:,} messages in {args.seconds:g} s under cProfile")
    for name, process in report["processes"].items():
        print(f"  {name:12s} {process['calls_per_request']:8.1f} Python calls a request, {process['calls_per_message']:7.1f} a message "
              f"(and {process['builtin_calls_per_request']:.1f} calls of builtins a request)")
        for row in process["top"]:
            print(f"      {row['per_request']:7.2f}  {row['function']}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
