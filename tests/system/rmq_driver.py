"""Runs the official RocketMQ 5 Python client against a proxy, as a separate process.

The system tests start it with HOME pointed at a temporary directory (the client writes logs
under ~/logs on import). Usage: ``python rmq_driver.py ENDPOINT STEPS_JSON``; prints one JSON
line: the results of the steps, in order. Not a test module (no ``test_`` prefix).

Steps (dicts, by "op"):
  produce  topic count [start] [tolerate] [pause] -> [{i, id, offset, queue} or {i, error}]
  consume  group topic want [invisible] [await] [rounds] [ack] [slot] -> [{id, body, tag, keys, props, attempt}]
  change   slot invisible      -> the ids whose invisible duration changed; old handles kept as "<slot>_old"
  ack      slot                -> [error code or null per message]
  push     group topic want [fail_first] -> [{id, attempt, ...}] consumed by a PushConsumer's listener (one
           FAILURE per message id in fail_first, on its first attempt), until want were consumed
Any step with "catch": true gives {error, code, message} (what the client raised) instead of failing.
"""

import copy
import json
import sys
import threading
import time

from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression, Message, MessageListener, Producer,
                      PushConsumer, SimpleConsumer)

PUSH_TIMEOUT_SECONDS = 15
# RMQ_DRIVER_TLS=1: connect with TLS (the CA comes from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH)
TLS = bool(__import__("os").environ.get("RMQ_DRIVER_TLS"))
# RMQ_DRIVER_AK / RMQ_DRIVER_SK: the client's Credentials (default: none, as the client's own default)
ACCESS_KEY = __import__("os").environ.get("RMQ_DRIVER_AK", "")
SECRET_KEY = __import__("os").environ.get("RMQ_DRIVER_SK", "")


def message_body(topic: str, i: int) -> bytes:
    # binary and text, so byte-for-byte comparison means something
    return f"{topic}:{i}:".encode() + bytes(range(256)) + b"\x00end"


def produce(config, step):
    producer = Producer(config, (step["topic"],), tls_enable=TLS)
    producer.startup()
    out = []
    try:
        for i in range(step.get("start", 0), step.get("start", 0) + step["count"]):
            message = Message()
            message.topic = step["topic"]
            message.body = message_body(step["topic"], i)
            message.tag = f"tag{i % 3}"
            message.keys = f"key-{i}"
            message.add_property("index", str(i))
            message.add_property("kind", "test")
            try:
                receipt = producer.send(message)
            except Exception as error:  # with "tolerate" (a failover under way), note it and go on
                if not step.get("tolerate"):
                    raise
                out.append({"i": i, "error": repr(error)})
                continue
            out.append({"i": i, "id": receipt.message_id, "offset": receipt.offset, "queue": str(receipt.message_queue)})
            time.sleep(step.get("pause", 0))
    finally:
        producer.shutdown()
    return out


def describe(message):
    return {"id": message.message_id, "body": message.body.hex(), "tag": message.tag, "keys": sorted(message.keys),
            "props": dict(message.properties), "attempt": message.delivery_attempt}


class Session:
    def __init__(self, endpoint):
        credentials = Credentials(ACCESS_KEY, SECRET_KEY) if ACCESS_KEY else Credentials()
        self.config = ClientConfiguration(endpoint, credentials, request_timeout=5)
        self.consumers = {}
        self.slots = {}

    def consumer(self, group, topic, await_seconds):
        key = (group, topic)
        if key not in self.consumers:
            consumer = SimpleConsumer(self.config, group, {topic: FilterExpression()}, await_duration=await_seconds, tls_enable=TLS)
            consumer.startup()
            self.consumers[key] = consumer
        return self.consumers[key]

    def consume(self, step):
        consumer = self.consumer(step["group"], step["topic"], step.get("await", 2))
        got = []
        for _ in range(step.get("rounds", 20)):
            if len(got) >= step["want"]:
                break
            for message in consumer.receive(min(32, step["want"] - len(got)), step.get("invisible", 20)):
                got.append(message)
                if step.get("ack", True):
                    consumer.ack(message)
        self.slots[step.get("slot", "last")] = (consumer, got)
        return [describe(m) for m in got]

    def change(self, step):
        consumer, messages = self.slots[step["slot"]]
        self.slots[step["slot"] + "_old"] = (consumer, [copy.copy(m) for m in messages])
        for message in messages:
            consumer.change_invisible_duration(message, step["invisible"])
        return [m.message_id for m in messages]

    def ack(self, step):
        consumer, messages = self.slots[step["slot"]]
        out = []
        for message in messages:
            try:
                consumer.ack(message)
                out.append(None)
            except Exception as error:  # the test reads the code the proxy answered
                out.append(getattr(error, "code", None) or repr(error))
        return out

    def push(self, step):
        got, done, lock = [], threading.Event(), threading.Lock()
        fail_first = set(step.get("fail_first", ()))

        class Listener(MessageListener):
            def consume(self, message):
                with lock:
                    if message.message_id in fail_first and message.delivery_attempt == 1:
                        return ConsumeResult.FAILURE
                    got.append(describe(message))
                    if len(got) >= step["want"]:
                        done.set()
                return ConsumeResult.SUCCESS

        consumer = PushConsumer(self.config, step["group"], Listener(), {step["topic"]: FilterExpression()}, tls_enable=TLS)
        consumer.startup()
        try:
            done.wait(PUSH_TIMEOUT_SECONDS)
            time.sleep(step.get("linger", 0))  # to see whether anything more arrives
        finally:
            consumer.shutdown()
        with lock:
            return list(got)

    def close(self):
        for consumer in self.consumers.values():
            consumer.shutdown()


def main():
    endpoint, steps = sys.argv[1], json.loads(sys.argv[2])
    session = Session(endpoint)
    results = []
    try:
        for step in steps:
            try:
                if step["op"] == "produce":
                    results.append(produce(session.config, step))
                else:
                    results.append(getattr(session, step["op"])(step))
            except Exception as error:  # with "catch": the step's result is the error the client raised
                if not step.get("catch"):
                    raise
                results.append({"error": type(error).__name__, "code": getattr(error, "code", None), "message": str(error)})
    finally:
        session.close()
    sys.stdout.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
