"""``STORE/identity``: what a store directory is, written when it is created, checked on every open.

Theory of operation
-------------------
A store root holds either a classic broker's log (``commitlog/``, ``consumequeue/``, ``epoch``) or a
DLedger member's (``dledger-<selfId>/``, ``consumequeue/``, and below a smooth upgrade's divide a
sealed ``commitlog/``). Both kinds share the names ``checkpoint``, ``abort``, ``lock`` and
``consumequeue/``, so without a marker a process of the wrong kind opens the other's store as an
empty one of its own and writes over it (a master on a member's store deleted its consume queues
and wrote a classic log over the entries' offsets).

``identity`` is one small text file of ``key=value`` lines (``commitlog.dledger.state_files``'s
syntax, replaced the same durable way: temp file, fsync, rename, directory fsync)::

    version=1              the format; a larger one is refused (written by a newer hasvc)
    kind=classic|dledger   who may open the store
    store_id=<32 hex>      uuid4, chosen at creation, kept by an upgrade
    created_ms=<int>       creation time, ms since the epoch
    member=<id>            dledger: the member's --self (its files are dledger-<id>/)
    group=<name>           dledger: the group's --group (absent: not known yet; the next open records it)
    upgraded_ms=<int>      dledger: when a classic store was turned into this member's (smooth upgrade)

Unknown keys are ignored (a later version may add some); a missing or invalid required one is an
error naming the file. Opening is two calls, so that a refusal changes no byte of the store:

    planned = check(root, opener)   # before anything is created, locked or written: refuse, or say what to write
    ...take the lock...
    identity = claim(root, opener)  # again under the lock; writes the marker when it is missing or changes

Rules (``check``): a classic broker opens only a classic store; a DLedger node opens only its own
member's store of its group, or — with ``upgrade`` (the explicit smooth-upgrade step) — a classic
store, whose marker then becomes the member's. A store written before markers existed is
recognised by its files (``infer``): ``dledger-*`` directories make it a member's (the one id they
name), classic segments a classic one; both at once are a member's only when the classic log ends
at or below the first DLedger data file (an upgraded store), otherwise it is ambiguous and
refused. Nothing at all: a new store, the opener's kind.
"""

from __future__ import annotations

import dataclasses
import enum
import glob
import os
import uuid

from commitlog.commit_log import now_ms as clock_ms
from commitlog.dledger.state_files import read_properties, write_properties
from commitlog.mapped_file import StoreError
from commitlog.mapped_file_queue import MappedFileQueue

IDENTITY_FILE = "identity"
IDENTITY_VERSION = 1
DLEDGER_DIRECTORY_PREFIX = "dledger-"  # commitlog.dledger.upgrade.dledger_directory's
# A member id or group name is one line of printable text; longer than this is not a name.
NAME_CHARS_MAX = 256


class StoreKind(enum.Enum):
    CLASSIC = "classic"
    DLEDGER = "dledger"


@dataclasses.dataclass(frozen=True, slots=True)
class StoreIdentity:
    kind: StoreKind
    store_id: str
    created_ms: int
    member: str | None = None  # dledger only
    group: str | None = None  # dledger only; None: not recorded yet
    upgraded_ms: int | None = None  # dledger only: made from a classic store at this time

    def describe(self, *, with_id: bool = True) -> str:
        """One phrase: ``DLedger member n2's store (group g, store id ...)``."""
        details = [f"group {self.group}"] if self.group is not None else []
        details += [f"store id {self.store_id}"] if with_id else []
        detail = f" ({', '.join(details)})" if details else ""
        if self.kind is StoreKind.CLASSIC:
            return f"a classic broker's store{detail}"
        return f"DLedger member {self.member}'s store{detail}"

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "store_id": self.store_id, "created_ms": self.created_ms,
                "member": self.member, "group": self.group, "upgraded_ms": self.upgraded_ms}  # fmt: skip

    def properties(self) -> dict[str, object]:
        values: dict[str, object] = {"version": IDENTITY_VERSION, "kind": self.kind.value, "store_id": self.store_id,
                                     "created_ms": self.created_ms}  # fmt: skip
        for key in ("member", "group", "upgraded_ms"):
            if getattr(self, key) is not None:
                values[key] = getattr(self, key)
        return values


@dataclasses.dataclass(frozen=True, slots=True)
class Opener:
    """Who opens a store: a classic broker, or DLedger member ``member`` of ``group`` (None: not
    checked, for tools and tests that know no group). ``upgrade``: this member may take over a
    classic store (the smooth upgrade's explicit step)."""

    kind: StoreKind
    member: str | None = None
    group: str | None = None
    upgrade: bool = False

    def __post_init__(self) -> None:
        assert (self.kind is StoreKind.DLEDGER) == (self.member is not None), self
        assert not self.upgrade or self.kind is StoreKind.DLEDGER, self


CLASSIC = Opener(StoreKind.CLASSIC)


def dledger_member(member: str, group: str | None = None, *, upgrade: bool = False) -> Opener:
    return Opener(StoreKind.DLEDGER, member=member, group=group, upgrade=upgrade)


# -- the file ---------------------------------------------------------------------------------


def identity_path(root: str) -> str:
    return os.path.join(root, IDENTITY_FILE)


def read_identity(root: str) -> StoreIdentity | None:
    """The marker of store ``root``; None when there is none. StoreError (naming the file) when it
    cannot be read or is not a valid marker."""
    path = identity_path(root)
    try:
        values = read_properties(path)
    except IsADirectoryError:
        raise StoreError(f"{path}: a directory, not the store's identity file") from None
    except NotADirectoryError:
        raise StoreError(f"{root}: not a directory") from None
    if values is None:
        return None
    return _decode(path, values)


def _decode(path: str, values: dict[str, str]) -> StoreIdentity:
    def required(key: str) -> str:
        value = values.get(key, "")
        if not value:
            raise StoreError(f"{path}: no {key}= line: not a valid store identity (restore it, or remove it to have "
                             f"it inferred from the files again)")  # fmt: skip
        return value

    def integer(key: str, value: str) -> int:
        if not value.isdigit():
            raise StoreError(f"{path}: {key}={value!r} is not a non-negative integer")
        return int(value)

    version = integer("version", required("version"))
    if version != IDENTITY_VERSION:
        raise StoreError(f"{path}: version {version}, this hasvc reads version {IDENTITY_VERSION} "
                         f"(written by a newer hasvc?)")  # fmt: skip
    kind_text = required("kind")
    try:
        kind = StoreKind(kind_text)
    except ValueError:
        raise StoreError(f"{path}: kind={kind_text!r}, expected classic or dledger") from None
    store_id = required("store_id")
    if len(store_id) != 32 or any(c not in "0123456789abcdef" for c in store_id):
        raise StoreError(f"{path}: store_id={store_id!r} is not 32 lowercase hex digits")
    created_ms = integer("created_ms", required("created_ms"))
    member = group = upgraded_ms = None
    if kind is StoreKind.DLEDGER:
        member = _name(path, "member", required("member"))
        group = _name(path, "group", values["group"]) if values.get("group") else None
        upgraded_ms = integer("upgraded_ms", values["upgraded_ms"]) if values.get("upgraded_ms") else None
    return StoreIdentity(kind, store_id, created_ms, member, group, upgraded_ms)


def _name(where: str, key: str, value: str) -> str:
    if not value or len(value) > NAME_CHARS_MAX or not value.isprintable() or value != value.strip():
        raise StoreError(f"{where}: {key} {value!r} is not a name (1 to {NAME_CHARS_MAX} printable characters, "
                         f"no surrounding spaces)")  # fmt: skip
    return value


def write_identity(root: str, identity: StoreIdentity) -> None:
    """Replace ``root``'s marker durably (temp file, fsync, rename, directory fsync)."""
    for key in ("member", "group"):
        value = getattr(identity, key)
        if value is not None:
            _name(identity_path(root), key, value)
    write_properties(identity_path(root), identity.properties())


def new_identity(opener: Opener, *, now_ms: int) -> StoreIdentity:
    return StoreIdentity(opener.kind, uuid.uuid4().hex, now_ms, opener.member, opener.group)


# -- what the files say (stores from before markers) ------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Inferred:
    """What a store's files say it is: ``kind`` None for an empty store; ``member`` for a DLedger
    store with one member directory; ``ambiguous`` a reason when the files say both."""

    kind: StoreKind | None
    member: str | None = None
    ambiguous: str | None = None


def infer(root: str) -> Inferred:
    """The kind of store ``root`` by its files (read-only)."""
    members = sorted(os.path.basename(path)[len(DLEDGER_DIRECTORY_PREFIX) :]
                     for path in glob.glob(os.path.join(glob.escape(root), DLEDGER_DIRECTORY_PREFIX + "*"))
                     if os.path.isdir(path))  # fmt: skip
    classic_directory = os.path.join(root, "commitlog")
    classic = MappedFileQueue.segment_files(classic_directory)
    if not members:
        return Inferred(StoreKind.CLASSIC if classic else None)
    if len(members) > 1:
        names = ", ".join(DLEDGER_DIRECTORY_PREFIX + member for member in members)
        return Inferred(None, ambiguous=f"the logs of several DLedger members ({names})")
    member = members[0]
    data = MappedFileQueue.segment_files(os.path.join(root, DLEDGER_DIRECTORY_PREFIX + member, "data"))
    if classic and data:
        classic_end = classic[-1][0] + os.path.getsize(classic[-1][1])
        if classic_end > data[0][0]:
            return Inferred(None, member, ambiguous=(
                f"a classic log (commitlog/, up to offset {classic_end}) overlapping member {member}'s DLedger log "
                f"({DLEDGER_DIRECTORY_PREFIX}{member}/data/, from offset {data[0][0]}): both a classic broker and a "
                f"DLedger node wrote here"))  # fmt: skip
    return Inferred(StoreKind.DLEDGER, member)


# -- the check --------------------------------------------------------------------------------


def check(root: str, opener: Opener, *, now_ms: int | None = None) -> tuple[StoreIdentity, bool]:
    """Whether ``opener`` may open store ``root``, without changing anything: ``(identity, write)``,
    the store's identity once opened and whether the marker must be (re)written. StoreError, one
    line naming the file and what to do, when it may not."""
    now_ms = clock_ms() if now_ms is None else now_ms  # the creation (or upgrade) time the marker records
    for key, value in (("--self", opener.member), ("--group", opener.group)):
        if value is not None:
            _name(f"{root}: refusing to open it", key, value)  # it could not be recorded
    found = read_identity(root)
    if found is None:
        found = _legacy_identity(root, opener, now_ms=now_ms)
        if found is None:
            return new_identity(opener, now_ms=now_ms), True
        return _admit(root, found, opener, now_ms=now_ms, legacy=True)[0], True
    return _admit(root, found, opener, now_ms=now_ms, legacy=False)


def claim(root: str, opener: Opener, *, now_ms: int | None = None) -> StoreIdentity:
    """``check`` again (under the store's lock) and write the marker when it is missing or changes."""
    identity, write = check(root, opener, now_ms=now_ms)
    if write:
        write_identity(root, identity)
    return identity


def _legacy_identity(root: str, opener: Opener, *, now_ms: int) -> StoreIdentity | None:
    """What a store without a marker is, by its files; None when it is empty (a new store)."""
    inferred = infer(root)
    if inferred.ambiguous is not None:
        raise StoreError(f"{identity_path(root)}: none, and the files hold {inferred.ambiguous}; refusing to open it "
                         f"(copy out what you need with hasvc store dump, then move one of them away)")  # fmt: skip
    if inferred.kind is None:
        return None
    return StoreIdentity(inferred.kind, uuid.uuid4().hex, now_ms, inferred.member)


def _admit(root: str, found: StoreIdentity, opener: Opener, *, now_ms: int, legacy: bool) -> tuple[StoreIdentity, bool]:
    """The identity ``opener`` may open the store as, and whether it must be written; StoreError if none."""
    where = identity_path(root) + (" (none: inferred from the files)" if legacy else "")
    what = found.describe(with_id=not legacy)  # a store id made up for a store without a marker means nothing
    if opener.kind is StoreKind.CLASSIC:
        if found.kind is StoreKind.DLEDGER:
            raise StoreError(f"{where}: {what}; a classic master or slave must not open it: run hasvc node --self "
                             f"{found.member} on it, or give this broker another --store")  # fmt: skip
        return found, False
    if found.kind is StoreKind.CLASSIC:
        if not opener.upgrade:
            raise StoreError(f"{where}: {what}; a DLedger node opens one only to continue its log (smooth upgrade, "
                             f"with every broker of the group stopped): add --upgrade-from-classic, or give this node "
                             f"another --store")  # fmt: skip
        upgraded = dataclasses.replace(found, kind=StoreKind.DLEDGER, member=opener.member, group=opener.group,
                                       upgraded_ms=now_ms)  # fmt: skip
        return upgraded, True
    if found.member != opener.member:
        raise StoreError(f"{where}: {what}, not member {opener.member}'s: start it with --self {found.member}, or "
                         f"give --self {opener.member} a store of its own")  # fmt: skip
    if opener.group is not None and found.group is not None and found.group != opener.group:
        raise StoreError(f"{where}: {what}, not of group {opener.group}: start it with --group {found.group}, or give "
                         f"this node a store of its own")  # fmt: skip
    if found.group is None and opener.group is not None:
        return dataclasses.replace(found, group=opener.group), True  # recorded by the first open that knows it
    return found, False
