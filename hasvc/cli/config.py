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
              help="Only the settings this process reads (hasvc master, slave, node, proxy, broker or controller).")
@click.option("--mode", type=click.Choice(["classic", "dledger", "controller"]), default=None,
              help="Only the settings of a classic pair (hasvc master, slave), of a DLedger member (hasvc node) or of "
                   "controller mode (hasvc broker, controller).")
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: one line a setting; json: every field, the reasons too.")  # fmt: skip
def list_settings(process, mode, output_format) -> None:
    """Every setting: name, type, default, unit, range and the processes that read it, the
    store's included.

    'hasvc config show NAME' says what one does, why its default is what it is, and the rules
    it takes part in."""
    from hasvc import settings

    if process and mode:
        raise CommandError("give --process or --mode, not both", EXIT_USAGE)
    chosen = settings.for_process(process) if process else settings.for_mode(mode) if mode else settings.all_settings()
    click.echo(settings.json_text(chosen) if output_format == "json" else settings.text_table(chosen), nl=False)


@config.command("show")
@click.argument("name")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def show(name, output_format) -> None:
    """One setting whole: type, default, unit, processes, and what it does and why."""
    import json

    from hasvc import settings

    try:
        settings.lookup(name)
    except KeyError as error:
        raise CommandError(str(error.args[0]), EXIT_USAGE) from None
    found = settings.named(name)  # two for a name a classic pair and controller mode both use
    if output_format == "json":
        shown = found[0].to_json() if len(found) == 1 else [setting.to_json() for setting in found]
        click.echo(json.dumps(shown, indent=2))
    else:
        click.echo("\n".join(settings.text_whole(setting) for setting in found), nl=False)


@config.command("check")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("--process", type=click.Choice(("master", "slave", "node")), default="master", show_default=True,
              help="The process the file is for: each takes the settings it reads.")
@click.option("--secret-file", type=click.Path(dir_okay=False, exists=True),
              help="The secret the process would be started with (or HASVC_SECRET): an address off loopback needs one.")
def check(file, process, secret_file) -> None:
    """Check a TOML file of settings (its [broker] table) as 'hasvc PROCESS --config FILE' would
    at start, starting nothing: unknown names (with the nearest), types, ranges, combinations,
    the TLS files it names. Options given on the command line at start (--store, a slave's
    --master-ha) are assumed when the file has none. Exit 0 when a process could start with it,
    2 with one line saying what is wrong otherwise."""
    import dataclasses

    from hasvc.cli.broker import _build_config
    from hasvc.config import BrokerConfig, load_toml

    try:
        given = load_toml(file)
    except (OSError, ValueError) as error:
        raise CommandError(str(error), EXIT_USAGE) from None
    assumed = {"store": "STORE"} if "store" not in given else {}
    if process == "slave" and "master_ha" not in given:
        assumed["master_ha"] = "127.0.0.1:10912"
    role = {"master": "ASYNC_MASTER", "slave": "SLAVE", "node": "SYNC_MASTER"}[process]
    config = _build_config(role, assumed, file, secret_file, ())
    if process == "node":
        from hasvc.cli.node import _refuse_unapplied

        _refuse_unapplied(config)
    from commitlog.config import StoreConfig

    defaults = {field.name: field.default for cls in (StoreConfig, BrokerConfig) for field in dataclasses.fields(cls)}
    changed = sorted(name for name in given if given[name] != defaults.get(name))
    note = f"; assumed {', '.join(f'{name}={value}' for name, value in assumed.items())}" if assumed else ""
    count = f"{len(given)} setting{'' if len(given) == 1 else 's'}"
    click.echo(f"{file}: OK for hasvc {process} ({count}, {len(changed)} not the default{note})")
