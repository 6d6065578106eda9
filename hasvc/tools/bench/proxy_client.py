"""The official RocketMQ Python client as a load generator for ``hasvc bench proxy``.

Run as ``python -m hasvc.tools.bench.proxy_client ENDPOINT MODE SENDERS SECONDS SIZE TOPIC [GROUP [WANT]]``
in a child process whose HOME is a temporary directory (the client writes logs under ~/logs).
Prints one JSON line: count, seconds, rate, errors (and, for consumers, duplicates), and
``client_cpu_percent``: this process's CPU (user + system, every thread) over the measured window,
in per cent of one core. The client is Python: near 100 % it is the bottleneck, whatever it talks to.

* ``produce``: SENDERS threads each ``send`` a body of SIZE bytes for SECONDS.
* ``consume``: one SimpleConsumer; ``SIMPLE_RECEIVERS`` threads each receive (32 at a time, the
  proxy's batch maximum) and acknowledge the batch from ``SIMPLE_ACK_THREADS`` shared threads, until
  SECONDS pass or a receive comes back empty after something was consumed. The rate is taken up to
  the last acknowledged batch (the final, empty receive long-polls for nothing).
* ``consume-one``: one SimpleConsumer thread that receives 32 at a time and acknowledges each
  message before the next (each ack waits for its answer) until WANT are acknowledged or SECONDS
  pass: bound by the ack's latency, not by CPU; ``ack_ms`` is the mean ack call (what a holding
  back of acks in the proxy would cost such a consumer).
* ``push``: one PushConsumer (the client's own receive loop per queue, 32 a receive; its listener
  runs on ``PUSH_CONSUMPTION_THREADS`` threads and each message is acknowledged by the thread that
  consumed it) until WANT messages are acknowledged or SECONDS pass. The clock starts at its first
  ReceiveMessage (a PushConsumer looks for its queues a second after it starts: that pause is the
  client's, not the proxy's) and stops at its last acknowledgement.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import threading
import time

# Each consumer's best settings on the 2-core VM (docs/PROXY.md "Speed"): the client acknowledges
# one message per gRPC call, so what bounds a consumer is how many acknowledgements it keeps in flight.
SIMPLE_RECEIVERS = 4  # SimpleConsumer receives in flight at once (one thread each)
SIMPLE_ACK_THREADS = 64  # acknowledgements of received batches in flight at once, shared by the receivers
PUSH_CONSUMPTION_THREADS = 64  # PushConsumer(consumption_thread_count=...), the client's default is 20
PUSH_CACHE_MESSAGES = 1024  # PushConsumer(max_cache_message_count=...), the client's default


def _credentials():
    """The client's credentials: an account of the proxy's --acl file from the environment
    (HASVC_BENCH_ACCESS_KEY, HASVC_BENCH_SECRET_KEY), else none (calls go unsigned)."""
    from rocketmq import Credentials

    access_key, secret_key = os.environ.get("HASVC_BENCH_ACCESS_KEY"), os.environ.get("HASVC_BENCH_SECRET_KEY")
    return Credentials(access_key, secret_key) if access_key and secret_key else Credentials()


def produce(endpoint: str, senders: int, seconds: float, size: int, topic: str) -> dict:
    from rocketmq import ClientConfiguration, Message, Producer

    producer = Producer(ClientConfiguration(endpoint, _credentials()), (topic,))
    producer.startup()
    counts, errors = [0] * senders, [0] * senders
    body = b"x" * size
    stop = time.monotonic() + seconds

    def sender(index: int) -> None:
        while time.monotonic() < stop:
            message = Message()
            message.topic, message.body = topic, body
            try:
                producer.send(message)
                counts[index] += 1
            except Exception:  # counted: a benchmark reports failures, it does not stop on them
                errors[index] += 1

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(senders)]
    started, cpu = time.monotonic(), time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    producer.shutdown()
    return {"count": sum(counts), "seconds": elapsed, "rate": sum(counts) / elapsed, "errors": sum(errors),
            "client_cpu_percent": 100 * cpu / elapsed}  # fmt: skip


def consume(endpoint: str, seconds: float, topic: str, group: str) -> dict:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(ClientConfiguration(endpoint, Credentials()), group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    lock = threading.Lock()
    seen: set[str] = set()
    totals = {"count": 0, "errors": 0, "duplicates": 0, "last": 0.0}
    drained = threading.Event()

    def ack(message) -> bool:
        try:
            consumer.ack(message)
            return True
        except Exception:  # counted: a benchmark reports failures, it does not stop on them
            return False

    started = time.monotonic()
    totals["last"], totals["cpu_start"] = started, time.process_time()

    # the client's ack_async returns no future in 5.1.2, so batches are acknowledged from threads
    with concurrent.futures.ThreadPoolExecutor(SIMPLE_ACK_THREADS) as pool:

        def receiver() -> None:
            while not drained.is_set() and time.monotonic() - started < seconds:
                messages = consumer.receive(32, 30)
                if not messages and totals["count"]:
                    drained.set()  # this last receive long-polled for nothing and is not counted
                    return
                oks = list(pool.map(ack, messages))
                with lock:
                    for message, ok in zip(messages, oks, strict=True):
                        totals["duplicates"] += message.message_id in seen
                        seen.add(message.message_id)
                        totals["count"] += ok
                        totals["errors"] += not ok
                    totals["last"], totals["cpu_last"] = time.monotonic(), time.process_time()

        threads = [threading.Thread(target=receiver) for _ in range(SIMPLE_RECEIVERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    consumer.shutdown()
    return _consumed(totals, started)


def consume_one(endpoint: str, seconds: float, topic: str, group: str, want: int) -> dict:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(ClientConfiguration(endpoint, Credentials()), group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    totals = {"count": 0, "errors": 0, "duplicates": 0, "ack_seconds": 0.0}
    seen: set[str] = set()
    started, cpu = time.monotonic(), time.process_time()
    totals["last"], totals["cpu_start"] = started, cpu
    while totals["count"] < want and time.monotonic() - started < seconds:
        for message in consumer.receive(32, 30):
            totals["duplicates"] += message.message_id in seen
            seen.add(message.message_id)
            before = time.monotonic()
            try:
                consumer.ack(message)
                totals["count"] += 1
            except Exception:  # counted: a benchmark reports failures, it does not stop on them
                totals["errors"] += 1
            totals["last"] = time.monotonic()
            totals["ack_seconds"] += totals["last"] - before
        totals["cpu_last"] = time.process_time()
    consumer.shutdown()
    result = _consumed(totals, started)
    result["ack_ms"] = 1000 * totals["ack_seconds"] / max(1, totals["count"] + totals["errors"])
    return result


def push(endpoint: str, seconds: float, topic: str, group: str, want: int) -> dict:
    from rocketmq import ClientConfiguration, ConsumeResult, Credentials, FilterExpression, MessageListener, PushConsumer

    lock = threading.Lock()
    seen: set[str] = set()
    totals = {"count": 0, "errors": 0, "duplicates": 0, "last": 0.0, "first_receive": 0.0}
    drained = threading.Event()

    class Listener(MessageListener):
        def consume(self, message):
            with lock:
                totals["duplicates"] += message.message_id in seen
                seen.add(message.message_id)
            return ConsumeResult.SUCCESS

    class Counting(PushConsumer):
        """Counts acknowledgements (the client calls ``_ack`` from the consuming thread after the
        listener said SUCCESS) and notes its first receive."""

        async def _receive_coroutine(self, queue, req, timeout):
            with lock:
                if not totals["first_receive"]:
                    totals["first_receive"], totals["cpu_start"] = time.monotonic(), time.process_time()
            return await super()._receive_coroutine(queue, req, timeout)

        def _ack(self, message):
            try:
                super()._ack(message)
            except Exception:
                with lock:
                    totals["errors"] += 1  # the client retries it a second later
                raise
            with lock:
                totals["count"] += 1
                totals["last"], totals["cpu_last"] = time.monotonic(), time.process_time()
                if totals["count"] >= want:
                    drained.set()

    consumer = Counting(ClientConfiguration(endpoint, Credentials()), group, Listener(), {topic: FilterExpression()},
                        max_cache_message_count=PUSH_CACHE_MESSAGES, consumption_thread_count=PUSH_CONSUMPTION_THREADS)  # fmt: skip
    consumer.startup()
    if want <= 0:
        drained.set()  # nothing was produced: nothing to wait for
    drained.wait(seconds)
    consumer.shutdown()
    return _consumed(totals, totals["first_receive"] or time.monotonic())


def _consumed(totals: dict, started: float) -> dict:
    """The rate and this process's CPU (every thread: the client's own and ours) over the window
    from ``started`` to the last acknowledgement."""
    elapsed = totals["last"] - started
    count = totals["count"]
    cpu = totals.get("cpu_last", 0.0) - totals.get("cpu_start", 0.0)
    return {"count": count, "seconds": elapsed, "rate": count / elapsed if elapsed > 0 else 0.0, "errors": totals["errors"],
            "duplicates": totals["duplicates"], "client_cpu_percent": 100 * cpu / elapsed if elapsed > 0 and cpu > 0 else 0.0}  # fmt: skip


def main() -> None:
    endpoint, mode, senders, seconds, size, topic = sys.argv[1:7]
    if mode == "produce":
        result = produce(endpoint, int(senders), float(seconds), int(size), topic)
    elif mode == "consume":
        result = consume(endpoint, float(seconds), topic, sys.argv[7])
    elif mode == "consume-one":
        result = consume_one(endpoint, float(seconds), topic, sys.argv[7], int(sys.argv[8]))
    elif mode == "push":
        result = push(endpoint, float(seconds), topic, sys.argv[7], int(sys.argv[8]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: produce, consume, consume-one or push")
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
