"""``hasvc drill --fault switchover`` for a classic pair: planned switchovers under load.

Each round: producers (failover clients that retry a refused send with the same sequence) write
uniquely numbered messages to the master; at a moment drawn from the seed the pair is switched
over (``hasvc.tools.switchover``: fence, wait for the slave's last byte, promote, demote); the
producers move on to the new master by themselves and go on for a while. Then, from the stores
on disk as in every drill: each message acknowledged PUT_OK is present exactly once at its
offset, nothing is duplicated, the commit logs and consume queues are byte-identical, the epoch
histories agree, and, unlike a failover, not one byte was cut from the old master (a switchover
that cut something would have let the old master take a write the new one lacks). The next round
switches back.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import time

import trio

from hasvc import client as hc
from hasvc.tools.drill import DRILL_TOPIC, Drill, InterruptWatch, Process, RoundReport
from hasvc.tools.switchover import switchover
from hasvc.tools.timeline_plot import finish

AFTER_SWITCH_SECONDS = 0.5  # writes go on against the new master before the round is checked


@dataclasses.dataclass
class SwitchoverRoundReport:
    round: int
    paused_seconds: float  # writes refused: from the fence to the new master taking writes
    wait_seconds: float  # of which waiting for the slave's last bytes
    cut_bytes: int  # bytes the old master cut when it rejoined (must be 0)
    rejoined: bool  # the old master reported as the new master's slave before the new master took writes
    answers: dict  # the producers' answers this round, by status (a send that found no master: "no master")
    checks: RoundReport

    @property
    def ok(self) -> bool:
        return self.checks.ok and self.cut_bytes == 0 and self.rejoined


class SwitchoverDrill(Drill):
    """A ``Drill`` whose rounds switch the pair over instead of killing the master."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.answers: collections.Counter = collections.Counter()

    async def _producer(self, client: hc.FailoverClient) -> None:
        """As ``Drill._producer``, counting every answer by status."""
        while True:
            number = self.next_number
            self.next_number += 1
            started = time.monotonic()
            try:
                result = await client.send(DRILL_TOPIC, f"m{number}:".encode() + b"d" * 200, queue_id=number % 4)
            except hc.ClientError:
                self.answers["no master"] += 1
                await trio.sleep(0.05)  # no master within the failover timeout: this one is not acknowledged
                continue
            self.answers[result.status] += 1
            if result.status == "PUT_OK":
                self.acked[number] = result.offset
                self.timeline.ack(started, time.monotonic())

    def run_round(self, number: int, master: Process, slave: Process) -> tuple[SwitchoverRoundReport, Process, Process]:
        self._wait(lambda: any(s["ack_offset"] >= 0 for s in self._status(master)["slaves"]), "the slave's first report")
        cut_before = _cut_bytes(master.log())
        self.answers.clear()
        delay = self.random.uniform(0.5, 2.0)
        found = {}

        async def run() -> None:
            addresses = [master.ready["listen"], slave.ready["listen"]]
            async with hc.connect_cluster(addresses, self.secret, retry_sends=True) as client, trio.open_nursery() as nursery:
                for _ in range(self.producers):
                    nursery.start_soon(self._producer, client)
                await trio.sleep(delay)
                window = self.timeline.fault("switchover")
                found["result"] = await switchover(master.ready["listen"], slave.ready["listen"], secret=self.secret)
                window.close()  # the new master's fence is lifted last: writes were refused for the last fenced_seconds
                self.timeline.gap("writes paused", window.end - found["result"].fenced_seconds, found["result"].fenced_seconds)
                await trio.sleep(AFTER_SWITCH_SECONDS)
                nursery.cancel_scope.cancel()

        self.run_writing(run)
        result = found["result"]
        self._wait(lambda: self._caught_up(slave, master), "the old master to catch up as a slave")
        checks = self.verify(number, slave, master, result.fenced_seconds, 0.0)
        checks.duplicates_answered = self._status(slave)["duplicate_sends"]
        report = SwitchoverRoundReport(number, result.fenced_seconds, result.wait_seconds, _cut_bytes(master.log()) - cut_before,
                                       result.rejoined, dict(self.answers), checks)  # fmt: skip
        return report, slave, master


def _cut_bytes(log: str) -> int:
    return sum(int(n) for n in re.findall(r"dropped (\d+) bytes", log))


def run_switchover_drill(*, rounds: int, producers: int, mode: str, seed: int, report_path: str | None, keep: bool,
                         echo=print, plot: str | None = None) -> bool:  # fmt: skip
    drill = SwitchoverDrill(producers=producers, mode=mode, seed=seed, echo=echo)
    reports: list[SwitchoverRoundReport] = []
    echo(f"drill --fault switchover: {rounds} round(s), {producers} producers, {mode.upper()}_MASTER, seed {seed}, "
         f"stores under {drill.root}")  # fmt: skip
    watch = InterruptWatch(drill.root, reports)
    try:
        with watch:
            master = drill.start("a", master_ha=None)
            slave = drill.start("b", master_ha=master.ready["ha_listen"])
            for number in range(1, rounds + 1):
                report, master, slave = drill.run_round(number, master, slave)
                reports.append(report)
                checks = report.checks
                others = ", ".join(f"{status} {count}" for status, count in sorted(report.answers.items()) if status != "PUT_OK") or "none"
                echo(f"round {number}: writes paused {report.paused_seconds:.3f} s ({report.wait_seconds:.3f} s for the slave), "
                     f"answers other than PUT_OK: {others}, acked {checks.acked}, lost {checks.lost}, dup {checks.duplicated}, retries answered {checks.duplicates_answered}, "
                     f"cut {report.cut_bytes} B, identical {checks.identical}, epochs {checks.epochs_agree}, files "
                     f"{checks.files_agree}: {'ok' if report.ok else 'FAILED'}")  # fmt: skip
                if not report.ok:
                    break
    finally:
        drill.close(keep or watch.interrupted)
    lost = sum(r.checks.lost for r in reports)
    duplicated = sum(r.checks.duplicated for r in reports)
    ok = len(reports) == rounds and all(r.ok for r in reports)
    echo(f"summary: {len(reports)} switchover(s), {len(drill.acked)} acknowledged writes, {lost} lost, {duplicated} duplicated: "
         f"{'OK' if ok else 'FAILED'}")  # fmt: skip
    result = {"fault": "switchover", "mode": mode, "seed": seed, "producers": producers, "acknowledged": len(drill.acked),
              "lost": lost, "duplicated": duplicated, "ok": ok, "rounds": [dataclasses.asdict(r) for r in reports],
              "timeline": drill.timeline.summary()}  # fmt: skip
    if report_path:
        with open(report_path, "w") as file:
            json.dump(result, file, indent=2)
    finish(result, plot, echo)
    return ok
