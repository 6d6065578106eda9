"""Every store knows what it is, with real processes: a classic broker pointed at a DLedger
member's store, or a node at another member's, exits with one line and leaves every byte of the
store as it was; a store from before markers gets one and goes on."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
import trio
from click.testing import CliRunner

from hasvc import client as hc
from hasvc.cli import main as cli_main
from hasvc.tools.partition import LOOPBACK, free_port
from tests.cluster import SEGMENT, Cluster, start_dledger_group

REFUSAL_TIMEOUT_SECONDS = 60  # a refused process that hangs fails the test


def store_bytes(path) -> dict[str, str]:
    """Every file and directory under ``path`` -> a digest of its content ("dir" for directories)."""
    found = {}
    for directory, directories, files in os.walk(path):
        for name in directories:
            found[os.path.relpath(os.path.join(directory, name), path)] = "dir"
        for name in files:
            full = os.path.join(directory, name)
            with open(full, "rb") as file:
                found[os.path.relpath(full, path)] = hashlib.sha256(file.read()).hexdigest()
    return found


def refused(command: list[str], store: str) -> str:
    """Run ``hasvc COMMAND``: it must exit != 0 without READY and without a traceback, its error
    one line, and no byte of ``store`` may change. Returns the error line."""
    before = store_bytes(store)
    with open(os.path.join(os.path.dirname(store), "refused.err"), "w+") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "hasvc.cli", *command], stdout=subprocess.PIPE, stderr=stderr,
                                   text=True)  # fmt: skip
        first_line = process.stdout.readline()  # READY when it serves (then stopped at once), "" when it exits
        if first_line:
            process.kill()
        process.wait(REFUSAL_TIMEOUT_SECONDS)
        process.stdout.close()
        stderr.seek(0)
        output = stderr.read()
    assert process.returncode != 0 and not first_line, (process.returncode, first_line)
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and output.rstrip().endswith(errors[0]), output[-3000:]
    assert store_bytes(store) == before
    return errors[0]


def member_with_messages(tmp_path, count: int = 20) -> tuple[str, dict]:
    """A one-member group (n0 of "g") that took ``count`` messages, stopped cleanly: its store."""
    node = start_dledger_group(tmp_path, 1, group="g")["n0"]
    try:

        async def send() -> None:
            async with hc.connect_cluster([node.client_address], retry_sends=True) as client:
                for number in range(count):
                    assert (await client.send("Id", f"m{number}".encode())).status == "PUT_OK"

        trio.run(send)
    finally:
        node.stop()
    return node.store, node


def classic_args(kind: str, store: str) -> list[str]:
    extra = ["--master-ha", f"{LOOPBACK}:{free_port()}"] if kind == "slave" else []
    return [kind, "--store", store, "--listen", f"{LOOPBACK}:0", "--ha-listen", f"{LOOPBACK}:0",
            "--set", f"commitlog_segment_size={SEGMENT}", *extra]  # fmt: skip


@pytest.mark.parametrize("marker", [True, False], ids=["marker", "store-from-before-markers"])
def test_a_master_or_slave_on_a_members_store_refuses_in_one_line_and_changes_nothing(tmp_path, marker) -> None:
    store, _ = member_with_messages(tmp_path)
    if not marker:
        os.unlink(os.path.join(store, "identity"))  # as a store written before markers existed
    for kind in ("master", "slave"):
        error = refused(classic_args(kind, store), store)
        assert f"{store}/identity" in error and "DLedger member n0's store" in error and "hasvc node --self n0" in error
    assert not os.path.exists(os.path.join(store, "commitlog")) and os.path.isdir(os.path.join(store, "consumequeue"))


def test_a_node_with_another_self_or_group_refuses_in_one_line_and_changes_nothing(tmp_path) -> None:
    store, node = member_with_messages(tmp_path)
    peers = f"n0-{LOOPBACK}:{free_port()};n1-{LOOPBACK}:{free_port()};n2-{LOOPBACK}:{free_port()}"
    base = ["node", "--store", store, "--listen", f"{LOOPBACK}:0", "--peers", peers,
            "--set", f"commitlog_segment_size={SEGMENT}"]  # fmt: skip
    error = refused([*base, "--group", "g", "--self", "n1"], store)
    assert "DLedger member n0's store" in error and "not member n1's" in error and "--self n0" in error
    error = refused([*base, "--group", "other", "--self", "n0"], store)
    assert "not of group other" in error and "--group g" in error
    node.start()  # its own member and group: it opens, and its messages are there
    try:

        async def send() -> str:
            async with hc.connect_cluster([node.client_address], retry_sends=True) as client:
                return (await client.send("Id", b"after")).status

        assert trio.run(send) == "PUT_OK"
    finally:
        node.stop()


def test_a_node_on_a_classic_store_refuses_unless_told_to_upgrade_it(tmp_path) -> None:
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    try:
        master = cluster.start_master("n0", role="async")
        with hc.BlockingClient(master.address) as client:
            assert client.send("Id", b"classic").status == "PUT_OK"
    finally:
        cluster.close()
    store = cluster.store("n0")
    peers = f"n0-{LOOPBACK}:{free_port()}"
    command = ["node", "--store", store, "--listen", f"{LOOPBACK}:0", "--group", "g", "--peers", peers, "--self", "n0",
               "--set", f"commitlog_segment_size={SEGMENT}"]  # fmt: skip
    error = refused(command, store)
    assert "a classic broker's store" in error and "--upgrade-from-classic" in error
    node = start_dledger_group(tmp_path, 1, group="g", extra_args=("--upgrade-from-classic",))["n0"]
    node.stop()
    verify = CliRunner().invoke(cli_main, ["store", "verify", store, "--member", "n0", "--json"])
    identity = json.loads(verify.output)["identity"]
    assert (identity["kind"], identity["member"], identity["group"]) == ("dledger", "n0", "g")
    assert identity["upgraded_ms"] is not None


def test_a_classic_store_from_before_markers_gets_one_and_serves_its_records(tmp_path) -> None:
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    master = cluster.start_master("m", role="async")
    with hc.BlockingClient(master.address) as client:
        offset = client.send("Id", b"old").offset
    assert master.stop() == 0
    store = cluster.store("m")
    os.unlink(os.path.join(store, "identity"))  # as a store written before markers existed
    master = cluster.start_master("m", role="async")
    try:
        with hc.BlockingClient(master.address) as client:
            assert bytes(client.read_record(offset).body) == b"old"
        with open(os.path.join(store, "identity")) as file:
            assert file.read().startswith("version=1\nkind=classic\nstore_id=")
    finally:
        cluster.close()


def test_store_verify_reports_the_identity_and_a_store_written_by_both_kinds(tmp_path) -> None:
    store, _ = member_with_messages(tmp_path)
    verify = CliRunner().invoke(cli_main, ["store", "verify", store, "--member", "n0"])
    assert verify.exit_code == 0, verify.output
    assert "identity     kind dledger, member n0, group g, store id " in verify.output
    wrong = CliRunner().invoke(cli_main, ["store", "verify", store, "--member", "n1"])
    assert wrong.exit_code == 1 and "not member n1's: give --member n0" in wrong.output
    classic = CliRunner().invoke(cli_main, ["store", "dump", store])
    assert classic.exit_code == 1 and "a DLedger member's: give --member n0" in classic.output
    # The issue's store: before markers, a master wrote a classic log over n0's offsets.
    other = Cluster(tmp_path, segment_size=SEGMENT)
    master = other.start_master("classic", role="async")
    with hc.BlockingClient(master.address) as client:
        assert client.send("Id", b"over").status == "PUT_OK"
    other.close()
    os.rename(other.store("classic") + "/commitlog", store + "/commitlog")
    os.unlink(os.path.join(store, "identity"))
    both = CliRunner().invoke(cli_main, ["store", "verify", store, "--member", "n0"])
    assert both.exit_code == 1, both.output
    assert "AMBIGUOUS" in both.output and "overlap      CORRUPT" in both.output
    assert "status       CORRUPT" in both.output
    dumped = CliRunner().invoke(cli_main, ["store", "dump", store, "--member", "n0", "--json"])
    assert dumped.exit_code == 0 and len(dumped.output.splitlines()) >= 20  # what to copy out stays readable
    assert "overlapping member n0's DLedger log" in refused(classic_args("master", store), store)
    node_command = ["node", "--store", store, "--listen", f"{LOOPBACK}:0", "--group", "g", "--peers",
                    f"n0-{LOOPBACK}:{free_port()}", "--self", "n0", "--set", f"commitlog_segment_size={SEGMENT}"]  # fmt: skip
    assert "hasvc store dump" in refused(node_command, store)
