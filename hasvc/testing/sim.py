"""One entry for the deterministic simulators, with fixed seeds by default.

    python -m hasvc.testing.sim classic    --seeds 2000 [--first-seed 0]
    python -m hasvc.testing.sim raft       --seeds 1000 [--nodes 3|5] [--first-seed 0]
    python -m hasvc.testing.sim raft-store --seeds 20   [--nodes 3|5] [--first-seed 0]
    python -m hasvc.testing.sim controller --seeds 1000 [--first-seed 0]
    python -m hasvc.testing.sim SIM --seed S            # replay one seed, printing its report
    python -m hasvc.testing.sim SIM --random-start      # explore from a random first seed (printed)
    python -m hasvc.testing.sim raft --seeds 3000 --digest  # a hash per seed of all that happened

``classic``: the classic master/slave cores (``hasvc.testing.classic_sim``): network faults,
kills and power losses, promotions, rejoins with epoch truncation, storage faults (flipped bits,
lost writes, ENOSPC, EIO) with repair from a peer or an accepted loss. ``raft``: the Raft core
(``hasvc.testing.raft_sim``) over in-memory logs: network faults, crashes, lost tails, full
disks (ENOSPC), failed fsyncs (EIO), committed entries found damaged. ``raft-store``: the same schedules over real
DLedger entry stores (``hasvc.testing.raft_store_sim``), torn pages on every crash.
``controller``: controller mode (``hasvc.testing.controller_sim``): a controller group whose
leader changes, 2-3 brokers failing over by themselves (agent, SyncStateSet tracker, lease),
kills, partitions (a master its clients reach and its controllers do not), lost messages.

``--digest`` (raft, raft-store) prints ``seed S HASH`` per seed: every message delivered, every
``Ready`` and the final logs (``hasvc.testing.digest``). A change to the core meant to change no
behaviour must leave the lines identical (``diff`` two runs).

Seeds start at 0 unless told otherwise, so a run is repeatable (CI runs fixed ranges); a failure
prints the one command that replays it, and exits 1.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time

from hasvc.testing import classic_sim, controller_sim, raft_sim, raft_store_sim
from hasvc.testing.checker import SafetyViolation

SIMULATORS = ("classic", "raft", "raft-store", "controller")
NODES_FIXED = ("classic", "controller")  # members chosen by the seed, no --nodes
PROGRESS_EVERY = 1000
DIGEST_CHARS = 32  # of a sha256's hex: 128 bits, far from any chance collision over a few million seeds


def replay_command(simulator: str, seed: int, nodes: int) -> str:
    if simulator in NODES_FIXED:
        return f"python -m hasvc.testing.sim {simulator} --seed {seed}"
    return f"python -m hasvc.testing.sim {simulator} --nodes {nodes} --seed {seed}"


def run_one(simulator: str, seed: int, nodes: int, **options):
    """One seed's report; raises (SafetyViolation, LivenessFailure, AssertionError) on a bug.
    ``options``: ``digest`` (raft, raft-store), a hashlib object fed all that happened."""
    if simulator == "classic":
        return classic_sim.run_seed(seed)
    if simulator == "raft":
        return raft_sim.run_seed(seed, nodes, **options)
    if simulator == "controller":
        return controller_sim.run_seed(seed)
    report, _ = raft_store_sim.run_seed(seed, nodes, **options)
    return report


def run_range(simulator: str, first: int, count: int, nodes: int, *, echo=print, digest: bool = False) -> int:
    """Seeds ``first..first+count-1``: 0 when all pass, 1 (after printing the replay) otherwise.
    ``digest``: print ``seed S HASH`` for each seed (see the module)."""
    started = time.monotonic()
    reports = []
    for seed in range(first, first + count):
        try:
            if digest:
                hashed = hashlib.sha256()
                reports.append(run_one(simulator, seed, nodes, digest=hashed))
                echo(f"seed {seed} {hashed.hexdigest()[:DIGEST_CHARS]}")
            else:
                reports.append(run_one(simulator, seed, nodes))
        except (SafetyViolation, AssertionError) as error:  # LivenessFailure is an AssertionError
            echo(f"FAIL {simulator} seed {seed}: {error!r}", file=sys.stderr)
            echo(f"replay: {replay_command(simulator, seed, nodes)}", file=sys.stderr)
            return 1
        done = seed - first + 1
        if done % PROGRESS_EVERY == 0:
            echo(f"... {done} seeds, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    where = "" if simulator in NODES_FIXED else f", {nodes} members"
    acked = sum(getattr(r, "acked", 0) for r in reports)
    crashes = sum(getattr(r, "crashes", 0) for r in reports)
    storage = f", {classic_sim.storage_summary(reports)}" if simulator == "classic" else ""
    if simulator == "controller":
        storage = f", {controller_sim.failover_summary(reports)}"
    if simulator in ("raft", "raft-store"):
        storage = f", {raft_sim.disk_summary(reports)}"
    echo(f"OK {simulator}{where}: {count} seeds ({first}..{first + count - 1}), {crashes} crashes, "
         f"{acked} acknowledged{storage}, {time.monotonic() - started:.1f} s")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hasvc.testing.sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("simulator", choices=SIMULATORS)
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run (default 1000)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0: repeatable)")
    parser.add_argument("--random-start", action="store_true", help="start at a random seed, printed first")
    parser.add_argument("--seed", type=int, help="replay this one seed and print its report")
    parser.add_argument("--nodes", type=int, choices=(3, 5), default=3, help="members (raft, raft-store)")
    parser.add_argument("--digest", action="store_true",
                        help="print a hash per seed of all that happened (raft, raft-store): diff two runs")  # fmt: skip
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if args.digest and args.simulator in ("classic", "controller"):
        parser.error("--digest is for raft and raft-store")
    if args.seed is not None:
        print(run_one(args.simulator, args.seed, args.nodes))
        return 0
    first = random.SystemRandom().randrange(10**9) if args.random_start else args.first_seed
    if args.random_start:
        print(f"first seed {first}", file=sys.stderr)
    return run_range(args.simulator, first, args.seeds, args.nodes, digest=args.digest)


if __name__ == "__main__":
    raise SystemExit(main())
