"""The controller's replicated state (``hasvc.state.controller.state``): commands, refusals that
change nothing, the invariants, the command codec and the snapshot (hypothesis on both decoders)."""

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hasvc.state.controller.config import ControllerTimings
from hasvc.state.controller.state import (
    AlterSyncStateSet,
    ControllerState,
    Elect,
    GroupState,
    Member,
    Register,
    StateFormatError,
    decode_command,
    encode_command,
)


def _group_of_two() -> ControllerState:
    state = ControllerState()
    state.apply(Register("g", "store-a", "10.0.0.1:9876", "10.0.0.1:10912"), index=1)
    state.apply(Register("g", "store-b", "10.0.0.2:9876", "10.0.0.2:10912"), index=2)
    return state


# -- config --------------------------------------------------------------------------------------


def test_default_timings_are_valid_and_order_interval_lease_timeout():
    timings = ControllerTimings().validate()
    assert timings.broker_heartbeat_interval_seconds < timings.master_lease_seconds
    assert timings.master_lease_seconds < timings.broker_heartbeat_timeout_seconds
    assert timings.allow_unclean_election is False


@pytest.mark.parametrize(("changes", "message"), [
    ({"master_lease_seconds": 0.7}, "master_lease_seconds=0.7: must be below broker_heartbeat_timeout_seconds"),
    ({"broker_heartbeat_interval_seconds": 0.4}, "broker_heartbeat_interval_seconds=0.4: must be below master_lease"),
    ({"min_in_sync_replicas": 0}, "min_in_sync_replicas=0: must be >=1"),
    ({"sync_set_lag_seconds_max": 0}, "sync_set_lag_seconds_max=0: must be >0"),
])  # fmt: skip
def test_impossible_timings_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(ControllerTimings(), **changes).validate()


# -- commands ------------------------------------------------------------------------------------


def test_register_assigns_ids_in_order_and_gives_an_identity_its_id_back():
    state = _group_of_two()
    again = state.apply(Register("g", "store-a", "10.0.0.9:9876", "10.0.0.9:10912"), index=3)
    assert again.accepted and again.broker_id == 1
    group = state.groups["g"]
    assert group.members[1] == Member("store-a", "10.0.0.9:9876", "10.0.0.9:10912")
    assert group.next_broker_id == 3
    assert state.apply(Register("g", "store-c", "c:1", "c:2")).broker_id == 3
    assert state.applied_index == 3


def test_first_election_opens_epoch_one_with_the_master_alone_in_the_set():
    state = _group_of_two()
    answer = state.apply(Elect("g", 2, 0, "first master"))
    assert answer.accepted
    group = state.groups["g"]
    assert (group.master_id, group.epoch, group.sync_state_set, group.sync_state_set_epoch) == (2, 1, {2}, 1)


def test_a_stale_or_repeated_election_changes_nothing():
    state = _group_of_two()
    state.apply(Elect("g", 1, 0, "first master"))
    before = state.groups["g"]
    answer = state.apply(Elect("g", 2, 0, "decided by a deposed controller leader"))
    assert not answer.accepted and "decided in epoch 0, the group is in epoch 1" in answer.reason
    assert state.groups["g"] is before and answer.group is before


def test_no_master_keeps_the_epoch_and_the_set():
    state = _group_of_two()
    state.apply(Elect("g", 1, 0, "first"))
    state.apply(AlterSyncStateSet("g", 1, 1, 1, frozenset({1, 2})))
    assert state.apply(Elect("g", None, 1, "nobody electable")).accepted
    group = state.groups["g"]
    assert (group.master_id, group.epoch, group.sync_state_set, group.sync_state_set_epoch) == (None, 1, {1, 2}, 2)
    assert not state.apply(Elect("g", None, 1, "again")).accepted
    assert state.apply(Elect("g", 2, 1, "a set member is back")).accepted
    assert state.groups["g"].epoch == 2


@pytest.mark.parametrize(("command", "reason"), [
    (AlterSyncStateSet("g", 2, 1, 1, frozenset({1, 2})), "broker 2 in epoch 1 is not the master"),
    (AlterSyncStateSet("g", 1, 0, 1, frozenset({1, 2})), "in epoch 0 is not the master"),
    (AlterSyncStateSet("g", 1, 1, 0, frozenset({1, 2})), "proposed from SyncStateSet epoch 0"),
    (AlterSyncStateSet("g", 1, 1, 1, frozenset({1})), "the SyncStateSet is that already"),
    (AlterSyncStateSet("g", 1, 1, 1, frozenset({2})), "must hold the master 1"),
    (AlterSyncStateSet("g", 1, 1, 1, frozenset({1, 7})), "not members of group 'g': \\[7\\]"),
    (AlterSyncStateSet("h", 1, 1, 1, frozenset({1, 2})), "no group 'h'"),
    (Elect("g", 9, 1, "x"), "broker 9 is not a member"),
])  # fmt: skip
def test_refused_alterations_leave_the_state_unchanged(command, reason):
    state = _group_of_two()
    state.apply(Elect("g", 1, 0, "first"))
    before = state.snapshot()
    answer = state.apply(command)
    assert not answer.accepted
    assert re.search(reason, answer.reason), answer.reason
    assert state.snapshot() == before


def test_accepted_alteration_bumps_the_set_epoch():
    state = _group_of_two()
    state.apply(Elect("g", 1, 0, "first"))
    assert state.apply(AlterSyncStateSet("g", 1, 1, 1, frozenset({1, 2}))).accepted
    assert state.groups["g"].sync_state_set_epoch == 2
    assert not state.apply(AlterSyncStateSet("g", 1, 1, 1, frozenset({1, 2}))).accepted  # a second copy


def test_the_group_invariants_catch_a_master_outside_its_set():
    with pytest.raises(AssertionError):
        GroupState({1: Member("a", "a:1", "a:2")}, 2, 1, 1, frozenset(), 1).check_invariants()
    before = GroupState({1: Member("a", "a:1", "a:2")}, 2, None, 3, frozenset(), 3)
    with pytest.raises(AssertionError):
        before.check_successor(dataclasses.replace(before, epoch=2))
    with pytest.raises(AssertionError, match="reused"):
        before.check_successor(dataclasses.replace(before, members={1: Member("b", "a:1", "a:2")}))


# -- random command sequences ----------------------------------------------------------------------

_ids = st.integers(min_value=1, max_value=5)
_commands = st.one_of(
    st.builds(Register, st.sampled_from(["g", "h"]), st.sampled_from(["s1", "s2", "s3", "s4"]),
              st.sampled_from(["a:1", "b:1"]), st.sampled_from(["a:2", "b:2"])),
    st.builds(Elect, st.sampled_from(["g", "h"]), st.none() | _ids, st.integers(0, 4), st.just("test")),
    st.builds(AlterSyncStateSet, st.sampled_from(["g", "h"]), _ids, st.integers(0, 4), st.integers(0, 6),
              st.frozensets(_ids, max_size=4)),
)  # fmt: skip


@settings(max_examples=300)
@given(st.lists(_commands, max_size=40))
def test_any_command_sequence_keeps_the_invariants_and_replays_identically(commands):
    state, replica = ControllerState(), ControllerState()
    for index, command in enumerate(commands, start=1):
        before = state.snapshot()
        answer = state.apply(command, index=index)
        if not answer.accepted:
            restored = ControllerState.restore(before)
            restored.note_applied(index)
            assert restored == state  # a refusal changed nothing but the applied index
        assert replica.apply(decode_command(encode_command(command)), index=index) == answer
    assert replica == state
    assert ControllerState.restore(state.snapshot()) == state


# -- the command codec ---------------------------------------------------------------------------


@given(_commands)
def test_command_codec_round_trips(command):
    assert decode_command(encode_command(command)) == command


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_command_decoder_raises_its_error_on_garbage(data):
    try:
        decode_command(data)
    except StateFormatError as error:
        assert "\n" not in str(error)


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(["v", "command", "group", "identity", "client_address", "ha_address",
                                        "new_master_id", "expected_epoch", "reason", "master_id", "epoch",
                                        "sync_state_set_epoch", "new_set", "extra"]),
                       st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3) | st.lists(st.integers(-1, 3)),
                       max_size=8))  # fmt: skip
def test_command_decoder_checks_fields_of_well_formed_json(document):
    import json

    data = json.dumps(document).encode()
    try:
        command = decode_command(data)
    except StateFormatError:
        return
    assert decode_command(encode_command(command)) == command


@pytest.mark.parametrize(("data", "message"), [
    (b"\xff", "not a UTF-8 JSON object"),
    (b"[1]", "not an object \\(list\\)"),
    (b'{"v":2,"command":"Elect"}', "version 2 is not 1"),
    (b'{"v":1,"command":"Fly"}', "unknown controller command 'Fly'"),
    (b'{"v":1,"command":"Elect","group":"g","new_master_id":1,"expected_epoch":0}', "lacks field 'reason'"),
    (b'{"v":1,"command":"Elect","group":"g","new_master_id":true,"expected_epoch":0,"reason":""}',
     "'new_master_id' is bool"),
    (b'{"v":1,"command":"Elect","group":"g","new_master_id":0,"expected_epoch":0,"reason":""}',
     "new_master_id 0 is outside"),
    (b'{"v":1,"command":"AlterSyncStateSet","group":"g","master_id":1,"epoch":1,"sync_state_set_epoch":1,'
     b'"new_set":[1,1]}', "names a broker twice"),
])  # fmt: skip
def test_command_decoder_errors_say_what(data, message):
    with pytest.raises(StateFormatError, match=message):
        decode_command(data)


def test_encoder_refuses_what_the_decoder_would():
    with pytest.raises(StateFormatError, match="Register client_address must be 1..261 characters"):
        encode_command(Register("g", "s", "x" * 300, "a:1"))
    with pytest.raises(StateFormatError, match="group name must be 1..128"):
        encode_command(Elect("", 1, 0, ""))


# -- snapshots -----------------------------------------------------------------------------------


def test_snapshot_holds_the_raft_index_and_restores_equal():
    state = _group_of_two()
    state.apply(Elect("g", 1, 0, "first"), index=7)
    restored = ControllerState.restore(state.snapshot())
    assert restored == state and restored.applied_index == 7


def test_snapshot_damage_is_found():
    data = bytearray(_group_of_two().snapshot())
    data[-3] ^= 0x01
    with pytest.raises(StateFormatError, match="fails its CRC32C"):
        ControllerState.restore(bytes(data))
    with pytest.raises(StateFormatError, match="not a controller snapshot"):
        ControllerState.restore(b"XXXX" + bytes(data[4:]))
    with pytest.raises(StateFormatError, match="shorter than its 20-byte header"):
        ControllerState.restore(bytes(data[:10]))


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_snapshot_decoder_raises_its_error_on_garbage(data):
    with pytest.raises(StateFormatError):
        ControllerState.restore(data)


@settings(max_examples=300)
@given(st.data())
def test_snapshot_of_a_valid_crc_but_bad_body_raises_its_error(data):
    """Bodies that pass the CRC (rebuilt after the change) still meet the field checks."""
    import struct

    import crc32c

    body = data.draw(st.sampled_from([
        b'{"g":{"members":{},"next_broker_id":1,"master_id":3,"epoch":1,"sync_state_set":[3],"sync_state_set_epoch":1}}',
        b'{"g":{"members":{"x":{}},"next_broker_id":1,"master_id":null,"epoch":0,"sync_state_set":[],'
        b'"sync_state_set_epoch":0}}',
        b'{"g":5}', b'[]', b'{"":{}}',
        b'{"g":{"members":{"1":{"identity":"a","client_address":"a:1","ha_address":"a:2"}},"next_broker_id":1,'
        b'"master_id":null,"epoch":0,"sync_state_set":[],"sync_state_set_epoch":0}}',
    ]))  # fmt: skip
    checked = struct.pack(">QI", 1, len(body)) + body
    with pytest.raises(StateFormatError):
        ControllerState.restore(b"HCS1" + struct.pack(">I", crc32c.crc32c(checked)) + checked)


def test_an_elect_entry_carries_the_new_masters_end_only_when_known():
    from hasvc.state.controller.state import Elect, decode_command, encode_command

    plain = encode_command(Elect("g", 2, 1, "r"))
    assert b"master_end" not in plain and decode_command(plain) == Elect("g", 2, 1, "r")  # as entries were before
    stamped = encode_command(Elect("g", 2, 1, "r", master_end=2120))
    assert decode_command(stamped) == Elect("g", 2, 1, "r", master_end=2120)
    import pytest

    from hasvc.state.controller.state import StateFormatError

    for bad in (b'"x"', b"-1", b"true", b"null"):
        with pytest.raises(StateFormatError):
            decode_command(stamped.replace(b'"master_end":2120', b'"master_end":' + bad))
