"""``hasvc proxy``: the RocketMQ 5 gRPC gateway in front of a hasvc master/slave pair."""

from __future__ import annotations

import asyncio
import logging
import sys

import click

from hasvc.cli.common import EXIT_UNAVAILABLE, EXIT_USAGE, CommandError, check_can_listen, tune_malloc


@click.command()
@click.option("--listen", default="127.0.0.1:8081", show_default=True,
              help="gRPC (plaintext) address; port 0 picks a free one (READY says which). RocketMQ's proxy uses 8081.")
@click.option("--brokers", required=True, help="The pair's client addresses, ADDR[,ADDR...]; the proxy follows the master.")
@click.option("--tls-listen", default=None, help="A second gRPC listener, with TLS (the Java client's default); needs "
              "--tls-cert and --tls-key.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), default=None, help="PEM certificate (chain) of the TLS listener.")
@click.option("--tls-key", type=click.Path(dir_okay=False), default=None, help="PEM private key of the TLS listener.")
@click.option("--metrics-listen", default=None, help="HOST:PORT for Prometheus metrics (port 0: a free one, in READY).")
@click.option("--advertise", default=None, help="HOST:PORT clients reach this proxy at (QueryRoute); default: the listen "
              "address, or for a wildcard listen the address the client used.")
@click.option("--queues", type=click.IntRange(1, 1024), default=4, show_default=True, help="Queues per topic (RocketMQ's producer default).")
@click.option("--topic", "topics", multiple=True, help="Serve only these topics (repeatable); default: any legal name.")
@click.option("--invisible-min-seconds", type=click.FloatRange(0.0), default=10.0, show_default=True,
              help="Shortest invisible duration a receive may ask for (RocketMQ's proxy: 10 s).")
@click.option("--start-at-end", is_flag=True, help="A new consumer group starts at the end of each queue (RocketMQ's "
              "proxy default) instead of at the oldest retained message.")
@click.option("--snapshot-every-events", type=click.IntRange(1), default=10_000, show_default=True,
              help="Write the whole consumer progress after this many events (replay starts there).")
@click.option("--send-lane/--no-send-lane", default=True, show_default=True,
              help="Send from the gRPC loop on a connection of its own to the master (docs/PROXY.md); off: every send "
              "crosses to the gateway's trio thread and its failover client (which the lane falls back to anyway).")
@click.option("--loop", "loop_name", type=click.Choice(["auto", "uvloop", "asyncio"]), default="auto", show_default=True,
              help="The gRPC side's event loop: uvloop (installed by the proxy extra; auto picks it when it imports) or "
              "asyncio's own (uvloop answered 9-20 % more calls a second: docs/design/proxy.md).")
@click.option("--null-sends", is_flag=True, hidden=True, help="Benchmark only: answer sends OK without storing them.")
@click.option("--secret-file", type=click.Path(dir_okay=False), default=None, help="The brokers' cluster secret (or HASVC_SECRET).")
@click.option("--tls-ca", type=click.Path(dir_okay=False), default=None, help="CA to verify the brokers' TLS certificate.")
@click.option("--acl", "acl_file", type=click.Path(dir_okay=False), default=None,
              help="TOML file of accounts (access key, secret key, topic and group patterns, pub/sub): every call must be "
              "signed by one (the official clients' Credentials) and permitted to it (docs/security.md).")
@click.option("--insecure", is_flag=True, help="Allow a non-loopback listener without --acl (anyone who reaches it sends and consumes).")
@click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
              help="A proxy limit by its name ('hasvc config list --process proxy'), e.g. --set calls_max=20480.")
def proxy(listen, brokers, tls_listen, tls_cert, tls_key, metrics_listen, advertise, queues, topics, invisible_min_seconds, start_at_end, snapshot_every_events,
          send_lane, loop_name, null_sends, secret_file, tls_ca, acl_file, insecure, settings) -> None:
    """A RocketMQ 5 gRPC proxy (apache.rocketmq.v2.MessagingService) in front of hasvc brokers.

    The official RocketMQ 5 clients produce (normal messages) and consume (SimpleConsumer,
    PushConsumer) through it unmodified; consumer-group progress is stored in the topic
    %HASVC_PROXY_PROGRESS of the brokers themselves. Prints READY {json} once it serves, logs to
    stderr, stops cleanly on SIGTERM/SIGINT. See docs/PROXY.md.

    A configuration it cannot use (an address, a certificate, an ACL file, a setting) exits 2
    before anything starts; a listen address in use exits 3.
    """
    from hasvc.config import parse_address, read_secret
    from hasvc.proxy import gateway, server
    from hasvc.proxy.acl import load_acl
    from hasvc.transport import check_tls_files

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_malloc()
    try:
        listen_address = parse_address(listen)
        advertise_address = parse_address(advertise) if advertise else None
        broker_list = [b.strip() for b in brokers.split(",") if b.strip()]
        for broker in broker_list:
            parse_address(broker)
        secret = read_secret(secret_file)
        tls_address = parse_address(tls_listen) if tls_listen else None
        metrics_address = parse_address(metrics_listen) if metrics_listen else None
        if tls_address is not None and not (tls_cert and tls_key):
            raise ValueError("--tls-listen needs --tls-cert and --tls-key")
        _check_exposure([listen_address, tls_address, metrics_address], acl=acl_file is not None, insecure=insecure)
        acl = load_acl(acl_file) if acl_file else None
        check_tls_files(cert=tls_cert if tls_address else None, key=tls_key if tls_address else None, ca=tls_ca)
        server_limits = _proxy_limits(settings)
    except (ValueError, OSError) as error:  # the configuration, or a file it names
        raise CommandError(str(error), EXIT_USAGE) from None
    check_can_listen([listen_address, tls_address, metrics_address])  # in use: exit 3, before the brokers are sought
    config = gateway.GatewayConfig(queues=queues, topics=frozenset(topics) if topics else None,
                                   invisible_min_seconds=invisible_min_seconds, start_at_end=start_at_end,
                                   snapshot_every_events=snapshot_every_events, null_sends=null_sends,
                                   send_lane=send_lane)  # fmt: skip
    if null_sends:
        logging.getLogger("hasvc.proxy").warning("--null-sends: sends are answered OK and NOT STORED (benchmark ceiling)")
    try:
        code = _run_loop(loop_name, server.serve(listen_address, broker_list, secret=secret, tls_ca=tls_ca,
                                        advertise=advertise_address, config=config, tls_listen=tls_address,
                                        tls_cert=tls_cert, tls_key=tls_key, metrics_listen=metrics_address, acl=acl,
                                        server_limits=server_limits))  # fmt: skip
    except OSError as error:  # a listener that could not be bound after all (taken meanwhile)
        raise CommandError(str(error), EXIT_UNAVAILABLE) from None
    sys.exit(code)


def _proxy_limits(settings: tuple[str, ...]):
    """``--set NAME=VALUE`` as ProxyLimits (hasvc/proxy/limits.py), typed and checked; ValueError
    (one line, with the nearest names) for anything else."""
    import dataclasses

    from commitlog.setting import SettingError
    from hasvc import settings as table
    from hasvc.cli.broker import _typed
    from hasvc.proxy.limits import ProxyLimits

    fields = {field.name: field for field in dataclasses.fields(ProxyLimits)}
    values = {}
    for setting in settings:
        name, separator, raw = setting.partition("=")
        if not separator:
            raise ValueError(f"--set {setting!r}: expected NAME=VALUE")
        if name not in fields:
            used_by = table.by_name().get(name)
            where = f" (it is read by {', '.join(used_by.processes)}, not the proxy)" if used_by else table.suggestion(name)
            raise ValueError(f"--set: {name!r} is not a proxy setting{where}")
        try:
            values[name] = _typed(raw, fields[name])
        except click.BadParameter as error:
            raise ValueError(f"--set {error.message}") from None
    try:
        return ProxyLimits(**values).validate()
    except SettingError as error:  # one line: the setting, its value, where from, the range and default
        raise ValueError(table.error_line(error, {name: "--set" for name in values})) from None


def _check_exposure(addresses, *, acl: bool, insecure: bool) -> None:
    """The brokers' rule for the proxy's listeners: off loopback only with client authentication
    (--acl), or with --insecure said out loud."""
    from hasvc.config import format_address, is_loopback

    exposed = [address for address in addresses if address is not None and not is_loopback(address[0])]
    if exposed and not acl and not insecure:
        raise ValueError(f"refusing to listen on {format_address(exposed[0])} without client authentication: give --acl FILE "
                         "(docs/security.md), or --insecure to let anyone who reaches it send and consume")  # fmt: skip


def _run_loop(loop_name: str, main):
    """Run ``main`` on the loop asked for (``auto``: uvloop when it imports, else asyncio's own)."""
    if loop_name != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop_name == "uvloop":
                main.close()
                raise click.ClickException("--loop uvloop: uvloop is not installed (pip install 'hasvc[proxy]')") from None
        else:
            return uvloop.run(main)
    return asyncio.run(main)


@click.command("proxy")
@click.option("--senders", default="1,16", show_default=True, help="Comma-separated numbers of concurrent senders.")
@click.option("--seconds", type=float, default=10.0, show_default=True, help="Per producer run.")
@click.option("--size", type=int, default=1024, show_default=True, help="Body bytes.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the runs as JSON here.")
@click.option("--acl-pairs", type=click.IntRange(min=0), default=0, show_default=True,
              help="Instead: the proxy with --acl (every call signed and checked) against the proxy without, in this "
                   "many alternating pairs of producer runs per number of senders; prints medians and the on/off ratio.")
def bench_proxy(senders, seconds, size, json_path, acl_pairs) -> None:
    """The official Python client through hasvc proxy beside hasvc's own client, on loopback.

    Starts a SYNC_MASTER master and a slave, the proxy, and a proxy that stores nothing (the
    official client's ceiling). For each number of senders: producers through both proxies and
    hasvc's client against the master; then a SimpleConsumer draining what was produced beside
    hasvc's client pulling it. Prints the rates and the gateway's cost against the ceiling.
    """
    from hasvc.tools.bench.proxy import run_bench

    try:
        counts = [int(n) for n in senders.split(",") if n.strip()]
    except ValueError:
        raise click.ClickException(f"--senders must be comma-separated numbers, got {senders!r}") from None
    if acl_pairs:
        from hasvc.tools.bench.proxy import run_acl_bench

        run_acl_bench(senders=counts, seconds=seconds, size=size, pairs=acl_pairs, json_path=json_path, echo=click.echo)
        return
    run_bench(senders=counts, seconds=seconds, size=size, json_path=json_path, echo=click.echo)


def register(main: click.Group, bench: click.Group) -> None:
    """Add ``hasvc proxy`` and ``hasvc bench proxy`` to the command line."""
    main.add_command(proxy)
    bench.add_command(bench_proxy)
