"""``hasvc master`` and ``hasvc slave``: run a broker process (imports trio and the broker only when one runs)."""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from hasvc.cli.common import check_can_listen, check_store_free, serve_until_signal, start_busy_polling, tune_malloc


def _broker_options(function):
    options = [
        click.option("--store", "store_dir", type=click.Path(file_okay=False), help="Store directory."),
        click.option("--listen", help="Client port, HOST:PORT (port 0: any free port)."),
        click.option("--ha-listen", help="HA port, HOST:PORT (default: the listen port + 1)."),
        click.option("--flush", type=click.Choice(["sync", "async"]), help="SYNC_FLUSH (group commit) or ASYNC_FLUSH."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False, exists=True),
                     help="TOML file with a [broker] table of options (command-line options win)."),
        click.option("--secret-file", type=click.Path(dir_okay=False, exists=True),
                     help="Cluster secret for HMAC authentication of every connection (or HASVC_SECRET)."),
        click.option("--insecure", is_flag=True, default=None, help="Allow a non-loopback listen address without a secret."),
        click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True),
                     help="PEM certificate (chain): the client and HA ports serve TLS (with --tls-key)."),
        click.option("--tls-key", type=click.Path(dir_okay=False, exists=True),
                     help="PEM private key of --tls-cert."),
        click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), help="CA a slave uses to verify its master's certificate (with --tls-cert/--tls-key on every broker)."),
        click.option("--metrics-listen", help="Serve Prometheus metrics on HOST:PORT."),
        click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
                     help="Any other option by its config name, e.g. --set slave_timeout_ms=1000."),
    ]  # fmt: skip
    for option in reversed(options):
        function = option(function)
    return function


def _build_config(role_default, cli_values: dict, config_file, secret_file, settings, other_names=()):
    """The BrokerConfig of a command's options, --config file and --set, checked by the settings
    table (hasvc/settings.py): a bad value is one line naming the setting, the value, where it
    came from (the option, --set, the file's key, the default) and what is allowed. The store's own
    settings (StoreConfig's) go by name into store_overrides. ``other_names``: names a caller
    takes from --set before this (a node's Raft settings), offered as suggestions too."""
    from commitlog.setting import SettingError
    from hasvc import settings as table
    from hasvc.config import BrokerConfig, convert, load_toml_with_origins, read_secret, settable_names, store_setting_names

    try:
        values, origins = load_toml_with_origins(config_file) if config_file else ({}, {})
    except OSError as error:
        raise click.UsageError(f"--config {config_file}: {error.strerror or error}") from None
    except ValueError as error:  # one line naming the file (tomllib.TOMLDecodeError is a ValueError)
        raise click.UsageError(str(error)) from None
    names = settable_names()
    for setting in settings:
        name, separator, raw = setting.partition("=")
        if not separator:
            raise click.BadParameter(f"{setting!r}: expected NAME=VALUE", param_hint="--set")
        if name not in names:
            raise click.BadParameter(_unknown_setting(name, [*names, *other_names]), param_hint="--set")
        try:
            values[name] = convert(name, table.parse_text(name, raw))
        except (KeyError, ValueError) as error:
            raise click.BadParameter(f"{name}={raw!r}: {_reason(error)}", param_hint="--set") from None
        origins[name] = "--set"
    for name, value in cli_values.items():
        if value is not None:
            try:
                values[name] = convert(name, value)
            except (KeyError, ValueError) as error:
                hint = f" (give HOST:PORT, e.g. 127.0.0.1:{value if str(value).isdigit() else 10911})" if "listen" in name or name == "master_ha" else ""
                raise click.BadParameter(f"{_reason(error)}{hint}", param_hint=f"--{name.replace('_', '-')}") from None
            origins[name] = f"--{name.replace('_', '-')}"
    values.setdefault("role", convert("role", role_default))
    secret = read_secret(secret_file)
    if secret is not None:
        values["secret"] = secret
    if "store" not in values:
        raise click.UsageError("--store is required (or 'store' in the config file)")
    store_names = store_setting_names()
    values["store_overrides"] = tuple(sorted((name, values.pop(name)) for name in list(values) if name in store_names))
    try:
        config = BrokerConfig(**values).validate()
    except SettingError as error:
        raise click.UsageError(table.error_line(error, origins)) from None
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    _check_tls_files(config.tls_cert, config.tls_key, config.tls_ca)
    return config


def _check_tls_files(cert, key, ca) -> None:
    """An unreadable, unparseable or mismatched certificate or key stops the command here, in one
    line naming the file, before anything starts."""
    from hasvc.transport import check_tls_files

    try:
        check_tls_files(cert=cert, key=key, ca=ca)
    except ValueError as error:
        raise click.ClickException(str(error)) from None


def _typed(raw: str, field):
    """A --set value parsed as its field's type (commitlog.setting.parse_text); BadParameter (one
    line, the type and the default as an example) when it is not one."""
    from commitlog.setting import parse_text

    try:
        return parse_text(field, raw)
    except ValueError as error:
        raise click.BadParameter(f"{field.name}={raw!r}: {error}", param_hint="--set") from None


def _unknown_setting(name: str, names) -> str:
    """What to say of a --set name this command does not take: which process reads it, if one
    does (the settings table, hasvc/settings.py), else the nearest of ``names``."""
    from hasvc import settings

    elsewhere = settings.by_name().get(name)
    if elsewhere is None:
        return f"unknown setting {name!r}{_suggest(name, names)}"
    readers = " and ".join(f"hasvc {process}" for process in elsewhere.processes)
    return f"{name!r} is not a setting of this command: only {readers} read{'s' if len(elsewhere.processes) == 1 else ''} it"


def _suggest(name: str, names) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(names), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else " ('hasvc config list' shows every setting)"


def _reason(error: BaseException) -> str:
    return str(error).strip("'\"") if isinstance(error, KeyError) else str(error)


def _run_broker(config, controlled=None) -> None:
    """``controlled``: (group, controllers, timings) of a controller-mode broker."""
    import logging

    from hasvc.broker import Broker

    # before the store is opened (and created): a port in use leaves nothing behind
    check_can_listen([config.listen, config.effective_ha_listen if config.is_master else None, config.metrics_listen])
    check_store_free(config.store)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hasvc").info("effective configuration: %s", json.dumps(config.describe()))
    tune_malloc()
    start_busy_polling(config.busy_poll_us)

    def make_broker():
        if controlled is None:
            return Broker(config)
        from hasvc.broker.controlled import ControlledBroker, ControlledOptions

        group, controllers, timings = controlled
        return ControlledBroker(config, ControlledOptions(group, controllers, timings))

    serve_until_signal(make_broker, store=config.store)


@click.command()
@_broker_options
@click.option("--role", type=click.Choice(["sync", "async"]), default=None,
              help="SYNC_MASTER (a put waits for a slave) or ASYNC_MASTER (default).")
def master(store_dir, listen, ha_listen, flush, config_file, secret_file, insecure, tls_cert, tls_key, tls_ca,
           metrics_listen, settings, role) -> None:  # fmt: skip
    """Run a master broker: takes writes, serves reads, replicates to slaves.

    Prints one line `READY {json}` on stdout when serving (with the actual ports), logs to stderr,
    and exits cleanly on SIGTERM/SIGINT (store flushed, abort file removed).
    """
    cli_values = dict(store=store_dir, listen=listen, ha_listen=ha_listen, flush=flush, insecure=insecure,
                      tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca, metrics_listen=metrics_listen, role=role)  # fmt: skip
    _run_broker(_build_config("ASYNC_MASTER", cli_values, config_file, secret_file, settings))


@click.command()
@_broker_options
@click.option("--master-ha", help="The master's HA address, HOST:PORT.")
def slave(store_dir, listen, ha_listen, flush, config_file, secret_file, insecure, tls_cert, tls_key, tls_ca,
          metrics_listen, settings, master_ha) -> None:  # fmt: skip
    """Run a slave broker: replicates the master's log byte for byte and serves reads.

    Sends are refused with SERVICE_NOT_AVAILABLE naming the master. --ha-listen is where it will
    serve slaves of its own once promoted (hasvc promote).
    """
    cli_values = dict(store=store_dir, listen=listen, ha_listen=ha_listen, flush=flush, insecure=insecure,
                      tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca, metrics_listen=metrics_listen,
                      master_ha=master_ha)  # fmt: skip
    _run_broker(_build_config("SLAVE", cli_values, config_file, secret_file, settings))


def _controlled_settings(settings: tuple[str, ...]) -> tuple[dict, tuple[str, ...]]:
    """``--set`` split into controller timings (ControllerTimings' names) and the rest (broker options)."""
    from hasvc.state.controller.config import ControllerTimings

    fields = {f.name: f for f in dataclasses.fields(ControllerTimings)}
    timings, rest = {}, []
    for setting in settings:
        name, _, raw = setting.partition("=")
        if name in fields:
            timings[name] = _typed(raw, fields[name])
        else:
            rest.append(setting)
    return timings, tuple(rest)


@click.command("broker")
@_broker_options
@click.option("--controllers", required=True, help="The controllers' ports, HOST:PORT,HOST:PORT,... (any of them: the leader is found).")
@click.option("--group", required=True, help="The broker group's name: the controllers keep one master per group.")
@click.option("--role", type=click.Choice(["sync", "async"]), default=None,
              help="How it acknowledges once the controllers make it master: SYNC_MASTER (default: a put waits for "
                   "every member of the SyncStateSet) or ASYNC_MASTER (a put is answered once the master holds it; "
                   "a failover may lose what the new master had not received).")
def controlled_broker(store_dir, listen, ha_listen, flush, config_file, secret_file, insecure, tls_cert, tls_key, tls_ca,
                      metrics_listen, settings, controllers, group, role) -> None:  # fmt: skip
    """Run a broker whose role the controllers decide (controller mode): no --role, no promote.

    It registers with the controllers (its store's identity keeps its broker id), heartbeats to
    their leader, and serves as SYNC_MASTER (a put waits for every member of the SyncStateSet;
    --role async or the role setting ASYNC_MASTER: it answers once its own log holds the put) or
    as the slave of the master they name. --ha-listen is where it serves slaves as master (port 0:
    a free port chosen at start and kept). Controller timings (broker_heartbeat_interval_seconds,
    master_lease_seconds, sync_set_lag_seconds_max, min_in_sync_replicas, ...) go in --set and must
    match the controllers'. Prints one line `READY {json}` on stdout when serving.
    """
    from hasvc.controller.client import parse_controllers
    from hasvc.state.controller.config import ControllerTimings

    timing_values, settings = _controlled_settings(settings)
    try:
        timings = ControllerTimings(**timing_values).validate()
        addresses = parse_controllers(controllers)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    if not group or len(group) > 256 or not group.isprintable():
        raise click.BadParameter(f"{group!r}: a group name is one line of printable text", param_hint="--group")
    cli_values = dict(store=store_dir, listen=listen, ha_listen=ha_listen, flush=flush, insecure=insecure,
                      tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca, metrics_listen=metrics_listen, role=role)  # fmt: skip
    slave = "role SLAVE: a controller-mode broker's role is the controllers' to decide (give --role sync or async: how it acknowledges once made master)"
    if any(setting.replace(" ", "").lower() == "role=slave" for setting in settings):
        raise click.UsageError(slave)
    config = _build_config("SYNC_MASTER", cli_values, config_file, secret_file, settings)
    if not config.is_master:
        raise click.UsageError(slave)
    defaults = {field.name: field.default for field in dataclasses.fields(type(config))}
    for name in ("master_ha", "in_sync_replicas", "min_in_sync_replicas"):  # the settings table: not the broker's
        if getattr(config, name) != defaults[name]:
            raise click.UsageError(f"{name} is not used by a controller-mode broker (hasvc broker): the controllers name "
                                   "its master, and a put waits for the SyncStateSet (controller mode's "
                                   "min_in_sync_replicas goes in --set); remove it from --set or the config file")  # fmt: skip
    _run_broker(config, controlled=(group, addresses, timings))
