"""The put path of one broker in one process, without a network or peers: CPU a message from a
pass of SENDs handed to ``PutService.put_items`` to every answer, classic against DLedger.

    .venv/bin/python scripts/dev/put_path_inprocess.py [--mode classic|dledger] [--passes 2000]
        [--rounds 5] [--requests 64] [--queues 4] [--size 1024] [--decode] [--idempotent] [--json FILE]

``classic``: a ``Broker`` playing ASYNC_MASTER (no slave to wait for: every put is answered once
appended). ``dledger``: a ``RaftBroker`` alone in its group (its quorum is itself: a proposal
commits in the Ready that appends it), SYNC_MASTER once its no-op is committed. Both with a
temporary store in /dev/shm when there is one. Each round hands PASSES passes of REQUESTS
one-message SENDs (SIZE-byte bodies, spread over QUEUES queues, as the load generator spreads its
producers) to ``put_items`` with an outbox that counts answers, yields to the event loop after
each pass, waits for every answer, and prints the main thread's CPU (``time.thread_time``) per
message. The first round warms the store up and is not counted in the median. With ``--decode``
the SENDs are handed as the client port hands them: frames with their payloads, decoded first
(``decode_send``) unless the put path decodes them itself (``PutService.decodes_sends``), so
that the decode is counted too. With ``--idempotent`` every request is a SEND_IDEMPOTENT, one
producer a request's place in its pass, each with its next sequence (every one new: none is a
retry); the requests are built before each round, outside its time. Run from one tree, the script measures another tree's code with
``PYTHONPATH=TREE`` (an older tree decodes every SEND first).

Why: in a running pair or group the put path shares the machine with its peers, the load
generator and their wake-ups (docs/performance.md: rates move ±15-30 % between rounds), and a
leader's or master's CPU a message includes the replication exchange. Here only the local work is
left -- decode and client I/O aside: the append (a DLedger leader's plan, proposal and entry
write), the commit and the dispatch, the answers -- so the two modes' costs can be compared
with each other directly. (``scripts/dev/dledger_leader_cpu.py`` times a DLedger leader's store and Raft
core alone, the followers' acknowledgements simulated; this one goes through the broker's
``PutService`` in both modes.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import trio

from commitlog import pass_encode
from hasvc.broker.broker import Broker
from hasvc.broker.raft.broker import RaftBroker
from hasvc.broker.raft.group import GroupConfig
from hasvc.config import BrokerConfig, BrokerRole
from hasvc.protocol import client as cp
from hasvc.state.raft.config import RaftConfig

# Short election timing: the lone member leads within ~0.3 s.
RAFT = RaftConfig(heartbeat_interval_seconds=0.05, election_timeout_min_seconds=0.2, election_timeout_max_seconds=0.3)
POOL_PASSES = 8  # distinct passes of requests built once and handed out in turn
LEAD_TIMEOUT_SECONDS = 30.0


# A SEND answer's first bytes when it is PUT_OK (its status string): the harness checks these
# instead of decoding every answer (a decode an answer was ~1 us a message of the harness's own).
PUT_OK_HEAD = cp.send_response_prefix("PUT_OK", "")[:8]


class CountingOutbox:
    """What ``PutService`` answers through: counts the answers and those not PUT_OK (by their
    status bytes: a joined piece's answers share one status), keeps nothing."""

    def __init__(self) -> None:
        self.answers = 0
        self.failures = 0

    def respond(self, frame, payload) -> None:
        self.answers += 1
        if payload[:8] != PUT_OK_HEAD:
            self.failures += 1

    def respond_joined(self, data, count) -> None:
        self.answers += count
        if data[cp.FRAME_HEADER.size : cp.FRAME_HEADER.size + 8] != PUT_OK_HEAD:
            self.failures += count

    def flush(self) -> None:
        pass


def requests_pool(requests: int, queues: int, size: int, decode: bool) -> list[list[tuple[cp.Frame, cp.SendRequest]]]:
    pool = []
    for number in range(POOL_PASSES):
        sends = []
        for index in range(requests):
            properties = [f"KEYS\x01k{number}-{index}\x02".encode()]
            request = cp.SendRequest("BenchTopic", index % queues, [os.urandom(size)], properties, 0, 0)
            payload = memoryview(cp.encode_send(request)) if decode else b""
            sends.append((cp.Frame(cp.SEND, index, payload), request))
        pool.append(sends)
    return pool


def pass_items(outbox, sends, decode: bool, put_decodes: bool) -> list:
    """A pass's (outbox, frame, request) items, as the client port hands them with ``decode``
    (a tree whose pass does not read SEND_IDEMPOTENTs' payloads: the port decodes those)."""
    if not decode:
        return [(outbox, frame, request) for frame, request in sends]
    if put_decodes and hasattr(pass_encode, "KIND_SEND_IDEMPOTENT"):
        return [(outbox, frame, None) for frame, _ in sends]
    if put_decodes:
        return [(outbox, frame, cp.decode_send(frame.payload, idempotent=True) if frame.kind == cp.SEND_IDEMPOTENT else None)
                for frame, _ in sends]  # fmt: skip
    return [(outbox, frame, cp.decode_send(frame.payload, idempotent=frame.kind == cp.SEND_IDEMPOTENT)) for frame, _ in sends]


def idempotent_round(pool, passes: int, first_pass: int, decode: bool) -> list:
    """``passes`` passes of the pool's requests as SEND_IDEMPOTENTs: the request at index i of
    every pass is producer i's, its sequence the pass's number from ``first_pass``."""
    made = []
    for number in range(first_pass, first_pass + passes):
        sends = []
        for index, (frame, request) in enumerate(pool[number % POOL_PASSES]):
            request = cp.SendRequest(request.topic, request.queue_id, request.bodies, request.properties, 0, 0, f"producer-{index}", number)
            payload = memoryview(cp.encode_send(request)) if decode else b""
            sends.append((cp.Frame(cp.SEND_IDEMPOTENT, frame.request_id, payload), request))
        made.append(sends)
    return made


async def _run(args, store: str) -> list[float]:
    rounds = []
    async with trio.open_nursery() as nursery:
        if args.mode == "classic":
            broker = Broker(BrokerConfig(store=store, role=BrokerRole.ASYNC_MASTER, listen=("127.0.0.1", 0)))
            await nursery.start(broker.run)
        else:
            config = BrokerConfig(store=store, role=BrokerRole.SYNC_MASTER, listen=("127.0.0.1", 0))
            broker = RaftBroker(config, GroupConfig(group="inprocess", self_id="n0", peers={"n0": ("127.0.0.1", 0)}, raft=RAFT))
            await nursery.start(broker.run)
            with trio.fail_after(LEAD_TIMEOUT_SECONDS):
                while broker.role_state.role is not BrokerRole.SYNC_MASTER:
                    await trio.sleep(0.01)
        outbox = CountingOutbox()
        pool = requests_pool(args.requests, args.queues, args.size, args.decode)
        put_items = broker.put_service.put_items
        put_decodes = getattr(broker.put_service, "decodes_sends", False)
        messages = args.passes * args.requests
        for round_number in range(args.rounds):
            expected = outbox.answers + messages
            sends_of = pool
            if args.idempotent:
                sends_of = idempotent_round(pool, args.passes, round_number * args.passes, args.decode)
            started = time.thread_time()
            for number in range(args.passes):
                put_items(pass_items(outbox, sends_of[number % len(sends_of)], args.decode, put_decodes))
                await trio.sleep(0)
            while outbox.answers < expected:
                await trio.sleep(0)
            rounds.append((time.thread_time() - started) / messages * 1e6)
            print(f"{args.mode}: {rounds[-1]:.2f} us of CPU a message", flush=True)
        if outbox.failures:
            raise SystemExit(f"{outbox.failures} puts were not PUT_OK")
        nursery.cancel_scope.cancel()
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("classic", "dledger"), default="dledger")
    parser.add_argument("--passes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64, help="one-message SENDs a pass")
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--decode", action="store_true", help="hand SEND frames with payloads, decoded as the client port does")
    parser.add_argument("--idempotent", action="store_true", help="SEND_IDEMPOTENTs, one producer per place in a pass, none a retry")
    parser.add_argument("--json", help="write the rounds and their median here too")
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where the throwaway store goes (default /dev/shm: the disk is not what this measures)")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first warms up)")
    store = tempfile.mkdtemp(prefix="hasvc-inprocess-", dir=args.dir)
    try:
        rounds = trio.run(_run, args, store)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    median = statistics.median(rounds[1:])
    print(f"{args.mode}: median {median:.2f} us of CPU a message over rounds 2-{args.rounds}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"mode": args.mode, "decode": args.decode, "idempotent": args.idempotent, "requests": args.requests,
                       "queues": args.queues, "size": args.size,
                       "passes": args.passes, "cpu_us_per_message": rounds, "median": median}, file, indent=1)  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
