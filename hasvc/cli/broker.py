"""``hasvc master`` and ``hasvc slave``: run a broker process (imports trio and the broker only when one runs)."""

from __future__ import annotations

import json
import sys

import click

from commitlog.mapped_file import StoreError, is_disk_full
from hasvc.cli.common import start_busy_polling, tune_malloc


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


def _build_config(role_default, cli_values: dict, config_file, secret_file, settings):
    import dataclasses

    from hasvc.config import BrokerConfig, convert, load_toml, read_secret

    try:
        values = load_toml(config_file) if config_file else {}
    except (OSError, ValueError) as error:  # tomllib.TOMLDecodeError is a ValueError
        raise click.UsageError(f"--config {config_file}: {error}") from None
    fields = {f.name: f for f in dataclasses.fields(BrokerConfig)}
    for setting in settings:
        name, separator, raw = setting.partition("=")
        if not separator or name not in fields:
            raise click.BadParameter(f"{setting!r}: expected NAME=VALUE with a known option name", param_hint="--set")
        values[name] = convert(name, _typed(raw, fields[name]))
    for name, value in cli_values.items():
        if value is not None:
            values[name] = convert(name, value)
    values.setdefault("role", convert("role", role_default))
    secret = read_secret(secret_file)
    if secret is not None:
        values["secret"] = secret
    if "store" not in values:
        raise click.UsageError("--store is required (or 'store' in the config file)")
    try:
        config = BrokerConfig(**values).validate()
    except (TypeError, ValueError) as error:
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
    kind = str(field.type)
    if "bool" in kind:
        if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise click.BadParameter(f"{field.name}={raw!r}: expected true or false", param_hint="--set")
        return raw.lower() in ("1", "true", "yes", "on")
    if "int" in kind and raw.lstrip("-").isdigit():
        return int(raw)
    if kind == "int":
        raise click.BadParameter(f"{field.name}={raw!r}: expected an integer", param_hint="--set")
    if "float" in kind:
        try:
            return float(raw)
        except ValueError:
            raise click.BadParameter(f"{field.name}={raw!r}: expected a number", param_hint="--set") from None
    return raw


def _run_broker(config) -> None:
    import logging
    import signal

    import trio

    from hasvc.broker import Broker
    from hasvc.transport import first_leaf

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hasvc").info("effective configuration: %s", json.dumps(config.describe()))
    tune_malloc()
    start_busy_polling(config.busy_poll_us)

    ready = False

    async def serve() -> None:
        nonlocal ready
        broker = Broker(config)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                addresses = await nursery.start(broker.run)
                ready = True
                click.echo("READY " + json.dumps(addresses))
                sys.stdout.flush()
                async for signum in signals:
                    logging.getLogger("hasvc").info("%s: shutting down", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(serve)
    except (StoreError, OSError, BaseExceptionGroup) as error:
        leaf = first_leaf(error)  # the nursery wraps what the broker's start raised (hasvc node does the same)
        if ready:  # not a start-up failure: the log gets the whole story
            logging.getLogger("hasvc").error("stopped by an error", exc_info=error)
            raise click.ClickException(f"stopped: {type(leaf).__name__}: {leaf}") from None
        if isinstance(leaf, StoreError):
            raise click.ClickException(str(leaf)) from None
        if isinstance(leaf, OSError) and is_disk_full(leaf):  # a small file of the store (lock, abort, checkpoint) at start
            raise click.ClickException(f"{leaf.filename or config.store}: the disk is full: {leaf.strerror}") from None
        if isinstance(leaf, OSError):
            raise click.ClickException(f"cannot listen: {leaf}") from None
        raise


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
