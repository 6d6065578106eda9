"""``hasvc send/read/status/promote/demote/transfer-leader/switchover``: client calls against
running brokers.

Every command takes one address or the cluster: ``--endpoints A,B,C`` or a comma list as the
address. Given the cluster, a command finds whom to ask itself: ``send`` and ``read`` the master
(or DLedger leader) through the failover client, ``transfer-leader`` the leader, ``promote`` the
slave furthest ahead, ``demote`` the masters of older epochs; ``status`` asks every member and
prints one table. Errors reach the command line's boundary (``hasvc.cli``) and become one line.
"""

from __future__ import annotations

import json
import sys

import click

from hasvc.cli.common import (EXIT_FAILED, EXIT_UNAVAILABLE, CommandError, client_secret, meaningful_leaf, record_json, secret_option,
                              tls_option)

# A command given the cluster waits this long for a master or leader to exist (a DLedger group
# elects within its election timeout, 6.3-7 s with DLedger's defaults), then gives up.
CLUSTER_WAIT_SECONDS = 15.0
# How often ``hasvc switchover`` asks the fenced master how far its slave has acknowledged.
SWITCHOVER_POLL_SECONDS = 0.05

endpoints_option = click.option("--endpoints", default=None, metavar="A,B,C",
                                help="Every member's client address: the command finds the master or leader itself.")  # fmt: skip


def _addresses(address: str | None, endpoints: str | None) -> list[str]:
    """The addresses given (ADDRESS, a comma list, and --endpoints), each checked, in order, once."""
    from hasvc.config import parse_address

    found: list[str] = []
    for text in (address, endpoints):
        for item in (part.strip() for part in (text or "").split(",")):
            if not item or item in found:
                continue
            try:
                parse_address(item)
            except ValueError as error:
                raise click.BadParameter(f"{error} (give HOST:PORT, e.g. 127.0.0.1:10911)", param_hint="ADDRESS") from None
            found.append(item)
    if not found:
        raise click.UsageError("give ADDRESS (HOST:PORT, or a comma list) or --endpoints A,B,C")
    return found


def _client_call(addresses: list[str], secret_file, tls_ca, body, *, follow: bool = False):
    """Run ``body(client)``: one address, a direct connection; several (or ``follow``), a
    failover client that finds the master itself and retries sends idempotently."""
    import trio

    from hasvc.client import connect, connect_cluster

    secret = client_secret(secret_file)

    async def run():
        if len(addresses) == 1 and not follow:
            async with connect(addresses[0], secret, tls_ca=tls_ca) as client:
                return await body(client)
        async with connect_cluster(addresses, secret, tls_ca=tls_ca, retry_sends=True, failover_timeout=CLUSTER_WAIT_SECONDS) as client:
            return await body(client)

    return trio.run(run)


async def _statuses(addresses: list[str], secret, tls_ca) -> list[tuple[str, dict | None, str]]:
    """(address, status or None, why not) of every address, asked at once."""
    import trio

    from hasvc.client import STATUS_TIMEOUT_SECONDS, ClientError, connect

    answers: dict[str, tuple[dict | None, str]] = {}

    async def ask(address: str) -> None:
        try:
            with trio.fail_after(STATUS_TIMEOUT_SECONDS):
                async with connect(address, secret, tls_ca=tls_ca) as client:
                    answers[address] = (await client.status(), "")
        except (ClientError, trio.TooSlowError) as error:
            answers[address] = (None, _short(str(error)) or "no answer")

    async with trio.open_nursery() as nursery:
        for address in addresses:
            nursery.start_soon(ask, address)
    return [(address, *answers[address]) for address in addresses]


def _short(reason: str) -> str:
    """A connection error without the address (the table's first column has it) and the hint."""
    return reason.split(" (")[0].rsplit(": ", 1)[-1]


@click.command()
@click.argument("address", required=False)
@click.argument("body", required=False)
@click.option("--topic", required=True)
@click.option("--tag", default=None)
@click.option("--key", default=None)
@click.option("--queue", "queue_id", type=int, default=0, show_default=True)
@click.option("--file", "file_path", type=click.Path(dir_okay=False, exists=True), help="One message per line from a file.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@endpoints_option
@secret_option
@tls_option
def send(address, body, topic, tag, key, queue_id, file_path, as_json, endpoints, secret_file, tls_ca) -> None:
    """Send BODY (or one message per line of stdin with BODY '-', or --file) to the broker at ADDRESS.

    With several addresses (a comma list or --endpoints) the message goes to the master or
    leader among them, found by asking each, and is sent again (stored once) across a failover.
    Prints one line per message; exits 1 if any message was not PUT_OK.
    """
    if endpoints and address is not None and body is None:  # send --endpoints A,B --topic T BODY
        address, body = None, address
    if file_path:
        with open(file_path, "rb") as file:
            bodies = [line.rstrip(b"\n") for line in file]
    elif body == "-" or body is None:
        bodies = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    else:
        bodies = [body.encode()]

    async def run(client):
        return [await client.send(topic, item, tags=tag, keys=key, queue_id=queue_id) for item in bodies]

    results = _client_call(_addresses(address, endpoints), secret_file, tls_ca, run)
    for result in results:
        if as_json:
            click.echo(json.dumps({"status": result.status, "offset": result.offset, "queue_id": result.queue_id,
                                   "queue_offset": result.queue_offset, "reason": result.reason}))  # fmt: skip
        else:
            detail = f" ({result.reason})" if result.reason else ""
            click.echo(f"{result.status} offset={result.offset} queue={result.queue_id} queue_offset={result.queue_offset}{detail}")
    if any(not result.ok for result in results):
        sys.exit(EXIT_FAILED)


@click.command()
@click.argument("address", required=False)
@click.option("--topic", default=None)
@click.option("--queue", "queue_id", type=int, default=0, show_default=True)
@click.option("--from", "from_offset", type=click.IntRange(min=0), default=0, show_default=True, help="Queue offset to start at.")
@click.option("--offset", "physical_offset", type=click.IntRange(min=0), default=None, help="Read the one record at this physical offset.")
@click.option("--follow", is_flag=True, help="Keep reading new messages (Ctrl-C to stop).")
@click.option("--json", "as_json", is_flag=True)
@endpoints_option
@secret_option
@tls_option
def read(address, topic, queue_id, from_offset, physical_offset, follow, as_json, endpoints, secret_file, tls_ca) -> None:
    """Read messages from a master or a slave: a topic's queue, or one record by physical offset.
    With several addresses, from the master or leader among them."""
    import trio

    def show(record) -> None:
        if as_json:
            click.echo(json.dumps(record_json(record.physical_offset, record, True)))
        else:
            body = bytes(record.body).decode("utf-8", errors="replace")
            click.echo(f"{record.physical_offset} {record.topic}/{record.queue_id}#{record.queue_offset} tags={record.tags or '-'} {body}")

    addresses = _addresses(address, endpoints)
    if physical_offset is not None:
        record = _client_call(addresses, secret_file, tls_ca, lambda client: client.read_record(physical_offset))
        show(record)
        return
    if topic is None:
        raise click.UsageError("give --topic (with --queue/--from) or --offset")

    async def run(client):
        offset = from_offset
        while True:
            result = await client.pull(topic, queue_id, offset, count_max=256)
            for record in result.records:
                show(record)
            offset = result.next_queue_offset
            if not result.records:
                if not follow:
                    return
                await trio.sleep(0.2)

    try:
        _client_call(addresses, secret_file, tls_ca, run)
    except BaseException as error:  # Ctrl-C is how --follow ends: exit 0 (trio may wrap it in a group)
        if not (follow and isinstance(meaningful_leaf(error), KeyboardInterrupt)):
            raise


def _one_call(address: str, secret_file, tls_ca, body):
    return _client_call([address], secret_file, tls_ca, body)


@click.command()
@click.argument("address", required=False)
@click.option("--role", type=click.Choice(["sync", "async"]), default="sync", show_default=True)
@endpoints_option
@secret_option
@tls_option
def promote(address, role, endpoints, secret_file, tls_ca) -> None:
    """Make the slave at ADDRESS a master: it stops replicating, opens a new epoch at its log's end
    (persisted before any write) and serves producers and slaves on its HA address.

    With several addresses: the slave whose log reaches furthest, and only when none of them is
    a running master (to move a running master, use hasvc switchover)."""
    import trio

    addresses = _addresses(address, endpoints)
    if len(addresses) > 1:
        statuses = trio.run(_statuses, addresses, client_secret(secret_file), tls_ca)
        masters = [a for a, s, _ in statuses if s is not None and s.get("role") != "SLAVE" and not s.get("fenced_by")]
        if masters:
            raise CommandError(f"{masters[0]} is a running master: promoting a slave now makes two (hasvc switchover "
                               f"{masters[0]} --to SLAVE moves it without losing a write)", EXIT_FAILED)  # fmt: skip
        slaves = [(s["max_offset"], -i, a) for i, (a, s, _) in enumerate(statuses) if s is not None and s.get("role") == "SLAVE"]
        if not slaves:
            raise CommandError(f"no slave answers among {', '.join(addresses)}", EXIT_UNAVAILABLE)
        address = max(slaves)[2]
    else:
        address = addresses[0]
    data = _one_call(address, secret_file, tls_ca, lambda client: client.promote(sync=role == "sync"))
    click.echo(f"{address}: {data['role']} epoch {data['epoch']} from offset {data['max_offset']}, HA address {data['ha_listen']}")


@click.command()
@click.argument("address", required=False)
@click.option("--master-ha", default=None, help="The new master's HA address, HOST:PORT (with several addresses: "
              "the HA address of the master of the newest epoch among them).")  # fmt: skip
@endpoints_option
@secret_option
@tls_option
def demote(address, master_ha, endpoints, secret_file, tls_ca) -> None:
    """Make the master at ADDRESS a slave of MASTER_HA: it stops taking writes, cuts what its log
    has beyond the consistent point with the new master's history, and catches up.

    With several addresses: every master but the one of the newest epoch becomes its slave."""
    import trio

    from hasvc.state import failover

    addresses = _addresses(address, endpoints)
    if len(addresses) == 1:
        if master_ha is None:
            raise click.UsageError("give --master-ha HOST:PORT (or several addresses: the newest master's is used)")
        targets = addresses
    else:
        statuses = trio.run(_statuses, addresses, client_secret(secret_file), tls_ca)
        chosen = failover.choose_master([(a, s) for a, s, _ in statuses])
        if chosen is None:
            raise CommandError(f"no master answers among {', '.join(addresses)}", EXIT_UNAVAILABLE)
        newest, newest_status = chosen
        master_ha = master_ha or newest_status["ha_listen"]
        targets = [a for a, s, _ in statuses if a != newest and s is not None and s.get("role") != "SLAVE"]
        if not targets:
            click.echo(f"nothing to demote: {newest} is the only master (epoch {newest_status['epoch']})")
            return
    for target in targets:
        data = _one_call(target, secret_file, tls_ca, lambda client: client.demote(master_ha))
        click.echo(f"{target}: {data['role']} of {data.get('master_ha')}")


@click.command()
@click.argument("address", required=False)
@click.option("--json", "as_json", is_flag=True, help="The whole STATUS object (a list of them for several addresses).")
@endpoints_option
@secret_option
@tls_option
def status(address, as_json, endpoints, secret_file, tls_ca) -> None:
    """Role, offsets and replication state of the broker at ADDRESS.

    With several addresses (a comma list or --endpoints), one table: each member's role,
    epoch or term, log end, lag behind the master or leader, up or down, and its last contact.
    Exits 3 when none answers."""
    import trio

    from hasvc.client.results import ConnectError
    from hasvc.protocol.wire import AUTH_STATUS_TEXT, AUTH_STATUS_WRONG_PORT

    addresses = _addresses(address, endpoints)
    if len(addresses) == 1:
        controller = False
        try:
            data = _one_call(addresses[0], secret_file, tls_ca, lambda client: client.status())
        except ConnectError as error:  # a controller port (port kind 4) answers the preface as one
            if AUTH_STATUS_TEXT[AUTH_STATUS_WRONG_PORT] not in str(error):
                raise
            from hasvc.cli.controller import controller_status

            data, controller = controller_status(addresses[0], client_secret(secret_file), tls_ca), True
        if as_json:
            click.echo(json.dumps(data))
        elif controller:
            from hasvc.cli.controller import echo_controller_status

            echo_controller_status(data)
        elif data.get("mode") == "dledger":
            _echo_dledger_status(data)
        else:
            _echo_classic_status(data)
        return
    statuses = trio.run(_statuses, addresses, client_secret(secret_file), tls_ca)
    if as_json:
        click.echo(json.dumps([{"address": a, "up": s is not None, **(s or {"error": why})} for a, s, why in statuses]))
    else:
        rows = cluster_rows(statuses)
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if all(s is None for _, s, _ in statuses):
        sys.exit(EXIT_UNAVAILABLE)


CLUSTER_COLUMNS = ("MEMBER", "ROLE", "EPOCH/TERM", "LOG END", "LAG", "STATE", "LAST CONTACT")


def cluster_rows(statuses: list[tuple[str, dict | None, str]]) -> list[tuple]:
    """The cluster table: a header and one row per address. Lag and last contact are the master's
    or leader's view of each member (a classic slave's lag in bytes, a DLedger member's in
    entries); a member that does not answer, or that the leader's connection to is down, is "down"."""
    from hasvc.state import failover

    up = [(a, s) for a, s, _ in statuses if s is not None]
    dledger = any(s.get("mode") == "dledger" for _, s in up)
    if dledger:
        leaders = [s for _, s in up if s.get("raft_role") == "LEADER"]
        leader = max(leaders, key=lambda s: s["term"]) if leaders else None
    else:
        chosen = failover.choose_master(up)
        leader = chosen[1] if chosen else None
    rows = [CLUSTER_COLUMNS]
    for address, data, why in statuses:
        if data is None:
            rows.append((address, "-", "-", "-", "-", f"down ({why})" if why else "down", "-"))
            continue
        state, lag, contact = "up", "-", "-"
        if dledger:
            role, epoch = data.get("raft_role", "?"), f"term {data.get('term')}"
            end = f"index {data.get('ledger_end_index')} (committed {data.get('committed_index')})"
            peer = (leader or {}).get("peers", {}).get(data.get("self_id")) if leader is not data else None
            if peer is not None:
                lag = f"{peer['lag_entries']} entries"
                contact = "-" if peer["last_contact_seconds"] is None else f"{peer['last_contact_seconds']} s ago"
                if not peer.get("connected", True):
                    state = "up (the leader's connection to it is down)"
        else:
            role, epoch = data["role"] + (" (fenced)" if data.get("fenced_by") else ""), f"epoch {data['epoch']}"
            end = f"offset {data['max_offset']}"
            if data["role"] == "SLAVE":
                entry = next((s for s in (leader or {}).get("slaves", []) if s["address"] == data["listen"]), None)
                if entry is not None:
                    lag = f"{entry['lag_bytes']} B, {entry['lag_seconds']} s"
                elif leader is not None:
                    lag = f"{leader['max_offset'] - data['max_offset']} B"
                contact = "replicating" if data.get("master_connected") else "master not connected"
        member = f"{address} ({data['self_id']})" if dledger and data.get("self_id") else address
        rows.append((member, role, epoch, end, lag, state, contact))
    return rows


def _echo_classic_status(data: dict) -> None:
    click.echo(f"role         {data['role']} (epoch {data['epoch']})")
    click.echo(f"listen       {data['listen']}   ha {data['ha_listen']}")
    click.echo(f"offsets      min {data['min_offset']}  max {data['max_offset']}  flushed {data['flushed_offset']}")
    if data.get("fenced_by"):
        click.echo(f"fenced       {data['fenced_by']} (SENDs refused)")
    if data["role"] == "SLAVE":
        state = "connected" if data["master_connected"] else "NOT connected (retrying)"
        client = data.get("master_client_address")
        click.echo(f"master       {client or '?'} (HA {data['master_ha']}) {state}")
    for item in data["slaves"]:
        click.echo(f"slave        {item['address']} ack {item['ack_offset']} lag {item['lag_bytes']} B / "
                   f"{item['lag_seconds']} s since {item['connected_since']}")  # fmt: skip
    if not data["slaves"] and data["role"] != "SLAVE":
        click.echo("slaves       none connected")


def _echo_dledger_status(data: dict) -> None:
    """A DLedger member's STATUS: role and term, its log's indexes (the first moves up with
    retention), offsets, and on a leader each peer's progress (a peer whose connection is down
    is said to be down, whatever it last matched)."""
    click.echo(f"role         {data['role']} ({data['raft_role']}, term {data['term']}, leader {data['leader_id']})")
    click.echo(f"listen       {data['listen']}   raft {data['raft_listen']}")
    click.echo(f"log          entries [{data['ledger_begin_index']}, {data['ledger_end_index']}]  committed "
               f"{data['committed_index']}  flushed {data['flushed_index']}  retention keeps from "
               f"{data['retention_floor_index']}")  # fmt: skip
    click.echo(f"offsets      min {data['min_offset']}  max {data['max_offset']}  flushed {data['flushed_offset']}")
    for item in data.get("damaged", ()):
        index = f" entry {item['index']}" if "index" in item else ""
        click.echo(f"damaged      {item['file']} [{item['from']}, {item['to']}){index}: {item['reason']} (cut at recovery)")
    if data.get("catch_up_index", -1) >= 0:
        click.echo(f"catch-up     lost entries up to {data['catch_up_index']}: no election, votes as if its log ended "
                   "there, until the leader has caught it up")  # fmt: skip
    for peer, item in sorted(data["peers"].items()):
        behind = ("  BEHIND THE LOG START: being reset to this leader's first entry (retention deleted what it needs)"
                  if item.get("behind_log_start") else "")  # fmt: skip
        contact = "never this term" if item["last_contact_seconds"] is None else f"{item['last_contact_seconds']} s ago"
        if item.get("connected", True):
            click.echo(f"peer         {peer} up, match {item['match_index']} lag {item['lag_entries']} entries, "
                       f"last contact {contact}{behind}")  # fmt: skip
        else:
            click.echo(f"peer         {peer} DOWN (no connection), last matched {item['match_index']}, "
                       f"{item['lag_entries']} entries behind, last contact {contact}{behind}")  # fmt: skip


async def _find_leader(addresses: list[str], secret, tls_ca, *, wait_seconds: float) -> tuple[str, dict]:
    """(client address, STATUS) of the DLedger leader of the newest term among ``addresses`` and
    the leaders they name; asked again until one leads or ``wait_seconds`` pass."""
    import trio

    from hasvc.client import ConnectError
    from hasvc.state import failover

    known = list(addresses)
    deadline = trio.current_time() + wait_seconds
    while True:
        statuses = await _statuses(known, secret, tls_ca)
        leaders = [(s["term"], a, s) for a, s, _ in statuses if s is not None and s.get("raft_role") == "LEADER"]
        if leaders:
            _, address, data = max(leaders, key=lambda item: item[:2])
            return address, data
        if any(s is not None and s.get("mode") != "dledger" for _, s, _ in statuses):
            raise CommandError("not a DLedger group: a classic pair moves its master with hasvc switchover", EXIT_FAILED)
        named = failover.named_leaders([(a, s) for a, s, _ in statuses], known=known)
        if named:
            known.extend(named)
            continue
        if trio.current_time() > deadline:
            downs = "; ".join(why for _, s, why in statuses if s is None)
            raise ConnectError(f"no leader among {', '.join(known)} within {wait_seconds:.0f} s" + (f" ({downs})" if downs else ""))
        await trio.sleep(0.2)


@click.command("transfer-leader")
@click.argument("address", required=False)
@click.option("--to", "target", required=True, help="The member id (of --peers) that should lead, e.g. n1.")
@click.option("--json", "as_json", is_flag=True, help="The outcome as one JSON object.")
@endpoints_option
@secret_option
@tls_option
def transfer_leader(address, target, as_json, endpoints, secret_file, tls_ca) -> None:
    """Hand the leadership of a DLedger group to member --to (DLedger's LEADERSHIP_TRANSFER).

    ADDRESS is any member's client port (or several, or --endpoints): the leader is found from
    their STATUS. When --to leads already there is nothing to do (exit 0). It answers once --to
    leads a new term, or refuses naming why: --to is not a member, --to is too far behind (its
    lag named; at most leadership_transfer_wait_index_max entries), or --to did not take over in
    time (within about 10 s). Exits 1 on refusal.
    """
    import trio

    addresses = _addresses(address, endpoints)
    secret = client_secret(secret_file)

    async def run():
        from hasvc.client import connect

        leader_address, leader = await _find_leader(addresses, secret, tls_ca, wait_seconds=CLUSTER_WAIT_SECONDS)
        if leader.get("self_id") == target:
            return None, leader
        async with connect(leader_address, secret, tls_ca=tls_ca) as client:
            return await client.transfer_leader(target), leader

    result, leader = trio.run(run)
    if result is None or result.status == "ALREADY_LEADER":
        details = {"leader_id": target, "term": leader.get("term")}
        if as_json:
            click.echo(json.dumps({"status": "OK", "reason": f"{target} leads already", **details}))
        else:
            click.echo(f"{target} leads term {leader.get('term')} already: nothing to do")
        return
    details = result.details
    if as_json:
        click.echo(json.dumps({"status": result.status, "reason": result.reason, **details}))
    elif result.ok:
        click.echo(f"{details.get('leader_id')} leads term {details.get('term')} (was {details.get('self_id')} in term "
                   f"{details.get('previous_term')}; {details.get('elapsed_seconds')} s)")  # fmt: skip
    else:
        click.echo(f"Error: refused: {result.status}: {result.reason}", err=True)
    if not result.ok:
        sys.exit(EXIT_FAILED)


@click.command()
@click.argument("master_address", metavar="MASTER")
@click.option("--to", "slave_address", required=True, metavar="SLAVE", help="The client address of the slave that takes over.")
@click.option("--timeout", "timeout_seconds", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds to wait for the slave to have every byte; past it the master takes writes again.")
@click.option("--role", type=click.Choice(["sync", "async"]), default=None, help="The new master's role (default: the old master's).")
@secret_option
@tls_option
def switchover(master_address, slave_address, timeout_seconds, role, secret_file, tls_ca) -> None:
    """A planned switch of a classic pair that loses and duplicates nothing: fence the master at
    MASTER (it refuses new writes with SERVICE_NOT_AVAILABLE, which failover clients retry, and
    goes on replicating), wait until the slave at SLAVE has acknowledged every byte of its log,
    promote the slave, and demote the old master under it (it becomes the new master's slave).

    If the slave does not catch up within --timeout the fence is lifted and the master takes
    writes again (exit 1): nothing changed."""
    import trio

    from hasvc.tools.switchover import SwitchoverError
    from hasvc.tools.switchover import switchover as run_switchover

    _addresses(master_address, None), _addresses(slave_address, None)  # each one HOST:PORT, checked
    secret = client_secret(secret_file)
    sync = None if role is None else role == "sync"
    try:
        result = trio.run(lambda: run_switchover(master_address, slave_address, secret=secret, tls_ca=tls_ca,
                                                 timeout_seconds=timeout_seconds, sync=sync))  # fmt: skip
    except SwitchoverError as error:
        raise CommandError(str(error), EXIT_FAILED) from None
    promoted = result.promoted
    click.echo(f"{slave_address}: {promoted['role']} epoch {promoted['epoch']} from offset {promoted['max_offset']} "
               f"(writes paused {result.fenced_seconds} s, {result.wait_seconds} s of it for the slave's last bytes)")  # fmt: skip
    click.echo(f"{master_address}: SLAVE of {result.demoted.get('master_ha')}"
               + ("" if result.rejoined else f" (it did not report within {timeout_seconds} s: the new master takes writes without it)"))
