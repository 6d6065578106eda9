"""The proxy's connection and message limits, as grpc server options (grpc core's channel args),
and the limit of its queue of consumer progress events.

Every connection the proxy accepts is bounded by gRPC itself once these are set: a message's size
both ways, the streams one connection may hold open, how long a connection may take to finish its
handshake and how long one may stay with no call at all; and the calls of the whole process. A
stream's unread answers are left to grpc's HTTP/2 flow control (a handler's ``write`` completes
once grpc's transport takes the message; not measured here), so what a client that never reads
can make the proxy hold is, by grpc's design, bounded by its streams times a message.

Consumer progress (deliveries, acks, invisible-time changes) waits in one queue for the progress
topic's writer (``hasvc/proxy/progress_log.py``); while the brokers are slow or unreachable it
stops draining, so it has a limit of its own: ``progress_events_queued_max``. The messages a
receive took from the brokers wait in its handler until grpc takes them (a consumer that does not
read holds them), all streams together under ``receive_bytes_held_max``.

``hasvc proxy --set NAME=VALUE`` sets any of them (``hasvc config list --process proxy``).
"""

from __future__ import annotations

import dataclasses

from commitlog.setting import check_settings, setting
from hasvc.protocol import client as client_protocol

STREAMS_PER_CONNECTION_MAX_DEFAULT = 1024
PROGRESS_EVENTS_QUEUED_MAX_DEFAULT = 65_536
RECEIVE_BYTES_HELD_MAX_DEFAULT = 256 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ProxyLimits:
    handshake_timeout_seconds: float = setting(
        5.0, "A connection that has not finished its TLS and HTTP/2 handshake by then is closed (grpc core's default is "
        "120 s: 500 one-byte connections were still held after 12 s). The official clients connect over the brokers' "
        "network: a handshake is two or three round trips.", above=0)  # fmt: skip
    connection_idle_seconds: float = setting(
        300.0, "A connection with no call in progress for this long is closed (GOAWAY; a client reconnects when it next "
        "calls). The official clients keep a Telemetry stream open for their whole life, so a live client is never "
        "idle; 5 minutes is Kafka's connections.max.idle.ms (9 min) halved.", above=0)  # fmt: skip
    keepalive_seconds: float = setting(
        60.0, "The proxy pings a connection silent this long, and closes it if the ping is not answered in "
        "ping_timeout_seconds: a client that vanished without a FIN does not hold its streams for ever.", above=0)  # fmt: skip
    ping_timeout_seconds: float = setting(20.0, "How long a keepalive ping may go unanswered before the connection is "
                                          "closed (keepalive_seconds).", above=0)  # fmt: skip
    streams_per_connection_max: int = setting(
        STREAMS_PER_CONNECTION_MAX_DEFAULT, "Streams one connection may have open at once (HTTP/2 "
        "SETTINGS_MAX_CONCURRENT_STREAMS; grpc's default is unbounded). A client's producer sends and its consumers' "
        "long-polling receives share one channel: 1,024 is 16x the 64 concurrent sends the load generator keeps in "
        "flight.", unit="streams", above=0)  # fmt: skip
    calls_max: int = setting(
        10 * STREAMS_PER_CONNECTION_MAX_DEFAULT, "Calls the whole process serves at once; beyond, a call is refused "
        "RESOURCE_EXHAUSTED (grpc's maximum_concurrent_rpcs): 10 connections' worth of full streams.",
        unit="calls", above=0)  # fmt: skip
    message_overhead_max: int = setting(
        1024 * 1024, "What a message may carry beyond its body (properties, system properties, the envelope): a "
        "received message may be this much larger than the body limit.", unit="bytes", above=0)  # fmt: skip
    progress_events_queued_max: int = setting(
        PROGRESS_EVENTS_QUEUED_MAX_DEFAULT, "Consumer progress events (deliveries, acks, invisible-time changes) "
        "waiting for the progress topic's writer; when the next call's would not fit, ReceiveMessage, AckMessage, "
        "ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue are refused TOO_MANY_REQUESTS (RocketMQ's proxy's "
        "flow-control answer, which the official consumers retry) until the brokers take the queue. 16 full event "
        "records (4,096 events each): a few seconds of the fastest consumption while the brokers stall; ~300 bytes a "
        "delivery event, ~20 MiB in all. Receives do not wait for their events to be stored, so without it a consumer "
        "grew the queue for as long as the brokers stalled; acks also hold their call until stored (calls_max).",
        unit="events", above=0)  # fmt: skip
    receive_bytes_held_max: int = setting(
        RECEIVE_BYTES_HELD_MAX_DEFAULT, "Bodies of the messages ReceiveMessage calls took from the brokers and grpc has "
        "not yet taken from them, all streams together: a consumer that does not read holds its receive's messages (up "
        "to 32) in the proxy. While reached, a new receive is refused TOO_MANY_REQUESTS (the official consumers retry). "
        "The brokers' client_answer_bytes_total_max is 256 MiB too; receives already under way may add theirs.",
        unit="bytes", above=0)  # fmt: skip

    def validate(self) -> ProxyLimits:
        check_settings(self)  # each field's type and range (every one > 0)
        return self


def server_options(body_size_max: int, limits: ProxyLimits = ProxyLimits()) -> list[tuple[str, int]]:
    """The grpc.aio.server options for a proxy whose message bodies are at most ``body_size_max``."""
    # A message received from a broker arrived in one client frame, whatever this proxy's body limit.
    send_max = max(body_size_max + limits.message_overhead_max, client_protocol.FRAME_SIZE_MAX_DEFAULT)
    return [
        ("grpc.max_receive_message_length", body_size_max + limits.message_overhead_max),
        ("grpc.max_send_message_length", send_max),
        ("grpc.max_concurrent_streams", limits.streams_per_connection_max),
        ("grpc.server_handshake_timeout_ms", int(limits.handshake_timeout_seconds * 1000)),
        ("grpc.max_connection_idle_ms", int(limits.connection_idle_seconds * 1000)),
        ("grpc.keepalive_time_ms", int(limits.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", int(limits.ping_timeout_seconds * 1000)),
    ]
