"""``hasvc proxy``: RocketMQ 5's gRPC MessagingService in front of hasvc (docs/PROXY.md).

convert (pure message/status/handle conversions), progress (pure consumer-group state), gateway
(the trio side: sends, receives, acks, the progress topic), server (grpc.aio and the bridge), cli.
"""
