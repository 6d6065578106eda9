"""Raft mode: a broker whose log is replicated by Raft (``hasvc node``; its store keeps DLedger's
on-disk format, ``commitlog.dledger``).

Modules, by concern
-------------------
- ``broker.py``: ``RaftBroker``, the member: store, driver, put path, client port, dispatch,
  retention, role changes, STATUS.
- ``driver.py``: ``RaftDriver``, one ``RaftNode`` over trio: Readies carried out, proposals, the
  timer, the checkpoint, leadership transfer.
- ``peers.py``: ``RaftSenders``, one outbound connection per peer and its bounded queue.
- ``listener.py``: ``RaftListener``, the Raft port: preface, HELLO, messages stepped into the core.
- ``sync.py``: ``EntrySync``, the entry files' syncs (group commit) and ``files_quiet``.
- ``replicator.py``: ``RaftReplicator`` and ``RaftLog``, the seams the classic put path uses.
- ``repair.py``: ``EntryRepair``, the scrub and the repair of damaged entries from peers.
- ``group.py``: ``GroupConfig`` and ``parse_peers`` (``--group --self --peers``).
The broker role a member plays is ``hasvc.state.raft.role.RaftRole``.

Theory of operation
-------------------
``RaftBroker`` composes, in one trio loop: the member's store (``DLedgerMessageStore``: records
in DLedger entries, consume queues over committed ones), the pure Raft core (``RaftNode``), its
driver (``RaftDriver``: the Raft port, one outbound connection per peer, timers, the background
flush), and the classic put path and client port unchanged: ``PutService`` appends through
``RaftLog.append_batch`` (a pass's groups over several queues through ``append_batches``, one
proposal for them all), which *proposes* the records (planned at their final offsets) instead of
writing them -- the proposals of one pass of puts carried out in one Ready when PutService calls
``RaftReplicator.appended``, their entries appended and pushed together -- and waits, as under SYNC_MASTER, until the ``RaftReplicator``'s replicated offset
-- the end of the committed entries -- passes the put's end. So a put is answered PUT_OK only once
a quorum has its entry (in memory, or flushed with ``--flush sync``); a put whose entry does not
commit in ``slave_timeout_ms`` is answered FLUSH_SLAVE_TIMEOUT, and one whose leader lost its
term before the commit is answered SLAVE_NOT_AVAILABLE (the waits fail on the role change): never
PUT_OK without a quorum. A retried idempotent send is recognised by the new leader, which rebuilds
its producer table from its log once every entry of it is committed, before it takes writes (one
rebuild at a time, built aside and installed when writes start: none runs beside them).

Roles (``hasvc status``: ``raft_role`` is the core's, ``role`` the broker role the node plays): a
leader plays SYNC_MASTER once every entry of its log is committed and dispatched (its no-op entry
commits the earlier terms' tail), after continuing each queue from its consume queue; every other
member plays SLAVE, serving committed reads, and refuses writes naming the leader it knows.

The driver carries each ``Ready`` out in the core's order: the hard state saved (fsynced), the
log truncated and appended (a follower's runs with ``append_run``), then messages queued to the
peers' senders (bounded: a message that does not fit is dropped, which Raft survives), then the
commit index to the store and dispatch, role changes to the broker. Acknowledgements
(PushResponse) read from a peer together are stepped one by one and their Ready carried out once
(they change no log; anything else read after them waits for that Ready first). Time is
``trio.current_time()`` only. A sender reads an APPEND's entries from the data files when it
sends it (the stored bytes, a view of the mapping per data file, written with the frame headers
in one ``writev``; what the socket does not take is copied before any wait, so no view of a
mapping is held while a truncate or retention may change it).

Flushing does not block the loop: the msync of the entry files runs in a worker thread while the
loop goes on appending, every 10 ms (DLedger's FlushDataService) or, with ``--flush sync``, as soon
as entries were appended. The one exception is a small flush with ``--flush sync`` (at most
SYNC_INLINE_ENTRIES_MAX entries waiting, as with one writer): it runs in the loop in the drain that
appended them, after that drain's messages left (``EntrySync.after_append``): on a follower before
the commit its push carried is applied (the acknowledgement the flush releases goes first), on a
leader after (the puts' answers go first). It is a group commit: the index appended when a flush starts is what it
marks flushed (``persisted``), and entries appended meanwhile wait for the next one; with
``--flush sync`` the core counts (leader) and acknowledges (follower) an entry only once it is
marked flushed. Only the data files decide what is flushed: recovery trusts them alone and
rebuilds the index units that do not match them, so the index files are synced after the
``persisted`` step, off the acknowledgement's path, at most every INDEX_FLUSH_INTERVAL_SECONDS (an
index unit not yet synced costs a longer recovery scan after a crash, never an entry). One sync runs at
a time, in a worker thread started from the loop (``EntrySync.start``: by an append with
``--flush sync``, by the end of the previous sync, and every FLUSH_INTERVAL_SECONDS), its end
handled by a callback. A full disk ends no task and no process: a leader answers puts DISK_FULL
(the disk above ``disk_max_used_space_ratio``, or no room for the files the proposal's entries
need: ``make_room`` before the core takes them), a follower drops an APPEND it has no room for
(the leader sends it again), the warm-up and the checkpoint try again later; an append that
still fails (the term-start no-op) is rolled back whole by the store and the core starts over as
a follower from the stored log (``RaftDriver._append_failed``). A leader hands over for a full disk
only to a member that said it has room (``hasvc.state.raft.disk_room``). A truncate (a TRUNCATE push from the leader) and retention cut and delete
files, so they hold the files quiet (``files_quiet``): they wait for the sync in flight, and none
starts until they are done. A reset (a RESET from the leader: this member needs entries the group
deleted) deletes every entry and consume-queue file (``DLedgerMessageStore.reset_log``) before its
answer is sent, holding the files quiet and the broker's ``maintenance`` lock (no consume-queue
flush in a worker thread meanwhile).
"""
