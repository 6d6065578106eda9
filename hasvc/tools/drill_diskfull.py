"""``hasvc drill --fault disk-full`` for a classic pair: one replica's disk fills up under load.

Each store lives on a small tmpfs of its own that the drill mounts (so it needs root). Each round:
producers write to a SYNC_MASTER and its slave; a filler file takes every free byte of one
replica's file system (drawn from the seed); the producers go on for ``FULL_SECONDS`` against the
full disk; the filler is removed; the drill waits for a PUT_OK again and for the two logs to
converge, and checks from disk as every drill does. What must hold: no process exits (a full disk
is answered DISK_FULL, or waited out by replication, never a crash), nothing acknowledged is lost
or duplicated, and writes resume by themselves once space is freed.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import subprocess
import time

import trio

from hasvc import client as hc
from hasvc.tools.drill import Drill, InterruptWatch, Process, RoundReport
from hasvc.tools.timeline_plot import finish

TMPFS_SIZE_MIB = 512  # each replica's file system: room for 20 rounds of the drill's writes at 8 producers with the 8 MiB segments below (96 MiB filled up by round 7 and the master then rightly answered DISK_FULL for good)
SEGMENT_SIZE = 8 * 1024 * 1024
FULL_SECONDS = 3.0  # the producers write against the full disk this long
RESUME_TIMEOUT_SECONDS = 60.0  # no PUT_OK this long after the space was freed: the round fails
FILL_CHUNK = 1024 * 1024


@dataclasses.dataclass
class DiskFullRoundReport:
    round: int
    victim: str
    statuses_while_full: dict[str, int]  # answers the producers got while the disk was full
    resumed_seconds: float  # space freed -> first PUT_OK
    exited: list[str]  # processes that exited during the round (must be none)
    checks: RoundReport | None

    @property
    def ok(self) -> bool:
        return not self.exited and self.checks is not None and self.checks.ok


def mount_tmpfs(path: str, size_mib: int) -> None:
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", path], check=True,
                   capture_output=True, text=True)  # fmt: skip


def unmount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True, text=True)


def fill(directory: str) -> str:
    """A file that takes every free byte of ``directory``'s file system; its path."""
    path = os.path.join(directory, "filler")
    chunk = bytes(FILL_CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
    return path


class DiskFullDrill(Drill):
    host_disk_ratio_off = False  # the full disk is the point
    def __init__(self, **kwargs):
        super().__init__(mode="sync", segment_size=SEGMENT_SIZE, **kwargs)
        self.fault_random = random.Random(f"disk-full-{kwargs.get('seed', 0)}")
        self.mounts: list[str] = []
        for store in ("a", "b"):
            path = os.path.join(self.root, store)
            mount_tmpfs(path, TMPFS_SIZE_MIB)
            self.mounts.append(path)

    def run_round(self, number: int, master: Process, slave: Process) -> DiskFullRoundReport:
        self._wait(lambda: any(s["ack_offset"] >= 0 for s in self._status(master)["slaves"]), "the slave's first report")
        victim_name = self.fault_random.choice(["master", "slave"])
        victim = master if victim_name == "master" else slave
        statuses: dict[str, int] = {}
        times: dict[str, float] = {}

        async def counted_producer(client: hc.FailoverClient) -> None:
            while True:
                number = self.next_number
                self.next_number += 1
                started = time.monotonic()
                try:
                    result = await client.send("Drill", f"m{number}:".encode() + b"d" * 200, queue_id=number % 4)
                except hc.ClientError as error:
                    statuses[type(error).__name__] = statuses.get(type(error).__name__, 0) + 1
                    await trio.sleep(0.05)
                    continue
                if "full" in times and "freed" not in times:
                    statuses[result.status] = statuses.get(result.status, 0) + 1
                if result.status == "PUT_OK":
                    self.acked[number] = result.offset
                    self.timeline.ack(started, time.monotonic())
                    if "freed" in times and "resumed" not in times:
                        times["resumed"] = time.monotonic()
                else:
                    await trio.sleep(0.01)

        async def run() -> None:
            addresses = [master.ready["listen"], slave.ready["listen"]]
            async with hc.connect_cluster(addresses, self.secret, retry_sends=True) as client, trio.open_nursery() as nursery:
                for _ in range(self.producers):
                    nursery.start_soon(counted_producer, client)
                await trio.sleep(self.fault_random.uniform(0.5, 1.5))
                filler = await trio.to_thread.run_sync(fill, victim.store)
                times["full"] = time.monotonic()
                window = self.timeline.fault(f"{victim_name}'s disk full", times["full"])  # once filled (filling takes seconds)
                await trio.sleep(FULL_SECONDS)
                os.unlink(filler)
                times["freed"] = time.monotonic()
                window.close(times["freed"])
                with trio.move_on_after(RESUME_TIMEOUT_SECONDS):
                    while "resumed" not in times:
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()

        self.run_writing(run)
        if "resumed" in times:
            self.timeline.gap("writes resumed", times["freed"], times["resumed"] - times["freed"])
        exited = [p.name for p in (master, slave) if not p.alive]
        report = DiskFullRoundReport(number, victim_name, statuses, times.get("resumed", float("inf")) - times["freed"],
                                     exited, None)  # fmt: skip
        if exited or "resumed" not in times:
            return report
        self._wait(lambda: self._caught_up(master, slave), "the replicas to converge")
        report.checks = self.verify(number, master, slave, 0.0, 0.0)
        return report

    def close(self, keep: bool) -> None:
        for process in self.processes:
            process.stop()
        for path in self.mounts:
            unmount(path)
        super().close(keep)


def run_diskfull_drill(*, rounds: int, producers: int, seed: int, report_path: str | None, keep: bool, echo=print,
                       plot: str | None = None) -> bool:
    if os.geteuid() != 0:
        raise PermissionError("--fault disk-full mounts a small tmpfs for each store: run it as root")
    drill = DiskFullDrill(producers=producers, seed=seed, echo=echo)
    reports: list[DiskFullRoundReport] = []
    echo(f"drill --fault disk-full: {rounds} round(s), {producers} producers, SYNC_MASTER, seed {seed}, "
         f"each store on its own {TMPFS_SIZE_MIB} MiB tmpfs under {drill.root}")  # fmt: skip
    ok = False
    watch = InterruptWatch(drill.root, reports, kept="the logs")  # the stores were on the tmpfs mounts
    try:
        with watch:
            master = drill.start("a", master_ha=None)
            slave = drill.start("b", master_ha=master.ready["ha_listen"])
            for number in range(1, rounds + 1):
                report = drill.run_round(number, master, slave)
                reports.append(report)
                checks = report.checks
                echo(f"round {number}: {report.victim}'s disk full {FULL_SECONDS:.0f} s; answers meanwhile "
                     f"{dict(sorted(report.statuses_while_full.items()))}; writes resumed {report.resumed_seconds:.2f} s after "
                     f"the space was freed; exited {report.exited or 'none'}"
                     + (f"; acked {checks.acked}, lost {checks.lost}, dup {checks.duplicated}, identical {checks.identical}"
                        if checks else "") + (": ok" if report.ok else ": FAILED"))  # fmt: skip
                if not report.ok:
                    break
            ok = len(reports) == rounds and all(r.ok for r in reports)
    finally:
        drill.close(keep or not ok)
        if not ok and not watch.interrupted:
            echo(f"the logs are kept under {drill.root}")
    lost = sum(r.checks.lost for r in reports if r.checks)
    exits = sum(len(r.exited) for r in reports)
    echo(f"summary: {len(reports)} round(s), {len(drill.acked)} acknowledged writes, {lost} lost, {exits} process exits: "
         f"{'OK' if ok else 'FAILED'}")  # fmt: skip
    result = {"fault": "disk-full", "seed": seed, "producers": producers, "acknowledged": len(drill.acked), "lost": lost,
              "exits": exits, "ok": ok, "rounds": [dataclasses.asdict(r) for r in reports], "timeline": drill.timeline.summary()}  # fmt: skip
    if report_path:
        with open(report_path, "w") as file:
            json.dump(result, file, indent=2)
    finish(result, plot, echo)
    return ok
