"""The HA handshake's decisions, on both ends: one owner of the epoch relation.

Theory of operation
-------------------
A slave opens with its epoch history and where its log ends (``ha.SlaveHello``); the master
answers with its own (``ha.MasterHello``). Two logs are one history when their epoch tables share
a consistent point (``commitlog.epoch.find_consistent_point``: the last offset both logs hold
under the same epoch). Both ends ask the same question of the same two tables:

* the master (``admit_slave``): refuse a slave whose history shares nothing with ours (a store of
  another cluster), a slave with no history whose log ends beyond ours, a slave whose log ends
  below our oldest retained byte; and when a related slave knows a newer epoch than ours, a newer
  master exists: refuse it and fence ourselves (``fence_epoch``);
* the slave (``reconcile``): refuse a master whose segments differ in size or whose history
  shares nothing with ours; refuse a master whose log ends inside the last epoch both histories
  share (its current one) below where ours holds that epoch: the master lost bytes of its own
  epoch (damage cut, a lost disk), and a healthy copy is never cut to match a damaged or shorter
  one — we keep our bytes, say so, and the master is repaired from us (``hasvc store repair
  --from``); otherwise cut our log back to the consistent point, which is then where the
  histories diverge (a former master's unacknowledged tail, in an epoch the new master never
  had, goes) and adopt the master's epoch table.

Nothing here reads the store: the drivers pass what the logs are (``LogView``) and carry out the
answer (send the refusal, fence, truncate, replace the epoch file).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from commitlog.epoch import EpochEntry, end_of, find_consistent_point
from hasvc.protocol import ha

# A refusal's reason in MASTER_HELLO is cut to this many characters (at most 4 bytes each: with
# 1000 epoch entries the frame stays under ha.HANDSHAKE_SIZE_MAX); the master's log keeps it whole.
REFUSAL_REASON_CHARS_MAX = 4096

@dataclasses.dataclass(frozen=True, slots=True)
class LogView:
    """What the handshake needs to know of a log (read by the driver, passed in)."""

    epochs: tuple[EpochEntry, ...]
    min_offset: int
    max_offset: int
    segment_size: int

    def __post_init__(self) -> None:
        assert 0 <= self.min_offset <= self.max_offset, (self.min_offset, self.max_offset)
        assert self.segment_size > 0

    @property
    def last_epoch(self) -> int:
        return self.epochs[-1].epoch if self.epochs else 0

    def epoch_pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple((entry.epoch, entry.start_offset) for entry in self.epochs)


@dataclasses.dataclass(frozen=True, slots=True)
class SlaveAdmission:
    """The master's answer to a slave: admitted when ``refusal`` is empty. ``fence_epoch`` > 0:
    the slave knows that newer epoch, so this master fences itself (``fence_reason``)."""

    refusal: str = ""
    fence_epoch: int = 0
    fence_reason: str = ""

    @property
    def admitted(self) -> bool:
        return not self.refusal

    def master_hello(self, master: LogView) -> ha.MasterHello:
        """The handshake answer that says so (the reason cut to ``REFUSAL_REASON_CHARS_MAX``:
        two 1000-entry histories quoted would not fit the frame)."""
        reason = self.refusal
        if len(reason) > REFUSAL_REASON_CHARS_MAX:
            reason = reason[: REFUSAL_REASON_CHARS_MAX - 3] + "..."
        status = ha.STATUS_REFUSED if reason else ha.STATUS_OK
        return ha.MasterHello(status, master.max_offset, master.min_offset, master.segment_size, master.epoch_pairs(), reason)


def _entries(pairs: Sequence[tuple[int, int]]) -> list[EpochEntry]:
    return [EpochEntry(epoch, start_offset) for epoch, start_offset in pairs]


def _describe(entries: Sequence[EpochEntry]) -> list[tuple[int, int]]:
    return [(entry.epoch, entry.start_offset) for entry in entries]


def admit_slave(hello: ha.SlaveHello, master: LogView) -> SlaveAdmission:
    """Whether the master replicates to the slave that sent ``hello``."""
    slave_entries = _entries(hello.epochs)
    slave_epoch = slave_entries[-1].epoch if slave_entries else 0
    related = not slave_entries or not master.epochs or find_consistent_point(
        slave_entries, hello.max_offset, list(master.epochs), master.max_offset
    ) >= 0  # fmt: skip
    if not related:
        return SlaveAdmission(
            f"no consistent point between the slave's epochs {list(hello.epochs)} and the master's "
            f"{_describe(master.epochs)}: the store is not from this cluster"
        )
    if slave_epoch > master.last_epoch:
        return SlaveAdmission(
            f"this master is behind your epoch {slave_epoch}: it is fenced and refuses writes",
            fence_epoch=slave_epoch,
            fence_reason=f"slave {hello.slave_id} knows epoch {slave_epoch}, newer than ours {master.last_epoch}",
        )
    if hello.max_offset > master.max_offset and not hello.epochs:
        return SlaveAdmission(f"the slave's log ends at {hello.max_offset}, beyond the master's end {master.max_offset}")
    if 0 < hello.max_offset < master.min_offset:
        return SlaveAdmission(
            f"the slave's log ends at {hello.max_offset} but the master's oldest retained offset is "
            f"{master.min_offset}: clear the slave's store to resynchronise"
        )
    return SlaveAdmission()


@dataclasses.dataclass(frozen=True, slots=True)
class Reconciliation:
    """The slave's answer to a master: refused when ``refusal`` is set; otherwise cut the log to
    ``truncate_to`` (None: keep it whole), then adopt ``epochs`` (None: keep ours).
    ``master_epoch`` is the newest epoch a related master showed (0: none, or refused before the
    histories were compared)."""

    refusal: str = ""
    truncate_to: int | None = None
    epochs: tuple[EpochEntry, ...] | None = None
    master_epoch: int = 0
    master_shrank: bool = False  # the refusal is the master's log ending short inside its own epoch


def _shrank_within_epoch(
    local: list[EpochEntry], local_end: int, master: list[EpochEntry], master_end: int
) -> tuple[int, int] | None:
    """(epoch, where our log holds it to) when the newest entry both histories share is the
    master's last — the epoch it still writes in — and our log holds that epoch beyond the
    master's end: bytes of one master's epoch that the master no longer has. None otherwise
    (in particular when the master's history goes on in a later epoch: then the bytes past
    that epoch's start are a divergence, and cutting them is the failover's rule)."""
    by_epoch = {entry.epoch: index for index, entry in enumerate(master)}
    for index in range(len(local) - 1, -1, -1):
        entry = local[index]
        match = by_epoch.get(entry.epoch)
        if match is not None and master[match].start_offset == entry.start_offset:
            held_to = end_of(local, index, local_end)
            if match == len(master) - 1 and master_end < held_to:
                return entry.epoch, held_to
            return None
    return None


def reconcile(local: LogView, local_end: int, master: ha.MasterHello) -> Reconciliation:
    """Where a slave's log (``local``, written up to ``local_end``) must be cut to follow the
    master that answered ``master``, and the epoch table it then takes on. The master's refusal
    is the slave's refusal too."""
    master_entries = _entries(master.epochs)
    master_epoch = master_entries[-1].epoch if master_entries else 0
    if master.status != ha.STATUS_OK:
        return Reconciliation(f"master refused replication: {master.reason}")
    if master.segment_size != local.segment_size:
        return Reconciliation(
            f"master segments are {master.segment_size} bytes, ours {local.segment_size}: logs could not be identical"
        )
    truncate_to = None
    if local.epochs and master_entries:
        point = find_consistent_point(list(local.epochs), local_end, master_entries, master.max_offset)
        if point < 0:
            return Reconciliation(
                f"no consistent point between our epochs {_describe(local.epochs)} and the "
                f"master's {master.epochs}: refusing to replicate (this store is not from this cluster)",
                master_epoch=master_epoch,
            )
        shrank = _shrank_within_epoch(list(local.epochs), local_end, master_entries, master.max_offset)
        if shrank is not None:
            epoch, held_to = shrank
            return Reconciliation(
                f"the master's log ends at {master.max_offset} inside its epoch {epoch}, which our log holds "
                f"to {held_to}: the master lost bytes of its own epoch; refusing to follow it and keeping "
                f"ours (repair the master's store from this broker: hasvc store repair DIR --from HOST:PORT)",
                master_epoch=master_epoch, master_shrank=True,
            )  # fmt: skip
        if point < local_end:
            truncate_to = point
    result = Reconciliation(
        truncate_to=truncate_to, epochs=tuple(master_entries) if master_entries else None, master_epoch=master_epoch
    )
    assert result.truncate_to is None or 0 <= result.truncate_to < local_end
    return result
