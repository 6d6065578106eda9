"""A planned switchover of a classic pair that loses and duplicates nothing (``hasvc switchover``).

Theory of operation
-------------------
Promoting a slave while its master still takes writes makes two masters until the old one is
demoted, and demote then cuts what the old master alone took. The switchover closes that window
by ordering the steps (Redis FAILOVER, Patroni switchover):

1. **Fence** the master (FENCE, docs/PROTOCOL.md §2): every SEND is refused with
   SERVICE_NOT_AVAILABLE from now on (a failover client looks for the master again and retries
   the same sequences), while the master goes on serving its slaves; a SYNC_MASTER put already
   appended is still answered when the slave acknowledges it.
2. **Wait** until the slave has acknowledged the master's whole log: its ``ack_offset`` in the
   master's STATUS equals the master's ``max_offset`` (fenced, the log no longer grows, so that
   equality is final). Past ``timeout_seconds`` the fence is lifted and nothing has changed.
3. **Promote** the slave, fenced from its first moment as master: a new epoch at its log's end,
   which is the old master's end.
4. **Demote** the old master under the new master's HA address: it becomes its slave; the two
   epoch histories agree up to its log's end, so nothing is cut.
5. **Lift** the new master's fence once the old master has reported as its slave. A SYNC_MASTER
   without a slave answers a put SLAVE_NOT_AVAILABLE (stored, not acknowledged): taking writes
   before its slave is back gave producers dozens of those per switchover under load. Past
   ``timeout_seconds`` the fence is lifted anyway (the pair is switched; puts meet what any
   master without a slave answers) and the result says so.

Every write acknowledged before the fence is in the slave's log before it is promoted (step 2),
and no write is taken by the old master after the fence: none is lost. A refused send was not
stored anywhere, and a retry of one that was is answered from the new master's producer table
(rebuilt from its log's end at promotion): none is duplicated.
"""

from __future__ import annotations

import dataclasses

import trio

from hasvc.client import ClientError, connect
from hasvc.config import format_address, parse_address

# How often the fenced master is asked how far its slave has acknowledged (a STATUS each: cheap).
POLL_SECONDS = 0.05
TIMEOUT_SECONDS_DEFAULT = 30.0


class SwitchoverError(ClientError):
    """The switchover did not happen (or stopped half-way): the message says what state the pair is in."""


@dataclasses.dataclass(frozen=True)
class SwitchoverResult:
    promoted: dict  # the new master's STATUS after PROMOTE
    demoted: dict  # the old master's STATUS after DEMOTE
    wait_seconds: float  # from the fence to the slave having every byte
    fenced_seconds: float  # from the fence to the new master taking writes
    rejoined: bool = True  # the old master reported as the new master's slave before its fence was lifted


def check_pair(master_address: str, master: dict, slave_address: str, slave: dict) -> None:
    """SwitchoverError unless ``master`` is an unfenced classic master and ``slave`` its connected slave."""
    if master.get("mode") == "dledger" or slave.get("mode") == "dledger":
        raise SwitchoverError("a DLedger group hands leadership over with hasvc transfer-leader")
    if master["role"] == "SLAVE":
        raise SwitchoverError(f"{master_address} is a slave, not a master")
    if master.get("fenced_by"):
        raise SwitchoverError(f"{master_address} is fenced already: {master['fenced_by']}")
    if slave["role"] != "SLAVE":
        raise SwitchoverError(f"{slave_address} is a {slave['role']}, not a slave")
    if format_address(parse_address(slave["master_ha"])) != format_address(parse_address(master["ha_listen"])):
        raise SwitchoverError(f"{slave_address} replicates from {slave['master_ha']}, not from {master_address} (HA {master['ha_listen']})")
    if not slave["master_connected"]:
        raise SwitchoverError(f"{slave_address} is not connected to its master: it would not catch up")


def slave_has_everything(master: dict, slave_listen: str) -> bool:
    """The master lists the slave and the slave has acknowledged the master's whole log."""
    entry = next((item for item in master["slaves"] if item["address"] == slave_listen), None)
    return entry is not None and entry["ack_offset"] == master["max_offset"]


def slave_reported(master: dict, slave_listen: str) -> bool:
    """The master lists the slave and has had its first report (a SYNC_MASTER put can wait for it)."""
    return any(item["address"] == slave_listen and item["ack_offset"] >= 0 for item in master["slaves"])


async def _wait_for(client, predicate, timeout_seconds: float) -> bool:
    """Ask ``client`` its STATUS every POLL_SECONDS until ``predicate(status)``; False on timeout."""
    with trio.move_on_after(timeout_seconds):
        while not predicate(await client.status()):
            await trio.sleep(POLL_SECONDS)
        return True
    return False


async def switchover(master_address: str, slave_address: str, *, secret=None, tls_ca: str | None = None,
                     timeout_seconds: float = TIMEOUT_SECONDS_DEFAULT, sync: bool | None = None) -> SwitchoverResult:  # fmt: skip
    """Make the slave at ``slave_address`` the master and the master at ``master_address`` its
    slave, as the module says. ``sync``: the new master's role (None: the old master's)."""
    async with connect(master_address, secret, tls_ca=tls_ca) as master, connect(slave_address, secret, tls_ca=tls_ca) as slave:
        master_status, slave_status = await master.status(), await slave.status()
        check_pair(master_address, master_status, slave_address, slave_status)
        if sync is None:
            sync = master_status["role"] == "SYNC_MASTER"
        reason = f"switchover to {slave_address}"
        await master.fence(reason)
        fenced = trio.current_time()
        caught_up = await _wait_for(master, lambda status: slave_has_everything(status, slave_status["listen"]), timeout_seconds)
        if not caught_up:
            await master.fence(reason, fence=False)
            raise SwitchoverError(f"{slave_address} did not acknowledge the master's log end within {timeout_seconds} s: "
                                  f"{master_address} takes writes again, nothing changed")  # fmt: skip
        waited = trio.current_time() - fenced
        rejoin = f"switchover from {master_address}: until it reports as this master's slave"
        try:
            promoted = await slave.promote(sync=sync, fence_reason=rejoin)
        except ClientError as error:
            await master.fence(reason, fence=False)
            raise SwitchoverError(f"promoting {slave_address} failed ({error}): {master_address} takes writes again") from None
        try:
            try:
                demoted = await master.demote(promoted["ha_listen"])
            except ClientError as error:
                raise SwitchoverError(f"{slave_address} is the master now but demoting {master_address} failed ({error}); it "
                                      f"stays fenced: run hasvc demote {master_address} --master-ha {promoted['ha_listen']}") from None  # fmt: skip
            rejoined = await _wait_for(slave, lambda status: slave_reported(status, master_status["listen"]), timeout_seconds)
        finally:
            with trio.CancelScope(shield=True):  # the new master must not stay fenced, whatever happened
                await slave.fence(rejoin, fence=False)
        taking_writes = trio.current_time() - fenced
        return SwitchoverResult(promoted, demoted, round(waited, 3), round(taking_writes, 3), rejoined)
