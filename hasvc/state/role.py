"""A broker's role as one state: master or slave, whose slave, fenced or not, the newest epoch a
peer has shown. Transitions return what the driver must do (effects), in order.

Theory of operation
-------------------
A broker is a master (SYNC_MASTER or ASYNC_MASTER: it takes writes and serves slaves on its HA
port) or a slave (it replicates from ``master_ha`` and refuses writes, naming its master).

* ``promote`` (slave -> master) happens in two steps because the driver does I/O in between:
  ``begin_promotion`` checks it is allowed, decides the new epoch (one past every epoch this
  broker or a peer has known) and says to stop replicating; the driver cuts a partial last record,
  appends the epoch at the log's end, persists it and rebuilds the producer table, all while the
  role still refuses writes; ``finish_promotion`` then makes it a master and says to serve slaves.
* ``demote`` (master -> slave of ``master_ha``) takes effect at once: stop serving slaves, end
  the puts waiting for slave acks (stored here, not known replicated), forget the producer table
  (rebuilt on a later promotion), start replicating.
* ``fence``: a peer showed a newer epoch, so a newer master exists; a fenced master refuses writes
  until it is demoted (and so rejoins the newer history) or promoted again. A FENCE request
  (``hasvc switchover``) fences too, and ``lift_fence`` with the same reason undoes only that one.
* ``epoch_seen`` remembers the newest epoch a peer showed (a master's hello, a slave's hello): a
  later promotion opens an epoch above it.
* Controller mode (``hasvc/broker/controlled.py``): a broker starts as a slave of nobody yet
  (``master_ha`` None: it refuses writes and replicates from no one) until its controller names
  the master; ``follow`` makes it the slave of the master it names (from any role), and a
  promotion opens the epoch the controller chose (``epoch``), which must lie above every epoch
  this broker knows.

Invariants (``check_invariants`` after every transition): a slave is not fenced and is the only
role that can be connected to a master, and only with a master address (None: no master named
yet, controller mode); ``peer_epoch`` never decreases.
"""

from __future__ import annotations

import dataclasses

from hasvc.config import Address, BrokerRole, format_address


@dataclasses.dataclass(frozen=True, slots=True)
class StopReplicating:
    """Cancel the HA client (a slave's replication)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StartReplicating:
    """Start the HA client towards ``master_ha``."""

    master_ha: Address


@dataclasses.dataclass(frozen=True, slots=True)
class StartHAService:
    """Open the HA port and serve slaves."""


@dataclasses.dataclass(frozen=True, slots=True)
class StopHAService:
    """Close the HA port and every slave connection."""


@dataclasses.dataclass(frozen=True, slots=True)
class FailAckWaits:
    """End every put waiting for slave acks as not replicated (FLUSH_SLAVE_TIMEOUT)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClearProducers:
    """Forget the producer table: a later promotion rebuilds it from the log."""


Effect = StopReplicating | StartReplicating | StartHAService | StopHAService | FailAckWaits | ClearProducers


@dataclasses.dataclass(frozen=True, slots=True)
class Promotion:
    """A promotion under way: the role it ends in and the epoch it opens."""

    role: BrokerRole
    epoch: int


class RoleState:
    __slots__ = ("role", "master_ha", "fenced_by", "peer_epoch", "master_connected", "replication_refused",
                 "master_client_address")

    def __init__(self, role: BrokerRole, master_ha: Address | None) -> None:
        self.role = role
        # a master keeps no master address (a master's configuration may still name one)
        self.master_ha = master_ha if role is BrokerRole.SLAVE else None
        self.fenced_by: str | None = None  # why writes are refused on a master; None: they are not
        self.peer_epoch = 0  # the newest epoch a peer has shown us
        self.master_connected = False  # a slave's HA client holds a session with its master
        # A slave that will not follow its master, and why (its log ends short inside its own
        # epoch: handshake.reconcile); None when it follows.
        self.replication_refused: str | None = None
        self.master_client_address: str | None = None  # the master's client port, as its MASTER_HELLO said
        self.check_invariants()

    def check_invariants(self) -> None:
        assert self.peer_epoch >= 0
        if self.role is BrokerRole.SLAVE:
            assert self.fenced_by is None
            assert self.master_ha is not None or not self.master_connected
        else:
            assert self.master_ha is None
            assert not self.master_connected

    @property
    def is_slave(self) -> bool:
        return self.role is BrokerRole.SLAVE

    @property
    def sync_master(self) -> bool:
        return self.role is BrokerRole.SYNC_MASTER

    def write_refusal(self) -> str | None:
        """Why this broker refuses a write now (SERVICE_NOT_AVAILABLE), or None."""
        if self.role is BrokerRole.SLAVE:
            if self.master_ha is None:
                return "this broker is a slave with no master named yet: its controller has not elected one"
            if self.master_client_address:
                return f"this broker is a slave; send to its master at {self.master_client_address}"
            return (f"this broker is a slave of the master whose HA address is {format_address(self.master_ha)} "
                    "(its client port is known once replication connects)")  # fmt: skip
        if self.fenced_by is not None:
            return f"this broker is fenced: {self.fenced_by}"
        return None

    def highest_epoch(self, local_epoch: int) -> int:
        """The newest epoch known here: our log's last or one a peer showed."""
        return max(local_epoch, self.peer_epoch)

    # -- transitions ----------------------------------------------------------------------

    def epoch_seen(self, epoch: int) -> None:
        self.peer_epoch = max(self.peer_epoch, epoch)
        self.check_invariants()

    def fence(self, reason: str) -> bool:
        """Refuse writes from now on; True when this fenced a broker that was not fenced."""
        assert self.role is not BrokerRole.SLAVE, "a slave takes no writes to fence"
        newly = self.fenced_by is None
        self.fenced_by = reason
        self.check_invariants()
        return newly

    def lift_fence(self, reason: str) -> None:
        """Take writes again after ``fence(reason)`` (a switchover given up); ValueError when not
        fenced, or fenced for another reason (a newer epoch's fence ends only by demote or promote)."""
        if self.fenced_by != reason:
            raise ValueError(f"not fenced by {reason!r}" + (f" but: {self.fenced_by}" if self.fenced_by else ""))
        self.fenced_by = None
        self.check_invariants()

    def set_master_connected(self, connected: bool) -> None:
        assert not connected or self.role is BrokerRole.SLAVE
        self.master_connected = connected
        self.check_invariants()

    def begin_promotion(self, role: BrokerRole, *, local_epoch: int, epoch: int | None = None) -> tuple[Promotion, list[Effect]]:
        """Slave -> ``role``, first step: the epoch to open and what to do before the driver
        prepares the log. The role is unchanged (writes stay refused) until ``finish_promotion``.
        ``epoch``: the one a controller chose (else one past every epoch known here): above every
        epoch known here, or the log's own last one when no peer showed it (a master restarted
        in its epoch resumes it: the driver opens no new one). Raises ValueError when this broker
        is not a slave, or ``epoch`` is neither."""
        if role is BrokerRole.SLAVE:
            raise ValueError("promote to SYNC_MASTER or ASYNC_MASTER")
        if self.role is not BrokerRole.SLAVE:
            raise ValueError(f"already {self.role.value}")
        highest = self.highest_epoch(local_epoch)
        resumes = epoch == local_epoch and self.peer_epoch < local_epoch
        if epoch is not None and epoch <= highest and not resumes:
            raise ValueError(f"cannot serve epoch {epoch}: this broker knows epoch {highest} already (a master's epoch only grows)")
        self.master_connected = False
        self.check_invariants()
        return Promotion(role, highest + 1 if epoch is None else epoch), [StopReplicating()]

    def finish_promotion(self, promotion: Promotion) -> list[Effect]:
        """Second step, once the new epoch is persisted: a master, taking writes."""
        assert self.role is BrokerRole.SLAVE, "one promotion at a time"
        self.role = promotion.role
        self.master_ha = None
        self.master_client_address = None
        self.fenced_by = None
        self.check_invariants()
        return [StartHAService()]

    def demote(self, master_ha: Address) -> list[Effect]:
        """Master -> slave of ``master_ha``. Raises ValueError when already a slave."""
        if self.role is BrokerRole.SLAVE:
            raise ValueError("already a slave")
        self.role = BrokerRole.SLAVE
        self.master_ha = master_ha
        self.master_client_address = None
        self.fenced_by = None
        self.check_invariants()
        return [ClearProducers(), StopHAService(), FailAckWaits(), StartReplicating(master_ha)]

    def follow(self, master_ha: Address) -> list[Effect]:
        """Controller mode: be the slave of ``master_ha`` from any role (a master is demoted; a
        slave of another master, or of none yet, replicates from this one instead); nothing to
        do when it already is."""
        if self.role is not BrokerRole.SLAVE:
            return self.demote(master_ha)
        if self.master_ha == master_ha:
            return []
        self.master_ha = master_ha
        self.master_connected = False
        self.master_client_address = None
        self.replication_refused = None
        self.check_invariants()
        return [StopReplicating(), StartReplicating(master_ha)]
