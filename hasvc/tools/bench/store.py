"""Store benchmarks: ``hasvc bench append`` and ``hasvc bench recover``.

Each configuration runs ``runs`` times on a fresh store; we print the median with min–max, and
beside it the machine's ceiling measured in the same run on the same bytes (a raw ``mmap`` copy
for appends, a raw ``crc32c`` pass for recovery), so a number can be judged on this machine.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time

import crc32c

from commitlog import scan
from commitlog.commit_log import CommitLog
from commitlog.config import FlushDiskType, StoreConfig
from commitlog.record import RECORD_CRC_TAIL_SIZE, Message, MessageBatch, PutMessageStatus, calc_record_size
from commitlog.services import StoreServices
from commitlog.store import MessageStore

BENCH_SEGMENT_SIZE = 256 * 1024 * 1024


def machine() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as file:
            model = next((line.split(":", 1)[1].strip() for line in file if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "native_scan": scan.NATIVE_AVAILABLE,
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("hasvc", "trio", "crc32c", "click"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def envelope(benchmark: str, settings: dict, **rest) -> dict:
    """What every ``hasvc bench`` JSON starts with: the benchmark, the machine, the versions and
    the settings; then its medians (each with min and max), the CPU of every process involved
    and every run."""
    return {"benchmark": benchmark, "machine": machine(), "versions": versions(), "settings": settings, **rest}


@dataclasses.dataclass
class Summary:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Summary:
        return cls(statistics.median(values), min(values), max(values))

    def text(self, scale: float = 1.0, digits: int = 0) -> str:
        return f"{self.median / scale:,.{digits}f} ({self.low / scale:,.{digits}f}–{self.high / scale:,.{digits}f})"


def _record_size(body_size: int) -> int:
    """The bytes a bench record takes in the log (the record CRC tail counted when the store writes it)."""
    tail = RECORD_CRC_TAIL_SIZE if StoreConfig().append_record_crc else 0
    return calc_record_size(body_size=body_size, topic_size=len("BenchTopic"), properties_size=len("TAGS\x01bench\x02") + tail)


def append_run(
    directory: str, *, body_size: int, batch: int, flush: str, producers: int, seconds: float
) -> dict:
    config = StoreConfig(
        commitlog_segment_size=BENCH_SEGMENT_SIZE,
        flush_disk_type=FlushDiskType.SYNC_FLUSH if flush == "sync" else FlushDiskType.ASYNC_FLUSH,
    )
    store = MessageStore.open(directory, config)
    store.warm_commitlog()  # as a running broker's write area is: warm before the clock starts
    services = StoreServices(store).start()
    body = os.urandom(body_size)
    if batch == 1:  # a single message: the general path (RocketMQ's putMessage)
        message = [Message("BenchTopic", body, properties={"TAGS": "bench"})]
        put = lambda: services.put(message)  # noqa: E731
    else:  # a batch sharing topic and queue: the native batch path (RocketMQ's putMessages)
        messages = MessageBatch("BenchTopic", [body] * batch, properties={"TAGS": "bench"})
        put = lambda: services.put_batch(messages)  # noqa: E731
    counts = [0] * producers
    failures = [0] * producers
    deadline = time.perf_counter() + seconds
    cpu_before = time.process_time()

    def produce(index: int) -> None:
        while time.perf_counter() < deadline:
            result = put()
            if result.status is PutMessageStatus.PUT_OK:
                counts[index] += batch
            else:
                failures[index] += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_before
    services.stop()
    store.close()
    total = sum(counts)
    return {
        "messages": total,
        "failures": sum(failures),
        "seconds": elapsed,
        "msgs_per_second": total / elapsed,
        "mb_per_second": total * _record_size(body_size) / elapsed / 1e6,
        "cpu_percent": 100 * cpu / elapsed,
    }


def mmap_copy_ceiling(directory: str, *, record_size: int, batch: int, seconds: float) -> float:
    """MB/s of copying ``record_size * batch`` byte chunks into a preallocated shared mapping."""
    path = os.path.join(directory, "ceiling")
    size = BENCH_SEGMENT_SIZE
    with open(path, "w+b") as file:
        os.posix_fallocate(file.fileno(), 0, size)
        mapping = mmap.mmap(file.fileno(), size)
        chunk = os.urandom(record_size * batch)
        view = memoryview(mapping)
        copied = 0
        position = 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            for _ in range(64):
                if position + len(chunk) > size:
                    position = 0
                view[position : position + len(chunk)] = chunk
                position += len(chunk)
                copied += len(chunk)
        elapsed = time.perf_counter() - started
        view.release()
        mapping.close()
    os.unlink(path)
    return copied / elapsed / 1e6


def bench_append(
    *, sizes: list[int], batches: list[int], flushes: list[str], runs: int, seconds: float, sync_producers: int, echo=print
) -> dict:
    results = []
    echo(f"{'body':>6} {'batch':>5} {'flush':>5} {'prod':>4} {'msgs/s median (min–max)':>30} {'MB/s':>8} "
         f"{'ceiling MB/s':>12} {'of ceiling':>10} {'cpu%':>5}")  # fmt: skip
    root = tempfile.mkdtemp(prefix="hasvc-bench-append-")
    try:
        for flush in flushes:
            for body_size in sizes:
                for batch in batches:
                    producers = sync_producers if flush == "sync" else 1
                    run_results = []
                    for run in range(runs):
                        directory = os.path.join(root, f"{flush}-{body_size}-{batch}-{run}")
                        run_results.append(
                            append_run(
                                directory, body_size=body_size, batch=batch, flush=flush,
                                producers=producers, seconds=seconds,
                            )  # fmt: skip
                        )
                        shutil.rmtree(directory)
                    ceiling = mmap_copy_ceiling(root, record_size=_record_size(body_size), batch=batch, seconds=seconds / 2)
                    rate = Summary.of([r["msgs_per_second"] for r in run_results])
                    mb = Summary.of([r["mb_per_second"] for r in run_results])
                    cpu = statistics.median(r["cpu_percent"] for r in run_results)
                    echo(
                        f"{body_size:>6} {batch:>5} {flush:>5} {producers:>4} {rate.text():>30} {mb.median:>8,.0f} "
                        f"{ceiling:>12,.0f} {mb.median / ceiling:>10.1%} {cpu:>5.0f}"
                    )
                    results.append(
                        {
                            "body_size": body_size, "batch": batch, "flush": flush, "producers": producers,
                            "msgs_per_second": dataclasses.asdict(rate), "mb_per_second": dataclasses.asdict(mb),
                            "ceiling_mmap_copy_mb_per_second": ceiling, "runs": run_results,
                        }  # fmt: skip
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    settings = {"sizes": sizes, "batches": batches, "flushes": flushes, "runs": runs, "seconds_per_run": seconds,
                "sync_producers": sync_producers, "segment_size": BENCH_SEGMENT_SIZE}  # fmt: skip
    return envelope("append", settings, results=results)


def bench_recover(*, size_mb: int, body_size: int, runs: int, segment_size: int, echo=print) -> dict:
    root = tempfile.mkdtemp(prefix="hasvc-bench-recover-")
    try:
        config = StoreConfig(commitlog_segment_size=segment_size)
        echo(f"writing {size_mb} MiB of {body_size}-byte records in {segment_size // (1024 * 1024)} MiB segments ...")
        with MessageStore.open(root, config) as store:
            messages = [Message("BenchTopic", os.urandom(body_size), properties={"TAGS": "bench"}) for _ in range(64)]
            while store.commit_log.max_offset < size_mb * 1024 * 1024:
                store.commit_log.append(store.prepare(messages))
            store.flush_commitlog(0)
            store.reput_from_offset = store.commit_log.max_offset  # the bench measures the scan only
        directory = os.path.join(root, "commitlog")
        rows = {}
        for name, native in (("native", True), ("python", False)):
            if native and not scan.NATIVE_AVAILABLE:
                continue
            rates, records, cpu = [], 0, []
            for _ in range(runs if native else 1):
                cpu_before = time.process_time()
                log = CommitLog(directory, segment_size=segment_size)
                log.load()
                previous = scan._USE_NATIVE
                scan._USE_NATIVE = native
                try:
                    report = log.recover(
                        abnormal=True, dispatch_from=0, checkpoint_min_timestamp=0, crc_function=crc32c.crc32c
                    )
                finally:
                    scan._USE_NATIVE = previous
                    log.close()
                assert report.corrupt_offset is None, report
                rates.append(report.scanned_bytes / report.seconds)
                cpu.append(100 * (time.process_time() - cpu_before) / report.seconds)
                records = report.records
            rows[name] = {"bytes_per_second": dataclasses.asdict(Summary.of(rates)), "records": records,
                          "cpu_percent": {"this process": statistics.median(cpu)},
                          "runs": [{"bytes_per_second": r, "cpu_percent": c} for r, c in zip(rates, cpu, strict=True)]}  # fmt: skip
        ceiling = _crc_ceiling(directory, runs)
        echo(f"{'walk':>8} {'GB/s median (min–max)':>26} {'records/s':>12} {'crc32c ceiling GB/s':>20} {'of ceiling':>10}")
        for name, row in rows.items():
            rate = Summary(**row["bytes_per_second"])
            records_per_second = row["records"] / (size_mb * 1024 * 1024 / rate.median)
            echo(
                f"{name:>8} {rate.text(1e9, 2):>26} {records_per_second:>12,.0f} {ceiling / 1e9:>20.2f} "
                f"{rate.median / ceiling:>10.1%}"
            )
        settings = {"size_mb": size_mb, "body_size": body_size, "segment_size": segment_size, "runs": runs}
        return envelope(
            "recover", settings, scan=rows, ceiling_crc32c_bytes_per_second=ceiling,
            note="files are in the page cache (just written): this is the CPU cost of the scan",
        )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _crc_ceiling(directory: str, runs: int) -> float:
    rates = []
    for _ in range(runs):
        total = 0
        started = time.perf_counter()
        for name in sorted(os.listdir(directory)):
            with open(os.path.join(directory, name), "rb") as file:
                with mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) as mapping:
                    crc32c.crc32c(mapping)
                    total += len(mapping)
        rates.append(total / (time.perf_counter() - started))
    return statistics.median(rates)


def write_json(path: str | None, data: dict) -> None:
    if path:
        with open(path, "w") as file:
            json.dump(data, file, indent=2)


# -- a store of 1 KiB records, for the benchmarks that read one (spark-read, catch-up) --------

RECORD_SIZE = 1024
BENCH_TOPIC = "BenchTopic"
BENCH_PROPERTIES = {"TAGS": "bench", "KEYS": "k"}


def _bench_body_size() -> int:
    """The body that makes a bench record RECORD_SIZE bytes in the log (its CRC tail counted)."""
    properties = len("TAGS\x01bench\x02KEYS\x01k\x02") + (RECORD_CRC_TAIL_SIZE if StoreConfig().append_record_crc else 0)
    return RECORD_SIZE - calc_record_size(body_size=0, topic_size=len(BENCH_TOPIC), properties_size=properties)


def build_store(path: str, *, size_gib: float, segment_mib: int, echo=print) -> tuple[int, int]:
    """A store of ``size_gib`` GiB of 1 KiB records; returns (records, log bytes). Reuses a store
    already at ``path`` if it was built with the same shape."""
    marker = os.path.join(path, "bench-store.txt")
    shape = f"{size_gib} {segment_mib} {RECORD_SIZE}"
    if os.path.exists(marker):
        with open(marker) as file:
            saved_shape, records, log_bytes = file.read().rsplit(" ", 2)
        if saved_shape == shape:
            echo(f"reusing the store at {path}")
            return int(records), int(log_bytes)
        shutil.rmtree(path)
    started = time.monotonic()
    config = StoreConfig(commitlog_segment_size=segment_mib * 1024 * 1024)
    target = int(size_gib * (1 << 30))
    body = bytes(range(256)) * (_bench_body_size() // 256) + bytes(_bench_body_size() % 256)
    records = 0
    with MessageStore.open(path, config) as store:
        while records * RECORD_SIZE < target:
            count = min(1000, (target - records * RECORD_SIZE) // RECORD_SIZE + 1)
            result = store.append_batch(MessageBatch(BENCH_TOPIC, [body] * count, queue_id=records % 8, properties=BENCH_PROPERTIES))
            if result.status is not PutMessageStatus.PUT_OK:
                raise RuntimeError(f"building the benchmark store: {result.status.name} {result.reason}")
            records += count
        store.flush_commitlog()
    log_bytes = records * RECORD_SIZE
    with open(marker, "w") as file:
        file.write(f"{shape} {records} {log_bytes}")
    echo(f"built {records:,} records ({log_bytes / 1e9:.2f} GB) in {time.monotonic() - started:.1f} s at {path}")
    return records, log_bytes
