"""One send of a drill's producer, shared by the DLedger and controller-mode drills.

A drill's producers write uniquely numbered messages (``m<number>:`` and 200 filler bytes, queue
``number % 4``) through the failover client for the whole drill. ``send_numbered`` is one such
send: it waits while the drill is paused (its checks read the stores, which must stand still),
counts the send as in flight while it runs (a send started before a pause may still be stored:
the checks wait until none is in flight), and records a PUT_OK's offset in ``drill.acked``.
What a drill does with the answer besides (when and by whom it was acknowledged) is its own.
"""

from __future__ import annotations

import time

import trio

from hasvc import client as hc

PAUSED_POLL_SECONDS = 0.01  # a paused producer looks again this often (a round's checks take seconds)
FILLER_SIZE = 200  # bytes after the number: records of a realistic small size
QUEUES = 4  # the drill topic's queues the messages spread over


async def send_numbered(drill, client: hc.FailoverClient, topic: str) -> tuple[int, float, hc.SendResult | None]:
    """(number, ``time.monotonic()`` when the send started, the answer or None when the failover
    client gave up). ``drill`` has ``paused``, ``next_number``, ``sends_in_flight`` and ``acked``
    (message number -> acknowledged offset)."""
    while drill.paused:
        await trio.sleep(PAUSED_POLL_SECONDS)
    number = drill.next_number
    drill.next_number += 1
    started = time.monotonic()
    drill.sends_in_flight += 1
    try:
        result = await client.send(topic, f"m{number}:".encode() + b"d" * FILLER_SIZE, queue_id=number % QUEUES)
    except hc.ClientError:
        return number, started, None  # not acknowledged: the failover client found nobody to take it in time
    finally:
        drill.sends_in_flight -= 1
    if result.status == "PUT_OK":
        drill.acked[number] = result.offset
    return number, started, result
