"""``hasvc demo``: the main job. A local master and slave (temporary stores, free ports, a
generated secret), SYNC_MASTER writes with a live progress line, their status, one failover round
(SIGKILL the master, promote the slave, rejoin the old master, verify from disk), a summary.
Everything it starts is stopped by PID before it returns."""

from __future__ import annotations

import os
import secrets
import sys
import time

import trio

from hasvc import client as hc
from hasvc.tools.drill import Drill

WRITE_SECONDS = 5.0


def _disk_used_mb(root: str) -> float:
    """The disk the files under ``root`` take (segments are sparse until written: not their size)."""
    used = 0
    for directory, _, names in os.walk(root):
        for name in names:
            try:
                used += os.stat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                pass
    return used / 1e6


def run_demo(*, producers: int = 16, keep: bool = True, echo=print) -> bool:
    drill = Drill(producers=producers, mode="sync", seed=int(time.time()), secret=secrets.token_hex(16).encode(), echo=echo)
    ok = False
    try:
        echo(f"stores and logs: {drill.root} (secret in {drill.secret_file})")
        master = drill.start("a", master_ha=None)
        slave = drill.start("b", master_ha=master.ready["ha_listen"])
        echo(f"master {master.ready['listen']} (HA {master.ready['ha_listen']}), slave {slave.ready['listen']}, SYNC_MASTER")
        drill._wait(lambda: any(s["ack_offset"] >= 0 for s in drill._status(master)["slaves"]), "the slave's first report")
        echo(f"1. writing for {WRITE_SECONDS:.0f} s with {producers} producers (a write returns once the slave has it)")
        drill.run_writing(_write_with_progress, drill, master, slave, echo)
        echo("2. hasvc status")
        for process in (master, slave):
            _print_status(drill._status(process), echo)
        echo("3. failover: SIGKILL the master under load, promote the slave, bring the old master back as a slave")
        report, master, slave = drill.run_round(1, master, slave)
        echo(f"   {report.acked:,} writes acknowledged in all, {report.lost} lost, {report.duplicated} duplicated; "
             f"promotion took {report.promote_seconds * 1000:.0f} ms; the old master cut {report.truncated_bytes} bytes "
             f"it alone had and caught up in {report.catch_up_seconds:.2f} s")  # fmt: skip
        echo(f"   {report.duplicates_answered} send(s) retried on the new master were already there (replicated before the "
             "kill) and were answered with their offsets, not stored twice")
        echo(f"   logs byte-identical: {report.identical}; epoch histories agree: {report.epochs_agree}")
        _print_status(drill._status(master), echo)
        ok = report.ok
        echo(f"summary: {'OK' if ok else 'FAILED'} — every acknowledged write survived the loss of the master"
             if ok else "summary: FAILED")  # fmt: skip
    finally:
        drill.close(keep)
    _where_the_stores_are(drill, keep, f"{drill.root}/a", "hasvc demo: SYNC_MASTER pair, SIGKILL of the master, promote", echo)
    return ok


def _run_to_the_end(drill, main, keep: bool, succeeded: str, verify: str, title: str, echo) -> bool:
    """Run a trio demo's ``main`` (True when its round was OK), close its drill whatever happens,
    then its summary (``succeeded`` saying what OK means) and where its stores are."""
    ok = False
    try:
        ok = trio.run(main)
    finally:
        drill.close(keep)
    echo(f"summary: {'OK — ' + succeeded if ok else 'FAILED'}")
    _where_the_stores_are(drill, keep, verify, title, echo)
    return ok


def _where_the_stores_are(drill, keep: bool, verify: str, title: str, echo) -> None:
    """A demo's last lines: where its stores were kept (how big, how to check one) and its picture,
    or that they were removed."""
    if keep:
        echo(f"stores kept in {drill.root} ({_disk_used_mb(drill.root):,.0f} MB on disk; remove the directory when done, "
             f"or run with --no-keep): `hasvc store verify {verify}` checks one")  # fmt: skip
        _picture(drill, title, echo)
    else:
        echo(f"stores removed ({drill.root})")


async def _show_progress(drill, rest_of_line, echo) -> None:
    """A demo's live progress for ``WRITE_SECONDS``: every half second the writes acknowledged so
    far, their rate and ``await rest_of_line()`` (the status the demo shows), over the same line on
    a terminal, a line each otherwise."""
    started = trio.current_time()
    while trio.current_time() - started < WRITE_SECONDS:
        await trio.sleep(0.5)
        rest = await rest_of_line()
        rate = len(drill.acked) / (trio.current_time() - started)
        line = f"   {len(drill.acked):>8,} acked  {rate:>8,.0f} msgs/s  {rest}"
        if sys.stdout.isatty():
            sys.stdout.write("\r" + line)
            sys.stdout.flush()
        else:
            echo(line)
    if sys.stdout.isatty():
        sys.stdout.write("\n")


def _picture(drill, title: str, echo) -> None:
    """The demo's timeline drawn into its kept directory (``hasvc drill --plot``'s picture), and
    where it is; without matplotlib, how to get it."""
    from hasvc.tools.timeline_plot import EXTRA_HINT, PlotError, check_can_plot, draw  # noqa: PLC0415

    path = os.path.join(drill.root, "failover.svg")
    try:
        check_can_plot(path)
    except PlotError:  # an .svg: only matplotlib missing
        echo(f"no picture of the failover: matplotlib is not installed ({EXTRA_HINT})")
        return
    draw(drill.timeline.summary(), path, title)
    echo(f"picture of the failover (writes/s and latency over time, the fault shaded): {path}")


async def _write_with_progress(drill: Drill, master, slave, echo) -> None:
    async with hc.connect_cluster([master.ready["listen"]], drill.secret) as producer, trio.open_nursery() as nursery:
        for _ in range(drill.producers):
            nursery.start_soon(drill._producer, producer)
        async with hc.connect(master.ready["listen"], drill.secret) as client:

            async def rest_of_line() -> str:
                status = await client.status()
                lag = status["slaves"][0]["lag_bytes"] if status["slaves"] else "-"
                return f"master offset {status['max_offset']:>11,}  slave lag {lag} B"

            await _show_progress(drill, rest_of_line, echo)
        nursery.cancel_scope.cancel()


def _print_status(status: dict, echo) -> None:
    slaves = ", ".join(f"{s['address']} ack {s['ack_offset']:,} lag {s['lag_bytes']} B" for s in status["slaves"]) or "none"
    master = f"; master {status['master_ha']} connected={status['master_connected']}" if status["role"] == "SLAVE" else ""
    echo(f"   {status['role']:<12} {status['listen']}  epoch {status['epoch']}  offsets [{status['min_offset']:,}, "
         f"{status['max_offset']:,}) flushed {status['flushed_offset']:,}  slaves: {slaves}{master}")  # fmt: skip


def run_dledger_demo(*, producers: int = 16, keep: bool = True, echo=print) -> bool:
    """``hasvc demo --dledger``: a DLedger group of three ``hasvc node``s (etcd-like election
    timing), writes with a live progress line, every member's status, SIGKILL of the leader under
    load with nobody promoting, the old leader back as a follower, and the proof from the stores
    on disk (``hasvc.tools.drill_dledger``: no acknowledged write lost or doubled, every member's
    committed log and consume queues identical)."""
    from hasvc.tools.drill_dledger import DLedgerDrill

    drill = DLedgerDrill(nodes=3, producers=producers, seed=int(time.time()), echo=echo)
    echo(f"stores and logs: {drill.root}")

    async def main() -> bool:
        ok = False
        async with trio.open_nursery() as nursery:
            await drill.relay.start(nursery)
            await drill.start_all()
            addresses = [node.client_address for node in drill.nodes.values()]
            leader = await drill.leader()
            echo(f"a DLedger group of 3: {', '.join(f'{m} {n.client_address}' for m, n in drill.nodes.items())}; "
                 f"{leader} was elected leader (Raft, nobody promoted it)")  # fmt: skip
            echo(f"1. writing for {WRITE_SECONDS:.0f} s with {producers} producers (a write returns once a quorum has it)")
            async with hc.connect_cluster(addresses, retry_sends=True) as client, trio.open_nursery() as producing:
                for _ in range(producers):
                    producing.start_soon(drill.producer, client)
                await _dledger_progress(drill, leader, echo)
                echo("2. hasvc status of every member")
                for node in drill.nodes.values():
                    _print_member(await drill.status(node), echo)
                echo(f"3. failover: SIGKILL the leader {leader} under load; the others elect a new one by themselves; "
                     f"{leader} comes back as a follower")  # fmt: skip
                report = await drill.run_round(1, "kill-leader")
                producing.cancel_scope.cancel()
            echo(f"   new leader {report.new_leader}: first PUT_OK {report.failover_seconds:.2f} s after the SIGKILL; "
                 f"{report.acked:,} writes acknowledged in all, {report.lost} lost, {report.duplicated} duplicated; "
                 f"the old leader's entries replaced on rejoin: {report.truncated_entries}")  # fmt: skip
            echo(f"   committed logs and consume queues identical on every member: {report.identical}")
            for node in drill.nodes.values():
                _print_member(await drill.status(node), echo)
            ok = report.ok
            nursery.cancel_scope.cancel()
        return ok

    return _run_to_the_end(drill, main, keep, "every acknowledged write survived the loss of the leader, with no human in the loop",
                           f"{drill.root}/n0 --member n0", "hasvc demo --dledger: a group of 3, SIGKILL of the leader, Raft elects",
                           echo)  # fmt: skip


async def _dledger_progress(drill, leader: str, echo) -> None:
    async def rest_of_line() -> str:
        status = await drill.status(drill.nodes[leader]) or {}
        lags = ", ".join(f"{peer} {p.get('lag_entries', '-')}" for peer, p in (status.get("peers") or {}).items())
        return f"committed index {status.get('committed_index', '-'):>8}  followers' lag (entries): {lags}"

    await _show_progress(drill, rest_of_line, echo)


def _print_member(status: dict | None, echo) -> None:
    if status is None:
        echo("   (not running)")
        return
    echo(f"   {status['self_id']} {status['raft_role']:<9} plays {status['role']:<11} term {status['term']:<3} "
         f"leader {status['leader_id']}  entries to {status['ledger_end_index']:,}, committed {status['committed_index']:,}, "
         f"offsets to {status['max_offset']:,}")  # fmt: skip


def run_controller_demo(*, producers: int = 16, keep: bool = True, echo=print) -> bool:
    """``hasvc demo --controller``: a pair of ``hasvc broker --controllers`` and one ``hasvc
    controller`` (controller mode): the controller elects the first master, writes with a live
    progress line, every broker's and the controller's status, SIGKILL of the master under load
    with nobody promoting (the controller elects the other broker), the old master back as its
    slave, and the proof from the stores on disk (``hasvc.tools.drill_controller``)."""
    from hasvc.tools.drill_controller import ControllerDrill

    drill = ControllerDrill(nodes=2, producers=producers, seed=int(time.time()), echo=echo)
    group = drill.group
    echo(f"stores and logs: {drill.root}")

    async def main() -> bool:
        ok = False
        async with trio.open_nursery() as relays:
            await drill.start_links(relays)
            await trio.to_thread.run_sync(drill.start)
            master = await trio.to_thread.run_sync(group.master)
            echo(f"controller c0 {group.controllers.address('c0')}; brokers "
                 f"{', '.join(f'{name} {group.address(name)}' for name in drill.names)} (group {group.group}); the controller "
                 f"elected {master} master and the other follows it (nobody promoted anyone)")  # fmt: skip
            echo(f"1. writing for {WRITE_SECONDS:.0f} s with {producers} producers (a write returns once every member of the "
                 "SyncStateSet has it, while the master holds its lease)")  # fmt: skip
            addresses = [group.address(name) for name in drill.names]
            async with hc.connect_cluster(addresses, retry_sends=True) as client, trio.open_nursery() as producing:
                for _ in range(producers):
                    producing.start_soon(drill.producer, client)
                await _controller_progress(drill, master, echo)
                echo("2. hasvc status of every broker and of the controller")
                await trio.to_thread.run_sync(_print_controlled, drill, echo)
                echo(f"3. failover: SIGKILL the master {master} under load; the controller sees its heartbeats stop and elects "
                     f"the other broker; {master} comes back as its slave (the new master acknowledges again once it is "
                     "back in the SyncStateSet: min_in_sync_replicas 2)")  # fmt: skip
                report = await drill.run_round(1, "kill-master")
                producing.cancel_scope.cancel()
            echo(f"   new master {report.new_master} in epoch {report.epoch}: first PUT_OK {report.failover_seconds:.2f} s after "
                 f"the SIGKILL; {report.acked:,} writes acknowledged in all, {report.lost} lost, {report.duplicated} duplicated; "
                 f"the old master cut {report.truncated_bytes} bytes it alone had")  # fmt: skip
            echo(f"   logs and consume queues byte-identical: {report.identical}; epoch histories agree: {report.epochs_agree}")
            await trio.to_thread.run_sync(_print_controlled, drill, echo)
            ok = report.ok
            relays.cancel_scope.cancel()
        return ok

    return _run_to_the_end(drill, main, keep, "every acknowledged write survived the loss of the master; the controller failed the "
                           "pair over", f"{drill.root}/b0",
                           "hasvc demo --controller: a pair and a controller, SIGKILL of the master, the controller elects", echo)  # fmt: skip


async def _controller_progress(drill, master: str, echo) -> None:
    async def rest_of_line() -> str:
        status = await trio.to_thread.run_sync(drill.group.status, master) or {}
        return (f"master offset {status.get('max_offset', 0):>11,}  confirmed {status.get('confirm_offset') or 0:>11,}  "
                f"SyncStateSet {status.get('sync_state_set')}  lease {status.get('lease_seconds_left', 0):.2f} s")  # fmt: skip

    await _show_progress(drill, rest_of_line, echo)


def _print_controlled(drill, echo) -> None:
    """Every broker's controller-mode STATUS fields, then the controller's view of the group."""
    group = drill.group
    for name in drill.names:
        status = group.status(name)
        if status is None:
            echo(f"   {name} (not running)")
            continue
        echo(f"   {name} broker {status['broker_id']} {status['role']:<11} epoch {status['epoch']}  offsets to "
             f"{status['max_offset']:,}  SyncStateSet {status['sync_state_set']} (set epoch {status['sync_state_set_epoch']})  "
             f"confirmed {status['confirm_offset'] if status['confirm_offset'] is not None else '-'}  "
             f"lease {status['lease_seconds_left']:.2f} s  fenced: {status.get('fenced_by') or 'no'}")  # fmt: skip
    view = group.controllers.status("c0")["groups"].get(group.group, {})
    members = ", ".join(f"{broker_id} alive={member['alive']}" for broker_id, member in view.get("members", {}).items())
    echo(f"   controller c0: master {view.get('master_id')} in epoch {view.get('epoch')}, SyncStateSet "
         f"{view.get('sync_state_set')}, members {members}")  # fmt: skip
