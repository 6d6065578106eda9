"""``hasvc drill --fault corrupt`` for a classic pair: one replica's store damaged, under load.

Each round: producers write uniquely numbered messages to a SYNC_MASTER and its slave; one of
the two (drawn from the seed) is stopped (SIGTERM or SIGKILL, drawn too); one bit of one byte of
one file of its store is flipped (``hasvc.tools.faults``: a commit log segment, a consume queue
file, the checkpoint or an epoch file); it is restarted on the same ports while the producers go
on. A broker that finds damage in what it had acknowledged refuses to start with one line naming
the file and offset; the drill then runs the command that line names,
``hasvc store repair STORE --from PEER`` (the peer's copy is byte-identical), and restarts it.
Then, from the stores on disk as in every drill: each message acknowledged PUT_OK is present
exactly once at its offset, the commit logs and consume queues are byte-identical, each side's
consume queues equal a rebuild from its log (``check_consume_queues``), and the epoch histories
agree. A damaged copy must never be what the healthy one is cut to match.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import time

import trio

from hasvc import client as hc
from hasvc.testing.launch import StartError
from hasvc.tools.drill import Drill, Process, RoundReport, log_digest, queue_file_digests
from hasvc.tools.faults import flip_random_byte
from hasvc.tools.timeline_plot import finish

REPAIR_TIMEOUT_SECONDS = 120.0
SETTLE_SECONDS = 0.5  # the master's end must stand still this long before the copies are compared


@dataclasses.dataclass
class CorruptRoundReport:
    round: int
    victim: str  # "master" or "slave"
    stop: str  # "SIGTERM" or "SIGKILL"
    fault: str  # what was flipped, where
    outcome: str  # "started" (nothing refused), "repaired" (refused, repaired from the peer, started), "failed: ..."
    refusal: str  # the broker's one line, when it refused
    checks: RoundReport | None

    @property
    def ok(self) -> bool:
        return self.checks is not None and self.checks.ok and not self.outcome.startswith("failed")


class CorruptDrill(Drill):
    """A ``Drill`` whose rounds damage a stopped replica's store instead of failing over."""

    def __init__(self, **kwargs):
        super().__init__(mode="sync", **kwargs)
        self.fault_random = random.Random(f"corrupt-{kwargs.get('seed', 0)}")

    def restart(self, process: Process, *, master_ha: str | None) -> Process:
        """The same store on the same ports (the slave dials the master's HA address it knows)."""
        store = os.path.basename(process.store)
        ports = ["--listen", process.ready["listen"], "--ha-listen", process.ready["ha_listen"]]
        args = (["master", "--role", self.mode] if master_ha is None else ["slave", "--master-ha", master_ha])
        args += [*self._common(store), *ports]  # the later --listen/--ha-listen win
        replacement = Process(self.root, f"{store}-{len(self.processes)}", args)
        replacement.store = process.store
        self.processes.append(replacement)
        return replacement

    def _settle(self, master: Process, slave: Process) -> None:
        """Until the master's end stands still and the slave holds it: sends the producers had in
        flight when they were cancelled are still answered (and replicated) for a moment, and a
        check taken meanwhile compares a moving end."""
        while True:
            end = self._status(master)["max_offset"]
            time.sleep(SETTLE_SECONDS)
            self._wait(lambda: self._caught_up(master, slave), "the replicas to converge")
            if self._status(master)["max_offset"] == end:
                return

    def _repair(self, victim: Process, peer: Process) -> str:
        """``hasvc store repair STORE --from PEER`` on a stopped replica; the failure, or ""."""
        repair = subprocess.run([sys.executable, "-m", "hasvc.cli", "store", "repair", victim.store, "--from",
                                 peer.ready["listen"], *(["--secret-file", self.secret_file] if self.secret_file else [])],
                                capture_output=True, text=True, timeout=REPAIR_TIMEOUT_SECONDS)  # fmt: skip
        if repair.returncode != 0:
            return f"repair exited {repair.returncode}: {_last_line(repair.stderr or repair.stdout)}"
        return ""

    def run_round(self, number: int, master: Process, slave: Process) -> tuple[CorruptRoundReport, Process, Process]:
        self._wait(lambda: any(s["ack_offset"] >= 0 for s in self._status(master)["slaves"]), "the slave's first report")
        rng = self.fault_random
        victim_name = rng.choice(["master", "slave"])
        stop = rng.choice(["SIGTERM", "SIGKILL"])
        delay = rng.uniform(0.5, 1.5)
        found: dict = {}

        def damage_and_restart() -> None:
            victim, peer = (master, slave) if victim_name == "master" else (slave, master)
            if stop == "SIGTERM":
                victim.stop()
            else:
                victim.kill()
            fault = flip_random_byte(victim.store, rng)
            found["fault"] = fault.describe(self.root) if fault else "no file held data"
            master_ha = None if victim is master else master.ready["ha_listen"]
            try:
                found["process"] = self.restart(victim, master_ha=master_ha)
                found["outcome"] = "started"
            except StartError as error:
                found["refusal"] = _last_line(str(error))
                failure = self._repair(victim, peer)
                if failure:
                    found["outcome"] = f"failed: {failure}"
                    return
                try:
                    found["process"] = self.restart(victim, master_ha=master_ha)
                except StartError as again:
                    found["outcome"] = f"failed: refused again after the repair: {_last_line(str(again))}"
                    return
                found["outcome"] = "repaired"

        async def run() -> None:
            addresses = [master.ready["listen"], slave.ready["listen"]]
            async with hc.connect_cluster(addresses, self.secret, retry_sends=True) as client, trio.open_nursery() as nursery:
                for _ in range(self.producers):
                    nursery.start_soon(self._producer, client)
                await trio.sleep(delay)
                found["window"] = self.timeline.fault(f"corrupt {victim_name} ({stop})")
                await trio.to_thread.run_sync(damage_and_restart)
                found["window"].close()
                await trio.sleep(0.5)  # writes go on against the restarted replica
                nursery.cancel_scope.cancel()

        self.run_writing(run)
        if victim_name == "master":
            self.timeline.gap_from_acks("writes resumed", found["window"].start)
        report = CorruptRoundReport(number, victim_name, stop, found.get("fault", "?"), found.get("outcome", "failed: no outcome"),
                                    found.get("refusal", ""), None)  # fmt: skip
        if "process" not in found:
            return report, master, slave
        if victim_name == "master":
            master = found["process"]
        else:
            slave = found["process"]
        self._wait(lambda: self._caught_up(master, slave), "the replicas to converge")
        restarted = found["process"]
        self._wait(lambda: self._status(restarted)["scrub"]["passes"] >= 1, "a scrub pass of the restarted replica")
        damaged = self._status(restarted)["damaged"]
        if damaged:  # found while serving (the scrub): stop it, repair from the peer, start it again
            peer = slave if restarted is master else master
            where = ", ".join(f"[{d['from']}, {d['to']}) {d['reason']}" for d in damaged)
            restarted.stop()
            error = self._repair(restarted, peer)
            if error:
                report.outcome = f"failed: the scrub found {where}; {error}"
                return report, master, slave
            replacement = self.restart(restarted, master_ha=None if restarted is master else master.ready["ha_listen"])
            if restarted is master:
                master = replacement
            else:
                slave = replacement
            report.outcome = f"scrub found {where}; repaired"
            self._wait(lambda: self._caught_up(master, slave), "the replicas to converge after the repair")
        self._settle(master, slave)
        report.checks = self.verify(number, master, slave, 0.0, 0.0)
        if not report.checks.identical:
            report.outcome += "; differs: " + self.differences(master, slave)
        return report, master, slave

    def differences(self, master: Process, slave: Process) -> str:
        """Where the two copies differ: the log's first differing offset, the queue files."""
        end = self._status(master)["max_offset"]
        parts = []
        if log_digest(master.store, end, self.segment_size) != log_digest(slave.store, end, self.segment_size):
            parts.append(f"commit log (first difference at offset {first_difference(master.store, slave.store, end, self.segment_size)})")
        ours, theirs = queue_file_digests(master.store), queue_file_digests(slave.store)
        parts += [f"consume queue {name}" for name in sorted(set(ours) | set(theirs)) if ours.get(name) != theirs.get(name)]
        return ", ".join(parts) or "nothing on disk (a race?)"


def first_difference(first: str, second: str, end: int, segment_size: int) -> int:
    """The first commit log offset below ``end`` where two stores' bytes differ (-1: none)."""
    offset = 0
    while offset < end:
        name = f"{offset - offset % segment_size:020d}"
        size = min(end - offset, segment_size - offset % segment_size)
        blocks = []
        for store in (first, second):
            with open(os.path.join(store, "commitlog", name), "rb") as file:
                file.seek(offset % segment_size)
                blocks.append(file.read(size))
        if blocks[0] != blocks[1]:
            return offset + next(i for i, (a, b) in enumerate(zip(*blocks, strict=False)) if a != b)
        offset += size
    return -1


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def run_corrupt_drill(*, rounds: int, producers: int, seed: int, report_path: str | None, keep: bool, echo=print,
                      plot: str | None = None) -> bool:
    drill = CorruptDrill(producers=producers, seed=seed, echo=echo)
    reports: list[CorruptRoundReport] = []
    echo(f"drill --fault corrupt: {rounds} round(s), {producers} producers, SYNC_MASTER, seed {seed}, stores under {drill.root}")
    try:
        master = drill.start("a", master_ha=None)
        slave = drill.start("b", master_ha=master.ready["ha_listen"])
        for number in range(1, rounds + 1):
            report, master, slave = drill.run_round(number, master, slave)
            reports.append(report)
            checks = report.checks
            verdict = "ok" if report.ok else "FAILED"
            echo(f"round {number}: {report.victim} ({report.stop}) {report.fault}: {report.outcome}"
                 + (f" [{report.refusal}]" if report.refusal else "")
                 + (f"; acked {checks.acked}, lost {checks.lost}, dup {checks.duplicated}, identical {checks.identical}, "
                    f"epochs {checks.epochs_agree}" if checks else "")
                 + (f"; queues differ from a rebuild from the log: {checks.queues}" if checks and checks.queues else "")
                 + f": {verdict}")  # fmt: skip
            if not report.ok:
                break
    finally:
        ok = len(reports) == rounds and all(r.ok for r in reports)
        drill.close(keep or not ok)
        if not ok:
            echo(f"the stores and logs are kept under {drill.root}")
    lost = sum(r.checks.lost for r in reports if r.checks)
    refused = sum("repaired" in r.outcome for r in reports)
    echo(f"summary: {len(reports)} round(s), {len(drill.acked)} acknowledged writes, {lost} lost, {refused} damaged copies "
         f"(refused at start, or found by the scrub) repaired from the peer: {'OK' if ok else 'FAILED'}")  # fmt: skip
    result = {"fault": "corrupt", "seed": seed, "producers": producers, "acknowledged": len(drill.acked), "lost": lost,
              "ok": ok, "rounds": [dataclasses.asdict(r) for r in reports], "timeline": drill.timeline.summary()}  # fmt: skip
    if report_path:
        with open(report_path, "w") as file:
            json.dump(result, file, indent=2)
    finish(result, plot, echo)
    return ok
