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


# -- broker processes --------------------------------------------------------------------------


def _broker_options(function):
    options = [
        click.option("--store", "store_dir", type=click.Path(file_okay=False), help="Store directory."),
        click.option("--listen", help="Client port, HOST:PORT (port 0: any free port)."),
        click.option("--ha-listen", help="HA port, HOST:PORT (default: the listen port + 1)."),
        click.option("--flush", type=click.Choice(["sync", "async"]), help="SYNC_FLUSH (group commit) or ASYNC_FLUSH."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False, exists=True),
                     help="TOML file with a [broker] table of options (command-line options win)."),
        click.option("--secret-file", type=click.Path(dir_okay=False, exists=True),
                     help="Cluster secret for HMAC authentication of every connection (or HASVC_SECRET)."),
        click.option("--insecure", is_flag=True, default=None, help="Allow a non-loopback listen address without a secret."),
        click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True)),
        click.option("--tls-key", type=click.Path(dir_okay=False, exists=True)),
        click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), help="CA a slave uses to verify its master's certificate (with --tls-cert/--tls-key on every broker)."),
        click.option("--metrics-listen", help="Serve Prometheus metrics on HOST:PORT."),
        click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
                     help="Any other option by its config name, e.g. --set slave_timeout_ms=1000."),
    ]  # fmt: skip
    for option in reversed(options):
        function = option(function)
    return function


def _build_config(role_default, cli_values: dict, config_file, secret_file, settings):
    import dataclasses

    from hasvc.config import BrokerConfig, convert, load_toml, read_secret

    values = load_toml(config_file) if config_file else {}
    fields = {f.name: f for f in dataclasses.fields(BrokerConfig)}
    for setting in settings:
        name, separator, raw = setting.partition("=")
        if not separator or name not in fields:
            raise click.BadParameter(f"{setting!r}: expected NAME=VALUE with a known option name", param_hint="--set")
        values[name] = convert(name, _typed(raw, fields[name]))
    for name, value in cli_values.items():
        if value is not None:
            values[name] = convert(name, value)
    values.setdefault("role", convert("role", role_default))
    secret = read_secret(secret_file)
    if secret is not None:
        values["secret"] = secret
    if "store" not in values:
        raise click.UsageError("--store is required (or 'store' in the config file)")
    try:
        return BrokerConfig(**values).validate()
    except (TypeError, ValueError) as error:
        raise click.UsageError(str(error)) from None


def _typed(raw: str, field):
    kind = str(field.type)
    if "bool" in kind:
        return raw.lower() in ("1", "true", "yes", "on")
    if "int" in kind and raw.lstrip("-").isdigit():
        return int(raw)
    if "float" in kind:
        return float(raw)
    return raw


def _run_broker(config) -> None:
    import logging
    import signal

    import trio

    from hasvc.broker import Broker

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hasvc").info("effective configuration: %s", json.dumps(config.describe()))

    async def serve() -> None:
        broker = Broker(config)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                addresses = await nursery.start(broker.run)
                click.echo("READY " + json.dumps(addresses))
                sys.stdout.flush()
                async for signum in signals:
                    logging.getLogger("hasvc").info("%s: shutting down", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(serve)
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    except OSError as error:
        raise click.ClickException(f"cannot listen: {error}") from None


@main.command()
@_broker_options
@click.option("--role", type=click.Choice(["sync", "async"]), default=None,
              help="SYNC_MASTER (a put waits for a slave) or ASYNC_MASTER (default).")
def master(store_dir, listen, ha_listen, flush, config_file, secret_file, insecure, tls_cert, tls_key, tls_ca,
           metrics_listen, settings, role) -> None:  # fmt: skip
    """Run a master broker: takes writes, serves reads, replicates to slaves.

    Prints one line `READY {json}` on stdout when serving (with the actual ports), logs to stderr,
    and exits cleanly on SIGTERM/SIGINT (store flushed, abort file removed).
    """
    cli_values = dict(store=store_dir, listen=listen, ha_listen=ha_listen, flush=flush, insecure=insecure,
                      tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca, metrics_listen=metrics_listen, role=role)  # fmt: skip
    _run_broker(_build_config("ASYNC_MASTER", cli_values, config_file, secret_file, settings))


@main.command()
@_broker_options
@click.option("--master-ha", help="The master's HA address, HOST:PORT.")
def slave(store_dir, listen, ha_listen, flush, config_file, secret_file, insecure, tls_cert, tls_key, tls_ca,
          metrics_listen, settings, master_ha) -> None:  # fmt: skip
    """Run a slave broker: replicates the master's log byte for byte and serves reads.

    Sends are refused with SERVICE_NOT_AVAILABLE naming the master. --ha-listen is where it will
    serve slaves of its own once promoted (the failover issue).
    """
    cli_values = dict(store=store_dir, listen=listen, ha_listen=ha_listen, flush=flush, insecure=insecure,
                      tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca, metrics_listen=metrics_listen,
                      master_ha=master_ha)  # fmt: skip
    _run_broker(_build_config("SLAVE", cli_values, config_file, secret_file, settings))


# -- client commands ---------------------------------------------------------------------------


def _client_secret(secret_file):
    from hasvc.config import read_secret

    return read_secret(secret_file)


def _client_call(address, secret_file, tls_ca, body):
    """Run ``body(client)`` against ADDRESS; ClientError becomes a clean exit."""
    import trio

    from hasvc.client import ClientError, connect

    async def run():
        async with connect(address, _client_secret(secret_file), tls_ca=tls_ca) as client:
            return await body(client)

    try:
        return trio.run(run)
    except (ClientError, ValueError) as error:
        raise click.ClickException(str(error)) from None


_secret_option = click.option("--secret-file", type=click.Path(dir_okay=False, exists=True), help="Cluster secret (or HASVC_SECRET).")
_tls_option = click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), help="CA to verify a TLS broker.")


@main.command()
@click.argument("address")
@click.argument("body", required=False)
@click.option("--topic", required=True)
@click.option("--tag", default=None)
@click.option("--key", default=None)
@click.option("--queue", "queue_id", type=int, default=0, show_default=True)
@click.option("--file", "file_path", type=click.Path(dir_okay=False, exists=True), help="One message per line from a file.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@_secret_option
@_tls_option
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


@main.command()
@click.argument("address")
@click.option("--topic", default=None)
@click.option("--queue", "queue_id", type=int, default=0, show_default=True)
@click.option("--from", "from_offset", type=int, default=0, show_default=True, help="Queue offset to start at.")
@click.option("--offset", "physical_offset", type=int, default=None, help="Read the one record at this physical offset.")
@click.option("--follow", is_flag=True, help="Keep reading new messages (Ctrl-C to stop).")
@click.option("--json", "as_json", is_flag=True)
@_secret_option
@_tls_option
def read(address, topic, queue_id, from_offset, physical_offset, follow, as_json, secret_file, tls_ca) -> None:
    """Read messages from a master or a slave: a topic's queue, or one record by physical offset."""
    import trio

    def show(record) -> None:
        if as_json:
            click.echo(json.dumps(_record_json(record.physical_offset, record, True)))
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


@main.command()
@click.argument("address")
@click.option("--role", type=click.Choice(["sync", "async"]), default="sync", show_default=True)
@_secret_option
@_tls_option
def promote(address, role, secret_file, tls_ca) -> None:
    """Make the slave at ADDRESS a master: it stops replicating, opens a new epoch at its log's end
    (persisted before any write) and serves producers and slaves on its HA address."""
    data = _client_call(address, secret_file, tls_ca, lambda client: client.promote(sync=role == "sync"))
    click.echo(f"{data['role']} epoch {data['epoch']} from offset {data['max_offset']}, HA address {data['ha_listen']}")


@main.command()
@click.argument("address")
@click.option("--master-ha", required=True, help="The new master's HA address, HOST:PORT.")
@_secret_option
@_tls_option
def demote(address, master_ha, secret_file, tls_ca) -> None:
    """Make the master at ADDRESS a slave of MASTER_HA: it stops taking writes, cuts what its log
    has beyond the consistent point with the new master's history, and catches up."""
    data = _client_call(address, secret_file, tls_ca, lambda client: client.demote(master_ha))
    click.echo(f"{data['role']} of {data.get('master_ha')}")


@main.command()
@click.argument("address")
@click.option("--json", "as_json", is_flag=True)
@_secret_option
@_tls_option
def status(address, as_json, secret_file, tls_ca) -> None:
    """Role, offsets and replication state of the broker at ADDRESS."""
    data = _client_call(address, secret_file, tls_ca, lambda client: client.status())
    if as_json:
        click.echo(json.dumps(data))
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


@main.command()
@click.option("--producers", type=int, default=16, show_default=True)
@click.option("--keep/--no-keep", default=True, show_default=True, help="Keep the stores and logs afterwards.")
def demo(producers, keep) -> None:
    """The main job: a local master and slave with a generated secret, SYNC_MASTER writes with a
    live progress line, their status, one failover round verified from disk, a summary."""
    from hasvc.demo import run_demo

    if not run_demo(producers=producers, keep=keep, echo=click.echo):
        sys.exit(1)


@main.command()
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--producers", type=int, default=8, show_default=True)
@click.option("--mode", type=click.Choice(["sync", "async"]), default="sync", show_default=True)
@click.option("--seed", type=int, default=1, show_default=True, help="Seeds when the master is killed.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None, help="Write a JSON report here.")
@click.option("--keep", is_flag=True, help="Keep the stores and logs.")
def drill(rounds, producers, mode, seed, report_path, keep) -> None:
    """Failover rounds on loopback: SIGKILL the master under load, promote the slave, rejoin the
    old master as a slave, and check from the stores on disk that no acknowledged write was lost or
    duplicated and that the logs, consume queues and epochs agree. Exits 1 on any loss in sync mode."""
    from hasvc.drill import run_drill

    if not run_drill(rounds=rounds, producers=producers, mode=mode, seed=seed, report_path=report_path, keep=keep, echo=click.echo):
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


@bench.command("sync-write")
@click.option("--producers", type=int, default=64, show_default=True, help="Concurrent producers, one request in flight each.")
@click.option("--connections", type=int, default=1, show_default=True, help="Connections the producers share.")
@click.option("--size", type=int, default=1024, show_default=True, help="Body size in bytes.")
@click.option("--batch", type=int, default=1, show_default=True, help="Messages per request.")
@click.option("--duration", type=float, default=5.0, show_default=True, help="Seconds per run.")
@click.option("--runs", type=int, default=3, show_default=True)
@click.option("--role", type=click.Choice(["sync", "async"]), default="sync", show_default=True)
@click.option("--flush", type=click.Choice(["sync", "async"]), default="async", show_default=True)
@click.option("--slave-flush-before-ack", is_flag=True, help="The slave fsyncs before acknowledging.")
@click.option("--master", default=None, help="Target a running master instead of starting a local pair.")
@_secret_option
@click.option("--load-generator", type=click.Choice(["auto", "c", "python"]), default="auto", show_default=True,
              help="c: scripts/hasvc_load.c, built on first use (no secret support); python: hasvc.client; "
                   "auto: c when a compiler is there and no secret is given.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the results here.")
def bench_sync_write(producers, connections, size, batch, duration, runs, role, flush, slave_flush_before_ack, master,
                     secret_file, load_generator, json_path) -> None:  # fmt: skip
    """Acknowledged writes per second, MB/s and latency percentiles against a master + slave."""
    from hasvc.bench import write_json
    from hasvc.bench_sync import bench_sync_write as run

    data = run(producers=producers, connections=connections, size=size, batch=batch, duration=duration, runs=runs,
               role=role, flush=flush, master=master, slave_flush_before_ack=slave_flush_before_ack,
               secret=_client_secret(secret_file), load_generator=load_generator, echo=click.echo)  # fmt: skip
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
    from hasvc.bench import write_json
    from hasvc.bench_catchup import bench_catch_up as run

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
    from hasvc.bench import write_json
    from hasvc.bench_spark import bench_spark_read as run

    write_json(json_path, run(size_gib=size_gib, segment_mib=segment_mib, runs=runs, master=master,
                              directory=directory, keep=keep, echo=click.echo))  # fmt: skip


# -- hasvc spark (imports PySpark only when a command runs) ------------------------------------

from hasvc.spark_cli import spark  # noqa: E402

main.add_command(spark)
from hasvc.proxy.cli import register as register_proxy  # noqa: E402
register_proxy(main, bench)


if __name__ == "__main__":  # pragma: no cover
    main()
