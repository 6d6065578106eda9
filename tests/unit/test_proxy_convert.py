"""The proxy's pure conversions (hasvc/proxy/convert.py): handles, message ids, statuses, checks."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

pb = pytest.importorskip("hasvc.proxy.pb")

from commitlog import record as rec  # noqa: E402
from hasvc.proxy import convert  # noqa: E402
from hasvc.proxy.convert import Refused  # noqa: E402

Code, definition = pb.Code, pb.definition


@given(st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**64 - 1))
def test_receipt_handles_round_trip(queue_id, offset, nonce):
    assert convert.decode_receipt_handle(convert.encode_receipt_handle(queue_id, offset, nonce)) == (queue_id, offset, nonce)


@given(st.text(max_size=80))
def test_garbage_is_never_taken_for_a_receipt_handle(text):
    decoded = convert.decode_receipt_handle(text)
    if decoded is not None:  # only handles we could have made decode
        assert convert.encode_receipt_handle(*decoded) == text


@pytest.mark.parametrize("handle", ["", "hasvc1", "hasvc1 0 0", "hasvc1 -1 0 1", "hasvc1 0 0 zz", "other 0 0 1", "hasvc1 0 0 1 2",
                                    "hasvc1 01 0 1", "hasvc1 +1 0 1", "hasvc1 \u0661 0 1", "hasvc1 0 0 0A"])
def test_malformed_receipt_handles(handle):
    assert convert.decode_receipt_handle(handle) is None


def test_v1_message_ids_give_their_counter_and_others_none():
    assert convert.message_id_sequence("0102FC000000012EBD0B163CBA0000002A") == 42
    assert convert.message_id_sequence("C0A8000100002A9F0000000000000001") is None  # a 4.x offset id
    assert convert.message_id_sequence("01XYZ") is None
    producer = convert.producer_id_for("host@123@0@abc" * 20)
    assert producer == convert.producer_id_for("host@123@0@abc" * 20) and len(producer) <= 64


def test_only_put_ok_is_ok():
    assert convert.send_status_code("PUT_OK") == Code.OK
    assert convert.send_status_code("FLUSH_SLAVE_TIMEOUT") == Code.SLAVE_PERSISTENCE_TIMEOUT
    assert convert.send_status_code("SLAVE_NOT_AVAILABLE") == Code.HA_NOT_AVAILABLE
    assert convert.send_status_code("FLUSH_DISK_TIMEOUT") == Code.MASTER_PERSISTENCE_TIMEOUT
    for status in rec.PutMessageStatus:
        if status is not rec.PutMessageStatus.PUT_OK:
            assert convert.send_status_code(status.value) != Code.OK, status


def message(**system):
    result = definition.Message(body=system.pop("body", b"b"))
    result.topic.name = "T"
    result.system_properties.message_id = "01" + "0" * 32
    for key, value in system.items():
        if key == "keys":
            result.system_properties.keys.extend(value)
        else:
            setattr(result.system_properties, key, value)
    return result


def test_a_normal_message_becomes_a_send_with_its_id_stored():
    checked = convert.outgoing(message(tag="t", keys=["a", "b"]), body_size_max=10)
    assert (checked.tags, checked.keys, checked.properties) == ("t", "a b", {"UNIQ_KEY": "01" + "0" * 32})


@pytest.mark.parametrize("system, code", [
    ({"message_type": definition.FIFO}, Code.UNSUPPORTED),
    ({"message_group": "g"}, Code.UNSUPPORTED),
    ({"message_type": definition.TRANSACTION}, Code.UNSUPPORTED),
    ({"message_id": ""}, Code.ILLEGAL_MESSAGE_ID),
    ({"body": b""}, Code.MESSAGE_BODY_EMPTY),
    ({"body": b"x" * 11}, Code.MESSAGE_BODY_TOO_LARGE),
    ({"tag": "a||b"}, Code.ILLEGAL_MESSAGE_TAG),
    ({"keys": [" "]}, Code.ILLEGAL_MESSAGE_KEY),
])  # fmt: skip
def test_refusals(system, code):
    refused = convert.outgoing(message(**system), body_size_max=10)
    assert isinstance(refused, Refused) and refused.code == code and refused.message


def test_reserved_and_control_character_properties_are_refused():
    for key, value in [("TAGS", "x"), ("HASVC_PRODUCER_ID", "x"), ("a\x01", "x"), ("a", "b\x02")]:
        m = message()
        m.user_properties[key] = value
        refused = convert.outgoing(m, body_size_max=10)
        assert isinstance(refused, Refused) and refused.code == Code.ILLEGAL_MESSAGE_PROPERTY_KEY, key


def test_topics():
    assert convert.check_topic("ns%Orders", "%HASVC") is None
    assert convert.check_topic("%HASVC_PROXY_PROGRESS", "%HASVC").code == Code.ILLEGAL_TOPIC
    assert convert.check_topic("a b", "%HASVC").code == Code.ILLEGAL_TOPIC
    assert convert.check_topic("", "%HASVC").code == Code.ILLEGAL_TOPIC


def test_groups():
    assert convert.check_group("ns%Group_1-a") is None
    for bad in ("", "a b", "x" * 256, "g\n"):
        assert convert.check_group(bad).code == Code.ILLEGAL_CONSUMER_GROUP, bad


def test_tag_filters():
    assert convert.tag_filter(None) is None
    assert convert.tag_filter(definition.FilterExpression(type=definition.TAG, expression="*")) is None
    assert convert.tag_filter(definition.FilterExpression(type=definition.TAG, expression="a || b")) == {"a", "b"}
    assert convert.tag_filter(definition.FilterExpression(type=definition.SQL, expression="a > 1")).code == Code.UNSUPPORTED


# -- property tests: whatever a gRPC client sends, the conversion refuses it or builds a SEND the
# broker's decoder reads back as sent (never an exception, never properties that decode otherwise)

# The property separators (0x01, 0x02) and other control characters drawn often, not by chance.
_TEXT = st.text(st.one_of(st.sampled_from("a |\x00\x01\x02\n"), st.characters(blacklist_categories=("Cs",))), max_size=40)


@st.composite
def grpc_messages(draw):
    result = definition.Message(body=draw(st.binary(max_size=64)))
    result.topic.name = draw(st.sampled_from(["T", "T%1|x", ""]))
    system = result.system_properties
    system.message_id = draw(st.one_of(st.just("01" + "0" * 32), _TEXT))
    system.message_type = draw(st.sampled_from([definition.NORMAL, definition.MESSAGE_TYPE_UNSPECIFIED, definition.FIFO, 99]))
    if draw(st.booleans()):
        system.tag = draw(_TEXT)
    system.keys.extend(draw(st.lists(_TEXT, max_size=3)))
    for key, value in draw(st.dictionaries(_TEXT, _TEXT, max_size=4)).items():
        result.user_properties[key] = value
    return result


@given(grpc_messages())
def test_a_message_is_refused_or_becomes_a_send_that_decodes_as_sent(message):
    from hasvc.client.results import message_properties
    from hasvc.protocol import client as cp

    checked = convert.outgoing(message, body_size_max=32)
    if isinstance(checked, Refused):
        assert checked.code != Code.OK and checked.message
        return
    encoded = message_properties(checked.tags, checked.keys, checked.properties)
    expected = {key: value for key, value in checked.properties.items() if value}  # an empty value is dropped, as upstream
    if checked.tags:
        expected[rec.PROPERTY_TAGS] = checked.tags
    if checked.keys:
        expected[rec.PROPERTY_KEYS] = checked.keys
    assert rec.decode_properties(encoded) == expected
    assert expected[convert.PROPERTY_UNIQ_KEY] == message.system_properties.message_id
    request = cp.SendRequest("T", 0, [checked.body], [encoded], 0, 0, "producer", 1)
    decoded = cp.decode_send(cp.encode_send(request), idempotent=True)
    assert (decoded.bodies, decoded.properties) == ([message.body], [encoded])


def test_a_message_id_with_property_separators_is_refused():
    forged = convert.outgoing(message(message_id="x\x02TAGS\x01forged"), body_size_max=10)
    assert isinstance(forged, Refused) and forged.code == Code.ILLEGAL_MESSAGE_ID


@given(st.binary(max_size=200))
def test_any_bytes_that_parse_as_a_message_are_refused_or_converted(data):
    from google.protobuf.message import DecodeError

    try:
        message = definition.Message.FromString(data)
    except DecodeError:
        return  # grpc's own layer: the call fails before a handler sees it
    checked = convert.outgoing(message, body_size_max=64)
    assert isinstance(checked, Refused | convert.Outgoing)


@given(_TEXT, st.sampled_from([definition.TAG, definition.SQL, definition.FILTER_TYPE_UNSPECIFIED]))
def test_tag_filters_never_fail(text, kind):
    result = convert.tag_filter(definition.FilterExpression(type=kind, expression=text))
    assert result is None or isinstance(result, Refused) or all(tag and tag == tag.strip() for tag in result)


@given(_TEXT)
def test_names_and_ids_are_checked_without_failing(text):
    assert convert.check_topic(text, "%HASVC%") is None or convert.check_topic(text, "%HASVC%").code == Code.ILLEGAL_TOPIC
    assert convert.check_group(text) is None or convert.check_group(text).code == Code.ILLEGAL_CONSUMER_GROUP
    sequence = convert.message_id_sequence(text)
    assert sequence is None or 0 <= sequence < 2**32


@given(st.dictionaries(_TEXT, _TEXT, max_size=4), st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**31 - 1),
       st.integers(0, 2**63 - 1), st.binary(max_size=32))  # fmt: skip
def test_any_stored_record_becomes_a_message_a_client_can_parse(properties, timestamp, queue_id, offset, body):
    record = rec.Record(size=0, magic=0, body_crc=0, queue_id=queue_id, flag=0, queue_offset=offset, physical_offset=offset,
                        sysflag=0, born_timestamp=timestamp, born_host=("127.0.0.1", 1), store_timestamp=timestamp,
                        store_host=("::1", 2), reconsume_times=0, prepared_transaction_offset=0, body=memoryview(body),
                        topic="T", properties=properties)  # fmt: skip
    message = convert.delivered_message(record, receipt_handle="h", attempt=1, invisible_ms=30_000)
    parsed = definition.Message.FromString(message.SerializeToString())
    assert parsed.body == body and parsed.system_properties.message_id == convert.message_id_of(record)


def test_a_sealed_record_reaches_a_client_without_the_record_crc_tail():
    prepared = rec.prepare_message(rec.Message("T", b"body", properties={"TAGS": "a", "U": "v"}), record_crc=True)
    buffer = bytearray(prepared.size)
    rec.write_record(buffer, 0, prepared, queue_offset=0, physical_offset=0, store_timestamp=1,
                     store_ip=bytes([127, 0, 0, 1]), store_port=1)  # fmt: skip
    assert b"__CRC32#" in buffer
    message = convert.delivered_message(rec.decode_record(buffer), receipt_handle="h", attempt=1, invisible_ms=30_000)
    assert dict(message.user_properties) == {"U": "v"} and message.system_properties.tag == "a"
