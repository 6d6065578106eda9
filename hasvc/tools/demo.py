"""``hasvc demo``: the main job. A local master and slave (temporary stores, free ports, a
generated secret), SYNC_MASTER writes with a live progress line, their status, one failover round
(SIGKILL the master, promote the slave, rejoin the old master, verify from disk), a summary.
Everything it starts is stopped by PID before it returns."""

from __future__ import annotations

import secrets
import sys
import time

import trio

from hasvc import client as hc
from hasvc.tools.drill import Drill

WRITE_SECONDS = 5.0


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
        trio.run(_write_with_progress, drill, master, slave, echo)
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
    if keep:
        echo(f"stores kept in {drill.root}: `hasvc store verify {drill.root}/a` checks one")
    return ok


async def _write_with_progress(drill: Drill, master, slave, echo) -> None:
    async with hc.connect_cluster([master.ready["listen"]], drill.secret) as producer, trio.open_nursery() as nursery:
        for _ in range(drill.producers):
            nursery.start_soon(drill._producer, producer)
        started = trio.current_time()
        async with hc.connect(master.ready["listen"], drill.secret) as client:
            while trio.current_time() - started < WRITE_SECONDS:
                await trio.sleep(0.5)
                status = await client.status()
                lag = status["slaves"][0]["lag_bytes"] if status["slaves"] else "-"
                rate = len(drill.acked) / (trio.current_time() - started)
                line = f"   {len(drill.acked):>8,} acked  {rate:>8,.0f} msgs/s  master offset {status['max_offset']:>11,}  slave lag {lag} B"
                if sys.stdout.isatty():
                    sys.stdout.write("\r" + line)
                    sys.stdout.flush()
                else:
                    echo(line)
        if sys.stdout.isatty():
            sys.stdout.write("\n")
        nursery.cancel_scope.cancel()


def _print_status(status: dict, echo) -> None:
    slaves = ", ".join(f"{s['address']} ack {s['ack_offset']:,} lag {s['lag_bytes']} B" for s in status["slaves"]) or "none"
    master = f"; master {status['master_ha']} connected={status['master_connected']}" if status["role"] == "SLAVE" else ""
    echo(f"   {status['role']:<12} {status['listen']}  epoch {status['epoch']}  offsets [{status['min_offset']:,}, "
         f"{status['max_offset']:,}) flushed {status['flushed_offset']:,}  slaves: {slaves}{master}")  # fmt: skip
