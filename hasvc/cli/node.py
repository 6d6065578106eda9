"""``hasvc node``: run a DLedger member (imports trio and the broker only when one runs)."""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from hasvc.cli.broker import _build_config, _typed
from hasvc.cli.common import check_can_listen, check_store_free, serve_until_signal, start_busy_polling, tune_malloc

RAFT_PRESETS = ("dledger", "etcd")


def _raft_config(settings: tuple[str, ...], flush: str | None, preferred_leader: str | None):
    """Split ``--set`` into Raft settings (RaftConfig's names, or raft_preset=dledger|etcd) and the rest."""
    from commitlog.setting import SettingError
    from hasvc import settings as table
    from hasvc.state.raft.config import DLEDGER_DEFAULTS, ETCD_LIKE, RaftConfig

    fields = {f.name: f for f in dataclasses.fields(RaftConfig)}
    raft, rest = {}, []
    preset = DLEDGER_DEFAULTS
    for setting in settings:
        name, _, raw = setting.partition("=")
        if name == "raft_preset":
            if raw not in RAFT_PRESETS:
                raise click.BadParameter(f"raft_preset must be one of {', '.join(RAFT_PRESETS)}", param_hint="--set")
            preset = ETCD_LIKE if raw == "etcd" else DLEDGER_DEFAULTS
        elif name in fields:
            raft[name] = _typed(raw, fields[name])
        else:
            rest.append(setting)
    if flush is not None:
        raft["flush_sync"] = flush == "sync"
    if preferred_leader is not None:
        raft["preferred_leader_id"] = preferred_leader
    origins = {name: "raft_preset=etcd" for name in fields} if preset is ETCD_LIKE else {}
    origins.update({name: "--set" for name in raft})
    origins.update({"flush_sync": "--flush"} if flush is not None else {})
    origins.update({"preferred_leader_id": "--preferred-leader"} if preferred_leader is not None else {})
    try:
        return dataclasses.replace(preset, **raft).validate(), tuple(rest)
    except SettingError as error:
        raise click.UsageError(table.error_line(error, origins)) from None
    except (TypeError, ValueError) as error:
        raise click.UsageError(str(error)) from None


@click.command()
@click.option("--store", "store_dir", type=click.Path(file_okay=False), help="Store directory.")
@click.option("--listen", help="Client port, HOST:PORT (port 0: any free port).")
@click.option("--group", required=True, help="The DLedger group's name (every member's must match).")
@click.option("--peers", required=True, help='Every member\'s Raft address: "n0-HOST:PORT;n1-HOST:PORT;n2-HOST:PORT".')
@click.option("--self", "self_id", required=True, help="This member's id among --peers (its Raft port is its address there).")
@click.option("--preferred-leader", default=None, help="A member that takes leadership over when it has caught up.")
@click.option("--flush", type=click.Choice(["sync", "async"]), default=None,
              help="sync: an entry counts toward the quorum only once this member fsynced it (etcd's promise); "
                   "async (DLedger's default): once it is in the member's log, flushed every 10 ms.")
@click.option("--upgrade-from-classic", "upgrade_classic", is_flag=True,
              help="The smooth upgrade's explicit step: --store may be a classic broker's store (stopped cleanly); "
                   "its log is sealed and continued by this member's DLedger entries, and the store becomes this "
                   "member's for good. Without it a classic store is refused.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, exists=True),
              help="TOML file with a [broker] table of options (command-line options win).")
@click.option("--secret-file", type=click.Path(dir_okay=False, exists=True),
              help="Cluster secret for HMAC authentication of every connection, Raft ones included (or HASVC_SECRET).")
@click.option("--insecure", is_flag=True, default=None,
              help="Allow a non-loopback address without a secret. Without a secret anyone who reaches the Raft port "
                   "can speak as a member: a forged HELLO is accepted and knocks that member's connection off.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True),
              help="PEM certificate (chain) of both ports, client and Raft (with --tls-key): peers and clients speak TLS.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), help="PEM private key of --tls-cert (unencrypted).")
@click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True),
              help="Mutual TLS between members: the CA that signed every member's certificate; each member verifies "
                   "the others' (both ways) on the Raft port. Without it Raft traffic is encrypted but certificates "
                   "are not checked (the secret authenticates members).")
@click.option("--metrics-listen", help="Serve Prometheus metrics on HOST:PORT (STATUS's numbers, per-peer gauges, put latency).")
@click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
              help="Any broker option by its config name, a Raft setting (heartbeat_interval_seconds, "
                   "election_timeout_min_seconds, election_timeout_max_seconds, quorum_ack_timeout_seconds, ...), "
                   "or raft_preset=etcd (heartbeat 100 ms, election timeout 1-2 s) / dledger (the default: 2 s, 6.3-7 s). "
                   "commitlog_segment_size is the size of the Raft data files (default 1 GiB): every member of a "
                   "group must have the same (a member refuses a peer with another at its HELLO).")
def node(store_dir, listen, group, peers, self_id, preferred_leader, flush, upgrade_classic, config_file, secret_file,
         insecure, tls_cert, tls_key, tls_ca, metrics_listen, settings) -> None:  # fmt: skip
    """Run a DLedger member: the group elects its leader by Raft and keeps taking writes while a
    majority of it runs; no promote. The leader plays SYNC_MASTER once caught up (a put is
    PUT_OK once a quorum has its entry), the others SLAVE (committed reads; writes refused naming
    the leader). Prints `READY {json}` on stdout when serving, exits cleanly on SIGTERM/SIGINT."""
    from hasvc.broker.raft.group import GroupConfig, parse_peers, running_already_hint
    from hasvc.config import is_loopback
    from hasvc.state.raft.config import RaftConfig

    raft, rest = _raft_config(settings, flush, preferred_leader)
    raft_names = [field.name for field in dataclasses.fields(RaftConfig)] + ["raft_preset"]
    config = _build_config("SYNC_MASTER", dict(store=store_dir, listen=listen, insecure=insecure, tls_cert=tls_cert,
                                               tls_key=tls_key, tls_ca=tls_ca, metrics_listen=metrics_listen),
                           config_file, secret_file, rest,
                           other_names=raft_names)  # fmt: skip
    _refuse_unapplied(config)
    try:
        members = parse_peers(peers)
        group_config = GroupConfig(group=group, self_id=self_id, peers=members, raft=raft,
                                   upgrade_classic=upgrade_classic).validate()
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    # before the store is opened (and created): a port in use leaves nothing behind
    own = members[self_id]
    check_can_listen([own, config.listen, config.metrics_listen],
                     hints={own: f"its entry in --peers: {running_already_hint('member', self_id)}"})
    check_store_free(config.store)
    exposed = [address for address in members.values() if not is_loopback(address[0])]
    if exposed and config.secret is None and not config.insecure:
        raise click.UsageError(f"refusing Raft traffic off loopback ({exposed[0][0]}) without a secret: anyone who reaches "
                               "the Raft port could speak as a member; give --secret-file or HASVC_SECRET, or --insecure")  # fmt: skip
    _run_node(config, group_config)


# BrokerConfig's settings a DLedger member has no use for (the classic HA port and its slave, and
# the classic log's record CRC tail: an entry's CRC covers its
# whole record): given one, the node refuses to start rather than run without it.
NODE_UNAPPLIED_SETTINGS = ("ha_listen", "master_ha", "ha_send_heartbeat_interval_ms", "ha_housekeeping_interval_ms",
                           "ha_transfer_batch_size", "ha_frame_size_max", "ha_transfer_readahead_size",
                           "ha_max_gap_not_in_sync", "sync_from_last_file", "flush_before_ack",
                           "ha_reconnect_backoff_min_ms", "ha_reconnect_backoff_max_ms", "slave_id",
                           "append_record_crc")  # fmt: skip


def _refuse_unapplied(config) -> None:
    from hasvc import settings as table
    from hasvc.config import BrokerConfig

    defaults = {field.name: field.default for field in dataclasses.fields(BrokerConfig)}
    given = [name for name in NODE_UNAPPLIED_SETTINGS if getattr(config, name) != defaults[name]]
    given += [name for name, _ in config.store_overrides if "node" not in table.by_name()[name].processes]
    if given:
        raise click.UsageError(f"{given[0]} is not used by a DLedger member (hasvc node): remove it from --set or the "
                               "config file")  # fmt: skip


def _run_node(config, group_config) -> None:
    import logging

    from hasvc.broker.raft.broker import RaftBroker

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_malloc()
    start_busy_polling(config.busy_poll_us)
    logging.getLogger("hasvc").info("effective configuration: %s; raft %s", json.dumps(config.describe()), group_config.raft)

    serve_until_signal(lambda: RaftBroker(config, group_config), store=config.store)
