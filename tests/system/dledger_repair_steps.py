"""Steps of the DLedger store repair tests (tests/system/test_dledger_repair.py,
test_dledger_member_repair.py): real ``hasvc node`` processes on loopback, a member's entries
read with ``hasvc store dump``, one bit of a stopped member's entry flipped, and the members
stopped and compared from disk."""

from __future__ import annotations

import json
import os

import trio
from click.testing import CliRunner

from hasvc.cli import main as cli_main
from hasvc.tools.drill import queue_file_digests
from tests.system.dledger_nodes import member_status, send_numbered


def dump_entries(path, member: str) -> list[dict]:
    done = CliRunner().invoke(cli_main, ["store", "dump", str(path / member), "--member", member, "--json"])
    assert done.exit_code == 0, done.output
    return [json.loads(line) for line in done.output.splitlines()]


def verify(path, member: str) -> None:
    done = CliRunner().invoke(cli_main, ["store", "verify", str(path / member), "--member", member, "--json"])
    assert done.exit_code == 0 and json.loads(done.output)["ok"], done.output


def data_files(path, member: str) -> dict[str, bytes]:
    directory = path / member / f"dledger-{member}" / "data"
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def caught_up(nodes, leader: str, member: str) -> bool:
    leading, status = member_status(nodes[leader]), member_status(nodes[member])
    end = leading["ledger_end_index"]
    return (status["ledger_end_index"] == end and status["committed_index"] == end
            and leading["peers"][member]["match_index"] == end and status["catch_up_index"] == -1)  # fmt: skip


def stop_all_and_compare(tmp_path, nodes, leader: str, member: str) -> None:
    for name in sorted(nodes, key=lambda name: name == leader):  # the leader last: no election, no new entry
        nodes[name].stop()
    for name in nodes:
        verify(tmp_path, name)
    assert dump_entries(tmp_path, member) == dump_entries(tmp_path, leader)
    assert data_files(tmp_path, member) == data_files(tmp_path, leader)  # byte for byte
    assert queue_file_digests(str(tmp_path / member)) == queue_file_digests(str(tmp_path / leader))


def node_args(tmp_path, member: str = "n0", *extra: str) -> list[str]:
    from hasvc.tools.partition import LOOPBACK, free_port

    from hasvc.tools.drill_dledger import ETCD_LIKE_SETTINGS

    timing = [argument for setting in ETCD_LIKE_SETTINGS for argument in ("--set", setting)]
    return ["--store", str(tmp_path / member), "--listen", f"{LOOPBACK}:0", "--group", "one",
            "--peers", f"{member}-{LOOPBACK}:{free_port()}", "--self", member, *timing, *extra]  # fmt: skip


def sent_to_a_group_of_one(tmp_path, args: list[str], count: int, tag: str) -> dict[int, dict]:
    """``count`` messages tagged ``tag`` stored by member n0 alone (a group of one started with
    ``args``, stopped after): number -> its entry as ``dump_entries`` reads it."""
    from hasvc.tools.drill_dledger import Node

    node = Node(str(tmp_path), "n0", args)
    node.start()
    try:
        acked = trio.run(send_numbered, [node.client_address], count, tag)
    finally:
        node.stop()
    entries = {item["offset"]: item for item in dump_entries(tmp_path, "n0") if "offset" in item}
    return {number: entries[offset] for number, offset in acked.items()}


def flip(tmp_path, member: str, entry: dict, needle: bytes) -> tuple:
    """(the data file, its new content): one bit of ``needle``, the first after ``entry``'s
    offset in the member's first data file, flipped (a body: its entry's bodyCrc fails)."""
    data_file = tmp_path / member / f"dledger-{member}" / "data" / f"{0:020d}"
    content = bytearray(data_file.read_bytes())
    content[content.index(needle, entry["offset"])] ^= 0x01
    data_file.write_bytes(bytes(content))
    return data_file, bytes(content)
