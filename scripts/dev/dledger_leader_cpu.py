"""CPU per message of a DLedger leader's proposal path in one process: no sockets, no other process.

    python scripts/dev/dledger_leader_cpu.py TREE REQUESTS BATCH [PASSES] [ROUNDS] [batch|pass] [--parts]

Runs TREE's code (``sys.path``): a leader's ``DLedgerMessageStore`` (temporary directory, 64 MiB
data files) and ``RaftNode`` of three members; PASSES passes, each of REQUESTS SENDs of BATCH 1 KiB
messages planned (``plan_batch``), proposed (``RaftNode.propose``) and accepted (``accept_plan``),
as ``RaftDriver.propose_plan`` does, then the pass's Ready carried out as ``RaftDriver.drain``
does (entries appended to the store, each push's entries read as stored runs), both followers
acknowledging the last index, and the commit's Ready (committed index, dispatch); a first pass
unmeasured (it creates the consume-queue files). With ``pass`` (the last argument) each pass is
one proposal, as ``PutService`` proposes a pass of plain SENDs: planned by
``commitlog.entry_pass.plan_entry_pass`` when TREE has it (one native call; framed as stored with
the leader's term, and appended by ``append_framed``, when TREE's planner does that), else by one
``plan_batches`` of the pass's requests grouped by queue (the batch path's one proposal a pass;
the grouping itself not counted). Prints the
process CPU time (``time.process_time``) per message, the minimum and median of ROUNDS rounds
(a fresh store each). ``--parts``: also the wall time a pass spends in each part (the plan, the
core's proposal, the plan accepted, the Readies taken, the store's append and within it its
``pwrite``, the pushes' reads, each acknowledgement's step, the commit with its dispatch), over
every round's measured passes (the timers add ~0.1 us a part to the CPU figure).

Why: ``scripts/dev/dledger_cpu.py`` measures the whole group, whose three members and load generator
share this machine's two cores with other helpers' work: a 5-10 % change of the leader's Python
drowns in their noise. The minimum of several rounds of one process's CPU time does not. It
leaves out the client protocol (SEND decode, answers) and the sockets (pushes, acknowledgements
read), which ``dledger_cpu.py`` and ``calls_per_put.py`` cover.
"""

import inspect
import os
import random
import shutil
import statistics
import sys
import tempfile
import time


def main() -> None:
    parts = "--parts" in sys.argv
    if parts:
        sys.argv.remove("--parts")
    tree, requests, batch = os.path.abspath(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    passes = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 5
    mode = sys.argv[6] if len(sys.argv) > 6 else "batch"
    if mode not in ("batch", "pass"):
        raise SystemExit(f"the mode is batch or pass, not {mode!r}")
    sys.path.insert(0, tree)
    from commitlog import record as rec
    from commitlog.config import StoreConfig
    from commitlog.dledger.message_store import DLedgerMessageStore
    from hasvc.state.raft import ETCD_LIKE, RaftNode, Role
    from hasvc.state.raft.messages import PushResponse, PushResult, PushType, VoteResponse, VoteResult
    from hasvc.protocol import client as cp

    spent: dict[str, int] = {}  # part -> ns over the measured passes (--parts)
    measuring = [False]
    clock = time.perf_counter_ns

    def timed(part: str, call, *args, **kwargs):
        if not parts or not measuring[0]:
            return call(*args, **kwargs)
        started = clock()
        try:
            return call(*args, **kwargs)
        finally:
            spent[part] = spent.get(part, 0) + clock() - started

    entry_pass = None  # a tree from before it: a pass is one plan_batches
    if os.path.exists(os.path.join(tree, "commitlog", "entry_pass.py")):
        from commitlog import entry_pass
    framed = entry_pass is not None and "term" in inspect.signature(entry_pass.plan_entry_pass).parameters

    def propose_pass(node, store, batches, sends, now) -> None:
        if entry_pass is not None:
            framing = {"term": node.term} if framed else {}  # a tree whose planner frames the entries (AppendPlan.run)
            planned = timed("plan (plan_entry_pass)", entry_pass.plan_entry_pass, store, sends, messages_max=cp.SEND_MESSAGES_MAX,
                            decode=cp.decode_send, **framing)  # fmt: skip
            assert planned is not None and not planned.refusals and not planned.malformed
            plan = planned.plan
        else:
            plan = timed("plan (plan_batches)", store.plan_batches, batches)
        timed("propose (the core)", node.propose, plan.bodies, now)
        timed("accept_plan", store.accept_plan, plan)

    if parts:  # the append's pwrite, apart (a large append goes through the store's buffer by pwrite)
        from commitlog.mapped_file import MappedFile

        write_through = MappedFile.write_through
        MappedFile.write_through = lambda self, data: timed("  of which pwrite", write_through, self, data)

    def commit(store, committed_index: int) -> None:
        store.set_committed(committed_index)
        store.dispatch(1 << 30)

    def carry_out(node, store) -> None:
        ready = timed("ready (the core)", node.ready)
        entries = store.entries
        if ready.hard_state is not None:
            entries.save_hard_state(ready.hard_state)
        if ready.entries:
            run = store.take_run(ready.entries) if framed else None  # as RaftDriver.drain appends
            if run is not None:
                timed("store append", entries.append_framed, run)
            else:
                timed("store append", entries.append, ready.entries)
        for message in ready.messages:  # what a sender reads of each push (RaftSenders._frame_parts)
            run = getattr(message, "entries", None)
            if getattr(message, "type", None) is PushType.APPEND and run.data is None:
                timed("read_runs (the pushes)", entries.read_runs, run.first_index, run.count, run.last_term)
        if ready.committed_index is not None:
            timed("commit and dispatch", commit, store, ready.committed_index)

    def one_round() -> float:
        path = tempfile.mkdtemp(prefix="hasvc-leader-cpu-")
        try:
            store = DLedgerMessageStore.open(path, StoreConfig(commitlog_segment_size=64 << 20), self_id="n0",
                                             dledger=None)  # fmt: skip
            node = RaftNode(self_id="n0", members=("n0", "n1", "n2"), log=store.entries, config=ETCD_LIKE,
                            rng=random.Random(7), now=0.0)  # fmt: skip
            now = 10.0
            node.tick(now)
            carry_out(node, store)
            node.step(VoteResponse("n1", "n0", node.term + 1, VoteResult.ACCEPT, pre_vote=True), now)
            carry_out(node, store)
            node.step(VoteResponse("n1", "n0", node.term, VoteResult.ACCEPT), now)
            carry_out(node, store)
            assert node.role is Role.LEADER
            for peer in ("n1", "n2"):
                node.step(PushResponse(peer, "n0", node.term, PushType.COMPARE, PushResult.SUCCESS, 0, 0, 0, 0), now)
            carry_out(node, store)
            batches = [rec.MessageBatch("T", [b"x" * 1024] * batch, queue_id=i % 4) for i in range(requests)]
            sends = [cp.SendRequest("T", i % 4, [b"x" * 1024] * batch, [b""] * batch, 0, 0) for i in range(requests)]
            merged = [rec.MessageBatch("T", [b"x" * 1024] * batch * len(range(queue, requests, 4)), queue_id=queue)
                      for queue in range(min(requests, 4))]  # a pass's requests grouped by queue, as PutService groups them
            started = None
            for done in range(passes + 1):  # the first pass unmeasured: it creates the consume-queue files
                if done == 1:
                    started = time.process_time()
                    measuring[0] = True
                now += 0.001
                if mode == "pass":
                    propose_pass(node, store, merged, sends, now)
                for message_batch in batches if mode == "batch" else ():
                    plan = store.plan_batch(message_batch)
                    node.propose(plan.bodies, now)
                    store.accept_plan(plan)
                carry_out(node, store)
                last = node.last_index
                for peer in ("n1", "n2"):
                    timed(f"step {peer}'s acknowledgement", node.step,
                          PushResponse(peer, "n0", node.term, PushType.APPEND, PushResult.SUCCESS, 0, last, 0, last), now)  # fmt: skip
                carry_out(node, store)
                assert node.committed_index == last
            cpu = time.process_time() - started
            measuring[0] = False
            store.close()
            return cpu / (passes * requests * batch)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    results = [one_round() for _ in range(rounds)]
    print(f"{tree} {requests} x {batch} ({mode}): {1e6 * min(results):.2f} us a message "
          f"(min of {rounds} rounds; median {1e6 * statistics.median(results):.2f})")  # fmt: skip
    order = list(spent)
    if "  of which pwrite" in order and "store append" in order:  # finished first, printed after the append
        order.remove("  of which pwrite")
        order.insert(order.index("store append") + 1, "  of which pwrite")
    for part in order:
        print(f"  {spent[part] / 1000 / (rounds * passes):8.1f} us a pass  {part}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from usage import help_or_usage

    help_or_usage(__doc__, arguments_min=3)
    main()
