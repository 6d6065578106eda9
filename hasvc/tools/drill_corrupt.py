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

A round's cost is bounded (``hasvc.tools.drill_verify``): each round checks what changed since the
round before verified the logs — the records appended since (parsed: each acknowledged one at its
offset, none twice; their bytes compared with the peer's; the queue units they add compared with
a rebuild), and the files whose verified part moved (the damaged one always), re-read and
compared with their digest at the last check. A moved verified part (a repair that did not
restore the same bytes, a cut) makes that round run the full check, as does the first round and
the last, which reads both stores whole with nothing reused. The last round's verdict is that of
a full check; a change the file signatures hid mid-drill would be found there, a round late.
A round still waiting (for a restart, a repair, the replicas to converge, a scrub pass) past
``ROUND_TIMEOUT_SECONDS`` fails with what it was waiting for.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import os
import random
import re
import subprocess
import sys
import time
from array import array

import trio

from hasvc import client as hc
from hasvc.testing.launch import StartError
from commitlog.checkpoint import StoreCheckpoint
from commitlog.inspect import iter_records
from hasvc.tools.drill import (CATCH_UP_TIMEOUT_SECONDS, DRILL_TOPIC, Drill, InterruptWatch, Process, RoundReport, files_agree_with_log,
                               log_digest, queue_file_digests, queues_against_logs)  # fmt: skip
from hasvc.tools.drill_verify import FileDigests, PrefixDigests, QueueRebuild, RoundClock, RoundTimeout
from hasvc.tools.faults import flip_random_byte
from hasvc.tools.timeline_plot import finish

REPAIR_TIMEOUT_SECONDS = 120.0
SETTLE_SECONDS = 0.5  # the master's end must stand still this long before the copies are compared
# A round waits 10-30 s on a loaded 2-core machine (a refusal and repair included); past this
# it is waiting for something that is not coming. Its checks of the stores are not bounded by
# it: they read disks and end (the last round's, of both stores whole, takes minutes after 200).
ROUND_TIMEOUT_SECONDS = 600.0


@dataclasses.dataclass
class CorruptRoundReport:
    round: int
    victim: str  # "master" or "slave"
    stop: str  # "SIGTERM" or "SIGKILL"
    fault: str  # what was flipped, where
    outcome: str  # "started" (nothing refused), "repaired" (refused, repaired from the peer, started), "failed: ..."
    refusal: str  # the broker's one line, when it refused
    checks: RoundReport | None
    seconds: str = ""  # the round's duration and its phases
    checked: str = ""  # "full" or "since offset N" (and why a full check, when one was due mid-drill)

    @property
    def ok(self) -> bool:
        return self.checks is not None and self.checks.ok and not self.outcome.startswith("failed")


class _Verified:
    """What the checks proved up to ``end`` of the master's log: the acknowledged messages found
    there, the record boundaries, the queues rebuilt, and the digests that say it still holds."""

    def __init__(self) -> None:
        self.end: int | None = None
        self.store = ""  # the master's store, whose records these are
        self.seen: dict[int, int] = {}  # message number -> the offset of its (last) record
        self.boundaries = array("q")  # every record's offset, ascending
        self.acked_count = 0  # acknowledged writes (in the order acknowledged) checked so far
        self.logs = PrefixDigests()  # both stores' segments, up to end
        self.queue_prefixes = PrefixDigests()  # the master's consume queue files, up to the units compared
        self.queue_files = FileDigests()  # both stores' consume queue files, whole
        self.queues = QueueRebuild()


class CorruptDrill(Drill):
    """A ``Drill`` whose rounds damage a stopped replica's store instead of failing over."""

    def __init__(self, **kwargs):
        super().__init__(mode="sync", **kwargs)
        self.fault_random = random.Random(f"corrupt-{kwargs.get('seed', 0)}")
        self.verified = _Verified()  # what the checks proved so far (verify_since)
        self.clock: RoundClock | None = None  # the running round's phases and deadline

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

    def run_round(self, number: int, master: Process, slave: Process, *, last: bool = False) -> tuple[CorruptRoundReport, Process, Process]:
        """One round under ``ROUND_TIMEOUT_SECONDS``: past it, the round fails with what it was waiting for."""
        self.clock = RoundClock(ROUND_TIMEOUT_SECONDS)
        try:
            report, master, slave = self._run_round(number, master, slave, last=last)
        except RoundTimeout as timeout:
            report = CorruptRoundReport(number, "?", "?", "?", f"failed: {timeout}", "", None)
        report.seconds = self.clock.summary()
        self.clock = None
        return report, master, slave

    def _wait(self, predicate, what: str) -> None:
        """``Drill._wait``, and the round's deadline: a ``RoundTimeout`` naming ``what`` past it."""
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_SECONDS
        while not predicate():
            if self.clock is not None:
                self.clock.check(what)
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def _run_round(self, number: int, master: Process, slave: Process, *, last: bool) -> tuple[CorruptRoundReport, Process, Process]:
        clock = self.clock
        with clock.phase("ready"):
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
            found["damaged"] = fault.path if fault else ""
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
            with trio.move_on_after(clock.remaining()) as bound:
                async with hc.connect_cluster(addresses, self.secret, retry_sends=True) as client, trio.open_nursery() as nursery:
                    for _ in range(self.producers):
                        nursery.start_soon(self._producer, client)
                    await trio.sleep(delay)
                    found["window"] = self.timeline.fault(f"corrupt {victim_name} ({stop})")
                    # abandon_on_cancel: past the round's bound the drill reports and stops; the
                    # thread's processes are in self.processes, which close() stops.
                    await trio.to_thread.run_sync(damage_and_restart, abandon_on_cancel=True)
                    found["window"].close()
                    await trio.sleep(0.5)  # writes go on against the restarted replica
                    nursery.cancel_scope.cancel()
            if bound.cancelled_caught:
                found["timed_out"] = True

        with clock.phase("write+damage+restart"):
            self.run_writing(run)
        if found.get("timed_out"):
            waiting = "the stopped replica's damage, restart or repair" if "window" in found else "the producers' first writes"
            raise clock.expired(waiting)
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
        with clock.phase("converge"):
            self._wait(lambda: self._caught_up(master, slave), "the replicas to converge")
        restarted = found["process"]
        with clock.phase("scrub"):
            self._wait(lambda: self._status(restarted)["scrub"]["passes"] >= 1, "a scrub pass of the restarted replica")
        damaged = self._status(restarted)["damaged"]
        if damaged:  # found while serving (the scrub): stop it, repair from the peer, start it again
            peer = slave if restarted is master else master
            where = ", ".join(f"[{d['from']}, {d['to']}) {d['reason']}" for d in damaged)
            with clock.phase("scrub repair"):
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
            with clock.phase("converge"):
                self._wait(lambda: self._caught_up(master, slave), "the replicas to converge after the repair")
        with clock.phase("settle"):
            self._settle(master, slave)
        with clock.phase("verify"):
            if last:
                report.checks, report.checked = Drill.verify(self, number, master, slave, 0.0, 0.0), "full (the last round)"
            else:
                report.checks, report.checked = self.verify_since(number, master, slave, forced=[found["damaged"]] if found.get("damaged") else [])
        if not report.checks.identical:
            report.outcome += "; differs: " + self.differences(master, slave)
        return report, master, slave

    def verify_since(self, number: int, master: Process, slave: Process, *, forced: list[str]) -> tuple[RoundReport, str]:
        """``Drill.verify`` (the same report) over what changed since the last call: see the module's
        docstring. (The report, and what was checked: "since offset N" or "full" and why.)"""
        status = {"master": self._status(master), "slave": self._status(slave)}
        end = status["master"]["max_offset"]
        held = self.verified
        why = ""
        if held.end is None:
            why = "the first check"
        elif end < held.end:
            why = f"the log's end {end} is below the end verified before, {held.end}"
        else:
            moved = held.logs.changed(forced) + held.queue_prefixes.changed(forced)
            if moved:
                why = "rewritten since verified: " + ", ".join(os.path.relpath(path, self.root) for path in moved[:3])
        if why:
            held = self.verified = _Verified()
            start = status["master"]["min_offset"]
        else:
            start = held.end
        duplicated = 0
        rechecked: set[int] = set()
        if start < end:
            for offset, record, _crc_ok in iter_records(master.store, from_offset=start if start else None):
                if offset >= end:
                    break
                held.boundaries.append(offset)
                if record.topic != DRILL_TOPIC:
                    continue
                message = int(bytes(record.body).split(b":", 1)[0][1:])
                if message in held.seen:
                    duplicated += 1
                    rechecked.add(message)  # an earlier acknowledged copy now looks missing, as in a full check
                held.seen[message] = offset
        newly_acked = itertools.islice(self.acked.items(), held.acked_count, None)
        missing = {m for m, offset in newly_acked if held.seen.get(m) != offset}
        missing |= {m for m in rechecked if m in self.acked and held.seen.get(m) != self.acked[m]}
        held.acked_count = len(self.acked)
        lost = len(missing - self.lost)
        self.lost |= missing
        identical = log_digest(master.store, end, self.segment_size, start=start) == log_digest(slave.store, end, self.segment_size, start=start)
        identical = identical and held.queue_files.digests(master.store, forced=forced) == held.queue_files.digests(slave.store, forced=forced)
        epochs_agree = status["master"]["epochs"] == status["slave"]["epochs"]
        truncated = sum(int(n) for n in re.findall(r"dropped (\d+) bytes", slave.log()))
        files_agree = all(self._files_agree(process, status[name], identical) for name, process in (("master", master), ("slave", slave)))
        check = held.queues.advance(master.store, start, end)
        if why:  # the full rebuild against both sides' queues, as Drill.verify
            queues = queues_against_logs(master, slave)
        else:
            queues = "" if check.ok else f"master {os.path.basename(master.store)}: {check.describe()}"
            if not identical and not queues:
                queues = queues_against_logs(master, slave)  # the slave's queues are no longer the master's bytes
        for process in (master, slave):
            for path, length in segment_extents(process.store, end, self.segment_size):
                held.logs.record(path, length)
        for path, length in held.queues.queue_ends(master.store).items():
            held.queue_prefixes.record(path, length)
        held.end, held.store = end, master.store
        report = RoundReport(number, len(self.acked), lost, duplicated, truncated, 0.0, 0.0, identical, epochs_agree, files_agree,
                             queues=queues)  # fmt: skip
        return report, (f"full ({why})" if why else f"since offset {start}")

    def _files_agree(self, process: Process, status: dict, identical: bool) -> bool:
        """``files_agree_with_log`` with the record boundaries verified so far (the slave's are the
        master's when the logs are identical; otherwise its own, read whole)."""
        if process.store != self.verified.store and not identical:
            return files_agree_with_log(process.store, status)
        checkpoint = StoreCheckpoint.open(os.path.join(process.store, "checkpoint"))
        end = status["max_offset"]
        if checkpoint.master_flushed_offset > end:
            return False
        boundaries = self.verified.boundaries
        for _epoch, start in status["epochs"]:
            at = bisect.bisect_left(boundaries, start)
            if not (start == end or start < status["min_offset"] or (at < len(boundaries) and boundaries[at] == start)):
                return False
        return True

    def differences(self, master: Process, slave: Process) -> str:
        """Where the two copies differ: the log's first differing offset, the queue files."""
        end = self._status(master)["max_offset"]
        parts = []
        if log_digest(master.store, end, self.segment_size) != log_digest(slave.store, end, self.segment_size):
            parts.append(f"commit log (first difference at offset {first_difference(master.store, slave.store, end, self.segment_size)})")
        ours, theirs = queue_file_digests(master.store), queue_file_digests(slave.store)
        parts += [f"consume queue {name}" for name in sorted(set(ours) | set(theirs)) if ours.get(name) != theirs.get(name)]
        return ", ".join(parts) or "nothing on disk (a race?)"


def segment_extents(store: str, end: int, segment_size: int) -> list[tuple[str, int]]:
    """(path, bytes below ``end``) of each commit log segment of ``store`` that holds some."""
    directory = os.path.join(store, "commitlog")
    found = []
    for name in sorted(os.listdir(directory)):
        if name.isdigit() and int(name) < end:
            found.append((os.path.join(directory, name), min(segment_size, end - int(name))))
    return found


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
    watch = InterruptWatch(drill.root, reports)
    try:
        with watch:
            master = drill.start("a", master_ha=None)
            slave = drill.start("b", master_ha=master.ready["ha_listen"])
            for number in range(1, rounds + 1):
                report, master, slave = drill.run_round(number, master, slave, last=number == rounds)
                reports.append(report)
                checks = report.checks
                verdict = "ok" if report.ok else "FAILED"
                echo(f"round {number}: {report.victim} ({report.stop}) {report.fault}: {report.outcome}"
                     + (f" [{report.refusal}]" if report.refusal else "")
                     + (f"; acked {checks.acked}, lost {checks.lost}, dup {checks.duplicated}, identical {checks.identical}, "
                        f"epochs {checks.epochs_agree}" if checks else "")
                     + (f"; queues differ from a rebuild from the log: {checks.queues}" if checks and checks.queues else "")
                     + f": {verdict}" + f" ({report.seconds}; checked {report.checked or '-'})")  # fmt: skip
                if not report.ok:
                    break
    finally:
        ok = len(reports) == rounds and all(r.ok for r in reports)
        drill.close(keep or not ok)
        if not ok and not watch.interrupted:
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
