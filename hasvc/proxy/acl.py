"""Client authentication and authorization of the proxy (``hasvc proxy --acl FILE``), as RocketMQ 5's
ACL does it for the official clients. Pure: no gRPC, no clock (``now`` is an argument).

Theory of operation
-------------------
Every call of an official RocketMQ 5 client carries two headers (Java ``rpc/Signature.java``, Python
``rocketmq/v5/util/signature.py`` in apache/rocketmq-clients)::

    x-mq-date-time: 20260101T120000Z
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>

where the signature is hex(HMAC-SHA1(secret key, the x-mq-date-time value)). ``authenticate``
finds the account by its access key and checks the signature and the time; ``authorize`` checks
the account's topic and group patterns and actions (``pub``: send, route; ``sub``: route,
assignment, receive, ack, change invisible duration, dead-letter). Nothing is kept per client.

The time: both clients format their *local* time with a literal ``Z`` (Java's SimpleDateFormat
and Python's ``datetime.now()`` use the machine's zone), so an honest client in UTC+9 stamps a
time 9 hours ahead of UTC. By default (``any_time_zone = true``) a time is accepted when it lies
within ``clock_skew_seconds`` of now in some real time zone: from UTC-12:00 to UTC+14:00, widened by
the skew. That still refuses a signature replayed days later and a time that is no time at all,
but a captured header can be replayed for about a day: the signature covers the time only (not the
call), as in RocketMQ. Use the TLS listener where a listener can be overheard.
``any_time_zone = false`` narrows the window to ``clock_skew_seconds`` around UTC, for clients
known to run in UTC.

File format (TOML)::

    clock_skew_seconds = 300     # optional
    any_time_zone = true         # optional

    [[account]]
    access_key = "orders-app"
    secret_key = "a long random string"
    topics = ["Orders*"]         # fnmatch patterns over hasvc topic names (namespace%name with a namespace)
    groups = ["orders-*"]        # consumer groups, the same way
    actions = ["pub", "sub"]
"""

from __future__ import annotations

import calendar
import dataclasses
import fnmatch
import hashlib
import hmac
import tomllib

ALGORITHM = "MQv2-HMAC-SHA1"
AUTHORIZATION_HEADER = "authorization"
DATE_TIME_HEADER = "x-mq-date-time"
ACTIONS = ("pub", "sub")
# Kerberos' default tolerance of clocks that disagree (5 minutes).
CLOCK_SKEW_SECONDS_DEFAULT = 300
# The UTC offsets of real time zones: UTC-12:00 (Baker Island) to UTC+14:00 (Line Islands).
ZONE_OFFSET_MIN_SECONDS = -12 * 3600
ZONE_OFFSET_MAX_SECONDS = 14 * 3600
# An access key is at most this long (the header is bounded by gRPC's metadata limit anyway;
# this keeps a refusal's log line short).
ACCESS_KEY_SIZE_MAX = 256
# Signatures verified lately, (authorization, x-mq-date-time) -> (account, time): a client's calls
# within one second carry the same pair, and a hit skips the HMAC and the parse (~6 of ~7 us a
# call). The window is checked on every call all the same. Emptied when full: a bound, not an LRU.
VERIFIED_SIGNATURES_MAX = 4096
_ACCOUNT_KEYS = {"access_key", "secret_key", "topics", "groups", "actions"}
_TOP_KEYS = {"account", "clock_skew_seconds", "any_time_zone"}

# Why a call was refused: the label of the proxy's hasvc_proxy_acl_refused counter.
UNSIGNED, UNKNOWN_KEY, BAD_SIGNATURE, EXPIRED, NOT_PERMITTED = "unsigned", "unknown_key", "bad_signature", "expired", "not_permitted"
REASONS = (UNSIGNED, UNKNOWN_KEY, BAD_SIGNATURE, EXPIRED, NOT_PERMITTED)


@dataclasses.dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: bytes = dataclasses.field(repr=False)
    topics: tuple[str, ...]
    groups: tuple[str, ...]
    actions: frozenset[str]

    def may(self, action: str, *, topic: str | None = None, group: str | None = None) -> bool:
        if action not in self.actions:
            return False
        if topic is not None and not any(fnmatch.fnmatchcase(topic, pattern) for pattern in self.topics):
            return False
        return group is None or any(fnmatch.fnmatchcase(group, pattern) for pattern in self.groups)


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A refused call: ``authenticated`` False answers UNAUTHORIZED, True FORBIDDEN."""

    reason: str  # one of REASONS
    message: str
    authenticated: bool = False


@dataclasses.dataclass(frozen=True)
class Acl:
    accounts: dict[str, Account]
    clock_skew_seconds: float = CLOCK_SKEW_SECONDS_DEFAULT
    any_time_zone: bool = True
    _verified: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def authenticate(self, authorization: str | None, date_time: str | None, *, now: float) -> Account | Refusal:
        """The account whose key signed the call, or why not. ``now``: seconds since the epoch."""
        if not authorization or not date_time:
            return Refusal(UNSIGNED, "the call is not signed: give the client an access key and secret key (Credentials)")
        verified = self._verified.get((authorization, date_time))
        if verified is None:
            verified = self._verify(authorization, date_time)
            if isinstance(verified, Refusal):
                return verified
            if len(self._verified) >= VERIFIED_SIGNATURES_MAX:
                self._verified.clear()
            self._verified[authorization, date_time] = verified
        account, stamped = verified
        ahead = stamped - now
        low, high = -self.clock_skew_seconds, self.clock_skew_seconds
        if self.any_time_zone:
            low, high = low + ZONE_OFFSET_MIN_SECONDS, high + ZONE_OFFSET_MAX_SECONDS
        if not low <= ahead <= high:
            return Refusal(EXPIRED, f"x-mq-date-time {date_time} is {ahead:+.0f} s from now, outside the window "
                                    f"{low:+.0f}..{high:+.0f} s (a replayed signature, or a wrong clock)")  # fmt: skip
        return account

    def _verify(self, authorization: str, date_time: str) -> tuple[Account, float] | Refusal:
        """The signing account and the signed time, or why not (the window aside)."""
        parsed = parse_authorization(authorization)
        if parsed is None:
            return Refusal(UNSIGNED, f"the authorization header is not {ALGORITHM} Credential=..., SignedHeaders=x-mq-date-time, Signature=...")
        access_key, signature = parsed
        if not access_key:
            return Refusal(UNSIGNED, "the call is signed without an access key: give the client Credentials")
        account = self.accounts.get(access_key)
        if account is None:
            return Refusal(UNKNOWN_KEY, f"unknown access key {access_key[:ACCESS_KEY_SIZE_MAX]!r}")
        expected = hmac.new(account.secret_key, date_time.encode(), hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, signature.lower()):
            return Refusal(BAD_SIGNATURE, f"the signature of access key {access_key!r} is wrong (another secret key?)")
        stamped = parse_date_time(date_time)
        if stamped is None:
            return Refusal(EXPIRED, f"x-mq-date-time {date_time[:32]!r} is not yyyyMMddTHHmmssZ")
        return account, stamped

    @staticmethod
    def authorize(account: Account, actions: tuple[str, ...], *, topic: str | None = None, group: str | None = None) -> Refusal | None:
        """None when ``account`` may do one of ``actions`` on ``topic`` (and ``group``), else why not."""
        if any(account.may(action, topic=topic, group=group) for action in actions):
            return None
        what = " ".join(part for part in (f"topic {topic}" if topic else "", f"group {group}" if group else "") if part)
        return Refusal(NOT_PERMITTED, f"access key {account.access_key!r} may not {'/'.join(actions)} on {what or 'this resource'}",
                       authenticated=True)  # fmt: skip


def parse_authorization(value: str) -> tuple[str, str] | None:
    """(access key, signature) of an ``MQv2-HMAC-SHA1`` header that signs x-mq-date-time, else None."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        return None
    fields = {}
    for part in rest.split(","):
        name, separator, field_value = part.strip().partition("=")
        if not separator:
            return None
        fields[name] = field_value
    if fields.get("SignedHeaders", "").lower() != DATE_TIME_HEADER or "Credential" not in fields or "Signature" not in fields:
        return None
    return fields["Credential"], fields["Signature"]


def parse_date_time(text: str) -> float | None:
    """yyyyMMddTHHmmssZ as seconds since the epoch (read as UTC), None when it is not one."""
    if len(text) != 16 or text[8] != "T" or text[15] != "Z" or not (text[:8] + text[9:15]).isdigit():
        return None
    try:
        fields = (int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[9:11]), int(text[11:13]), int(text[13:15]))
        if not (1 <= fields[1] <= 12 and 1 <= fields[2] <= 31 and fields[3] < 24 and fields[4] < 60 and fields[5] < 61):
            return None
        return float(calendar.timegm((*fields, 0, 0, 0)))
    except (ValueError, OverflowError):
        return None


def load_acl(path: str) -> Acl:
    """The ACL file (see the module); ValueError, one line naming the file, when it is not one."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as error:
        raise ValueError(f"cannot read the ACL file {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"the ACL file {path} is not TOML: {error}") from None
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"the ACL file {path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_TOP_KEYS))})")
    skew = data.get("clock_skew_seconds", CLOCK_SKEW_SECONDS_DEFAULT)
    if not isinstance(skew, int | float) or isinstance(skew, bool) or skew < 0:
        raise ValueError(f"the ACL file {path}: clock_skew_seconds must be a number of seconds >= 0")
    any_time_zone = data.get("any_time_zone", True)
    if not isinstance(any_time_zone, bool):
        raise ValueError(f"the ACL file {path}: any_time_zone must be true or false")
    tables = data.get("account", [])
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"the ACL file {path} has no [[account]]: every call would be refused")
    accounts: dict[str, Account] = {}
    for number, table in enumerate(tables, 1):
        account = _account(path, number, table)
        if account.access_key in accounts:
            raise ValueError(f"the ACL file {path}: access key {account.access_key!r} appears twice")
        accounts[account.access_key] = account
    return Acl(accounts, clock_skew_seconds=float(skew), any_time_zone=any_time_zone)


def _account(path: str, number: int, table) -> Account:
    where = f"the ACL file {path}, account {number}"
    if not isinstance(table, dict):
        raise ValueError(f"{where}: not a table")
    unknown = sorted(set(table) - _ACCOUNT_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_ACCOUNT_KEYS))})")
    for key in ("access_key", "secret_key"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise ValueError(f"{where}: {key} must be a non-empty string")
    if len(table["access_key"]) > ACCESS_KEY_SIZE_MAX or any(c in table["access_key"] for c in ", ="):
        raise ValueError(f"{where}: access_key must be at most {ACCESS_KEY_SIZE_MAX} characters without ',', '=' or spaces")
    lists = {}
    for key in ("topics", "groups", "actions"):
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            raise ValueError(f"{where}: {key} must be a list of non-empty strings")
        lists[key] = tuple(value)
    wrong = sorted(set(lists["actions"]) - set(ACTIONS))
    if wrong or not lists["actions"]:
        raise ValueError(f"{where}: actions must be a non-empty list of {', '.join(ACTIONS)}")
    return Account(table["access_key"], table["secret_key"].encode(), lists["topics"], lists["groups"], frozenset(lists["actions"]))
