"""``hasvc spark …``: the Spark jobs from the command line.

This module imports PySpark only inside the commands, so ``hasvc`` works without the ``spark``
extra and says what to install when a Spark command is used without it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zipfile

import click

from commitlog.record import CRC_FUNCTIONS

_CRC_CHOICES = [*sorted(CRC_FUNCTIONS), "none"]


def _spark_module():
    try:
        from hasvc import spark as hs
    except ImportError as error:
        raise click.ClickException(
            f"the Spark pipeline needs PySpark, pyarrow and numpy ({error}); install them with: pip install -e '.[spark]'"
        ) from None
    return hs


def _session(master: str | None, conf: tuple[str, ...]):
    """Under spark-submit (it sets PYSPARK_GATEWAY_PORT) the master is spark-submit's unless given."""
    hs = _spark_module()
    if master is None and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        master = "local[*]"
    settings = {}
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"--conf takes KEY=VALUE, not {item!r}")
        settings[key] = value
    return hs, hs.session(master, conf=settings)


def _common(function):
    function = click.option("--master", default=None,
                            help="Spark master URL: local[*] (default), local[N], spark://HOST:PORT; under "
                                 "spark-submit, spark-submit's.")(function)  # fmt: skip
    function = click.option("--conf", multiple=True, metavar="KEY=VALUE", help="A Spark setting (repeatable).")(function)
    function = click.option("--crc", type=click.Choice(_CRC_CHOICES), default="crc32c", show_default=True,
                            help="Body checksum: crc32c for hasvc stores, crc32 for RocketMQ's, none to skip.")(function)  # fmt: skip
    return function


def _filters(function):
    function = click.option("--from-offset", type=int, default=None, help="Only records at or after this offset.")(function)
    function = click.option("--to-offset", type=int, default=None, help="Only records before this offset.")(function)
    function = click.option("--topics", default=None, help="Comma-separated topics to keep.")(function)
    return function


@click.group()
def spark() -> None:
    """Read commit logs with Spark: export, statistics, replica audit.

    Needs `pip install -e '.[spark]'` and Java 17+. Runs in local[*] by default; give
    --master spark://HOST:PORT for a cluster (executors need numpy, pyarrow, crc32c and this
    package: ship it with `hasvc spark pyfiles`), or run scripts/spark_*.py under spark-submit.
    """


@spark.command("export")
@click.argument("stores", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.argument("out", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["parquet", "json"]), default="parquet", show_default=True)
@click.option("--partition-by", default="", help="Comma-separated: topic, date (UTC day of store_ts).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option("--no-body", is_flag=True, help="Leave the body column out.")
@_filters
@_common
def spark_export(stores, out, fmt, partition_by, overwrite, no_body, from_offset, to_offset, topics, master, conf, crc):
    """Write the records of STORES... to OUT as Parquet or JSON lines."""
    hs, session = _session(master, conf)
    started = time.monotonic()
    columns = [c.strip() for c in partition_by.split(",") if c.strip()]
    try:
        hs.export(session, list(stores), out, format=fmt, partition_by=columns, mode="overwrite" if overwrite else "errorifexists",
                  crc=crc, include_body=not no_body, from_offset=from_offset, to_offset=to_offset, topics=topics)  # fmt: skip
    except (ValueError, hs.OptionError) as error:
        raise click.ClickException(str(error)) from None
    elapsed = time.monotonic() - started
    written = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(out) for f in files if not f.startswith((".", "_")))
    rows = session.read.parquet(out).count() if fmt == "parquet" else None
    click.echo(f"exported {rows if rows is not None else '?'} records to {out} ({fmt}, {written / 1e6:.1f} MB) in {elapsed:.1f} s")


@spark.command("stats")
@click.argument("stores", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--by", type=click.Choice(["topic,minute", "topic", "minute"]), default="topic,minute", show_default=True)
@click.option("--out", type=click.Path(), default=None, help="Also write the table here as Parquet.")
@click.option("--rows", type=int, default=50, show_default=True, help="Rows to print.")
@_filters
@_common
def spark_stats(stores, by, out, rows, from_offset, to_offset, topics, master, conf, crc):
    """Messages, bytes, body sizes, producer hosts and store latency per topic and minute."""
    hs, session = _session(master, conf)
    table = hs.stats(session, list(stores), by=by.split(","), crc=crc, from_offset=from_offset, to_offset=to_offset, topics=topics)
    if out:
        table.write.mode("overwrite").parquet(out)
        click.echo(f"written to {out}")
    table.show(rows, truncate=False)


@spark.command("segments")
@click.argument("stores", nargs=-1, required=True, type=click.Path(file_okay=False))
@_common
def spark_segments(stores, master, conf, crc):
    """One row per segment range: records, where decoding stopped and why (torn tails show here)."""
    hs, session = _session(master, conf)
    hs.segments(session, list(stores)).orderBy("store", "file_from_offset", "range_start").show(1000, truncate=False)


@spark.command("audit")
@click.argument("master_store", type=click.Path(file_okay=False))
@click.argument("slave_store", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@_common
def spark_audit(master_store, slave_store, as_json, master, conf, crc):
    """Compare SLAVE_STORE with MASTER_STORE record by record.

    Exits 1 when the slave diverges below its own max offset (missing, extra or differing
    records), 0 when it is a prefix of the master (records past its end are replication lag).
    """
    hs, session = _session(master, conf)
    started = time.monotonic()
    try:
        report = hs.audit(session, master_store, slave_store, crc=crc)
    except hs.OptionError as error:
        raise click.ClickException(str(error)) from None
    elapsed = time.monotonic() - started
    if as_json:
        click.echo(json.dumps(report.as_json()))
    else:
        click.echo(f"master      {report.master}: {report.master_records} records, end {report.master_end}")
        click.echo(f"slave       {report.slave}: {report.slave_records} records, end {report.slave_end}")
        click.echo(f"compared    {report.compared} records at offsets below the slave's end")
        click.echo(f"lag         {report.not_yet_replicated} records ({report.not_yet_replicated_bytes} bytes) not yet on the slave")
        for item in report.ranges:
            click.echo(f"{item.kind:<11} [{item.start}, {item.end})  {item.records} records")
        for segment in report.unclean_segments:
            click.echo(f"unclean     {segment['store']}/{segment['segment']}: stops at {segment['valid_end']}: {segment['stop_reason']}")
        verdict = f"DIVERGED at offset {report.first_divergence}" if report.diverged else "slave is a prefix of the master"
        click.echo(f"result      {verdict} ({elapsed:.1f} s)")
    if report.diverged:
        sys.exit(1)


@spark.command("pyfiles")
@click.argument("out", type=click.Path(dir_okay=False))
def spark_pyfiles(out):
    """Zip the pure-Python packages (commitlog, hasvc) for spark-submit --py-files.

    The executors of a real cluster also need numpy, pyarrow and crc32c installed; the optional
    native module is left out (a zip cannot load it), so they use the pure-Python paths.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above hasvc/cli/
    count = 0
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in ("commitlog", "hasvc"):
            for directory, _, files in os.walk(os.path.join(root, package)):
                for name in files:
                    if name.endswith((".py", ".properties")):
                        path = os.path.join(directory, name)
                        archive.write(path, os.path.relpath(path, root))
                        count += 1
    click.echo(f"wrote {out}: {count} files; use: spark-submit --py-files {out} scripts/spark_stats.py STORE")
