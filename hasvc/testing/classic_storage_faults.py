"""The storage faults of ``ClassicCluster`` and the operator's answers to them: a full disk, a
failed write or fsync, a flipped bit and lost writes on a stopped broker's disk, and the repair
from a peer (``hasvc store repair --from``) or the accepted loss (``--accept-loss``). See
``hasvc.testing.classic_cluster``'s "Storage faults".

``StorageFaults`` is a part of ``ClassicCluster`` (its base class): the methods run on the
cluster's own fields, as when they were written in the one class.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from commitlog.epoch import find_consistent_point, truncate_suffix_by_offset
from hasvc.testing.classic_broker import Broker, Damage, _holds, _read

if TYPE_CHECKING:
    from hasvc.testing.classic_checker import ClassicChecker


class StorageFaults:
    """Storage faults and the operator's repair in ``ClassicCluster`` (see the module)."""

    now: float
    brokers: dict[str, Broker]
    checker: ClassicChecker
    records: list[tuple[int, bytes]]
    storage_faults: dict[str, int]
    repairs: int
    accepted_losses: int

    def _fault(self, kind: str) -> None:
        self.storage_faults[kind] = self.storage_faults.get(kind, 0) + 1

    def disk_full(self, name: str, seconds: float) -> None:
        self.brokers[name].disk_full_until = self.now + seconds
        self._fault("enospc")

    def fail_write(self, name: str) -> None:
        self.brokers[name].fail_next_write = True
        self._fault("eio-write")

    def fail_fsync(self, name: str) -> None:
        self.brokers[name].fail_next_fsync = True
        self._fault("eio-fsync")

    def _held_records(self, broker: Broker, rng: random.Random, below: int, tries: int = 24) -> list[tuple[int, bytes]]:
        """Some records ``broker``'s log holds whole below ``below`` (sampled: the list is long)."""
        if not self.records:
            return []
        picks = [self.records[rng.randrange(len(self.records))] for _ in range(tries)]
        return [(offset, data) for offset, data in picks
                if broker.log.min_offset <= offset and offset + len(data) <= below and _holds(broker.log, offset, data)]

    def flip_bit(self, name: str, rng: random.Random) -> bool:
        """A stopped broker's disk flips one bit in a record below its flushed offset (what a
        restart then finds as damage, not a torn tail)."""
        broker = self.brokers[name]
        assert not broker.up and broker.damage is None
        held = self._held_records(broker, rng, broker.log.flushed_offset)
        if not held:
            return False
        offset, data = held[0]
        where = offset + rng.randrange(len(data))
        broker.log.flip(where, rng.randrange(8))
        broker.damage = Damage(offset, offset + len(data), f"body CRC mismatch at {offset} (bit flipped at {where})",
                               data, broker.log.max_offset)  # fmt: skip
        self._fault("flip")
        return True

    def lose_writes(self, name: str, rng: random.Random) -> bool:
        """A stopped broker's log ends below its checkpoint's flushed offset: flushed bytes gone
        from a record's start on (the disk lied about an fsync, or a segment file went)."""
        broker = self.brokers[name]
        assert not broker.up and broker.damage is None
        flushed = broker.log.flushed_offset
        held = self._held_records(broker, rng, flushed)
        if not held:
            return False
        start = held[0][0]
        truth = _read(broker.log, start, flushed)
        claimed = broker.log.max_offset
        broker.log.lose_flushed(start)
        reason = f"lost writes: the log ends at {start}, flushed to {flushed}"
        broker.damage = Damage(start, flushed, reason, truth, claimed)
        self.checker.after_crash(list(self.brokers.values()))  # the unflushed tail went too
        self._fault("lost-writes")
        return True

    def repair_source(self, name: str) -> Broker | None:
        """A running peer that holds the damaged range under the same epoch history (the logs
        are byte-identical there), or None."""
        broker = self.brokers[name]
        damage = broker.damage
        for peer in self.brokers.values():
            if peer is broker or not peer.up or peer.log.min_offset > damage.start or peer.log.max_offset < damage.end:
                continue
            if broker.epochs and peer.epochs and find_consistent_point(
                    broker.epochs, damage.claimed_end, peer.epochs, peer.log.max_offset) >= damage.end:  # fmt: skip
                return peer
        return None

    def repair(self, name: str, source: str) -> None:
        """``hasvc store repair DIR --from PEER``: the damaged range copied back from the peer."""
        broker, damage = self.brokers[name], self.brokers[name].damage
        broker.log.write_back(damage.start, _read(self.brokers[source].log, damage.start, damage.end))
        broker.damage = None
        self.repairs += 1
        self.checker.repaired(broker, damage)

    def accept_loss(self, name: str) -> None:
        """``hasvc store repair DIR --accept-loss``: cut at the damage (no peer holds the range)."""
        broker, damage = self.brokers[name], self.brokers[name].damage
        broker.log.truncate(min(damage.start, broker.log.max_offset))
        broker.epochs = truncate_suffix_by_offset(broker.epochs, broker.log.max_offset + 1)
        broker.damage = None
        self.accepted_losses += 1
        self.checker.accepted_loss(broker, damage, list(self.brokers.values()))
