"""Pure conversions between RocketMQ 5's gRPC messages and hasvc's records and statuses.

Nothing here does I/O: messages in, messages (or a :class:`Refused`) out. The rules follow
RocketMQ's proxy (``SendMessageActivity``, ``ReceiptHandle``) where hasvc has the same concept.

* A message id becomes an idempotent-send key: the official clients make v1 ids
  (``01 | MAC 6 | PID 2 | seconds 4 | counter 4``, hex), the counter increasing per process. The key
  is (a producer id derived from the client id of the connection, the counter), so a send the client
  retries with the same id is a retry to the broker (``docs/PROTOCOL.md`` SEND_IDEMPOTENT), however
  many proxies or proxy restarts lie between the attempts.
* Send statuses map as RocketMQ's proxy maps a SendResult; statuses it never sees (hasvc's refusals)
  map to the nearest code, never to OK.
* A receipt handle names a delivery: ``hasvc1 <queue> <queue offset> <nonce>``; the nonce changes
  on every delivery and every ChangeInvisibleDuration, so a stale handle is recognisable.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import zlib
from collections.abc import Mapping

from commitlog import record as rec
from hasvc.state.dedupe import PROPERTY_PRODUCER_ID, PROPERTY_PRODUCER_SEQ
from hasvc.proxy.pb import Code, definition

# RocketMQ's proxy: maxMessageSize 4 MiB (ProxyConfig), the broker's default as well.
BODY_SIZE_MAX_DEFAULT = rec.BODY_SIZE_MAX_DEFAULT
# RocketMQ's proxy: userPropertyMaxNum 128, maxUserPropertySize 16 KiB (ProxyConfig).
USER_PROPERTIES_MAX = 128
USER_PROPERTIES_SIZE_MAX = 16 * 1024
# RocketMQ's Validators: a topic name is at most 127 characters for the 4.x record format; hasvc's
# V2 records take 255 (commitlog.record.TOPIC_SIZE_MAX).
TOPIC_PATTERN = rec.TOPIC_PATTERN
# RocketMQ stores the client's message id as the UNIQ_KEY property (MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX).
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
KEYS_SEPARATOR = " "  # MessageConst.KEY_SEPARATOR
# Properties the proxy or the broker set; a user property of one of these names is refused, and
# they are not handed back as user properties (RocketMQ: MessageConst.STRING_HASH_SET).
SYSTEM_PROPERTIES = frozenset({rec.PROPERTY_TAGS, rec.PROPERTY_KEYS, PROPERTY_UNIQ_KEY, PROPERTY_PRODUCER_ID,
                               PROPERTY_PRODUCER_SEQ, "DELAY", "WAIT", "MIN_OFFSET", "MAX_OFFSET",
                               "TRAN_MSG", "__SHARDINGKEY", "TIMER_DELIVER_MS", "REAL_TOPIC", "REAL_QID"})  # fmt: skip
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MESSAGE_ID_V1 = re.compile(r"01[0-9A-Fa-f]{32}")
RECEIPT_HANDLE_PREFIX = "hasvc1"


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """A request or message the proxy answers with ``code`` and ``message`` (nothing stored)."""

    code: int
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Outgoing:
    """One message ready for hasvc's SEND_IDEMPOTENT."""

    topic: str
    body: bytes
    tags: str | None
    keys: str | None
    properties: dict[str, str]
    message_id: str


# Producer ids of this many recent client ids are remembered (a hash per send otherwise).
PRODUCER_IDS_CACHED_MAX = 4096


@functools.lru_cache(maxsize=PRODUCER_IDS_CACHED_MAX)
def producer_id_for(client_id: str) -> str:
    """The idempotent-send producer id of a client (at most 64 bytes, no 0x01/0x02)."""
    return "rmq-" + hashlib.blake2b(client_id.encode(), digest_size=12).hexdigest()


def message_id_sequence(message_id: str) -> int | None:
    """The per-process counter of a v1 message id, or None for any other id."""
    if not MESSAGE_ID_V1.fullmatch(message_id):
        return None
    return int(message_id[26:34], 16)


def check_topic(name: str, reserved_prefix: str) -> Refused | None:
    if not name or len(name) > rec.TOPIC_SIZE_MAX or not TOPIC_PATTERN.fullmatch(name):
        return Refused(Code.ILLEGAL_TOPIC, f"topic must be 1..{rec.TOPIC_SIZE_MAX} characters of [%|a-zA-Z0-9_-], got {name[:300]!r}")
    if name.startswith(reserved_prefix):
        return Refused(Code.ILLEGAL_TOPIC, f"topic {name!r} is reserved for the proxy (prefix {reserved_prefix!r})")
    return None


# RocketMQ's Validators: a consumer group is 1..255 characters of [%|a-zA-Z0-9_-].
GROUP_SIZE_MAX = 255


def check_group(name: str) -> Refused | None:
    if not name or len(name) > GROUP_SIZE_MAX or not TOPIC_PATTERN.fullmatch(name):
        return Refused(Code.ILLEGAL_CONSUMER_GROUP, f"consumer group must be 1..{GROUP_SIZE_MAX} characters of "
                                                    f"[%|a-zA-Z0-9_-], got {name[:300]!r}")  # fmt: skip
    return None


def outgoing(message, *, body_size_max: int) -> Outgoing | Refused:
    """Check one ``apache.rocketmq.v2.Message`` for sending, as RocketMQ's proxy does."""
    system = message.system_properties
    message_type = system.message_type
    if message_type not in (definition.NORMAL, definition.MESSAGE_TYPE_UNSPECIFIED):
        name = definition.MessageType.Name(message_type) if message_type in definition.MessageType.values() else str(message_type)
        return Refused(Code.UNSUPPORTED, f"hasvc proxy serves NORMAL messages only; {name} messages are not supported")
    if system.message_group or system.HasField("delivery_timestamp") or system.lite_topic:
        return Refused(Code.UNSUPPORTED, "hasvc proxy serves NORMAL messages only; message group (FIFO), delivery "
                                         "timestamp (delay) and lite topic are not supported")  # fmt: skip
    if not system.message_id:
        return Refused(Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
    if _CONTROL.search(system.message_id):  # stored as the UNIQ_KEY property: 0x01/0x02 would forge others
        return Refused(Code.ILLEGAL_MESSAGE_ID, f"message id {system.message_id[:80]!r} contains a control character")
    if len(message.body) == 0:
        return Refused(Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
    if len(message.body) > body_size_max:
        return Refused(Code.MESSAGE_BODY_TOO_LARGE, f"message body of {len(message.body)} bytes exceeds the max {body_size_max}")
    if system.body_encoding == definition.GZIP:
        return Refused(Code.UNSUPPORTED, "gzip-encoded bodies are not supported; send IDENTITY")
    tag = system.tag or None
    if tag is not None and (not tag.strip() or "|" in tag or _CONTROL.search(tag)):
        return Refused(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} is blank, contains '|' or a control character")
    for key in system.keys:
        if not key.strip() or _CONTROL.search(key):
            return Refused(Code.ILLEGAL_MESSAGE_KEY, f"key {key!r} is blank or contains a control character")
    refused = _check_user_properties(message.user_properties)
    if refused is not None:
        return refused
    properties = dict(message.user_properties)
    properties[PROPERTY_UNIQ_KEY] = system.message_id
    keys = KEYS_SEPARATOR.join(system.keys) or None
    return Outgoing(message.topic.name, bytes(message.body), tag, keys, properties, system.message_id)


def _check_user_properties(properties: Mapping[str, str]) -> Refused | None:
    if len(properties) > USER_PROPERTIES_MAX:
        return Refused(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"{len(properties)} user properties, the max is {USER_PROPERTIES_MAX}")
    size = 0
    for key, value in properties.items():
        if key in SYSTEM_PROPERTIES:
            return Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property is used by the system: {key}")
        if not key or _CONTROL.search(key):
            return Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property key {key!r} is empty or contains a control character")
        if _CONTROL.search(value):
            return Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"the value of property {key!r} contains a control character")
        size += len(key.encode()) + len(value.encode())
    if size > USER_PROPERTIES_SIZE_MAX:
        return Refused(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"user properties of {size} bytes, the max is {USER_PROPERTIES_SIZE_MAX}")
    return None


# hasvc's put statuses (docs/PROTOCOL.md) as RocketMQ's proxy maps SendStatus (SendMessageActivity):
# SEND_OK -> OK, FLUSH_DISK_TIMEOUT -> MASTER_PERSISTENCE_TIMEOUT, FLUSH_SLAVE_TIMEOUT ->
# SLAVE_PERSISTENCE_TIMEOUT, SLAVE_NOT_AVAILABLE -> HA_NOT_AVAILABLE. The broker refusals RocketMQ
# answers as remoting errors map to what its ResponseBuilder makes of them.
SEND_STATUS_CODES: Mapping[str, int] = {
    "PUT_OK": Code.OK,
    "FLUSH_DISK_TIMEOUT": Code.MASTER_PERSISTENCE_TIMEOUT,
    "FLUSH_SLAVE_TIMEOUT": Code.SLAVE_PERSISTENCE_TIMEOUT,
    "SLAVE_NOT_AVAILABLE": Code.HA_NOT_AVAILABLE,
    "MESSAGE_ILLEGAL": Code.BAD_REQUEST,
    "PROPERTIES_SIZE_EXCEEDED": Code.MESSAGE_PROPERTIES_TOO_LARGE,
    "OS_PAGE_CACHE_BUSY": Code.TOO_MANY_REQUESTS,
}


def send_status_code(status: str) -> int:
    """The gRPC code for a hasvc put status; only PUT_OK is OK."""
    return SEND_STATUS_CODES.get(status, Code.INTERNAL_SERVER_ERROR)


def encode_receipt_handle(queue_id: int, queue_offset: int, nonce: int) -> str:
    return f"{RECEIPT_HANDLE_PREFIX} {queue_id} {queue_offset} {nonce:x}"


def decode_receipt_handle(handle: str) -> tuple[int, int, int] | None:
    """(queue id, queue offset, nonce), or None when ``handle`` is not one of ours."""
    parts = handle.split(" ")
    if len(parts) != 4 or parts[0] != RECEIPT_HANDLE_PREFIX:
        return None
    try:
        queue_id, queue_offset, nonce = int(parts[1], 10), int(parts[2], 10), int(parts[3], 16)
    except ValueError:
        return None
    if not (0 <= queue_id < 2**31 and 0 <= queue_offset < 2**63 and 0 <= nonce < 2**64):
        return None
    if encode_receipt_handle(queue_id, queue_offset, nonce) != handle:
        return None  # only the canonical spelling ("+1", "01", other digits than ASCII are not ours)
    return queue_id, queue_offset, nonce


def message_id_of(record: rec.Record) -> str:
    """The client's message id (UNIQ_KEY), or one made from the physical offset for a message
    another client stored (RocketMQ's offset message id is the store host and the offset)."""
    return record.properties.get(PROPERTY_UNIQ_KEY) or f"00{record.physical_offset:032X}"


def _timestamp(target, milliseconds: int) -> None:
    target.seconds, target.nanos = divmod(milliseconds, 1000)
    target.nanos *= 1_000_000


def delivered_message(record: rec.Record, *, receipt_handle: str, attempt: int, invisible_ms: int):
    """An ``apache.rocketmq.v2.Message`` for a record delivered to a consumer."""
    message = definition.Message()
    message.topic.name = record.topic
    message.body = bytes(record.body)
    for key, value in record.properties.items():
        if key not in SYSTEM_PROPERTIES:
            message.user_properties[key] = value
    system = message.system_properties
    if record.tags:
        system.tag = record.tags
    if record.keys:
        system.keys.extend(k for k in record.keys.split(KEYS_SEPARATOR) if k)
    system.message_id = message_id_of(record)
    system.body_digest.type = definition.CRC32
    system.body_digest.checksum = f"{zlib.crc32(message.body):08X}"
    system.body_encoding = definition.IDENTITY
    system.message_type = definition.NORMAL
    _timestamp(system.born_timestamp, record.born_timestamp)
    system.born_host = record.born_host[0]
    _timestamp(system.store_timestamp, record.store_timestamp)
    system.store_host = f"{record.store_host[0]}:{record.store_host[1]}"
    system.receipt_handle = receipt_handle
    system.queue_id = record.queue_id
    system.queue_offset = record.queue_offset
    system.invisible_duration.seconds, rest = divmod(invisible_ms, 1000)
    system.invisible_duration.nanos = rest * 1_000_000
    system.delivery_attempt = attempt
    return message


def tag_filter(expression) -> frozenset[str] | None | Refused:
    """The tags a TAG filter expression accepts (None: all), or a Refused for SQL92."""
    if expression is None or expression.type == definition.SQL:
        if expression is not None and expression.type == definition.SQL:
            return Refused(Code.UNSUPPORTED, "SQL92 filter expressions are not supported; use a TAG expression")
        return None
    text = expression.expression.strip()
    if not text or text == "*":
        return None
    return frozenset(part.strip() for part in text.split("||") if part.strip())
