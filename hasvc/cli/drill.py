"""``hasvc demo`` and ``hasvc drill``: the local failover demo and drills (hasvc.tools, imported when run)."""

from __future__ import annotations

import sys

import click


@click.command()
@click.option("--producers", type=int, default=16, show_default=True)
@click.option("--keep/--no-keep", default=True, show_default=True, help="Keep the stores and logs afterwards.")
@click.option("--dledger", is_flag=True, help="A DLedger group of 3 nodes instead: Raft elects, SIGKILL the leader, nobody promotes.")
@click.option("--controller", is_flag=True,
              help="A pair in controller mode instead: a controller elects the master, SIGKILL it, nobody promotes.")
def demo(producers, keep, dledger, controller) -> None:
    """The main job: a local master and slave with a generated secret, SYNC_MASTER writes with a
    live progress line, their status, one failover round verified from disk, a summary.
    --dledger: the same with a Raft group of three nodes that elects its leader by itself.
    --controller: the same with a pair whose controller elects the master and fails it over."""
    from hasvc.tools.demo import run_controller_demo, run_demo, run_dledger_demo

    if dledger and controller:
        raise click.UsageError("--dledger or --controller, not both")
    run = run_dledger_demo if dledger else run_controller_demo if controller else run_demo
    if not run(producers=producers, keep=keep, echo=click.echo):
        sys.exit(1)


@click.command()
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--producers", type=int, default=8, show_default=True)
@click.option("--mode", type=click.Choice(["sync", "async", "dledger", "controller"]), default="sync", show_default=True,
              help="sync/async: a master and a slave, failover by promote; dledger: a Raft group, no promote; "
                   "controller: brokers whose controller fails them over, no promote.")
@click.option("--nodes", type=click.Choice(["2", "3", "5"]), default="3", show_default=True,
              help="dledger: group size (3 or 5); controller: brokers in the group.")
@click.option("--fault", type=click.Choice(["kill-leader", "kill-follower", "partition-leader", "mixed", "corrupt", "disk-full",
                                            "switchover", "kill-master", "partition-master", "kill-slave",
                                            "kill-controller-leader"]),
              default=None, help="The fault each round injects. dledger: kill-leader (the default), kill-follower, "
              "partition-leader, mixed, corrupt, disk-full. sync: corrupt, disk-full, switchover; without --fault, a "
              "failover round. corrupt: stop a replica, flip one bit in one file of its store, restart it under load "
              "(a classic broker that refuses is repaired from its peer; a DLedger member must rejoin by itself). "
              "disk-full: one replica's store, on a tmpfs the drill mounts as root, filled and freed under load. "
              "switchover (sync or async): a planned hasvc switchover under load each round, back and forth. "
              "controller: kill-master (the default: SIGKILL the master, the controller elects, it rejoins as a slave), "
              "partition-master (cut the master off from the controller, clients still reach it), kill-slave, "
              "kill-controller-leader (with --controllers 3: SIGKILL the controller leader; the brokers must keep "
              "serving while a new one is elected), mixed (with --controllers 3, a controller leader's kill among them).")
@click.option("--controllers", "controller_count", type=click.Choice(["1", "3"]), default="1", show_default=True,
              help="controller: the controller group's size.")
@click.option("--role", "controller_role", type=click.Choice(["sync", "async"]), default="sync", show_default=True,
              help="controller: the brokers as SYNC_MASTER or ASYNC_MASTER; async counts the PUT_OK messages a master "
                   "fault loses that only the old master acknowledged as accepted losses, apart (any other loss fails).")
@click.option("--dledger-timing", is_flag=True, help="dledger: DLedger's election defaults instead of etcd-like ones.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seeds when and whom the fault hits.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None, help="Write a JSON report here.")
@click.option("--keep", is_flag=True, help="Keep the stores and logs.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Draw the drill's timeline here (.svg, .png or .pdf): acknowledged writes per second and latency "
                   "p50/p99 over time, fault windows shaded, each failover's gap marked. Needs matplotlib (the bench extra).")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), help="dledger: every member's TLS certificate (with --tls-key).")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), help="dledger: its private key.")
@click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True),
              help="dledger: mutual TLS between members with this CA (the drill's clients verify with it, else with --tls-cert).")
def drill(rounds, producers, mode, nodes, fault, controller_count, controller_role, dledger_timing, seed, report_path, keep, plot, tls_cert, tls_key,
          tls_ca) -> None:  # fmt: skip
    """Failover rounds on loopback, checked from the stores on disk; exits 1 on any loss.

    sync/async: SIGKILL the master under load, promote the slave, rejoin the old master as a slave;
    no acknowledged write lost (sync mode) or duplicated, logs, consume queues and epochs agree.

    dledger: a group of --nodes `hasvc node` processes behind a partition relay; each round
    SIGKILLs or partitions a member and the group elects by itself; no acknowledged write lost or
    duplicated, committed logs and consume queues identical; failover time p50/p99.

    --fault switchover: each round a planned switchover of the pair under load (fence, wait for the
    slave's last byte, promote, demote); no acknowledged write lost or duplicated, nothing cut,
    logs identical.

    controller: one controller (or --controllers 3) and --nodes `hasvc broker --controllers`
    processes; each round SIGKILLs the master under load (or the --fault given), the controller
    elects a member of the SyncStateSet and the killed broker rejoins as its slave; the same
    checks, and failover time p50/p99.

    --fault corrupt: a replica is stopped, one bit of one file of its store flipped, and it is
    restarted under load; the same checks. A classic broker that refuses to open its store is
    repaired from its peer (hasvc store repair); a DLedger member must rejoin by itself.

    --plot FILE.svg: the picture of the drill (redraw it from a --report with hasvc drill-plot)."""
    if plot:
        _check_can_plot(plot)
    if (tls_cert or tls_key or tls_ca) and (mode != "dledger" or not (tls_cert and tls_key)):
        raise click.UsageError("--tls-cert/--tls-key (and --tls-ca) go together, with --mode dledger")
    if mode != "dledger" and mode != "controller" and nodes != "3":
        raise click.UsageError("--nodes goes with --mode dledger or controller")
    if (mode == "dledger" and nodes == "2") or (mode == "controller" and nodes == "5"):
        raise click.UsageError(f"--mode {mode} runs with --nodes {'3 or 5' if mode == 'dledger' else '2 or 3'}")
    if controller_role != "sync" and mode != "controller":
        raise click.UsageError("--role goes with --mode controller (--mode sync or async for a classic pair)")
    if controller_count != "1" and mode != "controller":
        raise click.UsageError("--controllers goes with --mode controller")
    if mode == "controller":
        if fault not in (None, "kill-master", "partition-master", "kill-slave", "kill-controller-leader", "mixed"):
            raise click.UsageError(f"--mode controller runs --fault kill-master, partition-master, kill-slave, "
                                   f"kill-controller-leader or mixed (not {fault})")  # fmt: skip
        if fault == "kill-controller-leader" and controller_count == "1":
            raise click.UsageError("--fault kill-controller-leader needs a group of controllers: --controllers 3")
        from hasvc.tools.drill_controller import run_controller_drill

        ok = run_controller_drill(nodes=int(nodes), rounds=rounds, producers=producers, fault=fault or "kill-master",
                                  seed=seed, report_path=report_path, keep=keep, plot=plot, echo=click.echo,
                                  controllers=int(controller_count), asynchronous=controller_role == "async")  # fmt: skip
        if not ok:
            sys.exit(1)
        return
    if fault in ("kill-master", "partition-master", "kill-slave", "kill-controller-leader"):
        raise click.UsageError(f"--fault {fault} runs with --mode controller")
    if fault == "disk-full" and mode != "dledger":
        if mode != "sync":
            raise click.UsageError("--fault disk-full runs with --mode sync or dledger")
        from hasvc.tools.drill_diskfull import run_diskfull_drill

        try:
            ok = run_diskfull_drill(rounds=rounds, producers=producers, seed=seed, report_path=report_path, keep=keep, plot=plot,
                                    echo=click.echo)  # fmt: skip
        except PermissionError as error:
            raise click.UsageError(str(error)) from None
    elif fault == "switchover":
        if mode == "dledger":
            raise click.UsageError("--fault switchover runs with --mode sync or async (a DLedger group: hasvc transfer-leader)")
        from hasvc.tools.drill_switchover import run_switchover_drill

        ok = run_switchover_drill(rounds=rounds, producers=producers, mode=mode, seed=seed, report_path=report_path, keep=keep, plot=plot,
                                  echo=click.echo)  # fmt: skip
    elif fault == "corrupt" and mode != "dledger":
        if mode != "sync":
            raise click.UsageError("--fault corrupt runs with --mode sync or dledger")
        from hasvc.tools.drill_corrupt import run_corrupt_drill

        ok = run_corrupt_drill(rounds=rounds, producers=producers, seed=seed, report_path=report_path, keep=keep, plot=plot, echo=click.echo)
    elif mode == "dledger":
        from hasvc.tools.drill_dledger import run_dledger_drill

        try:
            ok = run_dledger_drill(nodes=int(nodes), rounds=rounds, producers=producers, fault=fault or "kill-leader",
                                   seed=seed, report_path=report_path, keep=keep, plot=plot, etcd_timing=not dledger_timing,
                                   echo=click.echo, tls=(tls_cert, tls_key, tls_ca) if tls_cert else None)  # fmt: skip
        except PermissionError as error:
            raise click.UsageError(str(error)) from None
    else:
        if fault is not None:
            raise click.UsageError(f"--fault {fault} runs with --mode dledger")
        from hasvc.tools.drill import run_drill

        ok = run_drill(rounds=rounds, producers=producers, mode=mode, seed=seed, report_path=report_path, keep=keep, plot=plot, echo=click.echo)
    if not ok:
        sys.exit(1)


def _check_can_plot(path: str) -> None:
    """--plot is refused before the drill starts anything: matplotlib missing, or a format it cannot write."""
    from hasvc.cli.common import EXIT_UNAVAILABLE, EXIT_USAGE, CommandError
    from hasvc.tools.timeline_plot import PlotError, check_can_plot

    try:
        check_can_plot(path)
    except PlotError as error:
        raise CommandError(str(error), EXIT_UNAVAILABLE if "matplotlib" in str(error) else EXIT_USAGE) from None


@click.command("drill-plot")
@click.argument("report", type=click.Path(dir_okay=False, exists=True))
@click.argument("picture", type=click.Path(dir_okay=False))
def drill_plot(report, picture) -> None:
    """Draw the picture of a drill (as hasvc drill --plot does) from its JSON --report: acknowledged
    writes per second and latency p50/p99 over time, fault windows shaded, failover gaps marked.
    PICTURE's suffix says the format (.svg, .png or .pdf). Needs matplotlib (the bench extra)."""
    from hasvc.cli.common import EXIT_USAGE, CommandError
    from hasvc.tools.timeline_plot import PlotError, draw_report

    _check_can_plot(picture)
    try:
        draw_report(report, picture)
    except PlotError as error:
        raise CommandError(str(error), EXIT_USAGE) from None
    click.echo(f"picture: {picture}")
