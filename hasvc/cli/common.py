"""What several command groups share: the client options and a record as JSON."""

from __future__ import annotations

import base64

import click

secret_option = click.option("--secret-file", type=click.Path(dir_okay=False, exists=True), help="Cluster secret (or HASVC_SECRET).")
tls_option = click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), help="CA to verify a TLS broker.")


def client_secret(secret_file):
    from hasvc.config import read_secret

    return read_secret(secret_file)


def record_json(offset: int, record, crc_ok: bool) -> dict:
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


# glibc's malloc, as a server process sets it (the broker, a DLedger node, the proxy). A client
# connection's receive is copied out of the reused read buffer (wire.Buffer.feed): at 64 writers
# sending 32 messages a request those copies are up to 256 KiB, above glibc's default trim
# threshold, so every free gave the heap's top back (brk) and the next copy faulted fresh zeroed
# pages in: 0.11 brk a request at the master (scripts/dev/syscalls_per_put.py TREE 1 64 2 32), and,
# 3 alternating pairs of scripts/dev/cpu_per_put.py TREE 1 64 4 1 32, 108-122 -> 90-101 us of the
# master's CPU a request with these set. Allocations up to MALLOC_MMAP_THRESHOLD_BYTES come from
# the heap, and up to MALLOC_TRIM_THRESHOLD_BYTES of freed heap is kept for the next ones (what a
# busy server may hold beyond its live data). The environment's MALLOC_*_ variables win.
MALLOC_MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
MALLOC_TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def tune_malloc() -> bool:
    """Set glibc's trim and mmap thresholds for a server process (see above); False where there
    is no glibc ``mallopt`` (another libc: nothing is changed) or the environment sets them."""
    import ctypes
    import os

    if "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES) == 1


def start_busy_polling(busy_poll_us: int) -> None:
    """``busy_poll_us`` (hasvc/busy_poll.py) for this process's event loop, logged; a warning if
    this trio cannot be made to poll (the broker then runs as with 0)."""
    import logging

    from hasvc import busy_poll

    if busy_poll_us == 0:
        return
    if busy_poll.install(busy_poll_us):
        logging.getLogger("hasvc").info("busy polling: %d us before each sleep of the event loop", busy_poll_us)
    else:
        logging.getLogger("hasvc").warning("busy_poll_us=%d ignored: this trio's event loop is not the epoll one hasvc can poll", busy_poll_us)
