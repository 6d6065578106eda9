"""``hasvc store demo``: a million messages into a store, a clean reopen, then a SIGKILL under
SYNC_FLUSH load and a crash recovery that is checked against every acknowledged record.

The crash round is library code (``run_crash_round``) so the system tests use it too.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

from commitlog.config import StoreConfig
from commitlog.inspect import verify
from commitlog.record import MessageBatch, PutMessageStatus
from commitlog.services import StoreServices
from commitlog.store import MessageStore
from hasvc.tools.crash_writer import body_for

# How long the crash writer may take to open its store before we give up on it.
WRITER_READY_TIMEOUT_SECONDS = 30.0


@dataclasses.dataclass
class CrashRoundReport:
    acked: int
    missing: list[int]  # sequence numbers acknowledged but absent or wrong after recovery
    recovery: str
    end_offset: int
    abnormal: bool

    @property
    def ok(self) -> bool:
        return not self.missing


def run_crash_round(
    store_path: str,
    *,
    seconds: float,
    segment_size: int,
    flush: str = "sync",
    producers: int = 4,
    batch: int = 1,
    body_size: int = 100,
    pool: bool = False,
) -> CrashRoundReport:
    """Start a crash writer on ``store_path``, SIGKILL it after ``seconds``, reopen the store and
    check that every record it acknowledged is there, at its offset, with its body."""
    command = [
        sys.executable, "-m", "hasvc.tools.crash_writer", store_path,
        "--segment-size", str(segment_size), "--flush", flush, "--producers", str(producers),
        "--batch", str(batch), "--body-size", str(body_size),
    ]  # fmt: skip
    if pool:
        command.append("--pool")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    acks: list[tuple[int, int, int]] = []
    try:
        reader_done = threading.Event()
        ready = threading.Event()

        def read_output() -> None:
            for line in process.stdout:
                if line.startswith("READY"):
                    ready.set()
                elif line.startswith("ACK "):
                    _, offset, size, sequence = line.split()
                    acks.append((int(offset), int(size), int(sequence)))
            reader_done.set()

        thread = threading.Thread(target=read_output, daemon=True)
        thread.start()
        if not ready.wait(WRITER_READY_TIMEOUT_SECONDS):
            raise RuntimeError("crash writer did not open its store in time")
        time.sleep(seconds)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        reader_done.wait(10)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
    config = StoreConfig(commitlog_segment_size=segment_size)
    missing = []
    with MessageStore.open(store_path, config) as store:
        for offset, size, sequence in acks:
            try:
                record = store.get_record(offset, check_crc=True)
            except Exception:
                missing.append(sequence)
                continue
            if record.size != size or bytes(record.body) != body_for(sequence, body_size):
                missing.append(sequence)
        report = store.recovery
    return CrashRoundReport(
        acked=len(acks),
        missing=missing,
        recovery=report.describe(),
        end_offset=report.end_offset,
        abnormal=report.abnormal,
    )


def run_demo(store_path: str, *, messages: int, body_size: int, batch: int, echo=print) -> bool:
    segment_size = 64 * 1024 * 1024
    config = StoreConfig(commitlog_segment_size=segment_size)
    echo(f"store: {store_path}")
    echo(f"1. appending {messages:,} messages of {body_size} bytes in batches of {batch} to 4 queues (ASYNC_FLUSH)")
    with MessageStore.open(store_path, config) as store:
        store.warm_commitlog()
        with StoreServices(store) as services:
            body = b"m" * body_size
            written = 0
            started = time.perf_counter()
            while written < messages:
                count = min(batch, messages - written)
                queue_id = (written // batch) % 4
                result = services.put_batch(MessageBatch("DemoTopic", [body] * count, queue_id=queue_id, properties={"TAGS": "demo"}))
                if result.status is not PutMessageStatus.PUT_OK:
                    echo(f"   append failed: {result.status.name} {result.reason}")
                    return False
                written += count
            append_seconds = time.perf_counter() - started
        dispatch_started = time.perf_counter()
        while store.dispatch():
            pass
        dispatch_seconds = time.perf_counter() - dispatch_started
        stats = store.statistics()
    echo(
        f"   {messages / append_seconds:,.0f} msgs/s appended ({stats.max_offset / append_seconds / 1e6:,.0f} MB/s) "
        f"with the flush, dispatch and warm-up threads running; log [{stats.min_offset}, {stats.max_offset}) "
        f"in {stats.segments} segments; consume queues complete {dispatch_seconds * 1000:.0f} ms after the last append"
    )
    echo("2. clean close and reopen")
    with MessageStore.open(store_path, config) as store:
        echo(f"   {store.recovery.describe()}")
        table = store.consume_queues.queue_offset_table()
        echo(f"   consume queues: {', '.join(f'{t}/{q}={n}' for (t, q), n in sorted(table.items()))}")
    echo("3. crash: a writer process appends with SYNC_FLUSH (group commit, 4 threads); SIGKILL after 2 s")
    crash = run_crash_round(store_path, seconds=2.0, segment_size=segment_size, flush="sync")
    echo(f"   {crash.acked:,} puts acknowledged before the kill")
    echo(f"   {crash.recovery}")
    if crash.ok:
        echo(f"   all {crash.acked:,} acknowledged records present with their bodies and CRCs")
    else:
        echo(f"   LOST {len(crash.missing)} acknowledged records: first sequences {crash.missing[:10]}")
    echo("4. hasvc store verify")
    report = verify(store_path)
    state = "clean" if report.corrupt_offset is None else f"CORRUPT at {report.corrupt_offset}: {report.reason}"
    echo(
        f"   {report.records:,} records in {report.segments} segments, [{report.min_offset}, {report.max_offset}), "
        f"topics {report.topics}: {state}"
    )
    return crash.ok and report.corrupt_offset is None
