"""``hasvc bench read``: what checking records on the way out (``check_crc_on_read``) costs a read.

A store of ``size_gib`` GiB of 1 KiB records in 8 queues is built once (``--dir`` keeps it),
written in runs of ``run_records`` records per queue: 1 (the default) interleaves the queues, so
no two records of a PULL lie end to end (as in a DLedger member's log, where entry headers lie
between them); 1000 lays a queue's records end to end. Either way the check is one native call per
PULL and segment. The store is read whole, queue by queue, in PULLs of ``count_max`` records,
with the check on and with it off, alternating (on/off, then off/on, ...), ``pairs`` times. Two
layers, each timed on its own:

* **store**: in this process, what the broker does for a PULL and nothing else: the consume
  queue's units and ``MessageStore.read_records(copy=True)`` (the check and a copy of each record).
  Records/s and CPU µs per record: the check's own cost, without sockets.
* **broker**: a ``hasvc master`` process serving PULLs over loopback to one client here that
  decodes only the response frames (no record is decoded: the client is not what is measured).
  Records/s and the broker's CPU µs per record (``/proc/PID/stat``), the figure a busy broker
  pays; the wall-clock rate also carries the client and the machine's other load.

The log is in the page cache for every pass (built just before, or read once before the first
pass): this measures the CPU of the check, not the disk.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import trio

from commitlog.config import StoreConfig
from commitlog.store import MessageStore
from hasvc import client as hc
from hasvc.protocol import client as cp
from hasvc.tools.bench.catch_up import _start, stop_process
from commitlog.record import MessageBatch, PutMessageStatus
from hasvc.tools.bench.store import BENCH_PROPERTIES, BENCH_TOPIC, RECORD_SIZE, Summary, _bench_body_size, envelope
from hasvc.tools.bench.sync_write import process_cpu_seconds

QUEUES = 8  # build_store spreads its records over queues 0..7


def build_store(path: str, *, size_gib: float, segment_mib: int, run_records: int, echo=print) -> int:
    """The store read (reused when ``path`` holds one of the same shape); its record count."""
    marker = os.path.join(path, "bench-read-store.txt")
    shape = f"{size_gib} {segment_mib} {run_records}"
    if os.path.exists(marker):
        with open(marker) as file:
            saved_shape, records = file.read().rsplit(" ", 1)
        if saved_shape == shape:
            echo(f"reusing the store at {path}")
            return int(records)
    shutil.rmtree(path, ignore_errors=True)
    config = StoreConfig(commitlog_segment_size=segment_mib * 1024 * 1024, disk_max_used_space_ratio=1.0, disk_clean_ratio=1.0)
    body = bytes(range(256)) * (_bench_body_size() // 256) + bytes(_bench_body_size() % 256)
    target = int(size_gib * (1 << 30)) // RECORD_SIZE
    records = 0
    with MessageStore.open(path, config) as store:
        while records < target:
            batch = MessageBatch(BENCH_TOPIC, [body] * run_records, queue_id=records // run_records % QUEUES, properties=BENCH_PROPERTIES)
            result = store.append_batch(batch)
            if result.status is not PutMessageStatus.PUT_OK:
                raise RuntimeError(f"building the benchmark store: {result.status.name} {result.reason}")
            records += run_records
    with open(marker, "w") as file:
        file.write(f"{shape} {records}")
    echo(f"built {records:,} records in runs of {run_records} at {path}")
    return records


def store_pass(path: str, *, segment_mib: int, check: bool, count_max: int) -> dict:
    """Every record of every queue through ``read_records`` and a copy, in this process."""
    config = StoreConfig(commitlog_segment_size=segment_mib * 1024 * 1024, check_crc_on_read=check,
                         disk_max_used_space_ratio=1.0, disk_clean_ratio=1.0)  # fmt: skip
    records = 0
    with MessageStore.open(path, config) as store:
        started, cpu = time.perf_counter(), time.process_time()
        for queue_id in range(QUEUES):
            queue = store.consume_queues.find(BENCH_TOPIC, queue_id)
            offset = 0
            while units := queue.read(offset, count_max):
                checked = store.read_records(units, copy=True)  # as the broker's PULL
                assert checked.damage is None, checked.damage
                records += len(checked.views)
                offset += len(units)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"layer": "store", "check": check, "records": records, "seconds": seconds, "records_per_second": records / seconds,
            "cpu_us_per_record": cpu / records * 1e6}  # fmt: skip


def broker_pass(path: str, *, segment_mib: int, check: bool, count_max: int, log_path: str) -> dict:
    """Every record of every queue PULLed from a ``hasvc master`` on the store."""
    process, ready = _start(["master", "--store", path, "--role", "async", "--listen", "127.0.0.1:0", "--ha-listen", "127.0.0.1:0",
                             "--set", f"commitlog_segment_size={segment_mib * 1024 * 1024}",
                             "--set", f"check_crc_on_read={'true' if check else 'false'}",
                             "--set", "disk_max_used_space_ratio=1.0", "--set", "disk_clean_ratio=1.0"], log_path)  # fmt: skip
    try:
        broker_cpu = process_cpu_seconds(process.pid)
        started = time.perf_counter()
        records = trio.run(_pull_everything, ready["listen"], count_max)
        seconds = time.perf_counter() - started
        broker_cpu = process_cpu_seconds(process.pid) - broker_cpu
    finally:
        stop_process(process)
    return {"layer": "broker", "check": check, "records": records, "seconds": seconds, "records_per_second": records / seconds,
            "cpu_us_per_record": broker_cpu / records * 1e6}  # fmt: skip


async def _pull_everything(address: str, count_max: int) -> int:
    records = 0
    async with hc.connect(address) as client:
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                payload = await client._request(cp.PULL, cp.encode_pull(cp.PullRequest(BENCH_TOPIC, queue_id, offset, count_max)))
                response = cp.decode_pull_response(payload)
                if response.status != cp.OK:
                    raise RuntimeError(f"PULL {queue_id}@{offset}: {response.status} {response.reason}")
                if not response.records:
                    break
                records += len(response.records)
                offset = response.next_queue_offset
    return records


def bench_read(*, size_gib: float, segment_mib: int, count_max: int, run_records: int, pairs: int, directory: str | None,
               keep: bool, echo=print) -> dict:  # fmt: skip
    root = directory or tempfile.mkdtemp(prefix="hasvc-bench-read-")
    path = os.path.join(root, "store")
    try:
        build_store(path, size_gib=size_gib, segment_mib=segment_mib, run_records=run_records, echo=echo)
        store_pass(path, segment_mib=segment_mib, check=False, count_max=count_max)  # the log into the page cache
        runs = []
        for pair in range(pairs):
            for check in (True, False) if pair % 2 == 0 else (False, True):
                echo(f"pair {pair + 1}/{pairs}, check {'on' if check else 'off'}: load {os.getloadavg()[0]:.2f}")
                for result in (store_pass(path, segment_mib=segment_mib, check=check, count_max=count_max),
                               broker_pass(path, segment_mib=segment_mib, check=check, count_max=count_max,
                                           log_path=os.path.join(root, "broker.log"))):  # fmt: skip
                    result["pair"] = pair
                    result["load"] = os.getloadavg()[0]
                    runs.append(result)
                    echo(f"  {result['layer']:6s} {result['records_per_second']:>12,.0f} records/s  "
                         f"{result['cpu_us_per_record']:6.2f} CPU µs/record")  # fmt: skip
        summary = _summary(runs, echo)
    finally:
        if directory is None and not keep:
            shutil.rmtree(root, ignore_errors=True)
    settings = {"size_gib": size_gib, "segment_mib": segment_mib, "count_max": count_max, "run_records": run_records, "pairs": pairs,
                "record_size": RECORD_SIZE}  # fmt: skip
    return envelope("read", settings, summary=summary, runs=runs)


def _summary(runs: list[dict], echo) -> dict:
    summary = {}
    for layer in ("store", "broker"):
        for key in ("records_per_second", "cpu_us_per_record"):
            on = [r[key] for r in runs if r["layer"] == layer and r["check"]]
            off = [r[key] for r in runs if r["layer"] == layer and not r["check"]]
            ratios = [a / b for a, b in zip(on, off)]  # per pair: the runs of a pair were side by side
            summary[f"{layer}_{key}"] = {"on": vars(Summary.of(on)), "off": vars(Summary.of(off)),
                                         "on_over_off_per_pair": ratios, "on_over_off_median": statistics.median(ratios)}  # fmt: skip
            echo(f"{layer:6s} {key:20s} on {Summary.of(on).text(digits=2)}  off {Summary.of(off).text(digits=2)}  "
                 f"on/off per pair {', '.join(f'{r:.3f}' for r in ratios)}")  # fmt: skip
    return summary
