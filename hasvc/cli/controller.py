"""``hasvc controller``: run one controller of a controller group (imports trio only when one runs)."""

from __future__ import annotations

import dataclasses
import sys

import click

from hasvc.cli.broker import _check_tls_files, _suggest, _typed
from hasvc.cli.common import check_can_listen, check_store_free, serve_until_signal


OWN_SETTINGS = ("snapshot_interval_entries", "log_file_size")


def _settings(settings: tuple[str, ...]) -> tuple[dict, dict, dict]:
    """``--set`` split into (controller timings, Raft settings, the controller's own) by name."""
    from hasvc.controller.server import ControllerConfig
    from hasvc.state.controller.config import ControllerTimings
    from hasvc.state.raft.config import RaftConfig

    kinds = ({f.name: f for f in dataclasses.fields(ControllerTimings)}, {f.name: f for f in dataclasses.fields(RaftConfig)},
             {f.name: f for f in dataclasses.fields(ControllerConfig) if f.name in OWN_SETTINGS})
    values: tuple[dict, dict, dict] = ({}, {}, {})
    for setting in settings:
        name, separator, raw = setting.partition("=")
        if not separator:
            raise click.BadParameter(f"{setting!r}: expected NAME=VALUE", param_hint="--set")
        for fields, chosen in zip(kinds, values, strict=True):
            if name in fields:
                try:
                    chosen[name] = _typed(raw, fields[name])
                except ValueError as error:
                    raise click.BadParameter(f"{name}={raw!r}: {error}", param_hint="--set") from None
                break
        else:
            names = [n for fields in kinds for n in fields]
            raise click.BadParameter(f"unknown setting {name!r}{_suggest(name, names)}", param_hint="--set")
    return values


@click.command()
@click.option("--store", "store_dir", required=True, type=click.Path(file_okay=False),
              help="Store directory: the controller group's Raft log and the state's snapshot.")
@click.option("--listen", required=True, help="The controller port brokers call, HOST:PORT (port 0: any free port).")
@click.option("--peers", default=None,
              help='Every controller\'s Raft address: "c0-HOST:PORT;c1-HOST:PORT;c2-HOST:PORT" (1, 3 or 5). '
                   "Without it: a group of one, its Raft port any free port on loopback.")
@click.option("--self", "self_id", default=None, help="This controller's id among --peers (needed with --peers).")
@click.option("--allow-unclean-election", is_flag=True,
              help="When no member of a group's SyncStateSet is alive, elect another alive member: it may lack "
                   "acknowledged writes, so each such election is logged as a possible loss. Off by default.")
@click.option("--metrics-listen", default=None, help="Serve Prometheus metrics on HOST:PORT.")
@click.option("--secret-file", type=click.Path(dir_okay=False, exists=True),
              help="Cluster secret for HMAC authentication of every connection, Raft and controller ports (or HASVC_SECRET).")
@click.option("--insecure", is_flag=True, help="Allow a non-loopback address without a secret.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True),
              help="PEM certificate (chain) of both ports, controller and Raft (with --tls-key).")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), help="PEM private key of --tls-cert (unencrypted).")
@click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True),
              help="Mutual TLS between controllers on the Raft port: the CA that signed every controller's certificate.")
@click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
              help="A controller timing (broker_heartbeat_timeout_seconds, master_lease_seconds, ...), a Raft "
                   "setting of the controller group (election_timeout_min_seconds, ...), snapshot_interval_entries or log_file_size.")
def controller(store_dir, listen, peers, self_id, allow_unclean_election, metrics_listen, secret_file, insecure,
               tls_cert, tls_key, tls_ca, settings) -> None:  # fmt: skip
    """Run a controller: one of a group of 1, 3 or 5 that decides which broker of each
    controller-managed group is master (hasvc broker --controllers). The group replicates its
    state by Raft; its leader answers brokers' heartbeats and elects a new master when one
    falls silent. Prints `READY {json}` on stdout when serving, exits cleanly on SIGTERM/SIGINT."""
    from hasvc.broker.raft.group import parse_peers, running_already_hint
    from hasvc.config import is_loopback, parse_address, read_secret
    from hasvc.controller.server import CONTROLLER_RAFT, ControllerConfig
    from hasvc.state.controller.config import ControllerTimings

    timing_values, raft_values, own_values = _settings(settings)
    if allow_unclean_election:
        timing_values["allow_unclean_election"] = True
    try:
        listen_address = parse_address(listen)
        metrics_address = parse_address(metrics_listen) if metrics_listen else None
        members = parse_peers(peers) if peers is not None else None
        if members is not None and self_id is None:
            raise ValueError("--peers needs --self (this controller's id among them)")
        if members is None and self_id is not None:
            raise ValueError("--self names a controller of --peers: give --peers too")
        config = ControllerConfig(store=store_dir, listen=listen_address, self_id=self_id or "c0", peers=members,
                                  raft=dataclasses.replace(CONTROLLER_RAFT, **raft_values),
                                  timings=ControllerTimings(**timing_values), secret=read_secret(secret_file),
                                  tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca, metrics_listen=metrics_address,
                                  **own_values).validate()  # fmt: skip
    except (TypeError, ValueError) as error:
        raise click.UsageError(str(error)) from None
    _check_tls_files(tls_cert, tls_key, tls_ca)
    group = config.group_config()
    own = group.peers[group.self_id]
    exposed = [a for a in [listen_address, *(members or {}).values()] if not is_loopback(a[0])]
    if exposed and config.secret is None and not insecure:
        raise click.UsageError(f"refusing controller traffic off loopback ({exposed[0][0]}) without a secret: anyone who "
                               "reaches the ports could speak as a controller or a broker; give --secret-file or "
                               "HASVC_SECRET, or --insecure")  # fmt: skip
    check_can_listen([own, listen_address, metrics_address],
                     hints={own: f"its entry in --peers: {running_already_hint('controller', group.self_id)}"})
    check_store_free(store_dir)
    _run_controller(config)


def _run_controller(config) -> None:
    import logging

    from hasvc.controller.server import ControllerServer

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hasvc").info("controller %s: raft %s; timings %s", config.self_id, config.raft, config.timings)
    serve_until_signal(lambda: ControllerServer(config))


def controller_status(address: str, secret: bytes | None, tls_ca: str | None) -> dict:
    """The STATUS of the controller at ``address`` (``hasvc status ADDR`` on a controller port)."""
    import trio

    from hasvc import transport
    from hasvc.controller.client import ControllerClient

    async def ask() -> dict:
        context = transport.client_ssl_context(ca=tls_ca) if tls_ca else None
        client = ControllerClient([address], secret=secret, ssl_context=context)
        try:
            return (await client.status_of(address)).controller
        finally:
            await client.aclose()

    return trio.run(ask)


def echo_controller_status(data: dict) -> None:
    """A controller's STATUS: its place in the controller group, then each broker group."""
    leader = f"leader {data['leader_id']} ({data['leader_address']})" if data["leader_id"] else "no leader known"
    click.echo(f"role         {data['role']} ({data['raft_role']}, term {data['term']}, {leader}"
               f"{', holds its lease' if data['holds_lease'] else ''})")  # fmt: skip
    click.echo(f"listen       {data['listen']}   raft {data['raft_listen']}")
    click.echo(f"log          entries [{data['log_first_index']}, {data['log_last_index']}]  committed "
               f"{data['committed_index']}  applied {data['applied_index']}  snapshot {data['snapshot_index']}")  # fmt: skip
    for peer, item in sorted(data["peers"].items()):
        contact = "never this term" if item["last_contact_seconds"] is None else f"{item['last_contact_seconds']} s ago"
        click.echo(f"peer         {peer} {'up' if item['connected'] else 'DOWN'}, match {item['match_index']}, "
                   f"last contact {contact}")  # fmt: skip
    for name, group in sorted(data["groups"].items()):
        click.echo(f"group        {name}: master {group['master_id']} in epoch {group['epoch']}, SyncStateSet "
                   f"{group['sync_state_set']} (set epoch {group['sync_state_set_epoch']})")  # fmt: skip
        for broker_id, member in sorted(group["members"].items(), key=lambda item: int(item[0])):
            seen = "" if member["alive"] is None else (
                f", {'alive' if member['alive'] else 'SILENT'} (last heartbeat {member['last_heartbeat_seconds']} s ago, "
                f"epoch {member['epoch']}, max offset {member['max_offset']})")  # fmt: skip
            click.echo(f"  broker     {broker_id} {member['client_address']} (HA {member['ha_address']}){seen}")
