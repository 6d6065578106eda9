"""``hasvc send/read/promote/demote/transfer-leader/status``: one client call against a running broker."""

from __future__ import annotations

import json
import sys

import click

from hasvc.cli.common import client_secret, record_json, secret_option, tls_option


def _client_call(address, secret_file, tls_ca, body):
    """Run ``body(client)`` against ADDRESS; ClientError becomes a clean exit."""
    import trio

    from hasvc import transport
    from hasvc.client import ClientError, connect

    async def run():
        async with connect(address, client_secret(secret_file), tls_ca=tls_ca) as client:
            return await body(client)

    try:
        return trio.run(run)
    except (ClientError, ValueError) as error:
        raise click.ClickException(str(error)) from None
    except BaseExceptionGroup as group:  # connect's nursery wraps what the body raised (strict groups)
        expected, rest = group.split((ClientError, ValueError))
        if expected is None or rest is not None:
            raise
        raise click.ClickException(transport.describe(expected)) from None


@click.command()
@click.argument("address")
@click.argument("body", required=False)
@click.option("--topic", required=True)
@click.option("--tag", default=None)
@click.option("--key", default=None)
@click.option("--queue", "queue_id", type=int, default=0, show_default=True)
@click.option("--file", "file_path", type=click.Path(dir_okay=False, exists=True), help="One message per line from a file.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@secret_option
@tls_option
def send(address, body, topic, tag, key, queue_id, file_path, as_json, secret_file, tls_ca) -> None:
    """Send BODY (or one message per line of stdin with BODY '-', or --file) to the broker at ADDRESS.

    Prints one line per message; exits 1 if any message was not PUT_OK.
    """
    if file_path:
        with open(file_path, "rb") as file:
            bodies = [line.rstrip(b"\n") for line in file]
    elif body == "-" or body is None:
        bodies = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    else:
        bodies = [body.encode()]

    async def run(client):
        return [await client.send(topic, item, tags=tag, keys=key, queue_id=queue_id) for item in bodies]

    results = _client_call(address, secret_file, tls_ca, run)
    for result in results:
        if as_json:
            click.echo(json.dumps({"status": result.status, "offset": result.offset, "queue_id": result.queue_id,
                                   "queue_offset": result.queue_offset, "reason": result.reason}))  # fmt: skip
        else:
            detail = f" ({result.reason})" if result.reason else ""
            click.echo(f"{result.status} offset={result.offset} queue={result.queue_id} queue_offset={result.queue_offset}{detail}")
    if any(not result.ok for result in results):
        sys.exit(1)


@click.command()
@click.argument("address")
@click.option("--topic", default=None)
@click.option("--queue", "queue_id", type=int, default=0, show_default=True)
@click.option("--from", "from_offset", type=int, default=0, show_default=True, help="Queue offset to start at.")
@click.option("--offset", "physical_offset", type=int, default=None, help="Read the one record at this physical offset.")
@click.option("--follow", is_flag=True, help="Keep reading new messages (Ctrl-C to stop).")
@click.option("--json", "as_json", is_flag=True)
@secret_option
@tls_option
def read(address, topic, queue_id, from_offset, physical_offset, follow, as_json, secret_file, tls_ca) -> None:
    """Read messages from a master or a slave: a topic's queue, or one record by physical offset."""
    import trio

    def show(record) -> None:
        if as_json:
            click.echo(json.dumps(record_json(record.physical_offset, record, True)))
        else:
            body = bytes(record.body).decode("utf-8", errors="replace")
            click.echo(f"{record.physical_offset} {record.topic}/{record.queue_id}#{record.queue_offset} tags={record.tags or '-'} {body}")

    if physical_offset is not None:
        record = _client_call(address, secret_file, tls_ca, lambda client: client.read_record(physical_offset))
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
        _client_call(address, secret_file, tls_ca, run)
    except KeyboardInterrupt:
        pass


@click.command()
@click.argument("address")
@click.option("--role", type=click.Choice(["sync", "async"]), default="sync", show_default=True)
@secret_option
@tls_option
def promote(address, role, secret_file, tls_ca) -> None:
    """Make the slave at ADDRESS a master: it stops replicating, opens a new epoch at its log's end
    (persisted before any write) and serves producers and slaves on its HA address."""
    data = _client_call(address, secret_file, tls_ca, lambda client: client.promote(sync=role == "sync"))
    click.echo(f"{data['role']} epoch {data['epoch']} from offset {data['max_offset']}, HA address {data['ha_listen']}")


@click.command()
@click.argument("address")
@click.option("--master-ha", required=True, help="The new master's HA address, HOST:PORT.")
@secret_option
@tls_option
def demote(address, master_ha, secret_file, tls_ca) -> None:
    """Make the master at ADDRESS a slave of MASTER_HA: it stops taking writes, cuts what its log
    has beyond the consistent point with the new master's history, and catches up."""
    data = _client_call(address, secret_file, tls_ca, lambda client: client.demote(master_ha))
    click.echo(f"{data['role']} of {data.get('master_ha')}")


@click.command()
@click.argument("address")
@click.option("--json", "as_json", is_flag=True)
@secret_option
@tls_option
def status(address, as_json, secret_file, tls_ca) -> None:
    """Role, offsets and replication state of the broker at ADDRESS."""
    data = _client_call(address, secret_file, tls_ca, lambda client: client.status())
    if as_json:
        click.echo(json.dumps(data))
        return
    if data.get("mode") == "dledger":
        _echo_dledger_status(data)
        return
    click.echo(f"role         {data['role']} (epoch {data['epoch']})")
    click.echo(f"listen       {data['listen']}   ha {data['ha_listen']}")
    click.echo(f"offsets      min {data['min_offset']}  max {data['max_offset']}  flushed {data['flushed_offset']}")
    if data["role"] == "SLAVE":
        state = "connected" if data["master_connected"] else "NOT connected (retrying)"
        click.echo(f"master       {data['master_ha']} {state}")
    for item in data["slaves"]:
        click.echo(f"slave        {item['address']} ack {item['ack_offset']} lag {item['lag_bytes']} B / "
                   f"{item['lag_seconds']} s since {item['connected_since']}")  # fmt: skip
    if not data["slaves"] and data["role"] != "SLAVE":
        click.echo("slaves       none connected")


def _echo_dledger_status(data: dict) -> None:
    """A DLedger member's STATUS: role and term, its log's indexes (the first moves up with
    retention), offsets, and on a leader each peer's progress."""
    click.echo(f"role         {data['role']} ({data['raft_role']}, term {data['term']}, leader {data['leader_id']})")
    click.echo(f"listen       {data['listen']}   raft {data['raft_listen']}")
    click.echo(f"log          entries [{data['ledger_begin_index']}, {data['ledger_end_index']}]  committed "
               f"{data['committed_index']}  flushed {data['flushed_index']}  retention keeps from "
               f"{data['retention_floor_index']}")  # fmt: skip
    click.echo(f"offsets      min {data['min_offset']}  max {data['max_offset']}  flushed {data['flushed_offset']}")
    for peer, item in sorted(data["peers"].items()):
        behind = ("  BEHIND THE LOG START: being reset to this leader's first entry (retention deleted what it needs)"
                  if item.get("behind_log_start") else "")  # fmt: skip
        click.echo(f"peer         {peer} match {item['match_index']} lag {item['lag_entries']} entries, last contact "
                   f"{item['last_contact_seconds']} s{behind}")  # fmt: skip


@click.command("transfer-leader")
@click.argument("address")
@click.option("--to", "target", required=True, help="The member id (of --peers) that should lead, e.g. n1.")
@click.option("--json", "as_json", is_flag=True, help="The outcome as one JSON object.")
@secret_option
@tls_option
def transfer_leader(address, target, as_json, secret_file, tls_ca) -> None:
    """Hand the leadership of a DLedger group to member --to (DLedger's LEADERSHIP_TRANSFER).

    ADDRESS is the client port of the current leader. It answers once --to leads a new term, or
    refuses naming why: it does not lead (naming the leader it knows), --to is not a member, --to
    is too far behind (its lag named; at most leadership_transfer_wait_index_max entries), or --to
    did not take over in time (within about 10 s). Exits 1 on refusal.
    """
    result = _client_call(address, secret_file, tls_ca, lambda client: client.transfer_leader(target))
    details = result.details
    if as_json:
        click.echo(json.dumps({"status": result.status, "reason": result.reason, **details}))
    elif result.ok:
        click.echo(f"{details.get('leader_id')} leads term {details.get('term')} (was {details.get('self_id')} in term "
                   f"{details.get('previous_term')}; {details.get('elapsed_seconds')} s)")  # fmt: skip
    else:
        click.echo(f"refused: {result.status}: {result.reason}", err=True)
    if not result.ok:
        sys.exit(1)
