"""A DLedger member whose entries were damaged or lost rejoins by itself: real ``hasvc node``
processes on loopback, a byte flipped in a stopped member's data file (an entry below the
committed index), a member restarted with a shorter log than it acknowledged. Convergence is
checked from the stores on disk once every member stopped."""

from __future__ import annotations

import os

import pytest
import trio
from click.testing import CliRunner

from hasvc.cli import main as cli_main
from tests.cluster import start_dledger_group, wait_until
from tests.system.dledger_repair_steps import (caught_up, dump_entries, flip, node_args, sent_to_a_group_of_one,
                                                stop_all_and_compare)  # fmt: skip
from tests.system.dledger_nodes import member_status, send_numbered, sole_leader


def test_a_member_with_a_flipped_byte_below_the_committed_index_rejoins_and_ends_byte_identical(tmp_path) -> None:
    nodes = start_dledger_group(tmp_path, 3, group="repair")
    try:
        addresses = [node.client_address for node in nodes.values()]
        acked = trio.run(send_numbered, addresses, 300, "r")
        leader = sole_leader(nodes)
        member = next(m for m in nodes if m != leader)
        wait_until(lambda: caught_up(nodes, leader, member), message="the member caught up")
        committed = member_status(nodes[member])["committed_index"]
        nodes[member].stop()  # SIGTERM: a clean close
        entry = next(d for d in dump_entries(tmp_path, member) if d["offset"] == acked[100])
        assert entry["index"] < committed
        flip(tmp_path, member, entry, b"r100")
        nodes[member].start()  # it starts (before: refused, naming recovery_accept_lost_entries)
        status = member_status(nodes[member])
        (damage,) = status["damaged"]
        assert damage["index"] == entry["index"] and damage["from"] == entry["offset"] - 48, damage
        assert "bodyCrc mismatch" in damage["reason"] and damage["file"].endswith(f"{0:020d}")
        log = (tmp_path / f"{member}.log").read_text()
        assert "ERROR" in log and "damaged entries cut" in log
        assert f"entries up to {committed} (term" in log and "were lost here" in log  # its catch-up mark
        shown = CliRunner().invoke(cli_main, ["status", nodes[member].client_address])
        assert shown.exit_code == 0 and f"entry {entry['index']}: bodyCrc mismatch" in shown.output, shown.output
        more = trio.run(send_numbered, addresses, 20, "s")
        leader = sole_leader(nodes)
        wait_until(lambda: caught_up(nodes, leader, member), timeout=60, message="the damaged member caught up")
        assert len(more) == 20
    except BaseException:
        for node in nodes.values():
            node.kill()
        raise
    stop_all_and_compare(tmp_path, nodes, leader, member)
    currterm = (tmp_path / member / f"dledger-{member}" / "currterm").read_text()
    assert "catchUpIndex" not in currterm, currterm  # the mark was cleared on disk too


def test_a_member_restarted_with_a_shorter_log_than_it_acknowledged_iscaught_up(tmp_path) -> None:
    nodes = start_dledger_group(tmp_path, 3, group="short")
    try:
        addresses = [node.client_address for node in nodes.values()]
        acked = trio.run(send_numbered, addresses, 200, "t")
        leader = sole_leader(nodes)
        member = next(m for m in nodes if m != leader)
        wait_until(lambda: caught_up(nodes, leader, member), message="the member caught up")
        end = member_status(nodes[member])["ledger_end_index"]
        term = member_status(nodes[leader])["term"]
        nodes[member].kill()  # SIGKILL, then its unflushed pages are lost: its data file's tail zeroed
        entry = next(d for d in dump_entries(tmp_path, member) if d["offset"] == acked[150])
        data_file = tmp_path / member / f"dledger-{member}" / "data" / f"{0:020d}"
        content = bytearray(data_file.read_bytes())
        cut = entry["offset"] - 48
        content[cut:] = bytes(len(content) - cut)
        data_file.write_bytes(bytes(content))
        nodes[member].start()
        # Nothing new is proposed: the leader learns from a heartbeat that the member holds less.
        wait_until(lambda: caught_up(nodes, leader, member), timeout=60, message="the member was caught up")
        assert member_status(nodes[leader])["term"] == term  # in the same term: no election was needed
        assert member_status(nodes[member])["ledger_end_index"] == end
    except BaseException:
        for node in nodes.values():
            node.kill()
        raise
    stop_all_and_compare(tmp_path, nodes, leader, member)


def test_recovery_settings_are_checked_in_one_line_on_the_command_line_and_in_a_config_file(tmp_path) -> None:
    runner = CliRunner()
    done = runner.invoke(cli_main, ["node", *node_args(tmp_path), "--set", "recovery_accept_lost_entries=maybe"])
    assert done.exit_code == 2 and "recovery_accept_lost_entries='maybe': expected true or false" in done.output
    done = runner.invoke(cli_main, ["node", *node_args(tmp_path), "--set", "recovery_cut_segments_max=many"])
    assert done.exit_code == 2 and "recovery_cut_segments_max='many': expected an integer" in done.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[broker]\nrecovery_accept_lost_entrys = true\n")
    done = runner.invoke(cli_main, ["node", *node_args(tmp_path), "--config", str(bad)])
    assert done.exit_code == 2 and "unknown setting(s) recovery_accept_lost_entrys (did you mean recovery_accept_lost_entries?)" in done.output, done.output
    assert "Traceback" not in done.output and done.exception is None or isinstance(done.exception, SystemExit)
    bad.write_text("[broker]\nrecovery_accept_lost_entries = 'yes'\n")
    done = runner.invoke(cli_main, ["node", *node_args(tmp_path), "--config", str(bad)])
    assert done.exit_code == 2 and "recovery_accept_lost_entries='yes' (from " in done.output
    assert "key [broker].recovery_accept_lost_entries): expected true or false" in done.output, done.output
    bad.write_text("[broker\n")
    done = runner.invoke(cli_main, ["node", *node_args(tmp_path), "--config", str(bad)])
    assert done.exit_code == 2 and f"{bad}: not valid TOML:" in done.output, done.output


def test_a_group_of_one_refuses_damage_in_one_line_and_takes_the_loss_when_told(tmp_path) -> None:
    from hasvc.tools.drill_dledger import Node

    args = node_args(tmp_path)
    entry = sent_to_a_group_of_one(tmp_path, args, 50, "u")[20]
    data_file, content = flip(tmp_path, "n0", entry, b"u20")
    done = CliRunner().invoke(cli_main, ["node", *args])  # no other copy: refused, nothing changed
    assert done.exit_code == 3, done.output  # cannot start (the CLI's exit codes)
    (line,) = done.output.strip().splitlines()
    assert f"offset {entry['offset'] - 48} ({data_file}: bodyCrc mismatch (entry index {entry['index']})" in line, line
    assert "set recovery_accept_lost_entries=true (hasvc node --set)" in line
    assert data_file.read_bytes() == content
    accept = tmp_path / "accept.toml"
    accept.write_text("[broker]\nrecovery_accept_lost_entries = true\n")
    node = Node(str(tmp_path), "n0", [*args, "--config", str(accept)])
    node.start()
    try:
        status = member_status(node)
        assert status["ledger_end_index"] == entry["index"] - 1 and status["catch_up_index"] == -1
        assert [d["index"] for d in status["damaged"]] == [entry["index"]]  # reported, accepted
        assert trio.run(send_numbered, [node.client_address], 1, "v")  # it leads and takes writes
    finally:
        node.stop()


async def _send_sized(addresses: list[str], count: int, tag: str, size: int) -> dict[int, int]:
    """``count`` messages of about ``size`` bytes (``tag`` and the number first); number -> offset."""
    from hasvc import client as hc

    acked: dict[int, int] = {}
    async with hc.connect_cluster(addresses, retry_sends=True) as client:
        for number in range(count):
            body = f"{tag}{number}:".encode().ljust(size, b"x")
            result = await client.send("DL", body, queue_id=number % 4)
            assert result.status == "PUT_OK", result
            acked[number] = result.offset
    return acked


def test_damage_in_an_old_data_file_is_found_by_the_scrub_and_repaired_from_a_peer_without_a_cut(tmp_path) -> None:
    """Recovery re-checks only the newest data files: a flipped byte in the first of many is not
    seen at start. The scrub finds it, names it (file, range, entry), and rewrites that entry
    from another member's copy: nothing is cut, no catch-up, the copies end byte-identical."""
    nodes = start_dledger_group(tmp_path, 3, group="scrub", segment_size=64 * 1024)
    try:
        addresses = [node.client_address for node in nodes.values()]
        acked = trio.run(_send_sized, addresses, 400, "w", 1000)
        leader = sole_leader(nodes)
        member = next(m for m in nodes if m != leader)
        wait_until(lambda: caught_up(nodes, leader, member), message="the member caught up")
        end = member_status(nodes[member])["ledger_end_index"]
        nodes[member].stop()
        data_files = sorted(os.listdir(tmp_path / member / f"dledger-{member}" / "data"))
        assert len(data_files) >= 6, data_files  # the first is well outside what recovery re-checks
        entry = next(d for d in dump_entries(tmp_path, member) if d["offset"] == acked[10])
        data_file = tmp_path / member / f"dledger-{member}" / "data" / data_files[0]
        content = bytearray(data_file.read_bytes())
        content[content.index(b"w10:", entry["offset"]) + 100] ^= 0x04  # one bit of its message's body
        data_file.write_bytes(bytes(content))
        nodes[member].start()
        wait_until(lambda: (member_status(nodes[member])["scrub"] or {}).get("entries_repaired", 0) >= 1, timeout=60,
                   message="the scrub repaired the entry")  # fmt: skip
        status = member_status(nodes[member])
        assert status["damaged"] == [] and status["catch_up_index"] == -1, status
        assert status["scrub"]["damaged_found"] >= 1, status["scrub"]
        assert status["ledger_end_index"] >= end  # nothing was cut
        log = (tmp_path / f"{member}.log").read_text()
        pos = entry["offset"] - 48
        assert f"scrub: damaged entry at {data_files[0]} offsets [{pos}, " in log, log
        assert f"(index {entry['index']}): entry {entry['index']}: bodyCrc mismatch" in log
        assert f"scrub: entry {entry['index']} at offset {pos} repaired from n" in log
        assert "damaged entries cut" not in log
        with hc_blocking(nodes[member]) as client:
            assert bytes(client.read_record(acked[10]).body).startswith(b"w10:")
    except BaseException:
        for node in nodes.values():
            node.kill()
        raise
    stop_all_and_compare(tmp_path, nodes, leader, member)


def hc_blocking(node):
    from hasvc import client as hc

    return hc.BlockingClient(node.client_address)


def test_a_group_of_one_reports_damage_its_scrub_finds_in_an_old_data_file_and_serves_the_rest(tmp_path) -> None:
    """No other copy: the damage is named (file, range, entry) in one ERROR line and in STATUS
    ``damaged``, a read of it answers DAMAGED, nothing is cut, and every other entry is served."""
    from hasvc.client.results import ClientError
    from hasvc.tools.drill_dledger import Node

    args = node_args(tmp_path, "n0", "--set", "commitlog_segment_size=65536")
    node = Node(str(tmp_path), "n0", args)
    node.start()
    try:
        acked = trio.run(_send_sized, [node.client_address], 400, "z", 1000)
    finally:
        node.stop()
    data_files = sorted(os.listdir(tmp_path / "n0" / "dledger-n0" / "data"))
    assert len(data_files) >= 6, data_files
    entry = next(d for d in dump_entries(tmp_path, "n0") if d["offset"] == acked[10])
    data_file = tmp_path / "n0" / "dledger-n0" / "data" / data_files[0]
    content = bytearray(data_file.read_bytes())
    content[content.index(b"z10:", entry["offset"]) + 100] ^= 0x04
    data_file.write_bytes(bytes(content))
    node.start()  # recovery does not re-check the first data file: it starts
    try:
        wait_until(lambda: member_status(node)["damaged"], timeout=60, message="the scrub found the damage")
        (damage,) = member_status(node)["damaged"]
        pos = entry["offset"] - 48
        assert damage["file"].endswith(data_files[0]) and damage["from"] == pos and damage["index"] == entry["index"]
        assert damage["reason"] == f"entry {entry['index']}: bodyCrc mismatch"
        wait_until(lambda: "not repaired" in (tmp_path / "n0.log").read_text(), timeout=60, message="the one line")
        log = (tmp_path / "n0.log").read_text()
        assert f"scrub: damaged entry at {data_files[0]} offsets [{pos}, " in log
        assert "not repaired: no member gave a copy that checks (a group of one has no other copy)" in log
        with hc_blocking(node) as client:
            with pytest.raises(ClientError, match="DAMAGED|damaged"):
                client.read_record(acked[10])
            assert bytes(client.read_record(acked[11]).body).startswith(b"z11:")
        assert member_status(node)["ledger_end_index"] >= len(acked)  # nothing cut
    finally:
        node.stop()
