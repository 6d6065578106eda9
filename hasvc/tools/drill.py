"""``hasvc drill``: failover rounds on loopback, checked from the data on disk.

Each round: producers write uniquely numbered messages to the master; the master is killed with
SIGKILL at a random moment; the slave is promoted; producers move on to it for a while; the old
master is restarted as a slave of the new one, cuts what it had beyond the consistent point and
catches up. Then, from the stores on disk: every message acknowledged PUT_OK (in sync mode) is
present exactly once at its acknowledged offset, no message is duplicated, the two commit logs are
byte-identical, the consume queues are identical and each equals a rebuild from its log, both sides
have the same epoch history, and each side's checkpoint and epoch file agree with its log.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import time

import trio

from commitlog.checkpoint import StoreCheckpoint
from commitlog.inspect import check_consume_queues, iter_records
from hasvc import client as hc
from hasvc.testing.launch import ReadyProcess, hasvc_command
from hasvc.tools.timeline import Timeline
from hasvc.tools.timeline_plot import finish

CATCH_UP_TIMEOUT_SECONDS = 120.0
DRILL_TOPIC = "Drill"


class DrillInterrupted(KeyboardInterrupt):
    """Ctrl-C ended a drill: ``str()`` is the one line ``hasvc drill`` says (exit 130), true once
    the drill's clean-up has run."""


class InterruptWatch:
    """Ctrl-C in a drill's rounds, said in one line. ``with watch:`` around the rounds turns a
    KeyboardInterrupt (bare, or inside trio's exception groups) into ``DrillInterrupted``, naming
    the round it stopped in and where the stores are, and sets ``interrupted`` for the drill's
    clean-up: that stops every process the drill started (by PID) and keeps ``root`` for a look."""

    def __init__(self, root: str, reports: list, *, kept: str = "the stores and logs") -> None:
        self.root = root
        self.reports = reports  # the rounds done: the one interrupted is the next
        self.kept = kept
        self.interrupted = False

    def __enter__(self) -> InterruptWatch:
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if error is None:
            return False
        if isinstance(error, BaseExceptionGroup):
            interrupt = error.subgroup(KeyboardInterrupt) is not None
        else:
            interrupt = isinstance(error, KeyboardInterrupt)
        if not interrupt:
            return False
        self.interrupted = True
        raise DrillInterrupted(f"drill interrupted in round {len(self.reports) + 1}: the processes it started are stopped, "
                               f"{self.kept} kept under {self.root}") from None  # fmt: skip


class Process(ReadyProcess):
    """A ``hasvc ARGS`` process of a drill (or a benchmark), its log under ``root``."""

    def __init__(self, root: str, name: str, args: list[str]):
        super().__init__(name, hasvc_command(*args), os.path.join(root, f"{name}.log"))


@dataclasses.dataclass
class RoundReport:
    round: int
    acked: int
    lost: int
    duplicated: int
    truncated_bytes: int
    promote_seconds: float
    catch_up_seconds: float
    identical: bool
    epochs_agree: bool
    files_agree: bool = True  # checkpoint and epoch files consistent with each log
    duplicates_answered: int = 0  # retried sends the new master recognised (not stored again)
    queues: str = ""  # where a side's consume queues differ from a rebuild from its log ("": they match)

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.duplicated == 0 and self.identical and self.epochs_agree and self.files_agree
                and not self.queues)  # fmt: skip


class Drill:
    # The stores are throwaway: how full the host's disk is is not what a drill tests (the
    # disk-full drill, whose stores are on file systems of their own, keeps the ratio).
    host_disk_ratio_off = True

    def __init__(self, *, producers: int, mode: str, seed: int, segment_size: int = 4 * 1024 * 1024, echo=print,
                 secret: bytes | None = None, root: str | None = None):  # fmt: skip
        self.secret = secret
        self.producers = producers
        self.mode = mode
        self.random = random.Random(seed)
        self.segment_size = segment_size
        self.echo = echo
        self.root = root or tempfile.mkdtemp(prefix="hasvc-drill-")
        self.secret_file = None
        if secret is not None:
            self.secret_file = os.path.join(self.root, "secret")
            with open(os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
                file.write(secret)
        self.next_number = 0
        self.acked: dict[int, int] = {}  # message number -> acknowledged offset (PUT_OK only)
        self.lost: set[int] = set()  # acknowledged messages found missing (counted once)
        self.processes: list[Process] = []
        self.timeline = Timeline()  # every PUT_OK, the faults and failover gaps (--plot, --report)

    def _common(self, store: str) -> list[str]:
        # The stores are throwaway: retention (which a full disk triggers regardless of age) would
        # delete segments on one side mid-round and leave the from-disk checks comparing nothing.
        return ["--store", os.path.join(self.root, store), "--listen", "127.0.0.1:0", "--ha-listen", "127.0.0.1:0",
                "--set", f"commitlog_segment_size={self.segment_size}", "--set", "slave_timeout_ms=2000",
                "--set", "ha_reconnect_backoff_max_ms=500", "--set", "disk_clean_ratio=1.0",
                *(["--set", "disk_max_used_space_ratio=1.0"] if self.host_disk_ratio_off else []),
                *(["--secret-file", self.secret_file] if self.secret_file else [])]  # fmt: skip

    def start(self, store: str, *, master_ha: str | None) -> Process:
        if master_ha is None:
            args = ["master", "--role", self.mode, *self._common(store)]
        else:
            args = ["slave", "--master-ha", master_ha, *self._common(store)]
        process = Process(self.root, f"{store}-{len(self.processes)}", args)
        process.store = os.path.join(self.root, store)
        self.processes.append(process)
        return process

    async def _producer(self, client: hc.FailoverClient) -> None:
        """Numbered messages, each sent until it is answered (retried across a failover with the
        same producer sequence, so a retry is never stored twice)."""
        while True:
            number = self.next_number
            self.next_number += 1
            started = time.monotonic()
            try:
                result = await client.send(DRILL_TOPIC, f"m{number}:".encode() + b"d" * 200, queue_id=number % 4)
            except hc.ClientError:
                await trio.sleep(0.05)  # no master within the failover timeout: this one is not acknowledged
                continue
            if result.status == "PUT_OK":
                self.acked[number] = result.offset
                self.timeline.ack(started, time.monotonic())

    def run_round(self, number: int, master: Process, slave: Process) -> tuple[RoundReport, Process, Process]:
        self._wait(lambda: any(s["ack_offset"] >= 0 for s in self._status(master)["slaves"]), "the slave's first report")
        delay = self.random.uniform(0.5, 2.0)
        times: dict[str, float] = {}
        found: dict = {}

        async def run() -> None:
            addresses = [master.ready["listen"], slave.ready["listen"]]
            async with hc.connect_cluster(addresses, self.secret, retry_sends=True) as client, trio.open_nursery() as nursery:
                for _ in range(self.producers):
                    nursery.start_soon(self._producer, client)
                await trio.sleep(delay)
                times["kill"], times["reaped"] = await trio.to_thread.run_sync(master.kill)  # SIGKILL at a random moment under load
                fault = self.timeline.fault(f"kill master {os.path.basename(master.store)}", times["kill"])
                started = time.monotonic()
                async with hc.connect(slave.ready["listen"], self.secret) as admin:
                    promoted = await admin.promote(sync=self.mode == "sync")
                times["promote"] = time.monotonic() - started
                await trio.sleep(0.3)  # the producers move on to the new master by themselves
                target = (await client.status())["max_offset"]
                started = time.monotonic()
                rejoined = await trio.to_thread.run_sync(lambda: self.start(os.path.basename(master.store), master_ha=promoted["ha_listen"]))
                found["rejoined"] = rejoined
                fault.close()
                while (await self._status_async(rejoined))["max_offset"] < target:
                    await trio.sleep(0.02)
                times["catch_up"] = time.monotonic() - started
                await trio.sleep(0.3)  # SYNC_MASTER writes acknowledged by the rejoined slave
                found["failovers"] = client.failovers
                nursery.cancel_scope.cancel()

        self.run_writing(run)
        self.timeline.gap_from_acks("failover", times["kill"], sent_after=times["reaped"])
        rejoined = found["rejoined"]
        self._wait(lambda: self._caught_up(slave, rejoined), "the old master to catch up")
        report = self.verify(number, slave, rejoined, times["promote"], times["catch_up"])
        report.duplicates_answered = self._status(slave)["duplicate_sends"]
        return report, slave, rejoined

    def run_writing(self, run, *args) -> None:
        """``trio.run(run, *args)``: a stretch with the producers writing; the timeline shows the
        time between two such stretches (the drill's checks) as paused."""
        self.timeline.resume()
        try:
            trio.run(run, *args)
        finally:
            self.timeline.pause()

    async def _status_async(self, process: Process) -> dict:
        async with hc.connect(process.ready["listen"], self.secret) as client:
            return await client.status()

    def verify(self, number, master: Process, slave: Process, promote_seconds: float, catch_up_seconds: float) -> RoundReport:
        end = self._status(master)["max_offset"]
        seen: dict[int, int] = {}
        duplicated = 0
        for offset, record, _crc_ok in iter_records(master.store):
            if record.topic != DRILL_TOPIC:
                continue
            message = int(bytes(record.body).split(b":", 1)[0][1:])
            duplicated += message in seen
            seen[message] = offset
        missing = {message for message, offset in self.acked.items() if seen.get(message) != offset}
        lost = len(missing - self.lost)  # new in this round
        self.lost |= missing
        identical = log_digest(master.store, end, self.segment_size) == log_digest(slave.store, end, self.segment_size)
        identical = identical and queue_file_digests(master.store) == queue_file_digests(slave.store)
        epochs_agree = self._status(master)["epochs"] == self._status(slave)["epochs"]
        truncated = sum(int(n) for n in re.findall(r"dropped (\d+) bytes", slave.log()))
        files_agree = all(files_agree_with_log(process.store, self._status(process)) for process in (master, slave))
        return RoundReport(number, len(self.acked), lost, duplicated, truncated, promote_seconds, catch_up_seconds,
                           identical, epochs_agree, files_agree, queues=queues_against_logs(master, slave))  # fmt: skip

    def _status(self, process: Process) -> dict:
        with hc.BlockingClient(process.ready["listen"], self.secret) as client:
            return client.status()

    def _caught_up(self, master: Process, slave: Process) -> bool:
        m, s = self._status(master), self._status(slave)
        return (m["max_offset"] == s["max_offset"] and s["dispatched_offset"] == s["max_offset"]
                and m["dispatched_offset"] == m["max_offset"])  # fmt: skip

    def _wait(self, predicate, what: str) -> None:
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_SECONDS
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def close(self, keep: bool) -> None:
        for process in self.processes:
            process.stop()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


def files_agree_with_log(store: str, status: dict) -> bool:
    """The checkpoint claims no more than the log holds, and every epoch starts at a record
    boundary within the log (or at its end)."""
    checkpoint = StoreCheckpoint.open(os.path.join(store, "checkpoint"))
    end = status["max_offset"]
    if checkpoint.master_flushed_offset > end:
        return False
    boundaries = {offset for offset, _record, _ok in iter_records(store)} | {end}
    return all(start in boundaries or start < status["min_offset"] for _epoch, start in status["epochs"])


def log_digest(store: str, end: int, segment_size: int, *, start: int = 0) -> str:
    """SHA-256 of commit log bytes ``[start, end)`` read from the segment files on disk."""
    digest = hashlib.sha256()
    offset = start
    while offset < end:
        with open(os.path.join(store, "commitlog", f"{offset - offset % segment_size:020d}"), "rb") as file:
            file.seek(offset % segment_size)
            data = file.read(min(end - offset, segment_size - offset % segment_size))
        digest.update(data)
        offset += len(data)
    return digest.hexdigest()


def queues_against_logs(master: Process, slave: Process) -> str:
    """Each side's consume queues against a rebuild from its own log (``check_consume_queues``):
    the first differing unit, a queue offset two records hold; "" when both match. Units the
    dispatcher has not reached yet are no finding."""
    findings = []
    for name, process in (("master", master), ("slave", slave)):
        check = check_consume_queues(process.store)
        if not check.ok:
            findings.append(f"{name} {os.path.basename(process.store)}: {check.describe()}")
    return "; ".join(findings)


def queue_file_digests(store: str) -> dict:
    """SHA-256 of every consume queue file, by path under consumequeue/."""
    found = {}
    root = os.path.join(store, "consumequeue")
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as file:
                found[os.path.relpath(os.path.join(directory, name), root)] = hashlib.sha256(file.read()).hexdigest()
    return found


def run_drill(*, rounds: int, producers: int, mode: str, seed: int, report_path: str | None, keep: bool, echo=print,
              plot: str | None = None) -> bool:
    drill = Drill(producers=producers, mode=mode, seed=seed, echo=echo)
    reports: list[RoundReport] = []
    echo(f"drill: {rounds} round(s), {producers} producers, {mode.upper()}_MASTER, seed {seed}, stores under {drill.root}")
    echo(f"{'round':>5} {'acked*':>8} {'lost':>5} {'dup':>4} {'retries':>7} {'truncated B':>12} {'promote s':>10} {'catch-up s':>11} "
         f"{'identical':>9} {'epochs':>7} {'files':>6}")  # fmt: skip
    watch = InterruptWatch(drill.root, reports)
    try:
        with watch:
            master = drill.start("a", master_ha=None)
            slave = drill.start("b", master_ha=master.ready["ha_listen"])
            echo("  (* acknowledged writes so far; lost, truncated bytes and retries (sends retried after the failover that the new\n"
                 "   master recognised as already stored, so answered with their offsets instead of being stored twice) are this round's)")
            for number in range(1, rounds + 1):
                report, master, slave = drill.run_round(number, master, slave)
                reports.append(report)
                echo(f"{report.round:>5} {report.acked:>8} {report.lost:>5} {report.duplicated:>4} {report.duplicates_answered:>7} {report.truncated_bytes:>12} "
                     f"{report.promote_seconds:>10.3f} {report.catch_up_seconds:>11.3f} {str(report.identical):>9} "
                     f"{str(report.epochs_agree):>7} {str(report.files_agree):>6}")  # fmt: skip
                if report.queues:
                    echo(f"      consume queues differ from a rebuild from the log: {report.queues}")
    finally:
        drill.close(keep or watch.interrupted)
    consistent = len(reports) == rounds and all(
        r.duplicated == 0 and r.identical and r.epochs_agree and r.files_agree and not r.queues for r in reports
    )
    lost = sum(r.lost for r in reports)
    ok = consistent and (lost == 0 or mode == "async")
    verdict = "OK" if ok else "FAILED"
    if mode == "async" and lost:
        verdict += " (ASYNC_MASTER acknowledges before replicating: these writes were on the killed master only)"
    echo(f"summary: {len(reports)} round(s), {len(drill.acked)} acknowledged writes, {lost} lost, "
         f"{sum(r.duplicated for r in reports)} duplicated: {verdict}")  # fmt: skip
    result = {"rounds": [dataclasses.asdict(r) for r in reports], "mode": mode, "seed": seed, "producers": producers,
              "acknowledged": len(drill.acked), "lost": lost, "ok": ok, "timeline": drill.timeline.summary()}  # fmt: skip
    if report_path:
        with open(report_path, "w") as file:
            json.dump(result, file, indent=2)
    finish(result, plot, echo)
    return ok
