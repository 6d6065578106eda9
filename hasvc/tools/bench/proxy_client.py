"""The official RocketMQ Python client as a load generator for ``hasvc bench proxy``.

Run as ``python -m hasvc.tools.bench.proxy_client ENDPOINT MODE SENDERS SECONDS SIZE TOPIC [GROUP]`` in a
child process whose HOME is a temporary directory (the client writes logs under ~/logs). MODE
``produce``: SENDERS threads each ``send`` BODY of SIZE bytes for SECONDS; ``consume``: one
SimpleConsumer receives (32 at a time) and acks each batch from 16 threads until SECONDS pass or a receive comes back empty
after something was consumed (the rate is taken up to the last acknowledged batch: the final, empty
receive long-polls for nothing). Prints one JSON line: count, seconds, rate, errors.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import threading
import time

ACK_THREADS = 16  # acknowledgements of one received batch in flight at once


def produce(endpoint: str, senders: int, seconds: float, size: int, topic: str) -> dict:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(endpoint, Credentials()), (topic,))
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
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    producer.shutdown()
    return {"count": sum(counts), "seconds": elapsed, "rate": sum(counts) / elapsed, "errors": sum(errors)}


def consume(endpoint: str, seconds: float, topic: str, group: str) -> dict:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(ClientConfiguration(endpoint, Credentials()), group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    count = errors = 0

    def ack(message) -> bool:
        try:
            consumer.ack(message)
            return True
        except Exception:  # counted, as above
            return False

    started = last = time.monotonic()
    # the client's ack_async returns no future in 5.1.2, so a batch is acknowledged from threads
    with concurrent.futures.ThreadPoolExecutor(ACK_THREADS) as pool:
        while time.monotonic() - started < seconds:
            messages = consumer.receive(32, 30)
            if not messages and count:
                break  # drained: this last receive long-polled for nothing and is not counted
            for ok in pool.map(ack, messages):
                count += ok
                errors += not ok
            last = time.monotonic()
    elapsed = last - started
    consumer.shutdown()
    return {"count": count, "seconds": elapsed, "rate": count / elapsed if elapsed > 0 else 0.0, "errors": errors}


def main() -> None:
    endpoint, mode, senders, seconds, size, topic = sys.argv[1:7]
    if mode == "produce":
        result = produce(endpoint, int(senders), float(seconds), int(size), topic)
    else:
        result = consume(endpoint, float(seconds), topic, sys.argv[7])
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
