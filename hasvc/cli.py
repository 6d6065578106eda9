"""The ``hasvc`` command line."""

from __future__ import annotations

import base64
import json
import shutil
import sys
import tempfile

import click

from commitlog.inspect import iter_records, verify
from commitlog.mapped_file import StoreError
from commitlog.record import CRC_FUNCTIONS, RecordError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hasvc")
def main() -> None:
    """hasvc: a RocketMQ-format message commit log with master/slave replication.

    A store is a directory: commitlog/ (the message log, in RocketMQ's record format),
    consumequeue/ (per topic and queue, an index into the log), checkpoint, abort and lock.
    See docs/FORMAT.md for the bytes.
    """


# -- hasvc store -------------------------------------------------------------------------------


@main.group()
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
                click.echo(json.dumps(_record_json(offset, record, crc_ok)))
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


def _record_json(offset: int, record, crc_ok: bool) -> dict:
    return {
        "offset": offset,
        "size": record.size,
        "topic": record.topic,
        "queue_id": record.queue_id,
        "queue_offset": record.queue_offset,
        "flag": record.flag,
        "sysflag": record.sysflag,
        "properties": record.properties,
        "born_timestamp": record.born_timestamp,
        "born_host": f"{record.born_host[0]}:{record.born_host[1]}",
        "store_timestamp": record.store_timestamp,
        "store_host": f"{record.store_host[0]}:{record.store_host[1]}",
        "reconsume_times": record.reconsume_times,
        "body_crc": record.body_crc,
        "crc_ok": crc_ok,
        "body_base64": base64.b64encode(bytes(record.body)).decode(),
    }


@store.command("demo")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Store directory (default: a new temporary one).")
@click.option("--messages", type=int, default=1_000_000, show_default=True)
@click.option("--body-size", type=int, default=128, show_default=True)
@click.option("--batch", type=int, default=32, show_default=True)
@click.option("--keep/--no-keep", default=False, help="Keep the store afterwards.")
def store_demo(directory: str | None, messages: int, body_size: int, batch: int, keep: bool) -> None:
    """Write a million messages, reopen, crash a SYNC_FLUSH writer with SIGKILL, recover, verify."""
    from hasvc.store_demo import run_demo

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


# -- hasvc bench -------------------------------------------------------------------------------


@main.group()
def bench() -> None:
    """Benchmarks: medians of several runs, beside this machine's ceilings."""


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


@bench.command("append")
@click.option("--sizes", default="100,1024,16384", show_default=True, help="Body sizes in bytes.")
@click.option("--batch", "batches", default="1,32", show_default=True, help="Messages per append call.")
@click.option("--flush", "flushes", default="async,sync", show_default=True)
@click.option("--runs", type=int, default=3, show_default=True)
@click.option("--seconds", type=float, default=1.0, show_default=True, help="Length of one run.")
@click.option("--sync-producers", type=int, default=8, show_default=True,
              help="Producer threads under SYNC_FLUSH (group commit needs concurrency).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write results here.")
def bench_append(sizes, batches, flushes, runs, seconds, sync_producers, json_path) -> None:
    """Append throughput: msgs/s and MB/s per body size, batch and flush mode."""
    from hasvc.bench import bench_append as run, write_json

    data = run(
        sizes=_int_list(sizes), batches=_int_list(batches), flushes=flushes.split(","), runs=runs,
        seconds=seconds, sync_producers=sync_producers, echo=click.echo,
    )  # fmt: skip
    write_json(json_path, data)


@bench.command("recover")
@click.option("--size-mb", type=int, default=1024, show_default=True, help="Log size to scan.")
@click.option("--body-size", type=int, default=1024, show_default=True)
@click.option("--segment-size-mb", type=int, default=256, show_default=True)
@click.option("--runs", type=int, default=3, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None)
def bench_recover(size_mb, body_size, segment_size_mb, runs, json_path) -> None:
    """Recovery scan rate with CRC checks, native and pure-Python walks, beside raw crc32c."""
    from hasvc.bench import bench_recover as run, write_json

    data = run(size_mb=size_mb, body_size=body_size, runs=runs, segment_size=segment_size_mb * 1024 * 1024,
               echo=click.echo)  # fmt: skip
    write_json(json_path, data)


if __name__ == "__main__":  # pragma: no cover
    main()
