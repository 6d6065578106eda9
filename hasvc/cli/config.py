"""``hasvc config``: the settings table (hasvc/settings.py), every setting with its type, default,
unit, the processes that read it and why it has its default."""

from __future__ import annotations

import click

from hasvc.cli.common import EXIT_USAGE, CommandError
from hasvc.settings import PROCESSES  # the standard library only, until a table is asked for


@click.group()
def config() -> None:
    """The settings a process takes with --set NAME=VALUE (or in a --config file's [broker] table).

    docs/configuration.md has the same table, with examples.
    """


@config.command("list")
@click.option("--process", type=click.Choice(PROCESSES), default=None,
              help="Only the settings this process reads (hasvc master, slave, node or proxy).")
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: one line a setting; json: every field, the reasons too.")  # fmt: skip
def list_settings(process, output_format) -> None:
    """Every setting: name, type, default, unit and the processes that read it.

    'hasvc config show NAME' says what one does and why its default is what it is."""
    from hasvc import settings

    chosen = settings.for_process(process) if process else settings.all_settings()
    click.echo(settings.json_text(chosen) if output_format == "json" else settings.text_table(chosen), nl=False)


@config.command("show")
@click.argument("name")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def show(name, output_format) -> None:
    """One setting whole: type, default, unit, processes, and what it does and why."""
    import json

    from hasvc import settings

    try:
        setting = settings.lookup(name)
    except KeyError as error:
        raise CommandError(str(error.args[0]), EXIT_USAGE) from None
    click.echo(json.dumps(setting.to_json(), indent=2) if output_format == "json" else settings.text_whole(setting), nl=False)
    if output_format == "json":
        click.echo()
