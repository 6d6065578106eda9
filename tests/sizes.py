"""Sizes the storage tests share."""

# Small segments so tests roll files often; RocketMQ's defaults are in StoreConfig.
SEGMENT_SIZE = 64 * 1024
