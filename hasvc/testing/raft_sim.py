"""Randomised fault schedules for the Raft core, one seed at a time, and the CLI that runs many.

    python -m hasvc.testing.sim raft --seeds 100000 [--nodes 3|5] [--first-seed N]
    python -m hasvc.testing.sim raft --nodes 5 --seed 1234          # replay one seed, verbosely

A seed fixes everything: the settings (flush_sync or not, batch and in-flight limits, pre-vote and
check-quorum sometimes off, network loss, duplication and reordering), the clients' proposals and
the faults (crashes that lose unflushed entries and end their connections, restarts, partitions
that come and go, connections reset between running members, leadership transfers) and retention
(a member drops the entries below its core's ``retention_floor``, or -- a clean forced by a full
disk -- below where ``hasvc.state.raft.retention`` keeps from then: a leader below the lowest
match index it knows, which strands the members whose match it does not know, and it RESETs them
to its first index), and in half the seeds storage faults: a member
crashes and comes back without the tail of its log from a random index, committed entries
included, its catch-up mark saved (damage its recovery cut; only while every committed entry it
loses is held by another member). In half the seeds (drawn apart) disk faults
(``hasvc.testing.raft_disk``): a member's disk fills (its leader's proposals refused DISK_FULL,
its appends failing: the core starts over from its log, as the driver does) and frees later; a
member's fsync fails (never believed: it stops, without its unflushed tail); a member's entry at
or below its commit index is found damaged at a restart (cut there, catch-up mark saved). With
full disks a leader hands over only after leading an election timeout: never two step-downs in a
cascade. The checker also requires that no member ever grants a vote to a log that ends below a
committed entry it acknowledged. A chaos phase of ``chaos_seconds`` is followed by a settle phase
(the last fault): the network heals, every member restarts, every disk has room again, and within
``settle_seconds_max`` a leader must commit a final proposal and every member must hold the same
committed log. The ``RaftChecker`` runs after every step. A
failure prints the one command that replays it.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections.abc import Callable

from hasvc.state.raft.config import RaftConfig
from hasvc.state.raft.ready import Proposed
from hasvc.testing.checker import SafetyViolation
from hasvc.testing.digest import canonical
from hasvc.testing.network import NetworkConfig
from hasvc.testing.raft_cluster import SimCluster

# Simulated seconds of faults per seed, and the most a healed cluster may take to agree again.
CHAOS_SECONDS = 2.0
SETTLE_SECONDS_MAX = 20.0
PROGRESS_EVERY = 1000  # seeds between progress lines on stderr
COMPACT_PROBABILITY = 0.5  # a fault event also runs retention on a live member this often
FORCED_COMPACT_PROBABILITY = 0.3  # ... and that retention is a forced clean (disk full) this often
LOSE_TAIL_PROBABILITY = 0.2  # in a seed with storage faults, a fault event also loses a member's tail this often
DISK_FAULT_SEEDS = 0.5  # the share of seeds with disk faults
DISK_FAULT_PROBABILITY = 0.5  # in such a seed, a fault event also brings a disk fault this often


class LivenessFailure(AssertionError):
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class SeedSettings:
    config: RaftConfig
    network: NetworkConfig
    client_interval_seconds: float  # mean time between proposals
    fault_interval_seconds: float  # mean time between faults
    flush_delay_seconds: tuple[float, float]  # a flush completes this long after an append


@dataclasses.dataclass(frozen=True, slots=True)
class SeedReport:
    seed: int
    nodes: int
    events: int
    crashes: int
    acked: int
    committed: int
    leaders: int  # terms that had a leader
    resets: int  # logs reset to a leader's first index (members stranded by a forced clean)
    outcomes: dict[str, int]
    refused_runs: int = 0  # APPEND runs corrupted on the way and refused by a follower's check
    lost_tails: int = 0  # storage faults: a member restarted without its log's tail (catch-up mark saved)
    disk: dict[str, int] = dataclasses.field(default_factory=dict)  # disk faults by kind (``disk_summary``)


def settings_for(rng: random.Random) -> SeedSettings:
    config = RaftConfig(
        heartbeat_interval_seconds=0.075,
        election_timeout_min_seconds=0.3,
        election_timeout_max_seconds=0.6,
        push_timeout_seconds=0.1,
        quorum_ack_timeout_seconds=rng.choice([0.2, 0.5, 2.5]),
        push_batch_size_max=rng.choice([1, 40, 4096]),
        push_in_flight_max=rng.choice([1, 3, 1000]),
        pending_max=rng.choice([4, 10_000]),
        flush_sync=rng.random() < 0.5,
        pre_vote=rng.random() < 0.85,
        check_quorum=rng.random() < 0.85,
        preferred_leader_id="n0" if rng.random() < 0.2 else None,
    )
    network = NetworkConfig(
        delay_min_seconds=0.0005,
        delay_max_seconds=rng.choice([0.002, 0.02]),
        drop_probability=rng.choice([0.0, 0.02, 0.1]),
        duplicate_probability=rng.choice([0.0, 0.05]),
        straggler_probability=rng.choice([0.0, 0.05]),
        straggler_delay_seconds=0.2,
        fifo=rng.random() < 0.5,
    )
    flush = rng.choice([(0.002, 0.010), (0.01, 0.05)])  # DLedger flushes every 10 ms; a slow disk
    return SeedSettings(config, network, rng.choice([0.03, 0.08]), rng.choice([0.15, 0.4]), flush)


def _client(cluster: SimCluster, rng: random.Random, counter: list[int]) -> None:
    alive = cluster.alive()
    if not alive:
        return
    leader = cluster.leader()
    target = leader if leader is not None and rng.random() < 0.85 else rng.choice(alive)
    bodies = []
    for _ in range(rng.randint(1, 3)):
        counter[0] += 1
        bodies.append(f"p{counter[0]}".encode())
    if cluster.disk.full[target]:  # the driver's _room_refusal: DISK_FULL before the core sees it
        cluster.disk.refused += 1
        return
    if len(bodies) > 1 and cluster.together_rng.random() < 0.5:  # one proposal each, one Ready (a broker's pass)
        cluster.propose_together(target, [[body] for body in bodies])
    else:
        cluster.propose(target, bodies)


def _fault(cluster: SimCluster, rng: random.Random) -> None:
    alive, down = cluster.alive(), [m for m in cluster.members if cluster.nodes[m] is None]
    if alive and rng.random() < COMPACT_PROBABILITY:
        member, forced = rng.choice(alive), rng.random() < FORCED_COMPACT_PROBABILITY
        cluster.compact(member, forced=forced)  # retention, beside whatever fault comes
    roll = rng.random()
    if roll < 0.25 and len(alive) > 1:
        leader, unflushed = cluster.leader(), cluster.most_unflushed()
        pick = rng.random()
        if pick < 0.4 and leader is not None:
            cluster.crash(leader)
        elif pick < 0.6 and unflushed is not None:
            cluster.crash(unflushed)  # the worst moment for a power loss
        else:
            cluster.crash(rng.choice(alive))
    elif roll < 0.5 and down:
        cluster.start(rng.choice(down))
    elif roll < 0.65:
        members = list(cluster.members)
        rng.shuffle(members)
        cut = rng.randint(1, len(members) - 1)
        cluster.network.partition(members[:cut], members[cut:])
    elif roll < 0.75 and cluster.leader() is not None:
        cluster.network.partition([cluster.leader()])  # the leader alone on its side
    elif roll < 0.9:
        cluster.network.heal()
    elif roll < 0.95 and len(alive) > 1:
        source, target = rng.sample(alive, 2)  # a reset while both run (a leader's, often): no one may be deposed for it
        cluster.reset_connection(source, target)
    elif cluster.leader() is not None:
        cluster.transfer_leadership(cluster.leader(), rng.choice(cluster.members))


def _lose_tail(cluster: SimCluster, rng: random.Random) -> None:
    """A live member crashes and restarts later without its log's tail from a random index (if a
    healthy copy of every committed entry it loses remains)."""
    candidates = [m for m in cluster.alive() if cluster.logs[m].last_index() >= cluster.logs[m].first_index()]
    if not candidates:
        return
    member = rng.choice(candidates)
    log = cluster.logs[member]
    cluster.crash_losing_tail(member, rng.randint(log.first_index(), log.last_index()))


def _disk_fault(cluster: SimCluster, rng: random.Random, flipped: list[int]) -> None:
    """A disk fills or frees, an fsync fails, or an entry at or below a member's commit index is
    found damaged at its restart (``flipped[0]`` counts those)."""
    alive, roll = cluster.alive(), rng.random()
    full = [m for m in cluster.members if cluster.disk.full[m]]
    leader = cluster.leader()
    if roll < 0.35:
        member = leader if leader is not None and rng.random() < 0.5 else rng.choice(cluster.members)
        cluster.set_disk_full(member, True)
    elif roll < 0.65 and full:
        cluster.set_disk_full(rng.choice(full), False)
    elif roll < 0.8 and alive:
        cluster.disk.arm_fsync_failure(rng.choice(alive))
    elif alive:
        member = rng.choice(alive)
        log, committed = cluster.logs[member], cluster.node(member).committed_index
        below = min(committed, log.last_index())
        if log.first_index() <= below:
            flipped[0] += cluster.crash_losing_tail(member, rng.randint(log.first_index(), below))


def disk_summary(reports) -> str:
    """The disk faults of ``reports`` in one line (the CLI's summary)."""
    kinds = ("fills", "refused", "append_failures", "fsync_failures", "handovers", "flipped")
    totals = {kind: sum(r.disk.get(kind, 0) for r in reports) for kind in kinds}
    seeds = sum(1 for r in reports if r.disk)
    return (f"disk faults in {seeds} seeds: {totals['fills']} disks filled, {totals['refused']} proposals refused "
            f"DISK_FULL, {totals['append_failures']} appends failed, "
            f"{totals['handovers']} handovers for a full disk, "
            f"{totals['fsync_failures']} fsyncs failed, {totals['flipped']} committed entries found damaged; "
            f"{sum(r.lost_tails for r in reports)} tails lost")  # fmt: skip


def _settle(cluster: SimCluster) -> None:
    """Heal, restart everyone; a leader must commit a last proposal and all logs must agree."""
    cluster.network.heal()
    for member in cluster.members:  # the last fault: disks have room again, no fsync fails
        cluster.set_disk_full(member, False)
        cluster.disk.fsync_armed[member] = False
    for member in cluster.members:
        if cluster.nodes[member] is None:
            cluster.start(member)
    deadline = cluster.now + SETTLE_SECONDS_MAX
    probe: tuple[str, int] | None = None
    while cluster.now < deadline:
        cluster.run_until(cluster.now + 0.05)
        leader = cluster.leader()
        if probe is None or cluster.nodes[probe[0]] is None or cluster.node(probe[0]).role.value != "LEADER":
            probe = None
            if leader is not None:
                result = cluster.propose(leader, [b"probe-%d" % cluster.events])
                probe = (leader, result.last_index) if isinstance(result, Proposed) else None
            continue
        index = probe[1]
        nodes = [cluster.node(m) for m in cluster.members]
        if all(n.committed_index >= index for n in nodes):
            start = max(cluster.logs[m].first_index() for m in cluster.members)  # below it: deleted by retention
            logs = [[cluster.logs[m].entry_at(i) for i in range(start, index + 1)] for m in cluster.members]
            if all(log == logs[0] for log in logs):
                return
    raise LivenessFailure(f"no agreement {SETTLE_SECONDS_MAX} s after healing: "
                          + ", ".join(f"{m}: {cluster.node(m).role.value} term {cluster.node(m).term} "
                                      f"last {cluster.node(m).last_index} commit {cluster.node(m).committed_index}"
                                      for m in cluster.members))  # fmt: skip


def run_seed(seed: int, nodes: int = 3, *, log_factory: Callable[[str], object] | None = None,
             digest=None) -> SeedReport:  # fmt: skip
    """One seed's schedule; raises SafetyViolation, LivenessFailure or AssertionError on a bug.
    ``log_factory(member)`` gives each member its log (default: the in-memory SimLog);
    ``digest`` (a hashlib object) is fed what happened and the final state (``hasvc.testing.digest``)."""
    rng = random.Random(f"raft-sim-{nodes}-{seed}")
    settings = settings_for(rng)
    members = [f"n{i}" for i in range(nodes)]
    # Runs corrupted on the way in a third of the seeds, drawn apart from `rng` (its draws unchanged).
    corrupt = random.Random(f"raft-sim-corrupt-{nodes}-{seed}").choice([0.0, 0.0, 0.02])
    # Acknowledgements due together stepped before one Ready (the driver's reads) in half the seeds, drawn apart too.
    coalesce = random.Random(f"raft-sim-coalesce-{nodes}-{seed}").random() < 0.5
    # Storage faults (a member loses its log's tail) in half the seeds, drawn apart too.
    lose = random.Random(f"raft-sim-lose-{nodes}-{seed}").choice([0.0, LOSE_TAIL_PROBABILITY])
    lose_rng = random.Random(f"raft-sim-lose-faults-{nodes}-{seed}")
    # Disk faults (full disks, failed fsyncs, damage below the commit index) in half the seeds, drawn apart too.
    disk = random.Random(f"raft-sim-disk-{nodes}-{seed}").random() < DISK_FAULT_SEEDS
    disk_rng, flipped = random.Random(f"raft-sim-disk-faults-{nodes}-{seed}"), [0]
    cluster = SimCluster(seed=f"{nodes}-{seed}", members=members, config=settings.config, network=settings.network,
                         flush_delay_seconds=settings.flush_delay_seconds, corrupt_run_probability=corrupt,
                         coalesce_acknowledgements=coalesce, log_factory=log_factory, digest=digest)  # fmt: skip
    counter = [0]
    next_client = rng.expovariate(1 / settings.client_interval_seconds)
    next_fault = rng.expovariate(1 / settings.fault_interval_seconds)
    while True:
        at = min(next_client, next_fault)
        if at >= CHAOS_SECONDS:
            break
        cluster.run_until(at)
        if at == next_client:
            _client(cluster, rng, counter)
            next_client += rng.expovariate(1 / settings.client_interval_seconds)
        else:
            _fault(cluster, rng)
            if lose and lose_rng.random() < lose:
                _lose_tail(cluster, lose_rng)
            if disk and disk_rng.random() < DISK_FAULT_PROBABILITY:
                _disk_fault(cluster, disk_rng, flipped)
            next_fault += rng.expovariate(1 / settings.fault_interval_seconds)
    cluster.run_until(CHAOS_SECONDS)
    _settle(cluster)
    cluster.checker.final()
    report = SeedReport(seed, nodes, cluster.events, cluster.crashes, cluster.acked_count, len(cluster.checker.committed),
                      len(cluster.checker.leaders), cluster.resets, {s.value: n for s, n in cluster.outcomes.items()},
                      cluster.refused_runs, cluster.lost_tails,
                      _disk_counts(cluster, flipped[0]) if disk else {})  # fmt: skip
    if digest is not None:
        for member in members:
            log = cluster.logs[member]
            entries = [log.entry_at(i) for i in range(log.first_index(), log.last_index() + 1)]
            final = (member, entries, log.load_hard_state(), log.flushed_index(), cluster.node(member).status(cluster.now))
            digest.update(repr(canonical(final)).encode())
        reported = canonical(report)  # a seed without disk faults hashes as before they existed (``disk`` last)
        digest.update(repr(reported if report.disk else reported[:-1]).encode())
    return report


def _disk_counts(cluster: SimCluster, flipped: int) -> dict[str, int]:
    faults = cluster.disk
    return {"fills": faults.fills, "refused": faults.refused, "append_failures": faults.append_failures,
            "fsync_failures": faults.fsync_failures, "handovers": faults.handovers, "flipped": flipped}  # fmt: skip


def replay_command(seed: int, nodes: int) -> str:
    return f"python -m hasvc.testing.sim raft --nodes {nodes} --seed {seed}"


def run_seeds(first: int, count: int, nodes: int) -> list[SeedReport]:
    """Run seeds first..first+count-1; on a failure raise it with the replay command in the message."""
    reports = []
    for seed in range(first, first + count):
        try:
            reports.append(run_seed(seed, nodes))
        except AssertionError as error:  # SafetyViolation, LivenessFailure, a core invariant
            raise AssertionError(
                f"seed {seed} ({nodes} nodes) failed: {error!r}\nreplay: {replay_command(seed, nodes)}"
            ) from error
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, help="replay this one seed and print its report")
    parser.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    args = parser.parse_args(argv)
    if args.seed is not None:
        print(run_seed(args.seed, args.nodes))
        return 0
    started = time.monotonic()
    events = acked = refused = resets = lost_tails = 0
    reports = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        try:
            report = run_seed(seed, args.nodes)
        except (SafetyViolation, LivenessFailure, AssertionError) as error:
            print(f"FAIL seed {seed} ({args.nodes} nodes): {error!r}", file=sys.stderr)
            print(f"replay: {replay_command(seed, args.nodes)}", file=sys.stderr)
            return 1
        events += report.events
        acked += report.acked
        refused += report.refused_runs
        resets += report.resets
        lost_tails += report.lost_tails
        reports.append(report)
        done = seed - args.first_seed + 1
        if done % PROGRESS_EVERY == 0:
            print(f"... {done} seeds, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - started
    print(f"OK {args.seeds} seeds ({args.first_seed}..{args.first_seed + args.seeds - 1}), {args.nodes} nodes, "
          f"{events} events, {acked} acknowledged entries, {resets} resets, {refused} corrupted runs refused, "
          f"{lost_tails} tails lost, {elapsed:.1f} s")  # fmt: skip
    print(disk_summary(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
