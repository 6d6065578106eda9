"""``hasvc store …``: verify, dump and exercise a store directory (no broker, no trio).

``--member ID`` reads a DLedger member's store (``hasvc node --store DIR --self ID``): the classic
log below the smooth-upgrade divide (``DIR/commitlog/``, when there is one) and the member's
DLedger files (``DIR/dledger-ID/``), through ``commitlog.dledger.message_inspect``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile

import click

from commitlog.inspect import check_consume_queues, iter_records, verify
from commitlog.mapped_file import StoreError
from commitlog.record import CRC_FUNCTIONS, RecordError
from hasvc.cli.common import EXIT_USAGE, CommandError, client_secret, record_json, secret_option, tls_option


@click.group()
def store() -> None:
    """Inspect and exercise a store directory."""


member_option = click.option(
    "--member", "member", default=None, metavar="ID",
    help="A DLedger member's store (hasvc node --self ID): DIR/commitlog/ below the divide and DIR/dledger-ID/.",
)  # fmt: skip


def _members(directory: str) -> list[str]:
    return sorted(os.path.basename(path)[len("dledger-") :] for path in glob.glob(os.path.join(directory, "dledger-*")))


def _check_member(directory: str, member: str | None) -> dict:
    """A clear error for a member that has no files here, or a member store read without --member;
    also when ``STORE/identity`` says the store is another's. Returns what to report of the
    store's identity (``_identity_json``)."""
    identity = _identity_json(directory, member)
    members = _members(directory)
    if member is None:
        if members and not os.path.isdir(os.path.join(directory, "commitlog")):
            raise CommandError(f"{directory} is a DLedger member's store: give --member ({', '.join(members)})", EXIT_USAGE)
    elif member not in members:
        found = f"members here: {', '.join(members)}" if members else "no dledger-* directory here"
        raise CommandError(f"{directory}/dledger-{member}: no such directory ({found})", EXIT_USAGE)
    return identity


def _identity_json(directory: str, member: str | None) -> dict:
    """``{"identity": marker or None, "inferred": what the files say when there is no marker}``;
    ClickException (one line) when the marker cannot be read or names another kind or member."""
    from commitlog import identity as store_identity

    try:
        found = store_identity.read_identity(directory)
        if found is None:
            inferred = store_identity.infer(directory)
            kind = inferred.kind.value if inferred.kind is not None else None
            said = {"kind": kind, "member": inferred.member, "ambiguous": inferred.ambiguous}
            return {"identity": None, "inferred": said}
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    path = store_identity.identity_path(directory)
    if found.kind is store_identity.StoreKind.CLASSIC and member is not None:
        raise click.ClickException(f"{path}: {found.describe()}, not a DLedger member's: read it without --member")
    if found.kind is store_identity.StoreKind.DLEDGER and member != found.member:
        given = f"not member {member}'s" if member is not None else "a DLedger member's"
        raise click.ClickException(f"{path}: {found.describe()}, {given}: give --member {found.member}")
    return {"identity": found.to_json(), "inferred": None}


def _identity_line(identity: dict) -> str:
    """The ``identity`` line of ``verify``'s text output."""
    import datetime

    def when(ms: int) -> str:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    found = identity["identity"]
    if found is None:
        inferred = identity["inferred"]
        if inferred["ambiguous"] is not None:
            return f"none, and AMBIGUOUS: the files hold {inferred['ambiguous']}"
        said = {None: "an empty store", "classic": "a classic broker's"}.get(
            inferred["kind"], f"DLedger member {inferred['member']}'s"
        )
        return f"none (a store from before identity markers; its files say {said}; the next open writes it)"
    parts = [f"kind {found['kind']}"]
    parts += [f"member {found['member']}"] if found["member"] is not None else []
    parts += [f"group {found['group']}"] if found["group"] is not None else []
    parts += [f"store id {found['store_id']}", f"created {when(found['created_ms'])}"]
    parts += [f"upgraded from classic {when(found['upgraded_ms'])}"] if found["upgraded_ms"] is not None else []
    return ", ".join(parts)


def _ambiguous(identity: dict) -> bool:
    return identity["identity"] is None and identity["inferred"]["ambiguous"] is not None


@store.command("verify")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--crc", type=click.Choice(sorted(CRC_FUNCTIONS)), default="crc32c", show_default=True,
              help="Body checksum: crc32c for hasvc stores, crc32 for stores written by RocketMQ.")
@member_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def store_verify(directory: str, crc: str, member: str | None, as_json: bool) -> None:
    """Check every record of DIRECTORY's commit log, read-only.

    Walks all segments and checks each record's size, magic, field lengths, PHYSICALOFFSET and
    body CRC. Prints the segments, offsets, record count, topics and the first corrupt offset
    with the reason. The consume queues are compared with a rebuild from the log (what a full
    dispatch builds): the first differing unit of a queue (queue, index, both values), and a
    queue offset two records of the log hold; units not dispatched yet are counted, not an
    error. Exits 1 when the log or a queue is corrupt, 2 when it cannot be read at all. Never
    modifies the store; works on a folder holding only a copied commitlog/.

    With --member ID: a DLedger member's store. Both parts are checked (the classic log below
    the divide, if any, and every DLedger entry: header, index unit, and a body that is one record
    at the entry's pos + 48); entries are listed whether committed or not, with the checkpoint's
    committed index.
    """
    identity = _check_member(directory, member)
    if member is not None:
        _verify_member(directory, member, crc, as_json, identity)
        return
    try:
        report = verify(directory, crc=crc)
        queues = check_consume_queues(directory)
    except StoreError as error:
        raise CommandError(str(error), EXIT_USAGE) from None  # cannot be read at all: 2
    if as_json:
        click.echo(json.dumps({**report.as_json(), "consume_queues": queues.to_json(), **identity}))
    else:
        click.echo(f"store        {report.path}")
        click.echo(f"identity     {_identity_line(identity)}")
        click.echo(f"segments     {report.segments} x {report.segment_size} bytes")
        click.echo(f"offsets      [{report.min_offset}, {report.max_offset})")
        click.echo(f"records      {report.records}")
        click.echo(f"topics       {', '.join(f'{t}={n}' for t, n in sorted(report.topics.items())) or '-'}")
        click.echo(f"queues       {_queues_line(queues)}")
        if _ambiguous(identity):
            click.echo("status       CORRUPT: the store holds both kinds of log (see identity)")
        elif report.corrupt_offset is not None:
            click.echo(f"status       CORRUPT at offset {report.corrupt_offset}: {report.reason}")
        elif not queues.ok:
            click.echo(f"status       CORRUPT: the consume queues differ from the log: {queues.describe()}")
        else:
            click.echo("status       clean")
    if report.corrupt_offset is not None or _ambiguous(identity) or not queues.ok:
        sys.exit(1)


def _queues_line(queues) -> str:
    """The ``queues`` line of ``verify``'s text output: the consume queues against a rebuild from the log."""
    if not queues.ok:
        return f"DIFFER from a rebuild from the log: {queues.describe()}"
    behind = f", {queues.behind} not dispatched yet (built when the store opens)" if queues.behind else ""
    return f"{queues.queues} queue(s), {queues.units} unit(s) match a rebuild from the log{behind}"


def _verify_member(directory: str, member: str, crc: str, as_json: bool, identity: dict) -> None:
    from commitlog.dledger.message_inspect import verify_member

    try:
        report = verify_member(directory, member, crc=crc)
    except StoreError as error:
        raise CommandError(str(error), EXIT_USAGE) from None
    if as_json:
        click.echo(json.dumps({**report.as_json(), **identity}))
    else:
        click.echo(f"store        {report.path} (member {member})")
        click.echo(f"identity     {_identity_line(identity)}")
        if report.divided_offset >= 0:
            click.echo(f"divide       classic below offset {report.divided_offset}, DLedger from it")
        classic, dledger = report.classic, report.dledger
        if classic is not None:
            click.echo(f"classic      {classic.segments} x {classic.segment_size} bytes, offsets [{classic.min_offset}, "
                       f"{classic.max_offset}), {classic.records} records"
                       + (f", CORRUPT at {classic.corrupt_offset}: {classic.reason}" if classic.corrupt_offset is not None else ""))  # fmt: skip
        if dledger is None:
            click.echo("dledger      no data files" + _empty_log_start(directory, member))
        else:
            committed = (dledger.checkpoint or {}).get("committedIndex", "-")
            click.echo(f"dledger      {dledger.data_files} data files x {dledger.data_file_size} bytes, offsets "
                       f"[{dledger.start_offset}, {dledger.end_offset})")  # fmt: skip
            click.echo(f"entries      {dledger.entries} (index {dledger.first_index}..{dledger.last_index}, last term "
                       f"{dledger.last_term}), {report.dledger_messages} messages, {report.dledger_noops} no-ops; "
                       f"checkpoint committedIndex {committed}")  # fmt: skip
            if dledger.corrupt_offset is not None:
                click.echo(f"dledger      CORRUPT at offset {dledger.corrupt_offset}: {dledger.reason}")
            if report.bad_message_offset is not None:
                click.echo(f"message      BAD at offset {report.bad_message_offset}: {report.bad_message_reason}")
        if report.overlap is not None:
            click.echo(f"overlap      CORRUPT: {report.overlap}")
        click.echo(f"status       {'clean' if report.ok and not _ambiguous(identity) else 'CORRUPT'}")
    if not report.ok or _ambiguous(identity):
        sys.exit(1)


def _empty_log_start(store_root: str, member: str) -> str:
    """For a member with no data files: where its checkpoint says the empty log starts (a RESET,
    or a deletion, records it), or nothing."""
    import os

    from commitlog.dledger import state_files
    from commitlog.dledger.upgrade import dledger_directory

    path = os.path.join(dledger_directory(store_root, member), state_files.CHECKPOINT_FILE)
    checkpoint = state_files.read_properties(path) if os.path.exists(path) else None
    if not checkpoint or "beginIndex" not in checkpoint:
        return ""
    return (f": the log is empty and starts at entry {checkpoint['beginIndex']} (offset {checkpoint.get('beginPos', '?')}, "
            f"the term before it {checkpoint.get('beginTerm', '?')}) by its checkpoint; "
            f"committedIndex {checkpoint.get('committedIndex', '-')}")  # fmt: skip


@store.command("dump")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--from", "from_offset", type=int, default=None, help="Start at this physical offset (a record boundary).")
@click.option("--count", type=int, default=None, help="Print at most this many records.")
@click.option("--crc", type=click.Choice(sorted(CRC_FUNCTIONS)), default="crc32c", show_default=True)
@member_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, body in base64.")
def store_dump(directory: str, from_offset: int | None, count: int | None, crc: str, member: str | None, as_json: bool) -> None:  # fmt: skip
    """Print the records of DIRECTORY's commit log in order, read-only.

    With --member ID: a DLedger member's messages in offset order, the classic part's below the
    divide, then one per DLedger entry (no-op entries skipped, uncommitted ones included); each
    line says its part, and for DLedger its entry index and term (--json: "part": "classic" or
    "dledger", "index", "term").
    """
    _check_member(directory, member)
    if member is not None:
        _dump_member(directory, member, from_offset, count, crc, as_json)
        return
    printed = 0
    try:
        for offset, record, crc_ok in iter_records(directory, from_offset=from_offset, crc=crc):
            if count is not None and printed >= count:
                break
            printed += 1
            if as_json:
                click.echo(json.dumps(record_json(offset, record, crc_ok)))
            else:
                _print_record(offset, record, crc_ok)
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    except RecordError as error:
        raise click.ClickException(f"stopped: {error}") from None


def _print_record(offset: int, record, crc_ok: bool, prefix: str = "") -> None:
    body = bytes(record.body)
    preview = body[:40].decode("utf-8", errors="replace").encode("unicode_escape").decode()
    click.echo(
        f"{offset:>12} {prefix}size={record.size} topic={record.topic} queue={record.queue_id} "
        f"qoffset={record.queue_offset} tags={record.tags or '-'} store_ts={record.store_timestamp} "
        f"crc={'ok' if crc_ok else 'BAD'} body[{len(body)}]={preview!r}"
    )


def _dump_member(directory: str, member: str, from_offset: int | None, count: int | None, crc: str, as_json: bool) -> None:  # fmt: skip
    from commitlog.dledger.entry_codec import EntryFormatError
    from commitlog.dledger.message_inspect import iter_messages

    printed = 0
    try:
        for message in iter_messages(directory, member, from_offset=from_offset, crc=crc):
            if count is not None and printed >= count:
                break
            printed += 1
            if as_json:
                fields = {"part": message.part.value, "index": message.index, "term": message.term}
                click.echo(json.dumps({**record_json(message.offset, message.record, message.crc_ok), **fields}))
            else:
                where = message.part.value if message.index is None else f"dledger#{message.index}@{message.term}"
                _print_record(message.offset, message.record, message.crc_ok, f"{where} ")
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    except (RecordError, EntryFormatError) as error:
        raise click.ClickException(f"stopped: {error}") from None


@store.command("repair")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.option("--from", "peer", default=None, metavar="HOST:PORT",
              help="A broker (the master or a slave, its client port) that holds the damaged bytes: they are fetched from it.")
@click.option("--accept-loss", is_flag=True, help="Cut the log at the first damaged record, dropping it and everything after it.")
@click.option("--crc", type=click.Choice(sorted(CRC_FUNCTIONS)), default="crc32c", show_default=True)
@member_option
@secret_option
@tls_option
def store_repair(directory: str, peer: str | None, accept_loss: bool, crc: str, member: str | None, secret_file, tls_ca) -> None:  # fmt: skip
    """Repair a store that refuses to open because its log is damaged.

    The broker must be stopped. Every segment is checked (size, magic, fields, PHYSICALOFFSET,
    body CRC). With --from HOST:PORT each damaged range (from the invalid record to the next valid
    one) is read from that broker with READ, checked to be whole valid records that fill the range
    exactly, written over the range and fsynced: the logs of a master and its slaves are
    byte-identical. Nothing is written unless the fetched bytes check. With --accept-loss the log
    is cut at the first damaged record, as recovery did before it told damage from a torn tail;
    the line printed says how much was dropped. Exits 1 when the repair could not be done.

    With --member ID: a DLedger member's store (the node stopped), when its recovery refuses to
    start. With --from HOST:PORT (a live member's client port) each entry recovery would cut is
    read from that member (READ serves its committed data bytes; the members' data files are
    byte-identical), checked (a whole entry, bodyCrc, with this index and pos, and the term and
    size this store's header or index unit still say) and written over the damaged bytes, until
    recovery finds no damage. With --accept-loss the log ends at its last good entry, as
    recovery_accept_lost_entries=true does (no catch-up mark: the member may then vote with its
    shorter log, as DLedger's own recovery lets it).
    """
    from commitlog import repair

    if (peer is None) == (not accept_loss):
        raise click.UsageError("give one of --from HOST:PORT or --accept-loss")
    _check_member(directory, member)
    if member is not None:
        _repair_member(directory, member, peer, secret_file, tls_ca)
        return
    try:
        if accept_loss:
            loss = repair.accept_loss(directory, crc=crc)
            if loss.cut_offset < 0:
                click.echo(f"{directory}: no damage found; nothing cut")
            else:
                click.echo(f"{directory}: cut the log at offset {loss.cut_offset} ({loss.damaged[0].describe()}): "
                           f"dropped {loss.dropped_bytes} bytes, the damaged records and {loss.dropped_records} "
                           f"valid records after them")  # fmt: skip
                click.echo(f"{directory}: it starts as a slave from now on (a replica may hold more of its epoch: promote "
                           f"the one that holds the most); to serve from it as master, remove {directory}/{repair.LOSS_MARKER}")  # fmt: skip
            return
        report = _repair_from(directory, peer, crc, secret_file, tls_ca)
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    _echo_repaired(directory, peer, report.repaired, "damaged ranges",
                   f"{report.bytes_written} bytes, {report.records_written} records")  # fmt: skip


def _echo_repaired(where: str, peer: str, repaired, what: str, written: str) -> None:
    """A repair from ``peer``'s report: nothing found, or what was rewritten (``repaired``, each
    with ``describe()``) and how much (``written``) was checked and written."""
    if not repaired:
        click.echo(f"{where}: no damage found; nothing written")
    else:
        click.echo(f"{where}: repaired {len(repaired)} {what} from {peer} ({written} checked and written): "
                   + "; ".join(damage.describe() for damage in repaired))  # fmt: skip


def _repair_member(directory: str, member: str, peer: str | None, secret_file, tls_ca) -> None:
    from commitlog.dledger import member_repair

    try:
        if peer is None:
            loss = member_repair.accept_member_loss(directory, member)
            if not loss.damaged:
                click.echo(f"{directory} (member {member}): no damage found; nothing cut")
            else:
                click.echo(f"{directory} (member {member}): the log now ends at entry {loss.last_index}, "
                           f"{loss.lost_entries} entries it knew flushed are gone: "
                           + "; ".join(damage.describe() for damage in loss.damaged))  # fmt: skip
            return
        report = _with_peer(peer, secret_file, tls_ca, lambda fetch: member_repair.repair_member_from(directory, member, fetch))
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    _echo_repaired(f"{directory} (member {member})", peer, report.repaired, "entries", f"{report.bytes_written} bytes")


def _repair_from(directory: str, peer: str, crc: str, secret_file, tls_ca):
    from commitlog import repair

    return _with_peer(peer, secret_file, tls_ca, lambda fetch: repair.repair_from(directory, fetch, crc=crc))


def _with_peer(peer: str, secret_file, tls_ca, repair_with):
    """``repair_with(fetch)`` where ``fetch(offset, size_max)`` READs the log bytes of ``peer``
    (b"" where its log ends)."""
    from hasvc.client.blocking import BlockingClient
    from hasvc.client.results import ClientError
    from hasvc.protocol import client as cp

    try:
        client = BlockingClient(peer, client_secret(secret_file), tls_ca=tls_ca)
    except (OSError, ClientError, ValueError) as error:
        raise click.ClickException(f"cannot reach {peer}: {error}") from None

    def fetch(offset: int, size_max: int) -> bytes:
        try:
            return client.read(offset, size_max=size_max)
        except ClientError as error:
            if str(error).startswith(cp.OFFSET_ILLEGAL):
                return b""  # the peer's log ends before offset
            raise click.ClickException(f"{peer}: READ at offset {offset}: {error}") from None

    with client:
        return repair_with(fetch)


@store.command("demo")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Store directory (default: a new temporary one).")
@click.option("--messages", type=int, default=1_000_000, show_default=True)
@click.option("--body-size", type=int, default=128, show_default=True)
@click.option("--batch", type=int, default=32, show_default=True)
@click.option("--keep/--no-keep", default=False, help="Keep the store afterwards.")
def store_demo(directory: str | None, messages: int, body_size: int, batch: int, keep: bool) -> None:
    """Write a million messages, reopen, crash a SYNC_FLUSH writer with SIGKILL, recover, verify."""
    from hasvc.tools.store_demo import run_demo

    created = directory is None
    directory = directory or tempfile.mkdtemp(prefix="hasvc-demo-")
    try:
        ok = run_demo(directory, messages=messages, body_size=body_size, batch=batch, echo=click.echo)
    finally:
        if created and not keep:
            shutil.rmtree(directory, ignore_errors=True)
        elif keep or not created:
            click.echo(f"store kept at {directory}")
    click.echo("demo: OK" if ok else "demo: FAILED")
    if not ok:
        sys.exit(1)
