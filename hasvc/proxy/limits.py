"""The proxy's connection and message limits, as grpc server options (grpc core's channel args).

Every connection the proxy accepts is bounded by gRPC itself once these are set: a message's size
both ways, the streams one connection may hold open, how long a connection may take to finish its
handshake and how long one may stay with no call at all; and the calls of the whole process. A
stream's unread answers are left to grpc's HTTP/2 flow control (a handler's ``write`` completes
once grpc's transport takes the message; not measured here), so what a client that never reads
can make the proxy hold is, by grpc's design, bounded by its streams times a message.
"""

from __future__ import annotations

from hasvc.protocol import client as client_protocol

# A connection that has not finished its TLS and HTTP/2 handshake by then is closed (grpc core's
# default is 120 s: 500 one-byte connections were still held after 12 s). The official clients
# connect over the brokers' network: a handshake is two or three round trips.
HANDSHAKE_TIMEOUT_SECONDS = 5.0
# A connection with no call in progress for this long is closed (GOAWAY; a client reconnects when
# it next calls). The official clients keep a Telemetry stream open for their whole life, so a
# live client is never idle; 5 minutes is Kafka's connections.max.idle.ms (9 min) halved.
CONNECTION_IDLE_SECONDS = 300.0
# The proxy pings a connection silent this long, and closes it if the ping is not answered in
# PING_TIMEOUT_SECONDS: a client that vanished without a FIN does not hold its streams for ever.
KEEPALIVE_SECONDS = 60.0
PING_TIMEOUT_SECONDS = 20.0
# Streams one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; grpc's
# default is unbounded). A client's producer sends and its consumers' long-polling receives share
# one channel: 1,024 is 16x the 64 concurrent sends the load generator keeps in flight.
STREAMS_PER_CONNECTION_MAX = 1024
# Calls the whole process serves at once; beyond, a call is refused RESOURCE_EXHAUSTED (grpc's
# maximum_concurrent_rpcs): 10 connections' worth of full streams.
CALLS_MAX = 10 * STREAMS_PER_CONNECTION_MAX
# What a message may carry beyond its body (properties, system properties, the envelope).
MESSAGE_OVERHEAD_MAX = 1024 * 1024


def server_options(body_size_max: int) -> list[tuple[str, int]]:
    """The grpc.aio.server options for a proxy whose message bodies are at most ``body_size_max``."""
    # A message received from a broker arrived in one client frame, whatever this proxy's body limit.
    send_max = max(body_size_max + MESSAGE_OVERHEAD_MAX, client_protocol.FRAME_SIZE_MAX_DEFAULT)
    return [
        ("grpc.max_receive_message_length", body_size_max + MESSAGE_OVERHEAD_MAX),
        ("grpc.max_send_message_length", send_max),
        ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION_MAX),
        ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_SECONDS * 1000)),
        ("grpc.max_connection_idle_ms", int(CONNECTION_IDLE_SECONDS * 1000)),
        ("grpc.keepalive_time_ms", int(KEEPALIVE_SECONDS * 1000)),
        ("grpc.keepalive_timeout_ms", int(PING_TIMEOUT_SECONDS * 1000)),
    ]
