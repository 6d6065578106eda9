"""The trio relay floor at several request sizes: what one writer's round trip through two trio
processes costs with no work at any hop (scripts/bench_peers.py's "trio relay floor", whose
request is 1 KiB), so that a one-writer figure with larger requests can be read against its own
floor.

    .venv/bin/python scripts/dev/relay_floor.py [--sizes 1024,32768] [--seconds 8] [--rounds 3] [--json FILE]

Each round runs the relay once per size, in turn (a client with a blocking socket sends a request
of SIZE bytes behind a 12-byte header to a trio "master", which forwards it to a trio "slave",
waits for its 8-byte reply and answers the client with 16 bytes), and prints one JSON line: the
size, round trips a second, p50/p99 in microseconds and the processes' CPU. At the end: the
medians by size, and per size the messages a second a 32-message (or SIZE/1024-message) request
of 1 KiB messages would make at that pace.

Why: a SYNC_MASTER put of 32 messages at one writer crosses the same four hops as the relay's
request, so hasvc cannot answer such puts faster than the relay at 32 KiB answers its requests;
docs/design/put-path.md compares that ceiling with Redis's 32 x SET + WAIT at one writer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from bench_peers import trio_relay_floor  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1024,32768", help="request sizes in bytes, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="write every round and the medians here too")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    rows = []
    for number in range(1, args.rounds + 1):
        for size in sizes:
            result = trio_relay_floor(args.seconds, size=size)
            row = {"round": number, "size": size, "round_trips_per_second": round(result["acked_per_second"]),
                   "p50_us": round(result["p50_us"], 1), "p99_us": round(result["p99_us"], 1),
                   "cpu_percent": {name: round(value) for name, value in result["cpu_percent"].items()}}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    medians = {}
    for size in sizes:
        mine = [row for row in rows if row["size"] == size]
        rate = statistics.median(row["round_trips_per_second"] for row in mine)
        medians[size] = {"round_trips_per_second": rate, "p50_us": statistics.median(row["p50_us"] for row in mine),
                         "messages_per_second_of_1_kib": round(rate * max(1, size // 1024))}  # fmt: skip
        print(f"size {size}: median {rate:,.0f} round trips/s, p50 {medians[size]['p50_us']:.0f} us; "
              f"as {max(1, size // 1024)} x 1 KiB messages a request: {medians[size]['messages_per_second_of_1_kib']:,} msgs/s")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"rounds": rows, "medians": medians}, file, indent=2)


if __name__ == "__main__":
    main()
