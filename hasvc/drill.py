"""``hasvc drill``: failover rounds on loopback, checked from the data on disk.

Each round: producers write uniquely numbered messages to the master; the master is killed with
SIGKILL at a random moment; the slave is promoted; producers move on to it for a while; the old
master is restarted as a slave of the new one, cuts what it had beyond the consistent point and
catches up. Then, from the stores on disk: every message acknowledged PUT_OK (in sync mode) is
present exactly once at its acknowledged offset, no message is duplicated, the two commit logs are
byte-identical, the consume queues are identical, both sides have the same epoch history, and each
side's checkpoint and epoch file agree with its log.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import trio

from commitlog.checkpoint import StoreCheckpoint
from commitlog.inspect import iter_records
from hasvc import client as hc

READY_TIMEOUT_SECONDS = 30.0
CATCH_UP_TIMEOUT_SECONDS = 120.0
DRILL_TOPIC = "Drill"


class Process:
    def __init__(self, root: str, name: str, args: list[str]):
        self.name = name
        self.log_path = os.path.join(root, f"{name}.log")
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen([sys.executable, "-m", "hasvc.cli", *args], stdout=subprocess.PIPE, stderr=log)
        line = self.popen.stdout.readline().decode()
        if not line.startswith("READY "):
            self.kill()
            raise RuntimeError(f"{name} did not start; see {self.log_path}")
        self.ready = json.loads(line[len("READY ") :])

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        with open(self.log_path, errors="replace") as file:
            return file.read()


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

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.identical and self.epochs_agree and self.files_agree


class Drill:
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

    def _common(self, store: str) -> list[str]:
        return ["--store", os.path.join(self.root, store), "--listen", "127.0.0.1:0", "--ha-listen", "127.0.0.1:0",
                "--set", f"commitlog_segment_size={self.segment_size}", "--set", "slave_timeout_ms=2000",
                "--set", "ha_reconnect_backoff_max_ms=500",
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

    async def _produce(self, address: str, seconds: float | None, stop_event: trio.Event | None) -> None:
        try:
            async with hc.connect(address, self.secret) as client:
                async def worker() -> None:
                    while stop_event is None or not stop_event.is_set():
                        number = self.next_number
                        self.next_number += 1
                        try:
                            result = await client.send(DRILL_TOPIC, f"m{number}:".encode() + b"d" * 200, queue_id=number % 4)
                        except hc.ClientError:
                            return
                        if result.status == "PUT_OK":
                            self.acked[number] = result.offset

                with trio.move_on_after(seconds if seconds is not None else float("inf")):
                    async with trio.open_nursery() as nursery:
                        for _ in range(self.producers):
                            nursery.start_soon(worker)
        except hc.ClientError:
            pass

    def produce_until_killed(self, master: Process) -> None:
        delay = self.random.uniform(0.5, 2.0)

        async def run() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._produce, master.ready["listen"], None, None)
                await trio.sleep(delay)
                master.kill()  # SIGKILL at a random moment under load

        trio.run(run)

    def produce_for(self, master_address: str, seconds: float) -> None:
        trio.run(self._produce, master_address, seconds, None)

    def run_round(self, number: int, master: Process, slave: Process) -> tuple[RoundReport, Process, Process]:
        self._wait(lambda: self._status(master)["slaves"], "the slave to connect")
        self.produce_until_killed(master)
        started = time.monotonic()
        with hc.BlockingClient(slave.ready["listen"], self.secret) as client:
            promoted = client.promote(sync=self.mode == "sync")
        promote_seconds = time.monotonic() - started
        new_master, new_master_ha = slave, promoted["ha_listen"]
        self.produce_for(new_master.ready["listen"], 0.5)
        started = time.monotonic()
        rejoined = self.start(os.path.basename(master.store), master_ha=new_master_ha)
        self._wait(lambda: self._caught_up(new_master, rejoined), "the old master to catch up")
        catch_up_seconds = time.monotonic() - started
        report = self.verify(number, new_master, rejoined, promote_seconds, catch_up_seconds)
        return report, new_master, rejoined

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
                           identical, epochs_agree, files_agree)  # fmt: skip

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


def queue_file_digests(store: str) -> dict:
    """SHA-256 of every consume queue file, by path under consumequeue/."""
    found = {}
    root = os.path.join(store, "consumequeue")
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as file:
                found[os.path.relpath(os.path.join(directory, name), root)] = hashlib.sha256(file.read()).hexdigest()
    return found


def run_drill(*, rounds: int, producers: int, mode: str, seed: int, report_path: str | None, keep: bool, echo=print) -> bool:
    drill = Drill(producers=producers, mode=mode, seed=seed, echo=echo)
    reports: list[RoundReport] = []
    echo(f"drill: {rounds} round(s), {producers} producers, {mode.upper()}_MASTER, seed {seed}, stores under {drill.root}")
    echo(f"{'round':>5} {'acked*':>8} {'lost':>5} {'dup':>4} {'truncated B':>12} {'promote s':>10} {'catch-up s':>11} {'identical':>9} {'epochs':>7} {'files':>6}")
    try:
        master = drill.start("a", master_ha=None)
        slave = drill.start("b", master_ha=master.ready["ha_listen"])
        echo("  (* acknowledged writes so far; lost and truncated bytes are this round's)")
        for number in range(1, rounds + 1):
            report, master, slave = drill.run_round(number, master, slave)
            reports.append(report)
            echo(f"{report.round:>5} {report.acked:>8} {report.lost:>5} {report.duplicated:>4} {report.truncated_bytes:>12} "
                 f"{report.promote_seconds:>10.3f} {report.catch_up_seconds:>11.3f} {str(report.identical):>9} "
                 f"{str(report.epochs_agree):>7} {str(report.files_agree):>6}")  # fmt: skip
    finally:
        drill.close(keep)
    consistent = len(reports) == rounds and all(
        r.duplicated == 0 and r.identical and r.epochs_agree and r.files_agree for r in reports
    )
    lost = sum(r.lost for r in reports)
    ok = consistent and (lost == 0 or mode == "async")
    verdict = "OK" if ok else "FAILED"
    if mode == "async" and lost:
        verdict += " (ASYNC_MASTER acknowledges before replicating: these writes were on the killed master only)"
    echo(f"summary: {len(reports)} round(s), {len(drill.acked)} acknowledged writes, {lost} lost, "
         f"{sum(r.duplicated for r in reports)} duplicated: {verdict}")  # fmt: skip
    if report_path:
        with open(report_path, "w") as file:
            json.dump({"rounds": [dataclasses.asdict(r) for r in reports], "mode": mode, "seed": seed,
                       "producers": producers, "acknowledged": len(drill.acked), "lost": lost, "ok": ok}, file, indent=2)  # fmt: skip
    return ok
