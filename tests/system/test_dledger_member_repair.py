"""``hasvc store repair DIR --member ID --from ADDR | --accept-loss``: a DLedger member that refuses
to start on damage it cannot repair by itself names the command; real ``hasvc node`` processes on
loopback, a byte flipped in a stopped member's data file below the committed index, the store
repaired from a live member (or the loss accepted), reopened and compared from disk."""

from __future__ import annotations

import trio
from click.testing import CliRunner

from hasvc.cli import main as cli_main
from tests.cluster import start_dledger_group, wait_until
from tests.system.dledger_repair_steps import (caught_up, dump_entries, flip, node_args, sent_to_a_group_of_one,
                                                stop_all_and_compare)  # fmt: skip
from tests.system.dledger_nodes import member_status, send_numbered, sole_leader


def test_a_member_that_refuses_is_repaired_from_a_live_member_and_ends_byte_identical(tmp_path) -> None:
    """recovery_repair_from_peers=false on one member: it refuses the damage in one line naming the
    command; the command rewrites the entry from the leader; the member starts with nothing cut."""
    nodes = start_dledger_group(tmp_path, 3, group="offline",
                                member_args=lambda m: ["--set", "recovery_repair_from_peers=false"] if m == "n2" else [])  # fmt: skip
    try:
        addresses = [node.client_address for node in nodes.values()]
        acked = trio.run(send_numbered, addresses, 200, "q")
        leader = sole_leader(nodes)
        if leader == "n2":  # the refusing member must be a follower: hand leadership over by a restart
            nodes["n2"].stop()
            nodes["n2"].start()
            wait_until(lambda: sole_leader(nodes) != "n2", message="another leader")
            leader = sole_leader(nodes)
        member = "n2"
        wait_until(lambda: caught_up(nodes, leader, member), message="the member caught up")
        committed = member_status(nodes[member])["committed_index"]
        end = member_status(nodes[member])["ledger_end_index"]
        nodes[member].stop()  # SIGTERM: a clean close
        entry = next(d for d in dump_entries(tmp_path, member) if d["offset"] == acked[120])
        assert entry["index"] < committed
        data_file, damaged = flip(tmp_path, member, entry, b"q120")
        done = CliRunner().invoke(cli_main, ["node", *nodes[member].args])
        assert done.exit_code == 3, done.output
        (line,) = done.output.strip().splitlines()
        store = tmp_path / member
        assert f"offset {entry['offset'] - 48} ({data_file}: bodyCrc mismatch (entry index {entry['index']})" in line, line
        assert f"hasvc store repair {store} --member {member} --from HOST:PORT" in line, line
        assert f"hasvc store repair {store} --member {member} --accept-loss" in line, line
        assert data_file.read_bytes() == damaged  # nothing changed by the refusal
        done = CliRunner().invoke(cli_main, ["store", "repair", str(store), "--member", member,
                                             "--from", nodes[leader].client_address])  # fmt: skip
        assert done.exit_code == 0, done.output
        assert f"repaired 1 entries from {nodes[leader].client_address}" in done.output, done.output
        assert f"(index {entry['index']})" in done.output, done.output
        done = CliRunner().invoke(cli_main, ["store", "verify", str(store), "--member", member])
        assert done.exit_code == 0, done.output
        nodes[member].start()
        status = member_status(nodes[member])
        assert status["damaged"] == [] and status["catch_up_index"] == -1, status
        assert status["ledger_end_index"] >= end  # nothing was cut
        more = trio.run(send_numbered, addresses, 10, "p")
        assert len(more) == 10
        leader = sole_leader(nodes)
        wait_until(lambda: caught_up(nodes, leader, member), timeout=60, message="the repaired member caught up")
    except BaseException:
        for node in nodes.values():
            node.kill()
        raise
    stop_all_and_compare(tmp_path, nodes, leader, member)


def test_a_repair_from_a_member_that_does_not_hold_the_entry_writes_nothing(tmp_path) -> None:
    """A group of one: no other copy. The repair names the entry and why, exit 1, and the file is
    as it was; --accept-loss then cuts it, and the member starts with the shorter log."""
    from hasvc.tools.drill_dledger import Node

    args = node_args(tmp_path)
    entry = sent_to_a_group_of_one(tmp_path, args, 50, "u")[20]
    other = Node(str(tmp_path), "m0", node_args(tmp_path, "m0"))  # another group of one, a shorter log
    other.start()
    data_file, damaged = flip(tmp_path, "n0", entry, b"u20")
    try:
        done = CliRunner().invoke(cli_main, ["store", "repair", str(tmp_path / "n0"), "--member", "n0",
                                             "--from", other.client_address])  # fmt: skip
    finally:
        other.stop()
    assert done.exit_code == 1, done.output
    assert f"entry {entry['index']} at offset {entry['offset'] - 48}" in done.output, done.output
    assert "Traceback" not in done.output
    assert data_file.read_bytes() == damaged
    done = CliRunner().invoke(cli_main, ["store", "repair", str(tmp_path / "n0"), "--member", "n0", "--accept-loss"])
    assert done.exit_code == 0, done.output
    assert f"the log now ends at entry {entry['index'] - 1}" in done.output, done.output
    node = Node(str(tmp_path), "n0", args)
    node.start()  # no setting needed now
    try:
        status = member_status(node)
        assert status["ledger_end_index"] == entry["index"] - 1 and status["catch_up_index"] == -1
        assert trio.run(send_numbered, [node.client_address], 1, "v")  # it leads and takes writes
    finally:
        node.stop()
    assert len(dump_entries(tmp_path, "n0")) == 21  # u0..u19, then v0 (after the new term's no-op)
