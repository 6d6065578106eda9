"""``hasvc bench …``: the benchmarks in hasvc.tools.bench (imported when run)."""

from __future__ import annotations

import click

from hasvc.cli.common import client_secret, secret_option


@click.group()
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
    from hasvc.tools.bench.store import bench_append as run
    from hasvc.tools.bench.store import write_json

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
    from hasvc.tools.bench.store import bench_recover as run
    from hasvc.tools.bench.store import write_json

    data = run(size_mb=size_mb, body_size=body_size, runs=runs, segment_size=segment_size_mb * 1024 * 1024,
               echo=click.echo)  # fmt: skip
    write_json(json_path, data)


@bench.command("read")
@click.option("--size-gib", type=float, default=0.5, show_default=True, help="Log size to read (1 KiB records, 8 queues).")
@click.option("--segment-mib", type=int, default=64, show_default=True)
@click.option("--count-max", type=int, default=32, show_default=True, help="Records per PULL (hasvc read asks 256).")
@click.option("--run-records", type=int, default=1, show_default=True,
              help="Records written to one queue before the next (1: no two records of a PULL adjacent, the check's worst case).")
@click.option("--pairs", type=int, default=3, show_default=True, help="Check on/off pairs, alternating which goes first.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Build (or reuse) the store here instead of a temporary directory.")
@click.option("--keep", is_flag=True, help="Keep the temporary directory.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the results here.")
def bench_read(size_gib, segment_mib, count_max, run_records, pairs, directory, keep, json_path) -> None:
    """What check_crc_on_read costs the read path: PULLs with the check on and off, in the store and from a broker."""
    from hasvc.tools.bench.read import bench_read as run
    from hasvc.tools.bench.store import write_json

    write_json(json_path, run(size_gib=size_gib, segment_mib=segment_mib, count_max=count_max, run_records=run_records,
                              pairs=pairs, directory=directory, keep=keep, echo=click.echo))  # fmt: skip


@bench.command("sync-write")
@click.option("--producers", type=int, default=64, show_default=True, help="Concurrent producers, one request in flight each.")
@click.option("--connections", type=int, default=1, show_default=True, help="Connections the producers share.")
@click.option("--size", type=int, default=1024, show_default=True, help="Body size in bytes.")
@click.option("--batch", type=int, default=1, show_default=True, help="Messages per request.")
@click.option("--duration", type=float, default=5.0, show_default=True, help="Seconds per run.")
@click.option("--runs", type=int, default=3, show_default=True)
@click.option("--role", type=click.Choice(["sync", "async"]), default="sync", show_default=True)
@click.option("--mode", type=click.Choice(["classic", "dledger", "controller"]), default="classic", show_default=True,
              help="classic: a master + slave (--role); dledger: a Raft group of --nodes `hasvc node`s, etcd-like timing; "
                   "controller: one `hasvc controller` and two `hasvc broker --controllers`, the elected master "
                   "SYNC_MASTER against its SyncStateSet (run it alternately with classic to compare).")
@click.option("--nodes", type=click.Choice(["3", "5"]), default="3", show_default=True, help="dledger: group size.")
@click.option("--flush", type=click.Choice(["sync", "async"]), default="async", show_default=True,
              help="classic: the master's flush; dledger: sync = a quorum fsyncs an entry before it counts (etcd's promise).")
@click.option("--slave-flush-before-ack", is_flag=True, help="The slave fsyncs before acknowledging.")
@click.option("--master", default=None, help="Target a running master instead of starting a local pair.")
@secret_option
@click.option("--load-generator", type=click.Choice(["auto", "c", "python"]), default="auto", show_default=True,
              help="c: scripts/hasvc_load.c, built on first use (no secret support); python: hasvc.client; "
                   "auto: c when a compiler is there and no secret is given.")
@click.option("--page-cache-keep-mib", type=int, default=256, show_default=True,
              help="Local brokers drop flushed log pages more than this far behind from the page cache "
                   "(page_cache_keep_size, as scripts/bench_peers sets it); 0: keep everything (the store's default).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the results here.")
def bench_sync_write(producers, connections, size, batch, duration, runs, role, mode, nodes, flush, slave_flush_before_ack,
                     master, secret_file, load_generator, page_cache_keep_mib, json_path) -> None:  # fmt: skip
    """Acknowledged writes per second, MB/s and latency percentiles against a master + slave."""
    from hasvc.tools.bench.store import write_json
    from hasvc.tools.bench.sync_write import bench_sync_write as run

    if mode == "controller" and (role != "sync" or master is not None):
        raise click.UsageError("--mode controller starts its own pair, SYNC_MASTER: no --role async, no --master")
    data = run(producers=producers, connections=connections, size=size, batch=batch, duration=duration, runs=runs,
               role=mode if mode != "classic" else role, nodes=int(nodes), flush=flush, master=master, slave_flush_before_ack=slave_flush_before_ack,
               secret=client_secret(secret_file), load_generator=load_generator,
               page_cache_keep_size=page_cache_keep_mib * 1024 * 1024, echo=click.echo)  # fmt: skip
    write_json(json_path, data)


@bench.command("catch-up")
@click.option("--size-gib", type=float, default=2.0, show_default=True, help="Master log size the slave copies.")
@click.option("--runs", type=int, default=3, show_default=True)
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Build (or reuse) the master's store here instead of a temporary directory.")
@click.option("--keep", is_flag=True, help="Keep the temporary directory.")
@click.option("--cold", is_flag=True, help="Drop the master's log from the page cache before each catch-up.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the results here.")
def bench_catch_up(size_gib, runs, directory, keep, cold, json_path) -> None:
    """MB/s of a new slave copying a master's whole log, beside raw loopback TCP (send, sendfile)."""
    from hasvc.tools.bench.catch_up import bench_catch_up as run
    from hasvc.tools.bench.store import write_json

    write_json(json_path, run(size_gib=size_gib, runs=runs, directory=directory, keep=keep, cold=cold, echo=click.echo))


@bench.command("spark-read")
@click.option("--size-gib", type=float, default=2.0, show_default=True, help="Log size to read.")
@click.option("--segment-mib", type=int, default=64, show_default=True,
              help="Segment size (binaryFile needs small files; hasvc reads 1 GiB segments too).")
@click.option("--runs", type=int, default=3, show_default=True)
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Build (or reuse) the store here instead of a temporary directory.")
@click.option("--keep", is_flag=True, help="Keep the temporary directory.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the results here.")
def bench_spark_read(size_gib, segment_mib, runs, master, directory, keep, json_path) -> None:
    """Rows/s and MB/s reading a store with Spark: the hasvc data source vs binaryFile + mapInArrow."""
    from hasvc.tools.bench.spark_read import bench_spark_read as run
    from hasvc.tools.bench.store import write_json

    write_json(json_path, run(size_gib=size_gib, segment_mib=segment_mib, runs=runs, master=master,
                              directory=directory, keep=keep, echo=click.echo))  # fmt: skip
