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

from commitlog.inspect import iter_records, verify
from commitlog.mapped_file import StoreError
from commitlog.record import CRC_FUNCTIONS, RecordError
from hasvc.cli.common import EXIT_USAGE, CommandError, record_json


@click.group()
def store() -> None:
    """Inspect and exercise a store directory."""


member_option = click.option(
    "--member", "member", default=None, metavar="ID",
    help="A DLedger member's store (hasvc node --self ID): DIR/commitlog/ below the divide and DIR/dledger-ID/.",
)  # fmt: skip


def _members(directory: str) -> list[str]:
    return sorted(os.path.basename(path)[len("dledger-") :] for path in glob.glob(os.path.join(directory, "dledger-*")))


def _check_member(directory: str, member: str | None) -> None:
    """A clear error for a member that has no files here, or a member store read without --member."""
    members = _members(directory)
    if member is None:
        if members and not os.path.isdir(os.path.join(directory, "commitlog")):
            raise CommandError(f"{directory} is a DLedger member's store: give --member ({', '.join(members)})", EXIT_USAGE)
    elif member not in members:
        found = f"members here: {', '.join(members)}" if members else "no dledger-* directory here"
        raise CommandError(f"{directory}/dledger-{member}: no such directory ({found})", EXIT_USAGE)


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
    with the reason. Exits 1 when the log is corrupt, 2 when it cannot be read at all. Never
    modifies the store; works on a folder holding only a copied commitlog/.

    With --member ID: a DLedger member's store. Both parts are checked (the classic log below
    the divide, if any, and every DLedger entry: header, index unit, and a body that is one record
    at the entry's pos + 48); entries are listed whether committed or not, with the checkpoint's
    committed index.
    """
    _check_member(directory, member)
    if member is not None:
        _verify_member(directory, member, crc, as_json)
        return
    try:
        report = verify(directory, crc=crc)
    except StoreError as error:
        raise CommandError(str(error), EXIT_USAGE) from None  # cannot be read at all: 2
    if as_json:
        click.echo(json.dumps(report.as_json()))
    else:
        click.echo(f"store        {report.path}")
        click.echo(f"segments     {report.segments} x {report.segment_size} bytes")
        click.echo(f"offsets      [{report.min_offset}, {report.max_offset})")
        click.echo(f"records      {report.records}")
        click.echo(f"topics       {', '.join(f'{t}={n}' for t, n in sorted(report.topics.items())) or '-'}")
        if report.corrupt_offset is None:
            click.echo("status       clean")
        else:
            click.echo(f"status       CORRUPT at offset {report.corrupt_offset}: {report.reason}")
    if report.corrupt_offset is not None:
        sys.exit(1)


def _verify_member(directory: str, member: str, crc: str, as_json: bool) -> None:
    from commitlog.dledger.message_inspect import verify_member

    try:
        report = verify_member(directory, member, crc=crc)
    except StoreError as error:
        raise CommandError(str(error), EXIT_USAGE) from None
    if as_json:
        click.echo(json.dumps(report.as_json()))
    else:
        click.echo(f"store        {report.path} (member {member})")
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
        click.echo(f"status       {'clean' if report.ok else 'CORRUPT'}")
    if not report.ok:
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
