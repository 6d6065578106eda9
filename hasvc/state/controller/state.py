"""The controller's replicated state: broker groups, their members, master, epoch and SyncStateSet,
changed only by commands applied in Raft log order.

Theory of operation
-------------------
Every controller applies the same commands in the same order (the Raft log), so every controller
holds the same ``ControllerState``. ``apply(command)`` is deterministic: it reads nothing but the
state and the command, and answers ``Answer(accepted, reason, ...)``; a refused command leaves the
state exactly as it was. The commands (docs/design/controller.md):

* ``Register(group, identity, client_address, ha_address)``: the broker whose store carries
  ``identity`` gets a ``broker_id`` (1, 2, ... in order of first registration, never reused); the
  same identity gets the same id back and its addresses updated. A broker registers once per
  process start, so a member of the SyncStateSet registering again has restarted: it joins
  ``restarted`` (it may have lost unflushed bytes it acknowledged, a power loss). A restarted
  master is not named again in its epoch: the election rules (``elect.py``) elect the member of
  the set with the longest log into a new epoch, and withhold its lease meanwhile; any election
  from a set with a restarted member compares log ends heard after the restart.
* ``Elect(group, new_master_id, expected_epoch, reason)``: only when ``expected_epoch`` is the
  group's epoch (a deposed controller leader's stale decision, or a second copy, changes nothing).
  A new master opens ``epoch + 1`` with the SyncStateSet ``{new_master_id}`` (the restarted
  master itself when it has the longest log; ``restarted`` is emptied), and records its log end
  as last heard (``master_end``, when the command carries it; for diagnosis: ``elect.py`` says
  why the election rules do not rely on it). ``None`` records
  "no master" (nobody electable): the epoch and the SyncStateSet stay, so the set's members stay
  the ones that may be elected when they come back.
* ``AlterSyncStateSet(group, master_id, epoch, sync_state_set_epoch, new_set)``: the master's
  proposal, only when it is the master of that epoch, the set epoch is the current one (its view
  was current), the set changes, holds the master, and names only registered members.

``check_invariants`` runs after every accepted command and compares with the group before it:
a master is in its SyncStateSet, the set names only members, ids are below ``next_broker_id``;
``epoch``, ``sync_state_set_epoch`` and ``next_broker_id`` never decrease; a broker id keeps its
identity forever (no member is ever removed, so no id can be reused).

Bytes: ``encode_command``/``decode_command`` give a command's Raft entry body (a versioned JSON
object: rare, small, and readable in a log dump); ``snapshot()``/``restore()`` the whole state with
the Raft index it reflects and a CRC32C, so the controller can cut its Raft log. Both decoders
check every field's presence and type, refuse unknown ones, and raise ``StateFormatError`` (one
line) on anything else.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Mapping

from commitlog.record import CRC_FUNCTIONS

GROUP_NAME_LENGTH_MAX = 128  # a group name is a label in STATUS and logs, like a RocketMQ brokerName
IDENTITY_LENGTH_MAX = 128  # a store identity (STORE/identity) is a 32-hex-digit token; room to spare
ADDRESS_LENGTH_MAX = 261  # HOST:PORT: a DNS name is at most 253 characters (RFC 1035), ":" and 5 digits
REASON_LENGTH_MAX = 512  # an election's reason is one log line
MEMBERS_PER_GROUP_MAX = 16  # a master and a few slaves; each member costs heartbeats and set checks
GROUPS_MAX = 4096  # the whole state is in memory and in every snapshot; far above a real deployment
COMMAND_SIZE_MAX = 64 * 1024  # a command is a few hundred bytes; a bigger entry body is not ours
SNAPSHOT_SIZE_MAX = 64 * 1024 * 1024  # GROUPS_MAX full groups fit (about 4 KiB each) with room

COMMAND_VERSION = 1
_crc32c = CRC_FUNCTIONS["crc32c"]  # the crc32c package, through commitlog (the layer rule)
SNAPSHOT_MAGIC = b"HCS1"  # hasvc controller snapshot, format 1
# magic | u32 CRC32C of everything after it | u64 Raft index reflected | u32 body size | body
SNAPSHOT_HEADER = struct.Struct(">4sIQI")
assert SNAPSHOT_HEADER.size == 20


class StateFormatError(ValueError):
    """A command or snapshot's bytes that are not one (the message is one line)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    identity: str  # the broker store's identity: the same store gets the same broker_id back
    client_address: str  # HOST:PORT of its client port (clients find the master there)
    ha_address: str  # HOST:PORT of its HA port (slaves replicate from the master there)


@dataclasses.dataclass(frozen=True, slots=True)
class GroupState:
    members: Mapping[int, Member] = dataclasses.field(default_factory=dict)  # broker_id (>= 1) -> member
    next_broker_id: int = 1  # ids are assigned once, never reused
    master_id: int | None = None  # None: no master (never elected, or nobody electable)
    epoch: int = 0  # the master epoch; bumped by every election of a master
    sync_state_set: frozenset[int] = frozenset()  # holds master_id when master_id is not None
    sync_state_set_epoch: int = 0  # bumped by every accepted change and every election of a master
    restarted: frozenset[int] = frozenset()  # members of the set that registered again since they entered it
    # The last master elected: its log end then, as its last heartbeat said (None: not known). A
    # restarted set of one that never opened the group's epoch and reports less lost a tail.
    master_end: int | None = None

    def __hash__(self) -> int:  # members is a dict: hash what identifies the group's version
        return hash((self.next_broker_id, self.master_id, self.epoch, self.sync_state_set, self.sync_state_set_epoch,
                     self.restarted, self.master_end))  # fmt: skip

    @property
    def master_restarted(self) -> bool:
        return self.master_id is not None and self.master_id in self.restarted

    def check_invariants(self) -> None:
        assert self.next_broker_id >= 1
        assert self.epoch >= 0
        assert self.sync_state_set_epoch >= 0
        assert len(self.members) <= MEMBERS_PER_GROUP_MAX
        for broker_id in self.members:
            assert 1 <= broker_id < self.next_broker_id, (broker_id, self.next_broker_id)
        assert self.sync_state_set <= self.members.keys(), (self.sync_state_set, sorted(self.members))
        if self.master_id is not None:
            assert self.master_id in self.members
            assert self.master_id in self.sync_state_set, (self.master_id, self.sync_state_set)
            assert self.epoch >= 1
        assert self.restarted <= self.sync_state_set, (self.restarted, self.sync_state_set)
        identities = [member.identity for member in self.members.values()]
        assert len(set(identities)) == len(identities), "one identity, one broker id"

    def check_successor(self, after: GroupState) -> None:
        """What no command may do to a group: epochs and ids go back, an id changes hands."""
        assert after.epoch >= self.epoch, (self.epoch, after.epoch)
        assert after.sync_state_set_epoch >= self.sync_state_set_epoch
        assert after.next_broker_id >= self.next_broker_id
        for broker_id, member in self.members.items():
            assert broker_id in after.members, f"broker id {broker_id} removed"
            assert after.members[broker_id].identity == member.identity, f"broker id {broker_id} reused"

    def member_by_identity(self, identity: str) -> int | None:
        return next((broker_id for broker_id, member in self.members.items() if member.identity == identity), None)


# -- commands ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Register:
    group: str
    identity: str
    client_address: str
    ha_address: str


@dataclasses.dataclass(frozen=True, slots=True)
class Elect:
    group: str
    new_master_id: int | None  # None: record that nobody is electable
    expected_epoch: int  # the epoch the decision was made in; any other: refused
    reason: str  # why (a lapsed master, an operator's switchover, unclean): logged, not interpreted
    master_end: int | None = None  # the new master's log end as last heard (None: unknown); optional in the entry


@dataclasses.dataclass(frozen=True, slots=True)
class AlterSyncStateSet:
    group: str
    master_id: int
    epoch: int  # the master's epoch
    sync_state_set_epoch: int  # the set epoch the master's proposal was based on
    new_set: frozenset[int]


Command = Register | Elect | AlterSyncStateSet


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    accepted: bool
    reason: str = ""  # why refused ("" when accepted)
    broker_id: int | None = None  # Register: the id assigned (or given back)
    group: GroupState | None = None  # the group after the command (refused: as it was); None: no such group


def _refuse(reason: str, group: GroupState | None) -> Answer:
    return Answer(False, reason, None, group)


class ControllerState:
    """Every group's replicated state and the Raft index of the last entry applied to it."""

    __slots__ = ("groups", "applied_index")

    def __init__(self, groups: Mapping[str, GroupState] | None = None, applied_index: int = 0) -> None:
        self.groups: dict[str, GroupState] = dict(groups or {})
        self.applied_index = applied_index  # the Raft index this state reflects (0: none applied)
        self.check_invariants()

    def check_invariants(self) -> None:
        assert self.applied_index >= 0
        assert len(self.groups) <= GROUPS_MAX
        for group in self.groups.values():
            group.check_invariants()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ControllerState):
            return NotImplemented
        return self.groups == other.groups and self.applied_index == other.applied_index

    def note_applied(self, index: int) -> None:
        """A Raft entry that carries no controller command (a leader's no-op) was applied."""
        assert index > self.applied_index, (index, self.applied_index)
        self.applied_index = index

    def apply(self, command: Command, *, index: int | None = None) -> Answer:
        """Apply one command (the Raft entry at ``index``, when given); refused: state unchanged
        but ``applied_index``."""
        if index is not None:
            self.note_applied(index)
        before = self.groups.get(command.group)
        if isinstance(command, Register):
            answer = self._register(command, before)
        elif isinstance(command, Elect):
            answer = self._elect(command, before)
        else:
            answer = self._alter(command, before)
        if answer.accepted:
            after = answer.group
            assert after is not None
            after.check_invariants()
            if before is not None:
                before.check_successor(after)
            self.groups[command.group] = after
        else:
            assert self.groups.get(command.group) is before
        return answer

    def _register(self, command: Register, group: GroupState | None) -> Answer:
        if group is None:
            if len(self.groups) >= GROUPS_MAX:
                return _refuse(f"the controller holds {GROUPS_MAX} groups already (GROUPS_MAX)", None)
            group = GroupState()
        member = Member(command.identity, command.client_address, command.ha_address)
        broker_id = group.member_by_identity(command.identity)
        if broker_id is None:
            if len(group.members) >= MEMBERS_PER_GROUP_MAX:
                return _refuse(f"group {command.group!r} has {MEMBERS_PER_GROUP_MAX} members already", group)
            broker_id = group.next_broker_id
            group = dataclasses.replace(group, next_broker_id=broker_id + 1)
        members = dict(group.members)
        members[broker_id] = member
        restarted = group.restarted | ({broker_id} & group.sync_state_set)
        return Answer(True, "", broker_id, dataclasses.replace(group, members=members, restarted=restarted))

    def _elect(self, command: Elect, group: GroupState | None) -> Answer:
        if group is None:
            return _refuse(f"no group {command.group!r}", None)
        if command.expected_epoch != group.epoch:
            return _refuse(f"decided in epoch {command.expected_epoch}, the group is in epoch {group.epoch}", group)
        if command.new_master_id is None:
            if group.master_id is None:
                return _refuse("the group has no master already", group)
            return Answer(True, "", None, dataclasses.replace(group, master_id=None))  # the set, its restarts, master_end stay
        if command.new_master_id not in group.members:
            return _refuse(f"broker {command.new_master_id} is not a member of group {command.group!r}", group)
        elected = dataclasses.replace(group, master_id=command.new_master_id, epoch=group.epoch + 1,
                                      sync_state_set=frozenset({command.new_master_id}),
                                      sync_state_set_epoch=group.sync_state_set_epoch + 1,
                                      restarted=frozenset(), master_end=command.master_end)  # fmt: skip
        return Answer(True, "", command.new_master_id, elected)

    def _alter(self, command: AlterSyncStateSet, group: GroupState | None) -> Answer:
        if group is None:
            return _refuse(f"no group {command.group!r}", None)
        if command.master_id != group.master_id or command.epoch != group.epoch:
            return _refuse(f"broker {command.master_id} in epoch {command.epoch} is not the master "
                           f"(the master is {group.master_id} in epoch {group.epoch})", group)  # fmt: skip
        if command.sync_state_set_epoch != group.sync_state_set_epoch:
            return _refuse(f"proposed from SyncStateSet epoch {command.sync_state_set_epoch}, "
                           f"the set is in epoch {group.sync_state_set_epoch}", group)  # fmt: skip
        if command.new_set == group.sync_state_set:
            return _refuse("the SyncStateSet is that already", group)
        if command.master_id not in command.new_set:
            return _refuse(f"the SyncStateSet must hold the master {command.master_id}", group)
        strangers = sorted(command.new_set - group.members.keys())
        if strangers:
            return _refuse(f"not members of group {command.group!r}: {strangers}", group)
        altered = dataclasses.replace(group, sync_state_set=command.new_set,
                                      sync_state_set_epoch=group.sync_state_set_epoch + 1,
                                      restarted=group.restarted & group.sync_state_set & command.new_set)  # fmt: skip
        return Answer(True, "", None, altered)

    # -- snapshot ----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state and the Raft index it reflects, CRC32C-checked (see ``SNAPSHOT_HEADER``)."""
        body = json.dumps({name: _group_to_json(group) for name, group in sorted(self.groups.items())},
                          separators=(",", ":"), sort_keys=True).encode()  # fmt: skip
        checked = SNAPSHOT_HEADER.pack(SNAPSHOT_MAGIC, 0, self.applied_index, len(body))[8:] + body
        return SNAPSHOT_MAGIC + struct.pack(">I", _crc32c(checked)) + checked

    @classmethod
    def restore(cls, data: bytes) -> ControllerState:
        """The state a ``snapshot()`` holds; StateFormatError when ``data`` is not one."""
        if len(data) < SNAPSHOT_HEADER.size:
            raise StateFormatError(f"controller snapshot of {len(data)} bytes is shorter than its "
                                   f"{SNAPSHOT_HEADER.size}-byte header")  # fmt: skip
        if len(data) > SNAPSHOT_SIZE_MAX:
            raise StateFormatError(f"controller snapshot of {len(data)} bytes is over SNAPSHOT_SIZE_MAX")
        magic, crc, index, size = SNAPSHOT_HEADER.unpack_from(data)
        if magic != SNAPSHOT_MAGIC:
            raise StateFormatError(f"not a controller snapshot (magic {magic!r}, want {SNAPSHOT_MAGIC!r})")
        if crc != _crc32c(data[8:]):
            raise StateFormatError("controller snapshot fails its CRC32C (damaged)")
        if size != len(data) - SNAPSHOT_HEADER.size:
            raise StateFormatError(f"controller snapshot says {size} body bytes, holds "
                                   f"{len(data) - SNAPSHOT_HEADER.size}")  # fmt: skip
        document = _json_object(data[SNAPSHOT_HEADER.size:], "controller snapshot")
        if len(document) > GROUPS_MAX:
            raise StateFormatError(f"controller snapshot holds {len(document)} groups, over GROUPS_MAX")
        groups = {_group_name(name, "snapshot"): _group_from_json(value, name) for name, value in document.items()}
        try:
            return cls(groups, index)
        except AssertionError as error:
            raise StateFormatError(f"controller snapshot holds an impossible state: {error}") from None


# -- bytes ---------------------------------------------------------------------------------------

_COMMAND_FIELDS = {
    "Register": {"group": str, "identity": str, "client_address": str, "ha_address": str},
    "Elect": {"group": str, "new_master_id": (int, type(None)), "expected_epoch": int, "reason": str},
    "AlterSyncStateSet": {"group": str, "master_id": int, "epoch": int, "sync_state_set_epoch": int,
                          "new_set": list},
}  # fmt: skip
_COMMAND_TYPES = {"Register": Register, "Elect": Elect, "AlterSyncStateSet": AlterSyncStateSet}
# Fields an entry may lack (written only when not None, so entries without them read as before).
_OPTIONAL_FIELDS = {"Elect": ("master_end",)}


def encode_command(command: Command) -> bytes:
    """A command's Raft entry body: ``{"v": 1, "command": NAME, ...fields}`` as compact JSON.
    StateFormatError when a field is out of its bounds (checked here as the decoder checks it, so
    no entry is ever written that a restart could not read back)."""
    name = type(command).__name__
    fields = {}
    for field in dataclasses.fields(command):
        value = getattr(command, field.name)
        if value is None and field.name in _OPTIONAL_FIELDS.get(name, ()):
            continue
        fields[field.name] = sorted(value) if isinstance(value, frozenset) else value
    _check_command(name, dict(fields))
    data = json.dumps({"v": COMMAND_VERSION, "command": name, **fields}, separators=(",", ":"), sort_keys=True).encode()
    if len(data) > COMMAND_SIZE_MAX:
        raise StateFormatError(f"{name} command of {len(data)} bytes is over COMMAND_SIZE_MAX")
    return data


def decode_command(data: bytes) -> Command:
    """The command ``encode_command`` made; StateFormatError (one line) on anything else."""
    if len(data) > COMMAND_SIZE_MAX:
        raise StateFormatError(f"controller command of {len(data)} bytes is over COMMAND_SIZE_MAX ({COMMAND_SIZE_MAX})")
    document = _json_object(data, "controller command")
    version = document.pop("v", None)
    if type(version) is not int or version != COMMAND_VERSION:
        raise StateFormatError(f"controller command version {version!r} is not {COMMAND_VERSION}")
    name = document.pop("command", None)
    if not isinstance(name, str) or name not in _COMMAND_FIELDS:
        raise StateFormatError(f"unknown controller command {str(name)[:40]!r}")
    return _COMMAND_TYPES[name](**_check_command(name, document))


_TEXT_LENGTH_MAX = {"identity": IDENTITY_LENGTH_MAX, "client_address": ADDRESS_LENGTH_MAX,
                    "ha_address": ADDRESS_LENGTH_MAX, "reason": REASON_LENGTH_MAX}  # fmt: skip


def _check_command(name: str, document: dict) -> dict:
    """The command's fields, checked (presence, type, bounds); new_set made a frozenset."""
    optional = {key: document.pop(key) for key in _OPTIONAL_FIELDS.get(name, ()) if key in document}
    _check_fields(document, _COMMAND_FIELDS[name], f"{name} command")
    for key, value in optional.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise StateFormatError(f"{name} command field {key!r} is {type(value).__name__}, not int")
        document[key] = _natural(value, f"{name} {key}", minimum=0)
    _group_name(document["group"], name)
    for key, length_max in _TEXT_LENGTH_MAX.items():
        if key in document:
            _text(document[key], f"{name} {key}", length_max, length_min=0 if key == "reason" else 1)
    for key in ("new_master_id", "expected_epoch", "master_id", "epoch", "sync_state_set_epoch"):
        if document.get(key) is not None:
            _natural(document[key], f"{name} {key}", minimum=1 if key.endswith("_id") else 0)
    if "new_set" in document:
        document["new_set"] = _broker_ids(document["new_set"], f"{name} new_set")
    return document


def _json_object(data: bytes, what: str) -> dict:
    try:
        document = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise StateFormatError(f"{what} is not a UTF-8 JSON object: {str(error).splitlines()[0][:120]}") from None
    if not isinstance(document, dict):
        raise StateFormatError(f"{what} is JSON but not an object ({type(document).__name__})")
    return document


def _check_fields(document: dict, fields: dict, what: str) -> None:
    unknown = sorted(set(document) - set(fields))
    if unknown:
        raise StateFormatError(f"{what} has unknown fields {unknown[:5]}")
    for key, kind in fields.items():
        if key not in document:
            raise StateFormatError(f"{what} lacks field {key!r}")
        value = document[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) or not isinstance(value, kinds):
            wanted = " or ".join(k.__name__ for k in kinds)
            raise StateFormatError(f"{what} field {key!r} is {type(value).__name__}, not {wanted}")


def _text(value: str, what: str, length_max: int, *, length_min: int = 1) -> str:
    if not length_min <= len(value) <= length_max:
        raise StateFormatError(f"{what} must be {length_min}..{length_max} characters, not {len(value)}")
    return value


def _group_name(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise StateFormatError(f"{what}: group name is {type(value).__name__}, not str")
    return _text(value, f"{what}: group name", GROUP_NAME_LENGTH_MAX)


def _natural(value: int, what: str, *, minimum: int) -> int:
    if not minimum <= value < 2**63:
        raise StateFormatError(f"{what} {value} is outside [{minimum}, 2**63)")
    return value


def _broker_ids(values: list, what: str) -> frozenset[int]:
    if len(values) > MEMBERS_PER_GROUP_MAX:
        raise StateFormatError(f"{what} names {len(values)} brokers, over MEMBERS_PER_GROUP_MAX")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise StateFormatError(f"{what} holds {type(value).__name__}, not broker ids")
        _natural(value, f"{what} broker id", minimum=1)
    ids = frozenset(values)
    if len(ids) != len(values):
        raise StateFormatError(f"{what} names a broker twice")
    return ids


_MEMBER_FIELDS = {"identity": str, "client_address": str, "ha_address": str}
_GROUP_FIELDS = {"members": dict, "next_broker_id": int, "master_id": (int, type(None)), "epoch": int,
                 "sync_state_set": list, "sync_state_set_epoch": int}  # fmt: skip


def _group_to_json(group: GroupState) -> dict:
    return {"members": {str(broker_id): dataclasses.asdict(member) for broker_id, member in sorted(group.members.items())},
            "next_broker_id": group.next_broker_id, "master_id": group.master_id, "epoch": group.epoch,
            "sync_state_set": sorted(group.sync_state_set), "sync_state_set_epoch": group.sync_state_set_epoch,
            **({"restarted": sorted(group.restarted)} if group.restarted else {}),
            **({"master_end": group.master_end} if group.master_end is not None else {})}  # fmt: skip


def _group_from_json(value: object, name: str) -> GroupState:
    what = f"snapshot group {name[:GROUP_NAME_LENGTH_MAX]!r}"
    if not isinstance(value, dict):
        raise StateFormatError(f"{what} is {type(value).__name__}, not an object")
    restarted = value.get("restarted", [])  # written only when not empty (older snapshots lack it)
    if not isinstance(restarted, list):
        raise StateFormatError(f"{what} restarted must be a list of broker ids")
    restarted = _broker_ids(restarted, f"{what} restarted")
    master_end = value.get("master_end")  # written only when known (older snapshots lack it)
    if master_end is not None:
        if isinstance(master_end, bool) or not isinstance(master_end, int):
            raise StateFormatError(f"{what} master_end must be an integer")
        _natural(master_end, f"{what} master_end", minimum=0)
    value = {key: field for key, field in value.items() if key not in ("restarted", "master_end")}
    _check_fields(value, _GROUP_FIELDS, what)
    if len(value["members"]) > MEMBERS_PER_GROUP_MAX:
        raise StateFormatError(f"{what} has {len(value['members'])} members, over MEMBERS_PER_GROUP_MAX")
    members = {}
    for key, member in value["members"].items():
        if not key.isdigit() or not key.isascii():
            raise StateFormatError(f"{what} member key {key[:20]!r} is not a broker id")
        if not isinstance(member, dict):
            raise StateFormatError(f"{what} member {key} is {type(member).__name__}, not an object")
        _check_fields(member, _MEMBER_FIELDS, f"{what} member {key}")
        for field, length_max in (("identity", IDENTITY_LENGTH_MAX), ("client_address", ADDRESS_LENGTH_MAX),
                                  ("ha_address", ADDRESS_LENGTH_MAX)):  # fmt: skip
            _text(member[field], f"{what} member {key} {field}", length_max)
        members[_natural(int(key), f"{what} broker id", minimum=1)] = Member(**member)
    for key in ("next_broker_id", "epoch", "sync_state_set_epoch"):
        _natural(value[key], f"{what} {key}", minimum=0)
    if value["master_id"] is not None:
        _natural(value["master_id"], f"{what} master_id", minimum=1)
    return GroupState(members, value["next_broker_id"], value["master_id"], value["epoch"],
                      _broker_ids(value["sync_state_set"], f"{what} sync_state_set"), value["sync_state_set_epoch"],
                      restarted, master_end)  # fmt: skip
