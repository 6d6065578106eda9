"""The seams between the classic put path and a Raft member: ``RaftReplicator`` (the
``Replicator`` of ``PutService``: replicated = committed by the group) and ``RaftLog`` (its
``PutSink``, what it appends to: a put proposes its records through the driver)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from commitlog import entry_pass, pass_encode
from commitlog import record as rec
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.store import AppendResult
from hasvc.state.replication import Admission

if TYPE_CHECKING:
    from hasvc.broker.raft.driver import RaftDriver


class RaftReplicator:
    """The Replicator seam for DLedger mode: replicated = committed by the group. ``appended``
    (PutService: a pass of puts proposed) carries the proposals' Ready out (``after_proposals``:
    the driver's ``drain``): their entries appended and pushed together."""

    def __init__(self, store: DLedgerMessageStore, *, after_proposals=lambda: None) -> None:
        self.store = store
        self._listeners = []
        self._after_proposals = after_proposals

    def appended(self) -> None:
        self._after_proposals()

    def replicated_offset(self) -> int:
        return self.store.committed_end_offset()

    def admit(self, next_offset: int) -> Admission:
        return Admission.WAIT

    def shortfall(self, next_offset: int) -> str:
        return "not committed by a quorum of the group"

    def in_sync_count(self) -> int:
        return 1

    def subscribe(self, listener) -> None:
        self._listeners.append(listener)

    def committed(self) -> None:
        offset = self.replicated_offset()
        for listener in self._listeners:
            listener(offset)


class RaftLog:
    """A member's ``PutSink`` (``hasvc.broker.put_service``): its appends *propose* the records,
    planned at their final offsets by the member's store, through the driver. Reads go to the
    store itself (``ClientPort`` is given the store)."""

    __slots__ = ("config", "_store", "_driver")

    def __init__(self, store: DLedgerMessageStore, driver: RaftDriver) -> None:
        self.config = store.config  # the store's (frozen): PutService's flush type and waits
        self._store = store
        self._driver = driver

    def append_batch(self, batch: rec.MessageBatch) -> AppendResult:
        """Propose ``batch``; its Ready is carried out once the pass of puts is proposed
        (``RaftReplicator.appended``, which PutService calls next, before any wait)."""
        return self._driver.propose_plan(lambda: self._store.plan_batch(batch), drain=False)

    def append_batches(self, batches: list[rec.MessageBatch]) -> AppendResult:
        """Propose several batches (a pass's groups over several queues) as one proposal, in
        their order: one AppendResult for them all, its offsets and queue offsets each
        message's (``PutService`` cuts it per batch and request). Refused as a whole."""
        return self._driver.propose_plan(lambda: self._store.plan_batches(batches), drain=False)


    def append_pass(self, requests: list, *, messages_max: int, decode, decide=None, kinds=None) -> pass_encode.PassAppend | None:
        """Propose a pass of plain SENDs (``pass_encode.append_pass``'s requests) as one proposal
        planned by one native call (``entry_pass.plan_entry_pass``): the requests kept in the
        order read, the refused and malformed ones answered apart. None, with nothing proposed,
        when the pass takes the batch path (``plan_entry_pass``'s cases, or a proposal the
        driver refuses: a full disk, no longer leading), which answers it as before."""
        planned = entry_pass.plan_entry_pass(self._store, requests, messages_max=messages_max, decode=decode, decide=decide,
                                             kinds=kinds, term=self._driver.node.term)  # fmt: skip
        if planned is None:
            return None
        plan = planned.plan
        if plan is None:  # every request refused or malformed
            return pass_encode.PassAppend(None, planned.answers, planned.refusals, planned.malformed, planned.left_out)
        result = self._driver.propose_plan(lambda: plan, drain=False)
        if result.status is not rec.PutMessageStatus.PUT_OK:
            return None
        return pass_encode.PassAppend(result, planned.answers, planned.refusals, planned.malformed, planned.left_out, plan.entry_sizes)
