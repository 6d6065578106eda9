"""A Raft member as a broker (``hasvc node``): its store, the Raft driver, the classic put path
and client port, dispatch, retention, the scrub and repair (see ``hasvc.broker.raft``)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import time

import trio

from commitlog.dledger.entry_store import DLedgerStoreConfig
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.store import disk_used_ratio
from hasvc import admission as port_admission
from hasvc import transport
from hasvc.broker.client_port import ClientPort
from hasvc.broker.put_service import PutService, rebuild_producer_table
from hasvc.broker.raft.driver import RaftDriver
from hasvc.broker.raft.repair import EntryRepair
from hasvc.broker.raft.sync import DISK_FULL_RETRY_SECONDS
from hasvc.broker.raft.group import GroupConfig
from hasvc.broker.raft.listener import open_raft_listener
from hasvc.broker.raft.replicator import RaftLog, RaftReplicator
from hasvc.broker.raft.scheduling import RolePolicy
from hasvc.broker.raft_metrics import serve_raft_metrics
from hasvc.config import Address, BrokerConfig, BrokerRole, format_address
from hasvc.state.dedupe import ProducerTable
from hasvc.state.raft.ready import Role
from hasvc.state.raft.retention import node_keep_from
from hasvc.state.raft.role import RaftRole

LOGGER = logging.getLogger(__name__)

CONSUME_QUEUE_FLUSH_INTERVAL_SECONDS = 1.0
DISPATCH_INLINE_BYTES_MAX = 256 * 1024  # entries a commit dispatches inline; beyond, the dispatcher task
# TRANSFER_LEADER (``hasvc transfer-leader``) answers at the latest this long after it started:
# the core aborts a transfer its target did not complete within election_timeout_min_seconds
# (6.3 s by default, 1 s with etcd timing), so this is a backstop for a leader that steps down
# and hears of no successor. The same order as the ~10 s a DLedger admin request waits.
TRANSFER_LEADER_WAIT_SECONDS = 10.0


class RaftBroker:
    """A Raft member (``hasvc node``): see ``hasvc.broker.raft``."""

    def __init__(self, config: BrokerConfig, group: GroupConfig) -> None:
        self.config = config.validate()
        self.group = group.validate()
        self.role_state = RaftRole()
        self.producers = ProducerTable(window=config.producer_sequence_window, producers_max=config.producers_max)
        self.store: DLedgerMessageStore | None = None
        self.driver: RaftDriver | None = None
        self.replicator: RaftReplicator | None = None
        self.put_service: PutService | None = None
        self.client_port: ClientPort | None = None
        self.listen_address: Address | None = None
        self.raft_address: Address | None = None
        self.metrics = None  # RaftMetrics, with --metrics-listen
        self.metrics_address: Address | None = None
        self.started_at = time.time()
        self._dispatch_wakeup = trio.Event()
        self._taking_writes = False
        self._nursery: trio.Nursery | None = None
        # A producer table is being rebuilt in a worker thread (``_take_writes``): one at a time,
        # whatever the term; the leader takes writes once it is done, if it still leads that term.
        self._rebuilding = False
        self.retention_passes = 0  # retention passes done (status: lets a test wait for one)
        self.repair: EntryRepair | None = None  # the scrub and repair task, once serving
        # Held while a worker thread flushes the consume queues (StoreTasks.maintenance's role)
        # and while retention deletes files (consume queue files among them).
        self.maintenance = trio.Lock()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # A member syncs each append with --flush sync (the Raft config's), whatever the store's own flush says.
        store_config = dataclasses.replace(self.config.store_config(),
                                           small_write_pages=self.config.small_write_pages_for(self.group.raft.flush_sync))  # fmt: skip
        # Damage below what this member knew durable is cut and repaired from the leader, unless
        # it has no other copy (a group of one) or the settings say to refuse or to accept the loss.
        entry_config = DLedgerStoreConfig(data_file_size=store_config.commitlog_segment_size,
                                          page_cache_keep_size=store_config.page_cache_keep_size,
                                          preallocate_step_size=store_config.preallocate_step_size,
                                          small_write_pages=store_config.small_write_pages,
                                          recovery_cut_segments_max=self.config.recovery_cut_segments_max,
                                          recovery_accept_lost_entries=self.config.recovery_accept_lost_entries,
                                          recovery_repair_from_peers=self.config.recovery_repair_from_peers
                                          and len(self.group.peers) > 1)  # fmt: skip
        self.store = await trio.to_thread.run_sync(lambda: DLedgerMessageStore.open(
            self.config.store, store_config, self_id=self.group.self_id, group=self.group.group,
            upgrade_classic=self.group.upgrade_classic, dledger=entry_config))  # fmt: skip
        for damage in self.store.damaged:
            LOGGER.error("store %s: damaged entries cut, to be repaired from the leader: %s", self.config.store,
                         damage.describe())  # fmt: skip
        mark = self.store.entries.load_hard_state()
        if mark.catch_up_index >= 0:
            LOGGER.warning("store %s: entries up to %d (term %d) were lost here: this member neither votes as itself "
                           "nor stands for election until the leader has caught it up to there", self.config.store,
                           mark.catch_up_index, mark.catch_up_term)  # fmt: skip
        LOGGER.info("store %s: entries %d..%d, committed %d, dispatched %d", self.config.store,
                    self.store.entries.first_index(), self.store.entries.last_index(), self.store.entries.committed_index,
                    self.store.dispatched_index)  # fmt: skip
        try:
            async with trio.open_nursery() as nursery:
                await self._serve(nursery, task_status)
        finally:
            if self.put_service is not None:
                self.put_service.fail_all_waits()
            with trio.CancelScope(shield=True):
                if self.driver is not None:
                    await self.driver.close()
                await trio.to_thread.run_sync(self.store.close)
            LOGGER.info("store closed cleanly")

    async def _serve(self, nursery: trio.Nursery, task_status) -> None:
        self._nursery = nursery
        self.driver = RaftDriver(group=self.group, store=self.store, secret=self.config.secret,
                                 on_commit=self._on_commit, on_role=self._on_role,
                                 maintenance=self.maintenance)  # fmt: skip
        self.driver.senders.stalled_timeout_seconds = self.config.raft_send_stalled_timeout_seconds
        self.cpu_policy = RolePolicy(enabled=self.config.raft_follower_batch_scheduling)
        self.replicator = RaftReplicator(self.store, after_proposals=self.driver.drain)
        log = RaftLog(self.store, self.driver)
        self.put_service = PutService(config=self.config, store=log, role=self.role_state, replicator=self.replicator,
                                      producers=self.producers, after_appends=lambda: None)  # fmt: skip
        self.client_port = ClientPort(config=self.config, store=self.store, puts=self.put_service, status=self.status,
                                      promote=self._no_promote, demote=self._no_promote,
                                      transfer_leader=self.transfer_leader)  # fmt: skip
        own = self.group.peers[self.group.self_id]
        client_ssl, raft_ssl = self._server_ssl()
        raft_listener, raft_socket = await open_raft_listener(own, noun="member", self_id=self.group.self_id,
                                                              ssl_context=raft_ssl)  # fmt: skip
        self.raft_address = transport.listener_address(raft_socket)
        client_listener, client_socket = await transport.open_listener(self.config.listen, ssl_context=client_ssl)
        self.listen_address = transport.listener_address(client_socket)
        self.driver.client_address = self._announced_client_address()
        nursery.start_soon(port_admission.serve_admitted, client_listener, self.client_port.serve_client,
                           self.client_port.admission)  # fmt: skip
        nursery.start_soon(self.client_port.append_task)
        nursery.start_soon(self.put_service.waiter_timer_task)
        nursery.start_soon(self._dispatcher)
        nursery.start_soon(self._consume_queue_flusher)
        nursery.start_soon(self._retention)
        self.repair = EntryRepair(config=self.config, group=self.group, store=self.store, driver=self.driver,
                                  maintenance=self.maintenance)  # fmt: skip
        nursery.start_soon(self.repair.run)
        await self.driver.run(nursery, raft_listener)
        if self.config.metrics_listen is not None:  # after the driver runs: a scrape reads STATUS
            self.metrics, self.metrics_address = await nursery.start(
                functools.partial(serve_raft_metrics, self.config.metrics_listen, status=self.status))
            self.put_service.metrics = self.client_port.metrics = self.metrics
        task_status.started(self.addresses())
        LOGGER.info("ready: %s", json.dumps(self.addresses()))

    def _server_ssl(self):
        """(client port's, Raft port's) server TLS contexts, None without --tls-cert; sets the
        driver's context for its own connections to the peers. With --tls-ca the Raft port is
        mutual TLS: a peer must present a certificate the CA signed, and so must we."""
        config = self.config
        if config.tls_cert is None:
            return None, None
        if config.tls_ca is None:
            self.driver.peer_ssl_context = transport.unverified_client_ssl_context()
        else:
            self.driver.peer_ssl_context = transport.client_ssl_context(ca=config.tls_ca, cert=config.tls_cert, key=config.tls_key)
        client_ssl = transport.server_ssl_context(cert=config.tls_cert, key=config.tls_key)
        raft_ssl = transport.server_ssl_context(cert=config.tls_cert, key=config.tls_key, client_ca=config.tls_ca)
        return client_ssl, raft_ssl

    async def _no_promote(self, *args, **kwargs) -> dict:
        raise ValueError("a DLedger member is never promoted or demoted by hand: the group elects its leader")

    async def transfer_leader(self, target: str) -> tuple[str, str, dict]:
        """TRANSFER_LEADER (DLedger LEADERSHIP_TRANSFER): refused naming the leader unless this
        member leads, refused for an unknown member or one too far behind (its lag named), else
        answered once ``target`` leads or the transfer failed, within TRANSFER_LEADER_WAIT_SECONDS."""
        node = self.driver.node
        started = trio.current_time()
        lag = node.status(started).peers.get(target)
        details = {"self_id": self.group.self_id, "target": target, "previous_term": node.term,
                   "target_lag_entries": lag.lag_entries if lag is not None else None}  # fmt: skip
        if target not in self.group.peers:
            members = ", ".join(self.group.peers)
            status, reason = "UNKNOWN_MEMBER", f"{target!r} is not a member of group {self.group.group} ({members})"
        elif node.role is not Role.LEADER:
            status, reason = "NOT_LEADER", f"{self.group.self_id} does not lead: {self.role_state.leader_hint}"
        else:
            LOGGER.warning("handing leadership of term %d to %s", node.term, target)
            status, reason = await self.driver.transfer_leadership(target, wait_seconds=TRANSFER_LEADER_WAIT_SECONDS)
            LOGGER.warning("leadership transfer to %s: %s %s", target, status, reason)
        leader = node.leader_id
        details.update(term=node.term, leader_id=leader, elapsed_seconds=round(trio.current_time() - started, 3),
                       leader_raft_address=format_address(self.group.peers[leader]) if leader else None,
                       leader_client_address=self.driver.client_address_of(leader))  # fmt: skip
        return status, reason, details

    def _announced_client_address(self) -> str:
        """The client port as peers should tell clients: a wildcard host is replaced by the host
        of this member's Raft address (the one the others reach it at)."""
        host, port = self.listen_address
        if host in ("0.0.0.0", "::", ""):
            host = self.group.peers[self.group.self_id][0]
        return format_address((host, port))

    def listen_address_text(self) -> str | None:
        return format_address(self.listen_address) if self.listen_address is not None else None

    def addresses(self) -> dict:
        return {"role": self.role_state.role.name, "listen": format_address(self.listen_address),
                "raft_listen": format_address(self.raft_address), "group": self.group.group,
                "self_id": self.group.self_id, "pid": os.getpid(), "store": self.config.store,
                **({"metrics_listen": format_address(self.metrics_address)} if self.metrics_address else {})}  # fmt: skip

    # -- commit, dispatch, role ----------------------------------------------------------

    def _on_commit(self) -> None:
        """Answer the puts the commit covers, then dispatch what it committed to the consume
        queues inline, up to DISPATCH_INLINE_BYTES_MAX (a commit usually covers a few entries:
        the dispatcher task cost two task steps per commit); the dispatcher does the rest, in
        batches with a checkpoint between them."""
        self.replicator.committed()
        store = self.store
        if store.dispatched_index < store.entries.committed_index:
            store.dispatch(DISPATCH_INLINE_BYTES_MAX)
            if store.dispatched_index < store.entries.committed_index and store.dispatch_error is None:
                self._dispatch_wakeup.set()

    async def _dispatcher(self) -> None:
        while True:
            with trio.move_on_after(DISK_FULL_RETRY_SECONDS if self.store.dispatch_blocked else math.inf):
                await self._dispatch_wakeup.wait()
            self._dispatch_wakeup = trio.Event()
            while self.store.dispatch():
                await trio.lowlevel.checkpoint()
            self._on_role()

    async def _consume_queue_flusher(self) -> None:
        """Flush the consume queues in a worker thread, as the classic broker's housekeeping
        does: an msync in the loop stalled every put for its duration once a second (p99).
        Safe beside the dispatcher's appends (``ConsumeQueueStore.flush`` copies the queue list;
        a file's flush reads its write position once); anything that deletes consume queue
        files must hold ``maintenance`` too."""
        while True:
            await trio.sleep(CONSUME_QUEUE_FLUSH_INTERVAL_SECONDS)
            async with self.maintenance:
                await trio.to_thread.run_sync(self.store.flush_consume_queues)

    async def _retention(self) -> None:
        """DLedger's CleanSpaceService, every ``dledger_clean_interval_seconds``: delete expired
        head files, never an entry the core's ``retention_floor`` keeps (what some member may
        still need) unless the disk is above ``disk_clean_ratio`` (then a member left behind is
        RESET by the leader to its first index: ``behind_log_start`` until it answered). Runs on
        the trio thread, not a worker: appends, the dispatcher and the deletion share the file
        lists (a pass unlinks at most ``delete_segments_per_pass_max`` files); with the entry
        files quiet (``files_quiet``: no sync of a file being deleted) and ``maintenance`` held
        (no consume queue flush meanwhile)."""
        store = self.store
        while True:
            await trio.sleep(self.config.dledger_clean_interval_seconds)
            over_ratio = disk_used_ratio(store.path) > store.config.disk_clean_ratio
            keep_from = node_keep_from(self.driver.node, over_ratio=over_ratio, now=trio.current_time())  # never strands a member that is down
            async with self.maintenance, self.driver.files_quiet():
                deleted = store.clean_expired(keep_from_index=keep_from, over_ratio=over_ratio)
            self.retention_passes += 1
            if deleted:
                LOGGER.warning("retention deleted %d file(s)%s; the log starts at entry %d (offset %d)", len(deleted),
                               " (disk above disk_clean_ratio: regardless of the members' needs)" if over_ratio else "",
                               store.entries.first_index(), store.min_offset)  # fmt: skip

    def _on_role(self) -> None:
        """Play SYNC_MASTER while leading with every entry committed and dispatched, else SLAVE."""
        node = self.driver.node
        self.cpu_policy.follow(node.role is Role.FOLLOWER)
        leading = node.role is Role.LEADER
        if not leading:
            leader = node.leader_id
            client = self.driver.client_address_of(leader)
            self.role_state.leader_hint = (f"the leader is {leader} (raft {format_address(self.group.peers[leader])}"
                                           + (f", client {client}" if client else "") + ")"
                                           if leader else "no leader is known yet")  # fmt: skip
        if self._taking_writes and not leading:
            self._taking_writes = False
            self.role_state.role = BrokerRole.SLAVE
            self.store.discard_plans()
            self.put_service.fail_ack_waits()
            LOGGER.warning("no longer leading (term %d): writes refused, waiting puts failed", node.term)
        elif leading and not self._taking_writes:
            if self.store.dispatched_index < self.store.entries.committed_index:
                self._dispatch_wakeup.set()
                return
            if not self.store.caught_up() or self._rebuilding:
                return  # a rebuild for an earlier term decides again from now when it ends
            self._rebuilding = True
            self._nursery.start_soon(self._take_writes, node.term)

    async def _take_writes(self, term: int) -> None:
        """Rebuild the producer table (the log's last ``producer_table_rebuild_bytes``) in a worker
        thread, then take writes if this member still leads ``term``. In the event loop the scan
        held it for up to 1.8 s on a busy machine: no heartbeats went out, the followers elected
        another leader, and a drill's failover took 10-20 s of leaders deposed as they began.

        The rule: the table a leader takes writes with covers every entry of its log when it
        starts taking them (the rebuild starts once all of them are committed, ``caught_up``,
        and no entry is added before writes are taken), and no rebuild changes the table while
        writes are taken. The table is built aside and installed whole here, on the trio thread,
        only when writes start; one rebuild runs at a time. A rebuild of an earlier term used to
        end by letting a second one start for the new term beside the first: it ran after
        writes were taken, emptied the live table and refilled it only once its scan ended
        (seconds on a busy machine), so retries of messages the log held looked new meanwhile
        and were stored twice (a corrupt drill's 8 duplicates)."""
        node = self.driver.node
        started = trio.current_time()
        rebuilt = ProducerTable(window=self.config.producer_sequence_window, producers_max=self.config.producers_max)
        try:
            async with self.maintenance:  # never beside retention deleting the files it reads
                found = await trio.to_thread.run_sync(functools.partial(
                    rebuild_producer_table, self.store, rebuilt, span_bytes=self.config.producer_table_rebuild_bytes))
        finally:
            self._rebuilding = False
        if node.role is not Role.LEADER or node.term != term or self._taking_writes or not self.store.caught_up():
            self._on_role()  # a later term, or a step down meanwhile: decide again from now
            return
        self.producers.replace_with(rebuilt)
        self.store.resume_queue_offsets()
        self._taking_writes = True
        self.role_state.role = BrokerRole.SYNC_MASTER
        LOGGER.warning("leading term %d: taking writes from index %d (producer table: %d sequence(s) in %.3f s)", term,
                       self.store.entries.last_index() + 1, found, trio.current_time() - started)  # fmt: skip

    # -- status --------------------------------------------------------------------------

    def status(self) -> dict:
        node = self.driver.node
        raft = node.status(trio.current_time())
        stats = self.store.statistics()
        leader = raft.leader_id
        status = {
            "mode": "dledger", "group": self.group.group, "self_id": self.group.self_id,
            "role": self.role_state.role.name, "raft_role": raft.role.value, "term": raft.term, "epoch": raft.term,
            "leader_id": leader, "leader_address": format_address(self.group.peers[leader]) if leader else None,
            "leader_client_address": self.driver.client_address_of(leader),
            "ledger_begin_index": self.store.entries.first_index(), "ledger_end_index": raft.ledger_end_index,
            "committed_index": raft.committed_index, "flushed_index": raft.flushed_index,
            "dispatched_index": self.store.dispatched_index, "pending_proposals": raft.pending_count,
            "min_offset": stats.min_offset, "max_offset": stats.max_offset, "committed_offset": stats.committed_offset,
            "dispatched_offset": stats.dispatched_offset, "flushed_offset": stats.flushed_offset,
            "listen": format_address(self.listen_address), "raft_listen": format_address(self.raft_address),
            "pid": os.getpid(), "store": self.config.store,
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "duplicate_sends": self.put_service.duplicate_sends,
            "raft_messages_dropped": self.driver.dropped_messages,
            "raft_connections_refused": self.driver.refused_connections,
            **self.driver.admission.statistics(), **self.driver.senders.statistics(), **self.client_port.admission.statistics(),
            **self.client_port.answer_budget.statistics(),
            "appends_dropped_disk_full": self.driver.appends_dropped_disk_full,
            "retention_floor_index": node.retention_floor(), "retention_passes": self.retention_passes,
            "scrub": self.repair.scrubber.statistics.to_json() if self.repair.scrubber is not None else None,
            "catch_up_index": raft.catch_up_index,
            "damaged": [damage.to_json() for damage in self.store.damaged],
            "peers": {peer: {"match_index": p.match_index, "lag_entries": p.lag_entries,
                             "behind_log_start": p.behind_log_start,
                             "last_contact_seconds": None if p.last_contact_seconds == float("inf") else round(p.last_contact_seconds, 3),
                             "connected": self.driver.connected.get(peer, False),
                             "bytes_queued": self.driver.senders.bytes_queued(peer),
                             "closed_stalled": self.driver.senders.closed_stalled.get(peer, 0)}
                      for peer, p in raft.peers.items()},
        }  # fmt: skip
        if self.store.disk.full:
            status["disk_full"] = self.store.disk.reason
        if self.store.dispatch_blocked is not None:
            status["dispatch_blocked"] = self.store.dispatch_blocked
        return status
