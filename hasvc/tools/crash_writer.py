"""A process that appends numbered messages until it is killed; used by crash tests and demos.

    python -m hasvc.tools.crash_writer STORE [--segment-size N] [--flush sync|async] [--producers P]
                                       [--batch K] [--body-size B] [--pool]

It prints ``READY`` once the store is open, then one line per acknowledged put:
``ACK <offset> <size> <sequence>`` (for a batch, one line per message). Under SYNC_FLUSH a line is
printed only after the group commit covering the record returned PUT_OK, so every ACK line names
a record that must survive a SIGKILL. Bodies start with ``seq=<n>;`` so a checker can match them.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading

from commitlog.config import FlushDiskType, StoreConfig
from commitlog.record import Message, PutMessageStatus
from commitlog.services import StoreServices
from commitlog.store import MessageStore


def body_for(sequence: int, size: int) -> bytes:
    head = f"seq={sequence};".encode()
    return head + b"x" * max(0, size - len(head))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hasvc.tools.crash_writer")
    parser.add_argument("store")
    parser.add_argument("--segment-size", type=int, default=1024 * 1024)
    parser.add_argument("--flush", choices=["sync", "async"], default="sync")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--pool", action="store_true", help="enable the transient store pool")
    parser.add_argument("--limit", type=int, default=0, help="stop after this many messages (0: never)")
    args = parser.parse_args(argv)
    config = StoreConfig(
        commitlog_segment_size=args.segment_size,
        flush_disk_type=FlushDiskType.SYNC_FLUSH if args.flush == "sync" else FlushDiskType.ASYNC_FLUSH,
        transient_store_pool_enable=args.pool,
        flush_interval_commitlog_ms=50,
    )
    store = MessageStore.open(args.store, config)
    services = StoreServices(store).start()
    sequence = itertools.count()
    out_lock = threading.Lock()
    print("READY", flush=True)

    def produce() -> None:
        while True:
            numbers = [next(sequence) for _ in range(args.batch)]
            if args.limit and numbers[0] >= args.limit:
                return
            messages = [
                Message("CrashTopic", body_for(n, args.body_size), queue_id=n % 4, properties={"TAGS": "t"})
                for n in numbers
            ]
            result = services.put(messages)
            if result.status is not PutMessageStatus.PUT_OK:
                with out_lock:
                    print(f"FAIL {result.status.name} {result.reason}", flush=True)
                continue
            lines = [
                f"ACK {offset} {size} {n}"
                for offset, size, n in zip(result.offsets, _sizes(result), numbers)
            ]
            with out_lock:
                sys.stdout.write("\n".join(lines) + "\n")
                sys.stdout.flush()

    threads = [threading.Thread(target=produce, daemon=True) for _ in range(args.producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    services.stop()
    store.close()
    print("DONE", flush=True)


def _sizes(result) -> list[int]:
    ends = [*result.offsets[1:], result.next_offset]
    return [end - start for start, end in zip(result.offsets, ends)]


if __name__ == "__main__":
    main()
