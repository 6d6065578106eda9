"""``Replicator``: what the put path needs of replication, and classic HA's implementation.

Theory of operation
-------------------
The broker's put path does not know how records reach other brokers. It tells the replicator
that records were appended (``appended``: classic HA sends them to idle slave connections at once,
from the put path), asks whether a put that ends at ``next_offset`` can expect to be replicated
at all (``admit``) and how many replicas are in sync (``in_sync_count``, for
``min_in_sync_replicas``), and learns the offset below which records are as replicated as a put
must wait for (``replicated_offset``) whenever that may have moved (``subscribe``): it releases the
waiting puts the new offset covers.

Classic HA (``ClassicReplicator``): the offset is the one ``in_sync_replicas`` slaves have all
acknowledged (``ReplicaSet.ack_watermark``); it may have moved after every slave report, which
``HAService`` passes on (``on_report``). A Raft replicator implements the same protocol with its
quorum's commit offset, without touching the client port, the outboxes or the put tracker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from hasvc.state.replication import Admission, ReplicaSet

if TYPE_CHECKING:  # the HA service is attached at run time, once the store is open
    from hasvc.broker.ha_master import HAService


@runtime_checkable
class Replicator(Protocol):
    def appended(self) -> None:
        """Records were appended to the local log: send them on."""

    def replicated_offset(self) -> int:
        """Records below this offset are as replicated as a put waits for."""

    def admit(self, next_offset: int) -> Admission:
        """Whether a put ending at ``next_offset`` should wait for replication at all."""

    def shortfall(self, next_offset: int) -> str:
        """Why a put ending at ``next_offset`` cannot wait for replication (when ``admit`` says
        so): SLAVE_NOT_AVAILABLE's reason."""

    def in_sync_count(self) -> int:
        """Replicas close enough to the local log to count as in sync."""

    def subscribe(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(replicated_offset)`` whenever that offset may have moved."""


class ClassicReplicator:
    """Master/slave HA: the broker's ``ReplicaSet`` and, on a master, its ``HAService``."""

    def __init__(self, replicas: ReplicaSet, *, in_sync_replicas: int, max_gap: int, log_end: Callable[[], int]) -> None:
        self.replicas = replicas
        self.in_sync_replicas = in_sync_replicas
        self.max_gap = max_gap
        self.log_end = log_end  # the local log's readable end
        self.service: HAService | None = None  # serving slaves: on a master only
        self._listeners: list[Callable[[int], None]] = []

    def attach(self, service: HAService) -> None:
        assert self.service is None, "one HA service at a time"
        self.service = service

    def detach(self) -> None:
        self.service = None

    def appended(self) -> None:
        service = self.service
        if service is not None:
            service.push()

    def replicated_offset(self) -> int:
        return self.replicas.ack_watermark(self.in_sync_replicas)

    def admit(self, next_offset: int) -> Admission:
        return self.replicas.admit(next_offset=next_offset, max_gap=self.max_gap, replicas=self.in_sync_replicas)

    def shortfall(self, next_offset: int) -> str:
        """How many in-sync slaves were needed, how many there were."""
        ready = self.replicas.ready_count(next_offset=next_offset, max_gap=self.max_gap)
        return (f"stored on the master only: in_sync_replicas {self.in_sync_replicas} slave(s) needed within "
                f"ha_max_gap_not_in_sync {self.max_gap} bytes of the put's end {next_offset}, {ready} there "
                f"({len(self.replicas.slaves)} connected)")  # fmt: skip

    def in_sync_count(self) -> int:
        return self.replicas.in_sync_count(master_max_offset=self.log_end(), max_gap=self.max_gap)

    def subscribe(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    def on_report(self) -> None:
        """A slave reported (``HAService``): the replicated offset may have moved."""
        offset = self.replicas.ack_watermark(self.in_sync_replicas)  # replicated_offset()
        for listener in self._listeners:
            listener(offset)
