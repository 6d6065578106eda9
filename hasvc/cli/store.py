"""``hasvc store …``: verify, dump and exercise a store directory (no broker, no trio)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile

import click

from commitlog.inspect import iter_records, verify
from commitlog.mapped_file import StoreError
from commitlog.record import CRC_FUNCTIONS, RecordError
from hasvc.cli.common import record_json


@click.group()
def store() -> None:
    """Inspect and exercise a store directory."""


@store.command("verify")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--crc", type=click.Choice(sorted(CRC_FUNCTIONS)), default="crc32c", show_default=True,
              help="Body checksum: crc32c for hasvc stores, crc32 for stores written by RocketMQ.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def store_verify(directory: str, crc: str, as_json: bool) -> None:
    """Check every record of DIRECTORY's commit log, read-only.

    Walks all segments and checks each record's size, magic, field lengths, PHYSICALOFFSET and
    body CRC. Prints the segments, offsets, record count, topics and the first corrupt offset
    with the reason. Exits 1 when the log is corrupt, 2 when it cannot be read at all. Never
    modifies the store; works on a folder holding only a copied commitlog/.
    """
    try:
        report = verify(directory, crc=crc)
    except StoreError as error:
        raise click.ClickException(str(error)) from None
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


@store.command("dump")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--from", "from_offset", type=int, default=None, help="Start at this physical offset (a record boundary).")
@click.option("--count", type=int, default=None, help="Print at most this many records.")
@click.option("--crc", type=click.Choice(sorted(CRC_FUNCTIONS)), default="crc32c", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, body in base64.")
def store_dump(directory: str, from_offset: int | None, count: int | None, crc: str, as_json: bool) -> None:
    """Print the records of DIRECTORY's commit log in order, read-only."""
    printed = 0
    try:
        for offset, record, crc_ok in iter_records(directory, from_offset=from_offset, crc=crc):
            if count is not None and printed >= count:
                break
            printed += 1
            if as_json:
                click.echo(json.dumps(record_json(offset, record, crc_ok)))
            else:
                body = bytes(record.body)
                preview = body[:40].decode("utf-8", errors="replace").encode("unicode_escape").decode()
                click.echo(
                    f"{offset:>12} size={record.size} topic={record.topic} queue={record.queue_id} "
                    f"qoffset={record.queue_offset} tags={record.tags or '-'} store_ts={record.store_timestamp} "
                    f"crc={'ok' if crc_ok else 'BAD'} body[{len(body)}]={preview!r}"
                )
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    except RecordError as error:
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
