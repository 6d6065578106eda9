"""``hasvc demo`` and ``hasvc drill``: the local failover demo and drills (hasvc.tools, imported when run)."""

from __future__ import annotations

import sys

import click


@click.command()
@click.option("--producers", type=int, default=16, show_default=True)
@click.option("--keep/--no-keep", default=True, show_default=True, help="Keep the stores and logs afterwards.")
def demo(producers, keep) -> None:
    """The main job: a local master and slave with a generated secret, SYNC_MASTER writes with a
    live progress line, their status, one failover round verified from disk, a summary."""
    from hasvc.tools.demo import run_demo

    if not run_demo(producers=producers, keep=keep, echo=click.echo):
        sys.exit(1)


@click.command()
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--producers", type=int, default=8, show_default=True)
@click.option("--mode", type=click.Choice(["sync", "async"]), default="sync", show_default=True)
@click.option("--seed", type=int, default=1, show_default=True, help="Seeds when the master is killed.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None, help="Write a JSON report here.")
@click.option("--keep", is_flag=True, help="Keep the stores and logs.")
def drill(rounds, producers, mode, seed, report_path, keep) -> None:
    """Failover rounds on loopback: SIGKILL the master under load, promote the slave, rejoin the
    old master as a slave, and check from the stores on disk that no acknowledged write was lost or
    duplicated and that the logs, consume queues and epochs agree. Exits 1 on any loss in sync mode."""
    from hasvc.tools.drill import run_drill

    if not run_drill(rounds=rounds, producers=producers, mode=mode, seed=seed, report_path=report_path, keep=keep, echo=click.echo):
        sys.exit(1)
