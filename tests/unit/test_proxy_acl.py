"""hasvc/proxy/acl.py: the official clients' MQv2-HMAC-SHA1 signature checked, the time window, the
account's permissions, and the ACL file's one-line errors."""

import calendar
import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hasvc.proxy import acl
from hasvc.proxy.acl import Acl, Account, Refusal, load_acl, parse_authorization, parse_date_time

NOW = float(calendar.timegm((2026, 6, 1, 12, 0, 0, 0, 0, 0)))  # 20260601T120000Z
ACCOUNT = Account("orders-app", b"orders-secret", ("Orders*",), ("orders-*",), frozenset({"pub", "sub"}))
RULES = Acl({ACCOUNT.access_key: ACCOUNT})


def signed(date_time: str, access_key: str = "orders-app", secret: bytes = b"orders-secret") -> str:
    """The header as rocketmq/v5/util/signature.py (and the Java client's Signature) writes it."""
    signature = hmac.new(secret, date_time.encode(), hashlib.sha1).hexdigest()
    return f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={signature}"


def stamp(seconds: float) -> str:
    year, month, day, hour, minute, second = __import__("time").gmtime(seconds)[:6]
    return f"{year:04d}{month:02d}{day:02d}T{hour:02d}{minute:02d}{second:02d}Z"


def test_a_call_signed_with_the_accounts_secret_is_its_accounts():
    assert RULES.authenticate(signed("20260601T120000Z"), "20260601T120000Z", now=NOW) is ACCOUNT


@pytest.mark.parametrize("authorization, date_time, reason", [
    (None, "20260601T120000Z", acl.UNSIGNED),
    (signed("20260601T120000Z"), None, acl.UNSIGNED),
    ("Bearer abc", "20260601T120000Z", acl.UNSIGNED),
    (signed("20260601T120000Z", access_key=""), "20260601T120000Z", acl.UNSIGNED),
    (signed("20260601T120000Z", access_key="bogus-ak"), "20260601T120000Z", acl.UNKNOWN_KEY),
    (signed("20260601T120000Z", secret=b"wrong"), "20260601T120000Z", acl.BAD_SIGNATURE),
    (signed("20260601T120000Z"), "20260601T120001Z", acl.BAD_SIGNATURE),  # the time is what is signed
    (signed("20260530T120000Z"), "20260530T120000Z", acl.EXPIRED),  # two days old
    (signed("2026-06-01"), "2026-06-01", acl.EXPIRED),
])  # fmt: skip
def test_refused_calls_say_why_and_are_unauthorized(authorization, date_time, reason):
    refusal = RULES.authenticate(authorization, date_time, now=NOW)
    assert isinstance(refusal, Refusal)
    assert refusal.reason == reason
    assert not refusal.authenticated  # answered UNAUTHORIZED


@pytest.mark.parametrize("offset_hours", [-12, -9.5, 0, 5.75, 9, 14])
def test_a_client_stamping_its_local_time_with_a_z_is_accepted_in_any_real_zone(offset_hours):
    date_time = stamp(NOW + offset_hours * 3600 + 60)  # and a minute of clock skew
    assert RULES.authenticate(signed(date_time), date_time, now=NOW) is ACCOUNT


@pytest.mark.parametrize("offset_seconds", [-12 * 3600 - 301, 14 * 3600 + 301])
def test_a_time_beyond_every_zone_and_the_skew_is_refused(offset_seconds):
    date_time = stamp(NOW + offset_seconds)
    assert RULES.authenticate(signed(date_time), date_time, now=NOW).reason == acl.EXPIRED


def test_utc_only_narrows_the_window_to_the_skew():
    rules = Acl({ACCOUNT.access_key: ACCOUNT}, clock_skew_seconds=60, any_time_zone=False)
    inside, outside = stamp(NOW + 59), stamp(NOW + 9 * 3600)
    assert rules.authenticate(signed(inside), inside, now=NOW) is ACCOUNT
    assert rules.authenticate(signed(outside), outside, now=NOW).reason == acl.EXPIRED


def test_permissions_follow_the_patterns_and_actions():
    assert Acl.authorize(ACCOUNT, ("pub",), topic="Orders-eu") is None
    assert Acl.authorize(ACCOUNT, ("sub",), topic="Orders-eu", group="orders-billing") is None
    refusal = Acl.authorize(ACCOUNT, ("pub",), topic="Payments")
    assert refusal.reason == acl.NOT_PERMITTED and refusal.authenticated  # answered FORBIDDEN
    assert Acl.authorize(ACCOUNT, ("sub",), topic="Orders-eu", group="payments").reason == acl.NOT_PERMITTED
    publisher = Account("p", b"s", ("*",), ("*",), frozenset({"pub"}))
    assert Acl.authorize(publisher, ("sub",), topic="T", group="g") is not None
    assert Acl.authorize(publisher, ("pub", "sub"), topic="T") is None  # a route query: either will do


@given(st.text(max_size=200))
def test_parse_authorization_never_raises(text):
    parsed = parse_authorization(text)
    assert parsed is None or (isinstance(parsed[0], str) and isinstance(parsed[1], str))


@given(st.text(max_size=40))
def test_parse_date_time_never_raises(text):
    value = parse_date_time(text)
    assert value is None or isinstance(value, float)


@given(st.integers(min_value=0, max_value=4_000_000_000))
def test_parse_date_time_round_trips(seconds):
    assert parse_date_time(stamp(seconds)) == seconds


@pytest.mark.parametrize("text, named", [
    ("not toml [", "is not TOML"),
    ("", "has no [[account]]"),
    ('colour = "red"\n[[account]]\naccess_key = "a"\nsecret_key = "b"\nactions = ["pub"]\n', "unknown key(s) colour"),
    ('[[account]]\naccess_key = "a"\nactions = ["pub"]\n', "secret_key must be a non-empty string"),
    ('[[account]]\naccess_key = "a"\nsecret_key = "b"\nactions = ["publish"]\n', "actions must be"),
    ('[[account]]\naccess_key = "a"\nsecret_key = "b"\nactions = ["pub"]\ntopics = "T*"\n', "topics must be a list"),
    ('[[account]]\naccess_key = "a"\nsecret_key = "b"\nactions = ["pub"]\n' * 2, "appears twice"),
    ('clock_skew_seconds = -1\n[[account]]\naccess_key = "a"\nsecret_key = "b"\nactions = ["pub"]\n', "clock_skew_seconds"),
])  # fmt: skip
def test_a_bad_acl_file_is_one_line_naming_it(tmp_path, text, named):
    path = tmp_path / "acl.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as raised:
        load_acl(str(path))
    message = str(raised.value)
    assert "\n" not in message and str(path) in message and named in message, message


def test_an_acl_file_loads(tmp_path):
    path = tmp_path / "acl.toml"
    path.write_text('clock_skew_seconds = 60\nany_time_zone = false\n[[account]]\naccess_key = "orders-app"\n'
                    'secret_key = "orders-secret"\ntopics = ["Orders*"]\ngroups = ["orders-*"]\nactions = ["pub", "sub"]\n')  # fmt: skip
    rules = load_acl(str(path))
    assert rules.accounts == {"orders-app": ACCOUNT} and rules.clock_skew_seconds == 60 and not rules.any_time_zone


def test_a_verified_signature_is_still_checked_against_the_window_on_every_call():
    rules = Acl({ACCOUNT.access_key: ACCOUNT})
    header = signed("20260601T120000Z")
    assert rules.authenticate(header, "20260601T120000Z", now=NOW) is ACCOUNT
    assert rules.authenticate(header, "20260601T120000Z", now=NOW + 3 * 86400).reason == acl.EXPIRED
    assert rules.authenticate(signed("20260601T120000Z", secret=b"wrong"), "20260601T120000Z", now=NOW).reason == acl.BAD_SIGNATURE


def test_the_verified_signatures_stay_bounded():
    rules = Acl({ACCOUNT.access_key: ACCOUNT})
    for second in range(acl.VERIFIED_SIGNATURES_MAX + 10):
        date_time = stamp(NOW + second)
        assert rules.authenticate(signed(date_time), date_time, now=NOW) is ACCOUNT
    assert len(rules._verified) <= acl.VERIFIED_SIGNATURES_MAX
