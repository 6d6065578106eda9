"""Wall and CPU time inside the put path's functions, per message, by process, of a local
SYNC_MASTER pair or DLedger group under load.

    .venv/bin/python scripts/dev/put_path_time.py [--mode classic|controller|dledger] [--nodes 3|5] [--flush async|sync]
        [--producers 64] [--connections 1] [--batch 1] [--seconds 3] [--function MODULE:CLASS.METHOD ...]
        [--json FILE]

Starts the brokers from this checkout (``hasvc master``/``slave``, a ``hasvc controller`` and two
``hasvc broker --controllers``, or ``hasvc node`` x nodes with
the benchmark's etcd-like timing), each with a ``sitecustomize`` (in a temporary directory put
first on the brokers' PYTHONPATH; no hasvc code changes) that, on SIGUSR2, wraps the named
functions with ``time.perf_counter_ns`` and ``time.thread_time_ns`` and, on SIGUSR1, unwraps them
and writes what it counted. Drives them with the C load generator (scripts/hasvc_load.c) for one
second of warm-up, then measures one window and prints, for each process and function, its calls
per request and the wall time and the thread's CPU time spent inside it per message, beside the
process's whole CPU per message (every thread, from /proc).

Why: cProfile (scripts/dev/calls_per_put.py) counts calls exactly, but its per-call overhead makes
functions that call many small ones look several times costlier than they are; sampling
profilers see Python frames but not what a function costs a message. Two wrappers a call
(~0.3 us) are cheap against the put path's functions, which run once or a few times a pass of
many messages. Wall time above CPU time inside a function is time its thread was runnable but
not running (another process on its CPU, e.g. a peer woken by its own ``writev``) or blocked.
Times are inclusive (a function's callees are counted in it too) and cover only calls made while
wrapped: a bound method taken before the window (a callback) keeps calling the unwrapped one.
Functions must be synchronous (a coroutine function's wrapper would time only its creation).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hooked_brokers import add_shape_arguments, signal_window, start_hooked  # noqa: E402

from hasvc.tools.bench.sync_write import build_c_load, process_cpu_seconds, run_once  # noqa: E402

# The put path of both modes: a pass of SENDs read, appended (proposed), pushed, acknowledged,
# answered and dispatched. A name that a process does not have is skipped there.
FUNCTIONS = (
    "hasvc.broker.client_port:ClientPort._read_client",
    "hasvc.broker.client_port:ClientPort._take_frames",
    "hasvc.broker.put_service:PutService.put_items",
    "hasvc.broker.put_service:PutService._append_sends",
    "hasvc.broker.outbox:Outbox.flush",
    "hasvc.transport:Connection.writev_now",
    "hasvc.replicator:ClassicReplicator.on_report",
    "hasvc.broker.controlled:SyncStateSetReplicator._feed_acks",  # a report (on_report is a callback taken before)
    "hasvc.broker.controlled:SyncStateSetReplicator.changed",
    "hasvc.broker.controlled:SyncStateSetReplicator.appended",
    "hasvc.state.controller.sync_set:SyncStateSetTracker.on_ack",
    "hasvc.broker.producer_follow:producer_sequences",  # a controller-mode slave's follower (in a worker thread)
    "commitlog.store_reads:StoreReads.find_bytes",
    "hasvc.broker.ha_master:HAService.push",
    "hasvc.broker.store_tasks:StoreTasks.after_appends",
    "commitlog.store:MessageStore.dispatch",
    "hasvc.broker.raft.driver:RaftDriver.drain",
    "hasvc.broker.raft.peers:RaftSenders.send",
    "hasvc.broker.raft.listener:RaftListener._step",
    "hasvc.broker.raft.driver:RaftDriver.propose_plan",
    "hasvc.broker.raft.replicator:RaftReplicator.committed",
    "commitlog.dledger.message_planning:MessagePlanner.plan_batches",
    "commitlog.dledger.message_dispatch:MessageDispatch.dispatch",
    "commitlog.dledger.entry_writer:EntryWriter.append",
    "commitlog.dledger.entry_writer:EntryWriter.append_run",
    "hasvc.state.raft.node:RaftNode.step",
    "hasvc.state.raft.node:RaftNode.ready",
    "hasvc.state.raft.node:RaftNode.propose",
)

SITECUSTOMIZE = '''\
import os
if os.environ.get("HASVC_PUT_TIMES"):
    import importlib, inspect, json, signal, sys, time

    _wrapped = []  # (owner, name, original)
    _totals = {}  # name -> [calls, wall ns, cpu ns]

    def _wrap(target):
        module_name, _, qualified = target.partition(":")
        module = sys.modules.get(module_name)
        if module is None:
            return  # this process never imported it: not on its path
        *owners, name = qualified.split(".")
        owner = module
        for part in owners:
            owner = getattr(owner, part, None)
            if owner is None:
                return
        original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if original is None or inspect.iscoroutinefunction(original) or not callable(original):
            return
        counts = _totals.setdefault(target, [0, 0, 0])
        perf, thread = time.perf_counter_ns, time.thread_time_ns

        def timed(*args, **kwargs):
            wall, cpu = perf(), thread()
            try:
                return original(*args, **kwargs)
            finally:
                counts[0] += 1
                counts[1] += perf() - wall
                counts[2] += thread() - cpu

        setattr(owner, name, timed)
        _wrapped.append((owner, name, original))

    def _start(*_):
        _totals.clear()
        for target in os.environ["HASVC_PUT_TIMES_FUNCTIONS"].split(","):
            _wrap(target)

    def _stop(*_):
        while _wrapped:
            owner, name, original = _wrapped.pop()
            setattr(owner, name, original)
        path = os.path.join(os.environ["HASVC_PUT_TIMES"], "%d.json" % os.getpid())
        with open(path + ".part", "w") as file:
            json.dump(_totals, file)
        os.replace(path + ".part", path)

    signal.signal(signal.SIGUSR2, _start)
    signal.signal(signal.SIGUSR1, _stop)
'''
WARMUP_SECONDS = 1.0


def measure(pids: dict[str, int], work: str, window) -> tuple[dict, dict, object]:
    """Wrap in every process while ``window()`` runs: each one's counts, its CPU seconds over
    the window, and ``window()``'s result."""
    paths = {name: os.path.join(work, f"{pid}.json") for name, pid in pids.items()}
    cpu = {}

    def timed_window():
        cpu.update({name: process_cpu_seconds(pid) for name, pid in pids.items()})
        result = window()
        cpu.update({name: process_cpu_seconds(pid) - cpu[name] for name, pid in pids.items()})
        return result

    result = signal_window(pids, paths, timed_window)
    counts = {}
    for name, path in paths.items():
        with open(path) as file:
            counts[name] = json.load(file)
    return counts, cpu, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_arguments(parser, producers=64)
    parser.add_argument("--function", action="append", default=[], metavar="MODULE:CLASS.METHOD",
                        help="time this function too (a synchronous one)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    load = build_c_load()
    if load is None:
        print("a C compiler (cc) is needed to build scripts/hasvc_load.c", file=sys.stderr)
        return 2
    environment = {"HASVC_PUT_TIMES": "{work}", "HASVC_PUT_TIMES_FUNCTIONS": ",".join((*FUNCTIONS, *args.function))}
    settings = {"page_cache_keep_size": str(256 << 20)}  # as the benchmarks give their brokers
    cluster, work = start_hooked(args, SITECUSTOMIZE, environment, prefix="hasvc-put-times-", settings=settings)
    try:
        address, pids = cluster.master["listen"], cluster.pids
        shape = dict(producers=args.producers, connections=args.connections, size=1024, batch=args.batch, load_binary=load)
        run_once(address, pids, duration=WARMUP_SECONDS, **shape)
        counts, cpu, result = measure(pids, work, lambda: run_once(address, pids, duration=args.seconds, **shape))
    finally:
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    messages, requests = max(result.acked, 1), max(result.requests, 1)
    report = {
        "settings": vars(args),
        "requests": result.requests,
        "messages": result.acked,
        "acked_per_second": result.acked / args.seconds,
        "processes": {
            name: {
                "cpu_us_per_message": cpu[name] * 1e6 / messages,
                "functions": {
                    function: {"calls_per_request": calls / requests, "wall_us_per_message": wall / 1e3 / messages,
                               "cpu_us_per_message": thread / 1e3 / messages}
                    for function, (calls, wall, thread) in sorted(counts[name].items(), key=lambda item: -item[1][1])
                    if calls
                },
            }
            for name in pids
        },
    }
    if result.requests == 0 or result.acked < result.requests * args.batch:
        print(f"warning: {result.requests} requests, {result.acked} messages acknowledged ({result.statuses})", file=sys.stderr)
    print(f"{args.mode}, {args.producers} producer(s) over {args.connections} connection(s), batch {args.batch}, flush "
          f"{args.flush}: {result.acked:,} messages in {args.seconds:g} s ({report['acked_per_second']:,.0f}/s); "
          "wall / CPU inside each function, inclusive, us a message")
    for name, process in report["processes"].items():
        print(f"  {name}: {process['cpu_us_per_message']:.1f} us of CPU a message (every thread)")
        for function, row in process["functions"].items():
            print(f"      {row['wall_us_per_message']:7.2f} / {row['cpu_us_per_message']:6.2f}  "
                  f"{row['calls_per_request']:6.3f} a request  {function.split(':', 1)[1]}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
