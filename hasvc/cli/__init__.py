"""The ``hasvc`` command line: one module per command group, composed here.

Every command imports what it runs (the broker, trio, the tools, PySpark) inside its body, so
``hasvc store verify`` starts without trio and ``hasvc`` works without the ``spark`` extra.

The error boundary is here, once for every command (``HasvcGroup.main``): whatever a command
raises (a store, OS, configuration or protocol error, or a trio exception group wrapping one)
is printed as one line on stderr with a documented exit code (``hasvc.cli.common.explain``);
``--debug`` or ``HASVC_DEBUG=1`` shows the traceback instead. Ctrl-C is one line too, and exit
130 (``HasvcGroup.invoke``).
"""

from __future__ import annotations

import sys

import click

from hasvc.cli import common
from hasvc.cli.bench import bench
from hasvc.cli.broker import controlled_broker, master, slave
from hasvc.cli.controller import controller
from hasvc.cli.client import demote, promote, read, send, status, switchover, transfer_leader
from hasvc.cli.config import config
from hasvc.cli.drill import demo, drill, drill_plot
from hasvc.cli.node import node
from hasvc.cli.proxy import register as register_proxy
from hasvc.cli.spark import spark
from hasvc.cli.store import store

_debug = False  # --debug given (set by the group's callback, read by the boundary)


class HasvcGroup(click.Group):
    """The top-level group: its ``main`` is the error boundary of every command, and every
    command's help ends with the exit codes."""

    def add_command(self, command, name=None):
        _add_exit_codes(command)
        super().add_command(command, name)

    def invoke(self, ctx):
        """The command runs here: Ctrl-C, bare or inside trio's exception groups, leaves as one
        line with exit 130 -- what the command said in its KeyboardInterrupt (a drill names the
        round and where its stores are), else ``interrupted`` -- before click's own handling
        (a blank line and Abort) sees it."""
        try:
            return super().invoke(ctx)
        except BaseException as error:
            interrupt = common.interruption(error)
            if interrupt is None:
                raise
            raise common.CommandError(str(interrupt) or "interrupted", common.EXIT_INTERRUPTED) from error

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:  # a caller that handles click's exceptions itself
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            returned = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            click.echo("Error: interrupted", err=True)
            sys.exit(common.EXIT_INTERRUPTED)
        except SystemExit as exit:
            if isinstance(exit.code, str):  # sys.exit("message"): a refusal said in words
                click.echo(f"Error: {exit.code.removeprefix('hasvc: ')}", err=True)
                sys.exit(common.EXIT_USAGE)
            raise
        except BaseException as error:
            if _debug or common.debug_requested():
                raise
            message, code = common.explain(error)
            click.echo(f"Error: {message}", err=True)
            sys.exit(code)
        sys.exit(returned if isinstance(returned, int) else common.EXIT_OK)


def _add_exit_codes(command: click.Command) -> None:
    if command.epilog is None:
        command.epilog = common.EXIT_CODES_EPILOG
    for inner in getattr(command, "commands", {}).values():
        _add_exit_codes(inner)


@click.group(cls=HasvcGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=common.EXIT_CODES_EPILOG)
@click.version_option(package_name="hasvc")
@click.option("--debug", is_flag=True, help=f"Show the traceback of an error instead of one line (or {common.DEBUG_ENVIRONMENT}=1).")
def main(debug) -> None:
    """hasvc: a RocketMQ-format message commit log with master/slave replication.

    A store is a directory: commitlog/ (the message log, in RocketMQ's record format),
    consumequeue/ (per topic and queue, an index into the log), checkpoint, abort and lock.
    See docs/FORMAT.md for the bytes.
    """
    global _debug
    _debug = debug


for command in (store, master, slave, controlled_broker, node, controller, send, read, promote, demote, status, switchover, demo,
                drill, bench, spark, config):
    main.add_command(command)
main.add_command(transfer_leader)
main.add_command(drill_plot)
register_proxy(main, bench)  # hasvc proxy, hasvc bench proxy
_add_exit_codes(main)  # commands added to groups after the groups were added (hasvc bench proxy)
