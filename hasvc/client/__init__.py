"""The client library.

    async with hasvc.client.connect("127.0.0.1:10911", secret=None) as client:
        result = await client.send("Orders", b"hello", tags="new", keys="order-1")
        records = await client.pull("Orders", 0, 0, count_max=32)

    client = hasvc.client.BlockingClient("127.0.0.1:10911")   # same methods, for scripts
    client.send("Orders", b"hello"); client.close()

The package, one module per concern (every name is importable from ``hasvc.client``):

    results      ClientError, DamagedRecordError, SendResult, PullResult, TransferResult, message_properties
    connection   connect and Client: one connection to one broker
    cluster      connect_cluster and FailoverClient: follows the master among several brokers
    blocking     BlockingClient: the same calls, blocking, on a private trio thread

One connection carries many requests at once: each has a request id and its response may come in
any order, so a single connection can carry a whole benchmark's load.
"""

from hasvc.client.blocking import BlockingClient
from hasvc.client.cluster import (
    FAILOVER_BACKOFF_MAX_SECONDS,
    FAILOVER_BACKOFF_MIN_SECONDS,
    FAILOVER_TIMEOUT_SECONDS,
    STATUS_TIMEOUT_SECONDS,
    FailoverClient,
    connect_cluster,
)
from hasvc.client.connection import REQUEST_TIMEOUT_SECONDS, Client, connect
from hasvc.client.results import ClientError, ConnectError, DamagedRecordError, PullResult, SendResult, TransferResult, message_properties

__all__ = [
    "FAILOVER_BACKOFF_MAX_SECONDS", "FAILOVER_BACKOFF_MIN_SECONDS", "FAILOVER_TIMEOUT_SECONDS",
    "REQUEST_TIMEOUT_SECONDS", "STATUS_TIMEOUT_SECONDS", "BlockingClient", "Client", "ClientError", "ConnectError", "DamagedRecordError",
    "FailoverClient", "PullResult", "SendResult", "TransferResult", "connect", "connect_cluster",
    "message_properties",
]  # fmt: skip
