"""A broker process: one store, a client port, an HA port (master) or an HA client (slave), and
the store's background work as trio tasks — each a driver of its own (this package), composed here.

Theory of operation
-------------------
Everything runs in one trio loop. ``Broker.run`` opens the store, rebuilds the producer table (a
master), opens the client port (``ClientPort``), starts the put path's timer (``PutService``), the
store's tasks (``StoreTasks``), and either the HA service (a master's slaves, ``HAService``) or
the HA client (a slave's replication, ``HAClient``); it closes the store cleanly when cancelled.

The role is one state (``hasvc.state.role.RoleState``): PROMOTE and DEMOTE requests run its
transitions and ``_carry_out`` does what they return, in order. The put path reaches replication
only through the ``Replicator`` (``hasvc.replicator``); the HA drivers get the pieces they need
(config, store, replica set, role), never the broker.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import time

import trio

from commitlog import repair
from commitlog.commit_log import DamagedLogError
from commitlog.mapped_file import StoreError
from commitlog.store import MessageStore
from hasvc import transport
from hasvc.admission import serve_admitted
from hasvc.broker.client_port import ClientPort
from hasvc.broker.ha_master import HAService
from hasvc.broker.ha_slave import HAClient
from hasvc.broker.online_repair import OnlineRepair, repair_sources
from hasvc.broker.metrics import BrokerMetrics, serve_metrics
from hasvc.broker.put_service import PutService, StoreSink, rebuild_producer_table
from hasvc.broker.repairing import repair_from_a_slave
from hasvc.broker.store_tasks import StoreTasks
from hasvc.config import Address, BrokerConfig, BrokerRole, format_address
from hasvc.replicator import ClassicReplicator
from hasvc.state import role as role_effects
from hasvc.state import succession
from hasvc.state.dedupe import ProducerTable
from hasvc.state.replication import ReplicaSet
from hasvc.state.role import RoleState

LOGGER = logging.getLogger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig, *, role_state: RoleState | None = None, replicator=None):
        """``role_state`` and ``replicator``: a controller-mode broker's own (``controlled.py``:
        it starts as a slave of nobody yet, and replicates against its SyncStateSet)."""
        self.config = config.validate()
        self.role_state = role_state or RoleState(config.role, config.master_ha)
        self.replicas = ReplicaSet()
        self.replicator = replicator or ClassicReplicator(self.replicas, in_sync_replicas=config.in_sync_replicas,
                                                          max_gap=config.ha_max_gap_not_in_sync, log_end=self._log_end)  # fmt: skip
        self.producers = ProducerTable(window=config.producer_sequence_window, producers_max=config.producers_max)
        # The drivers over the store, made when it is open (attach_store).
        self.store: MessageStore | None = None
        self.store_tasks: StoreTasks | None = None
        self.put_service: PutService | None = None
        self.client_port: ClientPort | None = None
        self.listen_address: Address | None = None
        self.ha_address: Address | None = None
        self._nursery: trio.Nursery | None = None
        self._ha_client_scope: trio.CancelScope | None = None
        self._ha_client_done: trio.Event | None = None  # set when the running HA client's task has ended
        self._ha_service_scope: trio.CancelScope | None = None
        self._ha_service_closed = trio.Event()  # set once the running HA service's listener is closed
        self.ha_service: HAService | None = None  # a master's HAService, for pushing appends to its slaves
        self.started_at = time.time()  # wall clock, for the status's uptime
        self.metrics: BrokerMetrics | None = None
        self.metrics_address: Address | None = None

    def attach_store(self, store: MessageStore) -> None:
        """Make the drivers over an open store."""
        assert self.store is None, "one store per broker"
        self.store = store
        self.store_tasks = StoreTasks(store=store, role=self.role_state, warm_ahead_size=store.config.warm_ahead_size)
        self.put_service = PutService(config=self.config, store=StoreSink(store), role=self.role_state,
                                      replicator=self.replicator, producers=self.producers,
                                      after_appends=self.store_tasks.after_appends)  # fmt: skip
        self.client_port = ClientPort(config=self.config, store=store, puts=self.put_service, status=self.status,
                                      promote=self.promote, demote=self.demote, fence=self.fence)  # fmt: skip
        self.online_repair = OnlineRepair(store=store, maintenance=self.store_tasks.maintenance, sources=self._repair_sources,
                                          secret=self.config.secret, tls_ca=self.config.tls_ca)  # fmt: skip
        self.store_tasks.on_damage = self.online_repair.wake

    def _repair_sources(self, damage) -> list[str]:
        """Where damage found while serving is fetched from (``online_repair.repair_sources``)."""
        role = self.role_state
        return repair_sources(damage, is_slave=role.is_slave, master_client_address=role.master_client_address,
                              slaves=list(self.replicas.slaves.values()))  # fmt: skip

    @property
    def role(self) -> BrokerRole:
        return self.role_state.role

    def _log_end(self) -> int:
        return self.store.commit_log.max_offset

    # -- lifetime -------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Open the store, serve until cancelled, then close the store cleanly."""
        self.attach_store(await self._open_store())
        LOGGER.info("store %s: %s", self.config.store, self.store.recovery.describe())
        if self.store.checkpoint.damage:
            LOGGER.error("%s (%s); it is written anew, both copies, at the next checkpoint",
                         self.store.checkpoint.damage,
                         "the other copy was used" if self.store.checkpoint.trusted else
                         "no copy checked: recovery cut nothing by itself")  # fmt: skip
        if self.store.epoch_damage:
            LOGGER.error("the epoch file or its copy was damaged (%s): both written anew from the one that read",
                         self.store.epoch_damage)  # fmt: skip
        for topic, queue_id in self.store.queues_rebuilt:
            LOGGER.error("consume queue %s/%d was damaged in the middle: rebuilt from the log", topic, queue_id)
        try:
            if not self.role_state.is_slave:
                await self._rebuild_producer_table()  # before the client port opens
            async with trio.open_nursery() as nursery:
                ssl_context = self._server_ssl()
                client_listener, client_socket = await transport.open_listener(self.config.listen, ssl_context=ssl_context)
                self.listen_address = transport.listener_address(client_socket)
                nursery.start_soon(serve_admitted, client_listener, self.client_port.serve_client, self.client_port.admission)  # fmt: skip
                self._nursery = nursery
                if not self.role_state.is_slave:
                    self._open_start_epoch()
                    await self._start_ha_service(nursery, ssl_context)
                elif self.role_state.master_ha is not None:  # None: a controller-mode broker, no master named yet
                    self._start_ha_client()
                nursery.start_soon(self.client_port.append_task)
                nursery.start_soon(self.put_service.waiter_timer_task)
                self.store_tasks.start(nursery, self.put_service)
                nursery.start_soon(self.online_repair.run)
                if self.config.metrics_listen is not None:
                    self.metrics, self.metrics_address = await nursery.start(functools.partial(
                        serve_metrics, self.config.metrics_listen, store=self.store, replicas=self.replicas, role=self.role_state,
                        port_statistics=self.port_statistics,
                    ))  # fmt: skip
                    self.put_service.metrics = self.metrics
                    self.client_port.metrics = self.metrics
                task_status.started(self.addresses())
                LOGGER.info("ready: %s", json.dumps(self.addresses()))
        finally:
            self.put_service.fail_all_waits()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.store.close)
            LOGGER.info("store closed cleanly")

    async def _open_store(self) -> MessageStore:
        """The store, open; a master whose store is damaged first repairs it from a slave
        (``repairing``), or refuses with the store's one line."""
        open_store = functools.partial(MessageStore.open, self.config.store, self.config.store_config())
        self._check_loss_marker()
        try:
            return await trio.to_thread.run_sync(open_store)
        except DamagedLogError as damage:
            if self.role_state.is_slave:
                raise
            await repair_from_a_slave(self.config, damage, ssl_context=self._server_ssl())
        return await trio.to_thread.run_sync(open_store)

    def _check_loss_marker(self) -> None:
        """A store that accepted a loss (``hasvc store repair --accept-loss``) does not serve as a
        master: a slave may hold more of the epoch it cut, and a master that kept that epoch and
        wrote on would fork it. As a slave it follows its master (whose history then decides) and
        the mark goes."""
        cut = repair.read_loss_marker(self.config.store)
        if cut is None:
            return
        path = os.path.join(self.config.store, repair.LOSS_MARKER)
        if not self.role_state.is_slave:
            raise StoreError(
                f"{path}: this store gave up its log from offset {cut} (store repair --accept-loss), so a slave may hold "
                f"more of that epoch: promote the replica that holds the most and start this one as its slave; if no other "
                f"copy exists, remove {path} to serve from this store as master"
            )
        os.unlink(path)
        LOGGER.warning("%s: this store gave up its log from offset %d; it follows its master now", path, cut)

    def _open_start_epoch(self) -> None:
        """A master's epoch as it starts: a new store draws its first; after an abnormal exit a
        new one opens at the recovered end, so that a slave holding bytes this log lost (past that
        end, in the old epoch) cuts them on its next handshake (``succession.epoch_on_start``)."""
        epochs, end = self.store.epochs, self.store.commit_log.max_offset
        if epochs.last is None:
            epochs.append(first_epoch(), end)
            return
        epoch = succession.epoch_on_start(epochs.last_epoch, clean_exit=self.store.last_exit_ok)
        if epoch is not None:
            self.store.open_epoch(epoch)
            LOGGER.warning("the last run did not exit cleanly: epoch %d opened at offset %d", epoch, end)

    def after_appends(self, *, push: bool = True) -> None:
        """What follows a pass of appends outside the put path (a frame on a slave): the new
        records to the replicator (unless the caller pushed already), then the store's part."""
        if push:
            self.replicator.appended()
        self.store_tasks.after_appends()

    def _start_ha_client(self) -> None:
        """Start replicating; its cancel scope is made here, so a stop that follows at once
        cancels this client even before its task runs."""
        self._ha_client_scope = scope = trio.CancelScope()
        self._nursery.start_soon(self._run_ha_client, scope)

    async def _run_ha_client(self, scope: trio.CancelScope) -> None:
        # after_appends: the store's part alone (a slave serves no slaves: the replicator has nothing to push).
        client = HAClient(config=self.config, store=self.store, role=self.role_state, listen_address=self.listen_address,
                          truncation_locks=(self.store_tasks.maintenance, self.store_tasks.warming),
                          after_appends=self.store_tasks.after_appends)  # fmt: skip
        previous, self._ha_client_done = self._ha_client_done, trio.Event()
        done = self._ha_client_done
        try:
            with scope:
                if previous is not None:  # a client told to stop ends first: two must never write the log at once
                    await previous.wait()
                await client.run()
        finally:
            done.set()

    async def promote(self, role: BrokerRole, *, fence_reason: str = "", epoch: int | None = None) -> None:
        """Slave -> master: stop replicating, cut a partial last record, open a new epoch at the
        log's end and persist it before taking any write, then serve producers and slaves. With
        ``fence_reason`` it is fenced from its first moment as master (no write comes between).
        ``epoch``: the one a controller chose (controller mode), else one past every epoch known."""
        promotion, effects = self.role_state.begin_promotion(role, local_epoch=self.store.epochs.last_epoch, epoch=epoch)
        await self._carry_out(effects)
        if self._ha_client_done is not None:  # the HA client's last frame is in the log before it is cut
            await self._ha_client_done.wait()
        async with self.store_tasks.maintenance, self.store_tasks.warming:
            end = await trio.to_thread.run_sync(self.store.last_record_end)
            if end < self.store.commit_log.max_wrote_offset:
                LOGGER.warning("promote: cutting a partial record [%d, %d)", end, self.store.commit_log.max_wrote_offset)
                await trio.to_thread.run_sync(self.store.truncate, end)
            await trio.to_thread.run_sync(self.store.resume_queue_offsets)
            if promotion.epoch != self.store.epochs.last_epoch:  # equal: a controller's master resumes its epoch
                self.store.open_epoch(promotion.epoch)
            await self._rebuild_producer_table()
        effects = self.role_state.finish_promotion(promotion)
        if fence_reason:
            self.role_state.fence(fence_reason)
        await self._carry_out(effects)
        LOGGER.warning("promoted to %s: epoch %d from offset %d", role.value, promotion.epoch, self.store.commit_log.max_offset)

    async def _carry_out(self, effects: list[role_effects.Effect]) -> None:
        """Do what a role transition says, in its order."""
        for effect in effects:
            match effect:
                case role_effects.StopReplicating():
                    if self._ha_client_scope is not None:
                        self._ha_client_scope.cancel()
                case role_effects.StartReplicating():
                    self._start_ha_client()
                case role_effects.StartHAService():
                    await self._start_ha_service(self._nursery, self._server_ssl())
                case role_effects.StopHAService():
                    if self._ha_service_scope is not None:
                        self._ha_service_scope.cancel()
                        # its listener closed before this returns: a master named again in a
                        # newer epoch binds the same HA port next (EADDRINUSE while a slave's
                        # connection was still being torn down: the broker exited)
                        await self._ha_service_closed.wait()
                    self.replicator.detach()
                    self.ha_service = None
                    self.ha_address = None
                case role_effects.FailAckWaits():
                    self.put_service.fail_ack_waits()
                case role_effects.ClearProducers():
                    self.producers.clear()
                case _:
                    raise AssertionError(f"unknown effect {effect!r}")

    async def _rebuild_producer_table(self) -> None:
        """Before taking writes as master: learn the producer sequences at the log's end."""
        started = trio.current_time()
        span = self.config.producer_table_rebuild_bytes
        found = await trio.to_thread.run_sync(lambda: rebuild_producer_table(self.store, self.producers, span_bytes=span))
        LOGGER.info("producer table: %d producer(s), %d sequence(s) from the last %d bytes of the log in %.3f s",
                    len(self.producers), found, min(span, self.store.commit_log.max_offset), trio.current_time() - started)  # fmt: skip

    def make_ha_service(self) -> HAService:
        """The HA service of this broker as a master (its store open)."""
        client_address = format_address(self.listen_address) if self.listen_address is not None else ""
        return HAService(config=self.config, store=self.store, replicas=self.replicas, role=self.role_state,
                         on_ack=self.replicator.on_report, client_address=client_address,
                         on_closed=getattr(self.replicator, "on_slave_closed", None))  # fmt: skip

    async def _start_ha_service(self, nursery: trio.Nursery, ssl_context) -> None:
        if ssl_context is not None and self.config.tls_ca is not None:
            # Mutual TLS between members: a slave must present a certificate the CA signed.
            ssl_context = transport.server_ssl_context(cert=self.config.tls_cert, key=self.config.tls_key, client_ca=self.config.tls_ca)
        ha_listener, ha_socket = await transport.open_listener(self.config.effective_ha_listen, ssl_context=ssl_context)
        self.ha_address = transport.listener_address(ha_socket)
        self._ha_service_scope = trio.CancelScope()
        self._ha_service_closed = closed = trio.Event()
        self.ha_service = self.make_ha_service()
        self.replicator.attach(self.ha_service)
        nursery.start_soon(self._serve_ha, ha_listener, self.ha_service, self._ha_service_scope, closed)

    async def _serve_ha(self, listener, service: HAService, scope: trio.CancelScope, closed: trio.Event) -> None:
        try:
            with scope:
                await serve_admitted(listener, service.handle, service.admission)
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()
            closed.set()

    async def demote(self, master_ha) -> None:
        """Master -> slave of ``master_ha``: close the HA port and every slave connection, answer
        waiting SYNC_MASTER puts (FLUSH_SLAVE_TIMEOUT: they are stored here, not known replicated),
        then replicate from the new master, which first cuts what this log has beyond the two
        histories' consistent point."""
        await self._carry_out(self.role_state.demote(master_ha))
        LOGGER.warning("demoted: now a slave of %s", format_address(master_ha))

    async def follow(self, master_ha) -> None:
        """Controller mode: be the slave of ``master_ha``, from any role (``RoleState.follow``)."""
        effects = self.role_state.follow(master_ha)
        await self._carry_out(effects)
        if effects:
            LOGGER.warning("now a slave of %s", format_address(master_ha))

    async def fence(self, fence: bool, reason: str) -> None:
        """FENCE: refuse writes from now on (SERVICE_NOT_AVAILABLE naming ``reason``) while the
        slaves go on replicating and acknowledging what was written (``hasvc switchover`` waits
        for them), or lift a fence set with the same reason. ValueError on a slave, or to lift
        another fence (a newer epoch's is lifted only by demote or promote)."""
        if self.role_state.is_slave:
            raise ValueError("a slave takes no writes to fence")
        if fence:
            self.role_state.fence(reason)
            LOGGER.warning("fenced: %s", reason)
        else:
            self.role_state.lift_fence(reason)
            LOGGER.warning("fence lifted: %s", reason)

    def _server_ssl(self):
        if self.config.tls_cert is None:
            return None
        return transport.server_ssl_context(cert=self.config.tls_cert, key=self.config.tls_key)

    def addresses(self) -> dict:
        return {
            "role": self.role.value,
            "listen": format_address(self.listen_address),
            "ha_listen": format_address(self.ha_address) if self.ha_address else format_address(self.config.effective_ha_listen),
            "pid": os.getpid(),
            "store": self.config.store,
        }

    def status(self) -> dict:
        store = self.store
        master_max = store.commit_log.max_offset
        now = trio.current_time()
        slaves = []
        for progress in self.replicas.slaves.values():
            lag_bytes, lag_seconds = self.replicas.lag(progress, master_max_offset=master_max, now=now)
            slaves.append({
                "address": progress.address, "slave_id": progress.slave_id, "ack_offset": progress.ack_offset,
                "lag_bytes": lag_bytes, "lag_seconds": round(lag_seconds, 3),
                "connected_since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(progress.connected_since)),  # UTC
            })  # fmt: skip
        status = {
            **self.addresses(),
            "epoch": store.epochs.last_epoch,
            "epochs": [[e.epoch, e.start_offset] for e in store.epochs.entries],
            "min_offset": store.commit_log.min_offset,
            "max_offset": master_max,
            "flushed_offset": store.commit_log.flushed_offset,
            "dispatched_offset": store.reput_from_offset,
            "flush": store.config.flush_disk_type.value,
            "slaves": slaves,
            "producers": len(self.producers),
            "duplicate_sends": self.put_service.duplicate_sends,
            "uptime_seconds": round(time.time() - self.started_at, 1),
            **self.port_statistics(),
        }
        role = self.role_state
        if role.is_slave:
            status["master_ha"] = format_address(role.master_ha) if role.master_ha is not None else None
            status["master_connected"] = role.master_connected
            status["master_client_address"] = role.master_client_address  # from its MASTER_HELLO; null before
            if role.replication_refused:
                status["replication_refused"] = role.replication_refused
        status["scrub"] = self.store_tasks.scrubber.statistics.to_json()
        status["damaged"] = [found.to_json() for found in store.damaged]
        status["repair"] = self.online_repair.statistics.to_json()
        if store.dispatch_error:
            status["dispatch_error"] = store.dispatch_error
        status.update(store_condition(store))
        if role.fenced_by:
            status["fenced_by"] = role.fenced_by
        return status


    def port_statistics(self) -> dict[str, int]:
        """The ports' connection and byte counts (STATUS fields, and metrics as ``hasvc_<name>``)."""
        statistics = {**self.client_port.admission.statistics(), **self.client_port.answer_budget.statistics()}
        service = self.ha_service  # read once: the metrics thread calls this too, and a demotion drops it
        if service is not None:
            statistics.update(service.statistics())
        return statistics


def store_condition(store) -> dict:
    """STATUS's one-line reasons a store takes no writes, or falls behind, when it does: a failed
    sync (``write_failure``), a full disk (``disk_full``: what puts answer), a consume queue that
    cannot grow (``dispatch_blocked``). Empty when all is well."""
    condition = {}
    if store.write_failure is not None:
        condition["write_failure"] = store.write_failure
    if store.disk.full:
        condition["disk_full"] = store.disk.reason
    if store.dispatch_blocked is not None:
        condition["dispatch_blocked"] = store.dispatch_blocked
    return condition


def first_epoch() -> int:
    """A new cluster's first epoch: random in [1, 2**20], so two unrelated stores are very unlikely
    to share an (epoch, start offset) entry and be taken for one history; later epochs count up."""
    return secrets.randbelow(2**20) + 1
