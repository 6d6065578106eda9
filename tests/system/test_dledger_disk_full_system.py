"""DLedger members on small tmpfs disks (mounted here, as root): a leader whose disk fills answers
DISK_FULL and stays up, no member exits, writes resume once space frees; a disk that could never
hold an index file is refused at start in one line."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from hasvc import client as hc
from hasvc.tools.drill_dledger import ETCD_LIKE_SETTINGS, Node
from hasvc.tools.partition import LOOPBACK, free_port
from tests.cluster import small_tmpfs, wait_until

SEGMENT_SIZE = 4 * 1024 * 1024
MESSAGE_SIZE = 32 * 1024
# Room left on the leader's disk once the filler is written: a few data files' worth.
ROOM_LEFT = 12 * 1024 * 1024
SENDS_MAX = 4000  # far more than ROOM_LEFT holds: a leader that never refuses fails the test


def _status(node: Node) -> dict:
    with hc.BlockingClient(node.client_address) as client:
        return client.status()


def _leader(nodes: dict[str, Node]) -> Node:
    found = []

    def one() -> bool:
        found[:] = [n for n in nodes.values() if n.alive and _status(n)["role"] == "SYNC_MASTER"]
        return len(found) == 1

    wait_until(one, timeout=60, message="one member playing SYNC_MASTER")
    return found[0]


@contextlib.contextmanager
def group_on_tmpfs(tmp_path, group: str):
    """Three members, each store on its own 256 MiB tmpfs (an index file is 160 MiB), no disk
    ratio (1.0: the disks really fill); every member stopped and its disk unmounted after."""
    members = ["n0", "n1", "n2"]
    peers = ";".join(f"{member}-{LOOPBACK}:{free_port()}" for member in members)
    with contextlib.ExitStack() as stack:
        disks = {m: stack.enter_context(small_tmpfs(tmp_path / m, "256m")) for m in members}
        nodes = {}
        for member in members:
            args = ["--store", disks[member], "--listen", f"{LOOPBACK}:{free_port()}", "--group", group, "--peers", peers,
                    "--self", member, "--set", f"commitlog_segment_size={SEGMENT_SIZE}",
                    "--set", "disk_max_used_space_ratio=1.0", "--set", "disk_clean_ratio=1.0"]  # fmt: skip
            for setting in ETCD_LIKE_SETTINGS:
                args += ["--set", setting]
            nodes[member] = Node(str(tmp_path), member, args)
        try:
            for node in nodes.values():
                node.start()
            yield nodes
            assert all(node.alive for node in nodes.values())
            for node in nodes.values():
                with open(node.log_path, errors="replace") as log:
                    assert "Traceback" not in log.read(), node.member
        finally:
            for node in nodes.values():
                node.stop()


def fill_disk(store: str) -> str:
    """A file taking all but ROOM_LEFT of the disk holding ``store``; its path."""
    stat = os.statvfs(store)
    filler = os.path.join(store, "filler")
    with open(filler, "wb") as file:
        file.write(b"\0" * (stat.f_bavail * stat.f_frsize - ROOM_LEFT))
    return filler


def test_a_leader_whose_disk_fills_answers_disk_full_and_no_member_exits(tmp_path):
    """Each member's store on its own 256 MiB tmpfs (an index file is 160 MiB); the leader's
    disk filled by a file but for ROOM_LEFT; no ratio (1.0): the disk really fills. The leader
    answers DISK_FULL (its next data file cannot be made: the proposal is refused before the
    Raft core takes it), every member stays up (before: the leader's warm-up killed it, then the
    next leader's), reads go on; it hands leadership to a follower that said it has room, and the
    group takes writes again while its disk is still full; the filler deleted, it catches up."""
    with group_on_tmpfs(tmp_path, "full") as nodes:
        leader = _leader(nodes)
        with hc.BlockingClient(leader.client_address) as client:
            assert client.send("T", b"first").status == "PUT_OK"
            filler = fill_disk(leader.store)
            refusal = None
            for _ in range(SENDS_MAX):
                result = client.send("T", b"x" * MESSAGE_SIZE)
                if result.status != "PUT_OK":
                    refusal = result
                    break
            assert refusal is not None and refusal.status == "DISK_FULL", refusal
            for _ in range(20):
                assert client.send("T", b"x" * MESSAGE_SIZE).status == "DISK_FULL"
            assert "disk_full" in client.status()
            assert client.pull("T", 0, 0, count_max=1).records  # reads go on
            assert all(node.alive for node in nodes.values())
        wait_until(lambda: _status(leader)["role"] != "SYNC_MASTER", timeout=60,
                   message="the full leader to hand leadership over")  # fmt: skip
        roomy = _leader(nodes)
        assert roomy is not leader
        with hc.BlockingClient(roomy.client_address) as client:
            assert client.send("T", b"again").status == "PUT_OK"  # the group takes writes, the old disk still full
        os.unlink(filler)
        wait_until(lambda: _status(leader)["ledger_end_index"] == _status(roomy)["ledger_end_index"], timeout=60,
                   message="the member whose disk was full to catch up once the filler is gone")  # fmt: skip
        assert _leader(nodes) is roomy  # no hand-back


def test_a_follower_whose_disk_fills_drops_appends_stays_up_and_catches_up_once_space_frees(tmp_path):
    """A follower's disk filled but for ROOM_LEFT: the group goes on writing with the other two,
    the full follower drops the APPENDs it has no room for (it does not exit), and once its
    filler is deleted it catches up with the leader."""
    with group_on_tmpfs(tmp_path, "fullfollower") as nodes:
        leader = _leader(nodes)
        follower = next(node for node in nodes.values() if node is not leader)
        with hc.BlockingClient(leader.client_address) as client:
            assert client.send("T", b"first").status == "PUT_OK"
            filler = fill_disk(follower.store)
            sends = 2 * ROOM_LEFT // MESSAGE_SIZE
            for _ in range(sends):
                assert client.send("T", b"x" * MESSAGE_SIZE).status == "PUT_OK"
            wait_until(lambda: _status(follower)["appends_dropped_disk_full"] > 0, timeout=60,
                       message="the full follower to drop an APPEND")  # fmt: skip
            assert follower.alive
            os.unlink(filler)
            end = client.status()["ledger_end_index"]
            wait_until(lambda: _status(follower)["ledger_end_index"] >= end, timeout=60,
                       message="the follower to catch up once its filler is gone")  # fmt: skip
            assert client.send("T", b"after").status == "PUT_OK"


def test_a_node_on_a_disk_too_small_for_an_index_file_refuses_to_start_in_one_line(tmp_path):
    with small_tmpfs(tmp_path / "disk", "48m") as disk:
        port = free_port()
        done = subprocess.run([sys.executable, "-m", "hasvc.cli", "node", "--store", disk, "--listen", f"{LOOPBACK}:{free_port()}",
                               "--group", "small", "--peers", f"n0-{LOOPBACK}:{port}", "--self", "n0",
                               "--set", f"commitlog_segment_size={SEGMENT_SIZE}"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode != 0
        assert "Traceback" not in done.stderr and "AssertionError" not in done.stderr
        error = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert len(error) == 1 and "index file" in error[0] and disk in error[0], done.stderr[-2000:]
        assert os.listdir(disk) == []  # nothing written
