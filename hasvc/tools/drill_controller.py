"""``hasvc drill --mode controller``: a classic group whose controller fails it over, no human in the loop.

Theory of operation
-------------------
One ``hasvc controller`` (or a group of three: ``--controllers 3``) and ``--nodes`` ``hasvc broker
--controllers ... --group`` processes on loopback (``hasvc.testing.controlled_group``). Producers
write uniquely numbered messages through the failover client (idempotent retries: a send retried
on the new master is answered with its original offsets, never stored twice) for the whole drill.
Each broker calls the controllers through relays of its own, one per controller
(``ControllerLink``), which can cut it off from the controllers while clients and its peers still
reach it. Each round injects one fault at a random moment under load, and nobody promotes anyone:

- ``kill-master``: SIGKILL of the master; the controller elects the member of the SyncStateSet
  with the highest log, which promotes itself to the epoch the controller chose; the killed
  broker is restarted (same store and ports: it comes back as the new master's slave and cuts
  only what its epoch history says the new master never had);
- ``partition-master``: the master cut off from the controller, reachable by clients: it must
  stop acknowledging when its lease runs out, before the controller elects another (a write it
  acknowledged after that would be missing from the new master: counted lost); then healed, it
  follows the new master and cuts its unacknowledged tail;
- ``kill-slave``: SIGKILL of a slave, restarted: the SyncStateSet shrinks and expands again;
- ``kill-controller-leader`` (``--controllers 3``): SIGKILL of the controller leader under load;
  the other two elect a new one, every broker finds it by itself (the relays rename the leader
  a NOT_LEADER answer names to the broker's own relay to it), and the brokers keep serving
  meanwhile: the round checks that the master and its epoch stayed (no broker election), that
  writes were acknowledged between the kill and the moment every broker heartbeats to the new
  leader, and reports the longest pause between two PUT_OKs in that window; the killed
  controller is restarted (same store and ports) and rejoins as a follower;
- ``mixed``: each round one of the faults above, drawn from the seed (with three controllers,
  a controller leader's kill among them).

A master fault's round measures the time from the fault to the first PUT_OK of a send started
after it and answered by another broker than the old master (a put the dying or cut-off master
acknowledged does not count). Then the round waits until every broker holds
the master's log and is in its SyncStateSet, pauses the producers, and checks from the stores on
disk (``commitlog.inspect.iter_records``) as every drill does:

- every PUT_OK message is in the master's log exactly once, at its acknowledged offset;
- no message number appears twice;
- every broker's commit log is byte-identical up to the master's end, and so are the consume
  queues; every broker shows the same epoch history; checkpoint and epoch files agree with the log.

With three brokers the new master acknowledges once the surviving slave joins its SyncStateSet
(``min_in_sync_replicas`` 2, the default); with two, until the killed one is back, it answers
SLAVE_NOT_AVAILABLE (stored, not acknowledged), so the failover time then includes the restart.

``--role async``: the brokers run as ASYNC_MASTER (a put is acknowledged once the master holds
it), whose promise is weaker: a failover may lose what the new master had not received. A PUT_OK
message missing after a master fault is then counted as an **accepted loss**, reported apart,
when it was acknowledged by the old master only: at an offset at or past where the round's new
epoch starts in the new master's log (the old master's tail, which the new master never had).
Any other missing message is lost, as in a SYNC_MASTER run, and fails the drill; so does an
accepted loss in a round whose fault was not the master's (a slave's kill, a controller leader's).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import statistics
import tempfile
import time
import random

import trio

from commitlog.inspect import iter_records
from hasvc import client as hc
from hasvc.config import format_address, parse_address
from hasvc.protocol import controller as cp
from hasvc.protocol import wire
from hasvc.testing.controlled_group import ControlledGroup
from hasvc.tools.partition import COPY_BUFFER_SIZE, Link
from hasvc.tools.drill import DRILL_TOPIC, InterruptWatch, files_agree_with_log, log_digest, queue_file_digests
from hasvc.tools.drill_dledger import percentile
from hasvc.tools.drill_producer import send_numbered
from hasvc.tools.timeline import Timeline
from hasvc.tools.timeline_plot import finish

LOGGER = logging.getLogger(__name__)

FAULTS = ("kill-master", "partition-master", "kill-slave")
CONTROLLER_FAULT = "kill-controller-leader"  # with three controllers only
CONTROLLER_COUNTS = (1, 3)
SETTLE_SECONDS = 1.0  # writes go on this long (times 0.5-2, from the seed) before a fault, and after a rejoin
FAILOVER_WAIT_SECONDS = 60.0  # no PUT_OK this long after the fault: the round fails
SENDS_FINISHED_SECONDS = 60.0  # sends still in flight this long after the pause: the round fails
# Every broker's settings: the drill's segments are small (the from-disk checks read them all), and
# a failed-over producer retries within the failover client's time.
BROKER_SETTINGS = {"slave_timeout_ms": 2000, "ha_reconnect_backoff_min_ms": 100, "ha_reconnect_backoff_max_ms": 500}


@dataclasses.dataclass
class ControllerRoundReport:
    round: int
    fault: str
    killed: str  # the broker the fault hit
    new_master: str
    epoch: int  # the new master's epoch
    acked: int  # acknowledged writes so far
    lost: int
    duplicated: int
    failover_seconds: float  # fault -> first PUT_OK of a send started after it (0: a slave's fault)
    truncated_bytes: int  # what the old master cut as it rejoined
    identical: bool
    epochs_agree: bool
    files_agree: bool
    # kill-controller-leader: the new controller leader, the PUT_OKs answered between the kill and
    # every broker heartbeating to it, the longest pause between two PUT_OKs in that window, and
    # whether the master and its epoch stayed (a controller's failover must not move the master)
    controller_leader: str = ""
    writes_during: int = 0
    longest_pause_seconds: float = 0.0
    master_kept: bool = True
    # --role async: PUT_OK messages missing after the fault that only the old master had
    # acknowledged (past the start of the round's new epoch): ASYNC_MASTER's stated loss
    accepted_lost: int = 0

    @property
    def ok(self) -> bool:
        kept = self.fault != CONTROLLER_FAULT or (self.master_kept and self.writes_during > 0)
        return (self.lost == 0 and self.duplicated == 0 and self.identical and self.epochs_agree and self.files_agree
                and kept)  # fmt: skip


def split_losses(missing: set[int], acked: dict[int, int], epochs: list[list[int]], *, epoch_before: int,
                 accepted: bool) -> tuple[set[int], set[int]]:
    """The PUT_OK messages ``missing`` from the new master's log as (lost, accepted losses).
    ``acked``: message -> acknowledged offset; ``epochs``: the new master's epoch history
    ([epoch, start offset], oldest first); ``accepted``: an ASYNC_MASTER run's master fault. A
    loss is accepted only then, and only for a message acknowledged at or past where the first
    epoch newer than ``epoch_before`` (the master's before the fault) starts: the old master's
    tail, acknowledged by it alone, which the new master never received. Every other missing
    message is lost (a SYNC_MASTER run's strict check)."""
    starts = [start for epoch, start in epochs if epoch > epoch_before]
    if not accepted or not starts:
        return set(missing), set()
    tail = {message for message in missing if acked[message] >= min(starts)}
    return set(missing) - tail, tail


class ControllerLink(Link):
    """A broker's relay to one controller that also renames the leader a NOT_LEADER answer names
    (a controller port) to this broker's relay to that controller (``renames``, filled once every
    relay listens): a broker that followed the answer would otherwise call the leader around its
    relays, and cutting them would not cut it off. The controller's side is the preface (HELLO,
    AUTH_OK; a drill's controllers have no TLS), then answer frames, decoded and encoded again."""

    def __init__(self, source: str, target: str, target_address, renames: dict[str, str]) -> None:
        super().__init__(source, target, target_address)
        self.renames = renames

    async def _forward(self, stream: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream(*self.target_address)
        except OSError:  # the controller is down: the broker sees its connection closed
            return
        async with upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._copy, stream, upstream, nursery.cancel_scope)
            nursery.start_soon(self._copy_answers, upstream, stream, nursery.cancel_scope)

    async def _copy_answers(self, source: trio.SocketStream, sink: trio.SocketStream, both: trio.CancelScope) -> None:
        preface = wire.HELLO.size + wire.AUTH_OK.size
        decoder = cp.ControllerDecoder(answers=True)
        try:
            while data := await source.receive_some(COPY_BUFFER_SIZE):
                self.bytes_forwarded += len(data)
                self._note()
                if preface:
                    head, data = data[:preface], data[preface:]
                    preface -= len(head)
                    await sink.send_all(head)
                decoder.receive_data(data)
                out = bytearray()
                while (frame := decoder.next_event()) is not None:
                    answer = frame.message
                    if answer.status == cp.STATUS_NOT_LEADER and answer.leader in self.renames:
                        answer = dataclasses.replace(answer, leader=self.renames[answer.leader])
                    out += cp.encode_answer(frame.request_id, answer)
                if out:
                    await sink.send_all(bytes(out))
        except wire.ProtocolError as error:  # not ours to judge: the broker sees its connection closed
            LOGGER.warning("%r: %s", self, error)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            both.cancel()


class ControllerDrill:
    def __init__(self, *, nodes: int, producers: int, seed: int, echo=print, root: str | None = None,
                 segment_size: int = 4 * 1024 * 1024, controllers: int = 1, asynchronous: bool = False) -> None:  # fmt: skip
        if controllers not in CONTROLLER_COUNTS:
            raise ValueError(f"a controller drill runs 1 or 3 controllers, not {controllers}")
        self.names = [f"b{number}" for number in range(nodes)]
        self.producers = producers
        self.random = random.Random(seed)
        self.echo = echo
        self.root = root or tempfile.mkdtemp(prefix="hasvc-drill-controller-")
        self.asynchronous = asynchronous  # ASYNC_MASTER brokers: a master fault's losses are accepted, counted apart
        settings = {**BROKER_SETTINGS, "role": "ASYNC_MASTER"} if asynchronous else BROKER_SETTINGS
        self.group = ControlledGroup(self.root, controllers=controllers, segment_size=segment_size, settings=settings)
        self.epoch_before = 0  # the master's epoch before this round's fault
        self.accepted_lost: set[int] = set()
        self.next_number = 0
        self.acked: dict[int, int] = {}
        self.lost: set[int] = set()
        self.ok_times: list[tuple[float, float, str]] = []  # (send started, PUT_OK answered, by whom), monotonic
        self.timeline = Timeline()  # the same, with the faults and failover gaps (--plot, --report)
        self.sends_in_flight = 0
        self.paused = False
        self.links: dict[str, dict[str, ControllerLink]] = {}  # broker -> controller id -> its relay there

    async def start_links(self, nursery: trio.Nursery) -> None:
        controllers = self.group.controllers
        for name in self.names:
            renames: dict[str, str] = {}
            self.links[name] = {}
            for member in controllers.ids:
                link = ControllerLink(name, member, parse_address(controllers.address(member)), renames)
                await nursery.start(link.serve)
                self.links[name][member] = link
                renames[controllers.address(member)] = format_address(link.address)

    def link_addresses(self, name: str) -> list[str]:
        """What broker ``name`` calls the controllers at (its relays), in controller id order."""
        return [format_address(link.address) for link in self.links[name].values()]

    def set_cut(self, name: str, cut: bool) -> None:
        for link in self.links[name].values():
            link.set_cut(cut)

    def start(self) -> None:
        for name in self.names:
            self.group.start_broker(name, controllers=self.link_addresses(name))
        master = self.group.master()
        self.group.wait(lambda: self.group.in_sync(master, [n for n in self.names if n != master]), "every broker in sync")

    async def producer(self, client: hc.FailoverClient) -> None:
        addresses = {self.group.address(name): name for name in self.names}
        while True:
            _number, started, result = await send_numbered(self, client, DRILL_TOPIC)
            if result is None:
                continue
            if result.status == "PUT_OK":
                self.ok_times.append((started, time.monotonic(), addresses.get(client.address, "")))
                self.timeline.ack(*self.ok_times[-1][:2])
            else:
                await trio.sleep(0.01)  # SLAVE_NOT_AVAILABLE and the like: not acknowledged; do not spin

    async def first_ok_after(self, moment: float, *, sent_after: float, not_by: str) -> float:
        deadline = time.monotonic() + FAILOVER_WAIT_SECONDS
        while time.monotonic() < deadline:
            answered = [done for started, done, by in self.ok_times if started >= sent_after and by != not_by]
            if answered:
                return min(answered) - moment
            await trio.sleep(0.005)
        raise RuntimeError(f"no PUT_OK within {FAILOVER_WAIT_SECONDS:.0f} s of the fault")

    async def run_round(self, number: int, fault: str) -> ControllerRoundReport:
        group = self.group
        await trio.sleep(SETTLE_SECONDS * self.random.uniform(0.5, 2.0))
        if fault == CONTROLLER_FAULT:
            return await self._controller_round(number)
        master = await trio.to_thread.run_sync(group.master)
        self.epoch_before = (await trio.to_thread.run_sync(group.status, master))["epoch"]
        victim = master if fault != "kill-slave" else self.random.choice([n for n in self.names if n != master])
        log_before = group.brokers[victim].log()
        failover = 0.0
        # min_in_sync_replicas 2: with two brokers the new master acknowledges only once the
        # victim is back as its slave, so the first PUT_OK is awaited after the heal or restart
        # (an ASYNC_MASTER acknowledges alone)
        alone = len(self.names) == 2 and not self.asynchronous
        if fault == "partition-master":
            moment = time.monotonic()
            self.set_cut(victim, True)
            if not alone:
                failover = await self.first_ok_after(moment, sent_after=moment, not_by=victim)
            new_master = await trio.to_thread.run_sync(lambda: group.master(excluding=victim))
            self.set_cut(victim, False)
            if alone:
                failover = await self.first_ok_after(moment, sent_after=moment, not_by=victim)
        else:
            moment, reaped = await trio.to_thread.run_sync(group.kill, victim)
            if fault == "kill-master" and not alone:
                failover = await self.first_ok_after(moment, sent_after=reaped, not_by=victim)
            new_master = await trio.to_thread.run_sync(lambda: group.master(excluding=victim if victim == master else None))
            await trio.to_thread.run_sync(group.restart, victim)
            if fault == "kill-master" and alone:
                failover = await self.first_ok_after(moment, sent_after=reaped, not_by=victim)
        self.timeline.fault(f"{fault} {victim}", moment).close()  # to the heal or the restart
        if fault != "kill-slave":
            self.timeline.gap("failover", moment, failover)
        report = await self._settle_and_verify(number, fault, victim, new_master, failover)
        return dataclasses.replace(report, truncated_bytes=_cut_bytes(group.brokers[victim].log()[len(log_before):]))

    async def _controller_round(self, number: int) -> ControllerRoundReport:
        """SIGKILL the controller leader under load; the brokers must go on serving while the
        other controllers elect and every broker finds the new leader; then restart it."""
        group, controllers = self.group, self.group.controllers
        leader = await trio.to_thread.run_sync(controllers.leader)
        master = await trio.to_thread.run_sync(group.master)
        epoch = (await trio.to_thread.run_sync(group.status, master))["epoch"]
        moment, _reaped = await trio.to_thread.run_sync(controllers.processes[leader].kill)
        new_leader = await trio.to_thread.run_sync(controllers.leader)
        await trio.to_thread.run_sync(lambda: group.wait(lambda: self.heartbeating_to(new_leader),
                                                         "every broker heartbeating to the new controller leader"))  # fmt: skip
        refound = time.monotonic()
        answered = sorted(done for _started, done, by in self.ok_times if moment < done <= refound and by == master)
        marks = [moment, *answered, refound]
        pause = max(later - earlier for earlier, later in zip(marks, marks[1:]))
        status = await trio.to_thread.run_sync(group.status, master)
        kept = status is not None and status["role"] != "SLAVE" and status["epoch"] == epoch
        await trio.to_thread.run_sync(controllers.start, leader)
        self.timeline.fault(f"{CONTROLLER_FAULT} {leader}", moment).close()  # to the brokers' finding the new leader
        report = await self._settle_and_verify(number, CONTROLLER_FAULT, leader, master, refound - moment)
        return dataclasses.replace(report, controller_leader=new_leader, writes_during=len(answered),
                                   longest_pause_seconds=pause, master_kept=kept)  # fmt: skip

    def heartbeating_to(self, member: str) -> bool:
        """Whether every broker's controller client calls controller ``member`` the leader."""
        for name in self.names:
            status = self.group.status(name)
            if status is None or status["controller_leader"] != format_address(self.links[name][member].address):
                return False
        return True

    async def _settle_and_verify(self, number: int, fault: str, victim: str, new_master: str,
                                 failover: float) -> ControllerRoundReport:  # fmt: skip
        """Writes go on while the victim rejoins; then every broker in the SyncStateSet, the
        producers paused, the sends in flight finished, every broker in sync: the checks."""
        group = self.group
        await trio.sleep(SETTLE_SECONDS)
        others = [name for name in self.names if name != new_master]
        await trio.to_thread.run_sync(lambda: group.wait(lambda: group.in_set(new_master, others), "every broker in the SyncStateSet"))
        self.paused = True
        self.timeline.pause()
        try:
            deadline = time.monotonic() + SENDS_FINISHED_SECONDS
            while self.sends_in_flight:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.sends_in_flight} sends in flight {SENDS_FINISHED_SECONDS:.0f} s after the pause")
                await trio.sleep(0.01)
            await trio.to_thread.run_sync(lambda: group.wait(lambda: group.in_sync(new_master, others), "every broker in sync"))
            return await trio.to_thread.run_sync(self.verify, number, fault, victim, new_master, failover, 0)
        finally:
            self.paused = False
            self.timeline.resume()

    def verify(self, number: int, fault: str, killed: str, new_master: str, failover: float, truncated: int) -> ControllerRoundReport:
        group = self.group
        statuses = {name: group.status(name) for name in self.names}
        end = statuses[new_master]["max_offset"]
        at_offset: dict[int, int] = {}
        seen: set[int] = set()
        duplicated = 0
        for offset, record, _crc_ok in iter_records(group.store(new_master)):
            if record.topic != DRILL_TOPIC:
                continue
            message = int(bytes(record.body).split(b":", 1)[0][1:])
            duplicated += message in seen
            seen.add(message)
            at_offset[offset] = message
        missing = {m for m, offset in self.acked.items() if at_offset.get(offset) != m} - self.lost - self.accepted_lost
        missing, accepted = split_losses(missing, self.acked, statuses[new_master]["epochs"], epoch_before=self.epoch_before,
                                         accepted=self.asynchronous and fault in ("kill-master", "partition-master"))  # fmt: skip
        self.accepted_lost |= accepted
        lost = len(missing)
        self.lost |= missing
        reference_log = log_digest(group.store(new_master), end, group.segment_size)
        reference_queues = queue_file_digests(group.store(new_master))
        identical = all(statuses[name]["max_offset"] == end
                        and log_digest(group.store(name), end, group.segment_size) == reference_log
                        and queue_file_digests(group.store(name)) == reference_queues for name in self.names)  # fmt: skip
        epochs_agree = all(statuses[name]["epochs"] == statuses[new_master]["epochs"] for name in self.names)
        files_agree = all(files_agree_with_log(group.store(name), statuses[name]) for name in self.names)
        return ControllerRoundReport(number, fault, killed, new_master, statuses[new_master]["epoch"], len(self.acked), lost,
                                     duplicated, failover, truncated, identical, epochs_agree, files_agree,
                                     accepted_lost=len(accepted))  # fmt: skip

    def close(self, keep: bool) -> None:
        self.group.close()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


def _cut_bytes(log: str) -> int:
    return sum(int(n) for n in re.findall(r"dropped (\d+) bytes", log))


def run_controller_drill(*, nodes: int, rounds: int, producers: int, fault: str, seed: int, report_path: str | None,
                         keep: bool, echo=print, controllers: int = 1, plot: str | None = None,
                         asynchronous: bool = False) -> bool:  # fmt: skip
    faults = FAULTS + ((CONTROLLER_FAULT,) if controllers > 1 else ())
    if fault not in (*faults, "mixed"):
        if fault == CONTROLLER_FAULT:
            raise ValueError(f"--fault {CONTROLLER_FAULT} needs a group of controllers (--controllers 3)")
        raise ValueError(f"--mode controller runs --fault {', '.join(faults)} or mixed (not {fault})")
    drill = ControllerDrill(nodes=nodes, producers=producers, seed=seed, echo=echo, controllers=controllers,
                            asynchronous=asynchronous)  # fmt: skip
    reports: list[ControllerRoundReport] = []
    echo(f"drill: controller mode, {controllers} controller{'s' if controllers > 1 else ''} and {nodes} brokers, {rounds} round(s), "
         f"fault {fault}, {producers} producers, seed {seed}, {'ASYNC_MASTER' if asynchronous else 'SYNC_MASTER'}, no promote; "
         f"stores under {drill.root}")  # fmt: skip
    echo(f"{'round':>5} {'fault':>22} {'victim':>6} {'master':>6} {'epoch':>5} {'acked*':>8} {'lost':>5} {'dup':>4} {'failover s':>10} "
         f"{'truncated B':>11} {'identical':>9} {'epochs':>6} {'files':>5}")  # fmt: skip

    async def main() -> None:
        async with trio.open_nursery() as relay:
            await drill.start_links(relay)
            await trio.to_thread.run_sync(drill.start)
            await drive()
            relay.cancel_scope.cancel()

    async def drive() -> None:
        addresses = [drill.group.address(name) for name in drill.names]
        async with hc.connect_cluster(addresses, retry_sends=True) as client, trio.open_nursery() as nursery:
            for _ in range(producers):
                nursery.start_soon(drill.producer, client)
            for number in range(1, rounds + 1):
                kind = drill.random.choice(faults) if fault == "mixed" else fault
                report = await drill.run_round(number, kind)
                reports.append(report)
                echo(f"{report.round:>5} {report.fault:>22} {report.killed:>6} {report.new_master:>6} {report.epoch:>5} {report.acked:>8} "
                     f"{report.lost:>5} {report.duplicated:>4} {report.failover_seconds:>10.3f} {report.truncated_bytes:>11} "
                     f"{str(report.identical):>9} {str(report.epochs_agree):>6} {str(report.files_agree):>5}"
                     + (f"  new controller leader {report.controller_leader}; {report.writes_during} PUT_OK meanwhile, longest "
                        f"pause {report.longest_pause_seconds:.3f} s; master {'kept' if report.master_kept else 'MOVED'}"
                        if report.fault == CONTROLLER_FAULT else "")
                     + (f"  {report.accepted_lost} accepted lost (ASYNC_MASTER: acknowledged by the old master only)"
                        if report.accepted_lost else ""))  # fmt: skip
                if not report.ok:
                    break
            nursery.cancel_scope.cancel()

    watch = InterruptWatch(drill.root, reports)
    try:
        with watch:
            trio.run(main)
    finally:
        ok = len(reports) == rounds and all(r.ok for r in reports)
        drill.close(keep or not ok)
        if not ok and not watch.interrupted:
            echo(f"the stores and logs are kept under {drill.root}")
    failovers = [r.failover_seconds for r in reports if r.fault in ("kill-master", "partition-master")]
    if failovers:
        echo(f"failover (fault -> first PUT_OK on the new master): p50 {statistics.median(failovers):.3f} s, "
             f"p99 {percentile(failovers, 0.99):.3f} s over {len(failovers)} round(s)")  # fmt: skip
    switches = [r for r in reports if r.fault == CONTROLLER_FAULT]
    if switches:
        echo(f"controller leader failover (SIGKILL -> every broker heartbeating to the new leader): p50 "
             f"{statistics.median(r.failover_seconds for r in switches):.3f} s over {len(switches)} round(s); writes went on: "
             f"{min(r.writes_during for r in switches)} PUT_OK at least, longest pause "
             f"{max(r.longest_pause_seconds for r in switches):.3f} s, master kept in {sum(r.master_kept for r in switches)}")  # fmt: skip
    echo(f"  (* acknowledged writes so far; the rest is this round's)\nsummary: {len(reports)} round(s), "
         f"{len(drill.acked)} acknowledged writes, {sum(r.lost for r in reports)} lost, "
         + (f"{sum(r.accepted_lost for r in reports)} accepted lost (ASYNC_MASTER: acknowledged by the old master "
            "only, which a failover may lose), " if asynchronous else "")
         + f"{sum(r.duplicated for r in reports)} duplicated: {'OK' if ok else 'FAILED'}")  # fmt: skip
    result = {"mode": "controller", "role": "ASYNC_MASTER" if asynchronous else "SYNC_MASTER",
              "accepted_lost": len(drill.accepted_lost), "nodes": nodes, "controllers": controllers, "fault": fault, "seed": seed, "producers": producers,
              "rounds": [dataclasses.asdict(r) for r in reports], "acknowledged": len(drill.acked), "ok": ok,
              "failover_p50_seconds": statistics.median(failovers) if failovers else None,
              "failover_p99_seconds": percentile(failovers, 0.99) if failovers else None,
              "timeline": drill.timeline.summary()}  # fmt: skip
    if report_path:
        with open(report_path, "w") as file:
            json.dump(result, file, indent=2)
    finish(result, plot, echo)
    return ok
