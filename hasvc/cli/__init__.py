"""The ``hasvc`` command line: one module per command group, composed here.

Every command imports what it runs (the broker, trio, the tools, PySpark) inside its body, so
``hasvc store verify`` starts without trio and ``hasvc`` works without the ``spark`` extra.
"""

from __future__ import annotations

import click

from hasvc.cli.bench import bench
from hasvc.cli.broker import master, slave
from hasvc.cli.client import demote, promote, read, send, status, transfer_leader
from hasvc.cli.drill import demo, drill
from hasvc.cli.node import node
from hasvc.cli.proxy import register as register_proxy
from hasvc.cli.spark import spark
from hasvc.cli.store import store


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hasvc")
def main() -> None:
    """hasvc: a RocketMQ-format message commit log with master/slave replication.

    A store is a directory: commitlog/ (the message log, in RocketMQ's record format),
    consumequeue/ (per topic and queue, an index into the log), checkpoint, abort and lock.
    See docs/FORMAT.md for the bytes.
    """


for command in (store, master, slave, node, send, read, promote, demote, status, demo, drill, bench, spark):
    main.add_command(command)
main.add_command(transfer_leader)
register_proxy(main, bench)  # hasvc proxy, hasvc bench proxy
