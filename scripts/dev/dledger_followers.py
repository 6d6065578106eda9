"""What the second follower costs a local DLedger group: a classic SYNC_MASTER pair, a 3-member
group, and the same group with one follower stopped (SIGSTOP), alternating, under
scripts/hasvc_load.c.

    .venv/bin/python scripts/dev/dledger_followers.py [--producers 64] [--batch 1] [--seconds 3]
        [--rounds 3] [--kinds pair,group,stopped] [--warm-up-mib 320] [--group-set NAME=VALUE ...] [--json FILE]

Each round starts every kind in turn from this checkout (``LocalPair`` / ``LocalGroup`` as
``hasvc bench sync-write`` does: SYNC_MASTER or quorum in memory, ASYNC_FLUSH, etcd-like election
timing, ``page_cache_keep_size`` 256 MiB), warms it up as ``scripts/bench_peers`` does (``--warm-up-mib``
MiB written at 64 producers x 32 messages a request, in runs of 1 s: past the drop-behind, so the
classic master's and the leader's warm-up threads, which fault in pages ahead of a fresh store's
writes, have gone quiet; 0 skips it), drives it for 2 s at the measured shape, then measures one window of
``--seconds`` over one connection with 1 KiB messages and prints the acked msgs/s and each
process's CPU per acknowledged message (user + system, every thread, from /proc). ``stopped``:
after those 2 s one follower (not the leader) gets SIGSTOP and the group runs 1 s more before
the window, so the leader's pushes to it have filled its socket and its send queue and stopped
(its in-flight limit): the leader's quorum is itself and the other follower, as a classic master's
is itself and its slave, and three busy processes share the cores as a pair's do. The follower
gets SIGCONT after the window and every process is stopped by its PID. At the end: the medians
by kind and the ratios of the medians to the pair's.

Why: on a 2-core machine a 3-member group runs four busy processes (three members and the load
generator) where a pair runs three. The stopped kind removes the second follower's CPU and its
exchange with the leader (a push and an acknowledgement a pass) without changing anything else,
so the difference between ``group`` and ``stopped`` is what that second follower costs here.
Rounds of one kind move ±15-30 % on this VM; compare kinds within a round, and medians.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import time

from hasvc.tools.bench.sync_write import LocalGroup, LocalPair, build_c_load, process_cpu_seconds

KINDS = ("pair", "group", "stopped")
SETTINGS = {"page_cache_keep_size": str(256 << 20)}  # as scripts/bench_peers gives its brokers
WARMUP_SECONDS = 2  # at the measured shape, after the warm-up by bytes
WARM_UP_MIB_DEFAULT = 320  # scripts/bench_peers' WARM_UP_BYTES: page_cache_keep_size + 64 MiB
WARM_UP_RUNS_MAX = 20  # 1 s runs at 64 x 32 (as bench_peers): a slow cluster stops there
STOPPED_SETTLE_SECONDS = 1  # load after the SIGSTOP, before the window: the pushes to it stop


def _load(load: str, address: str, producers: int, batch: int, seconds: float) -> dict:
    host, _, port = address.rpartition(":")
    done = subprocess.run([load, host, port, "1", str(producers), str(batch), str(seconds), "1024"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(done.stdout)


def warm_up(load: str, address: str, mib: int) -> None:
    written = 0
    for _ in range(WARM_UP_RUNS_MAX):
        if written >= mib << 20:
            return
        written += _load(load, address, 64, 32, 1.0)["acked"] * 1024


def measure(kind: str, load: str, producers: int, batch: int, seconds: float, warm_up_mib: int,
            group_settings: dict[str, str] | None = None) -> dict:  # fmt: skip
    """One fresh pair or group of ``kind``, warmed and measured; stopped by PID."""
    cluster = LocalPair(role="sync", flush="async", settings=SETTINGS) if kind == "pair" else (
        LocalGroup(nodes=3, flush="async", settings={**SETTINGS, **(group_settings or {})}))  # fmt: skip
    stopped = None
    try:
        cluster.wait_connected()
        address = cluster.master["listen"]
        warm_up(load, address, warm_up_mib)
        _load(load, address, producers, batch, WARMUP_SECONDS)
        pids = cluster.pids
        if kind == "stopped":
            name, stopped = next((name, pid) for name, pid in pids.items() if not name.startswith("leader"))
            os.kill(stopped, signal.SIGSTOP)
            _load(load, address, producers, batch, STOPPED_SETTLE_SECONDS)
        before = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
        data = _load(load, address, producers, batch, seconds)
        after = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
        acked = data["acked"]
        if not acked:
            raise RuntimeError(f"{kind}: nothing acknowledged ({data['statuses']})")
        return {
            "kind": kind, "acked_per_second": round(acked / data["seconds"]), "p50_us": data["p50_us"],
            "statuses": data["statuses"],
            "cpu_us_per_message": {("stopped " if pid == stopped else "") + name: round(1e6 * (after[name] - before[name]) / acked, 1)
                                   for name, pid in pids.items()},
        }  # fmt: skip
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)  # else it could not see the SIGTERM of close()
        cluster.close()


def summary(rows: list[dict]) -> dict:
    medians = {}
    for kind in KINDS:
        rates = [row["acked_per_second"] for row in rows if row["kind"] == kind]
        if rates:
            medians[kind] = statistics.median(rates)
    ratios = {f"{kind}/pair": round(rate / medians["pair"], 2) for kind, rate in medians.items()
              if kind != "pair" and medians.get("pair")}  # fmt: skip
    if medians.get("group") and medians.get("stopped"):
        ratios["stopped/group"] = round(medians["stopped"] / medians["group"], 2)
    return {"median_acked_per_second": medians, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, in the order each round runs them")
    parser.add_argument("--warm-up-mib", type=int, default=WARM_UP_MIB_DEFAULT,
                        help="MiB written at 64 x 32 into each fresh pair or group first (0: none)")
    parser.add_argument("--group-set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the groups' members (hasvc node --set), e.g. push_batch_size_max=65536")
    parser.add_argument("--json", help="write the rows and the summary here too")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}: choose from {', '.join(KINDS)}")
    group_settings = dict(setting.split("=", 1) for setting in args.group_set)
    load = build_c_load()
    if load is None:
        raise SystemExit("a C compiler (cc) is needed to build scripts/hasvc_load.c")
    rows = []
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for round_number in range(args.rounds):
        for kind in kinds:
            row = measure(kind, load, args.producers, args.batch, args.seconds, args.warm_up_mib, group_settings)
            row["round"] = round_number
            rows.append(row)
            cpu = ", ".join(f"{name} {value}" for name, value in row["cpu_us_per_message"].items())
            print(f"round {round_number} {kind:8} {row['acked_per_second']:>8,} acked/s  CPU us a message: {cpu}", flush=True)
    result = summary(rows)
    medians = ", ".join(f"{kind} {rate:,.0f}" for kind, rate in result["median_acked_per_second"].items())
    print(f"medians (acked/s): {medians}; ratios: {result['ratios']}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"started": started, "producers": args.producers, "batch": args.batch, "seconds": args.seconds,
                       "warm_up_mib": args.warm_up_mib, "rows": rows, **result}, file, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
