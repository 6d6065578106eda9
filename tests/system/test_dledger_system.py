"""DLedger mode with real ``hasvc node`` processes on loopback: elections with nobody promoting,
SIGKILL of the leader and of a minority, partitions, bad input on the Raft port. Losses are
checked from the stores on disk (the drill) or by reading every acknowledged offset back."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys

import trio
from click.testing import CliRunner

from hasvc import client as hc
from hasvc.cli import main as cli_main
from hasvc.protocol import raft as raft_wire
from hasvc.protocol import wire
from hasvc.state.raft.messages import PushResponse, PushResult, PushType
from hasvc.tools.drill_dledger import Node
from hasvc.tools.partition import LOOPBACK, free_port
from tests.cluster import start_dledger_group, wait_until
from tests.system.dledger_nodes import (RETENTION_SEGMENT_SIZE, all_caught_up, member_status, one_member_down, passes_after,
                                        read_back, send_numbered, sole_leader, start_retention_group)  # fmt: skip

DRILL_TIMEOUT_SECONDS = 300  # a drill that hangs fails the test instead of the CI run


def _start_group(tmp_path, size: int, *extra_args: str) -> dict[str, Node]:
    return start_dledger_group(tmp_path, size, group="sys", extra_args=extra_args)


def test_drill_kills_and_partitions_leaders_and_loses_nothing() -> None:
    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "drill", "--mode", "dledger", "--rounds", "3", "--producers", "4",
                           "--fault", "mixed", "--seed", "7"], capture_output=True, text=True, timeout=DRILL_TIMEOUT_SECONDS)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 lost, 0 duplicated: OK" in done.stdout


def test_a_five_member_group_survives_two_deaths_and_the_dead_rejoin(tmp_path) -> None:
    nodes = _start_group(tmp_path, 5)
    try:
        addresses = [node.client_address for node in nodes.values()]
        before = trio.run(send_numbered, addresses, 50, "a")
        leader = sole_leader(nodes)
        follower = next(m for m in nodes if m != leader)
        nodes[leader].kill()
        nodes[follower].kill()
        after = trio.run(send_numbered, addresses, 50, "b")  # three of five: still a quorum, nobody promoted
        survivor = next(m for m in nodes if nodes[m].alive)
        # By offset, not index: no-op entries of new terms lie between the messages' entries.
        last = max(after.values())
        wait_until(lambda: member_status(nodes[survivor])["committed_offset"] > last, message="the writes committed")
        read_back(nodes[survivor], before, "a")
        read_back(nodes[survivor], after, "b")
        for member in (leader, follower):
            nodes[member].start()  # same store, same ports
        new_leader = sole_leader(nodes)
        end = member_status(nodes[new_leader])["ledger_end_index"]
        wait_until(lambda: all(member_status(n)["committed_index"] >= end for n in nodes.values()), message="everyone caught up")
        read_back(nodes[leader], before, "a")
        read_back(nodes[follower], after, "b")
    finally:
        for node in nodes.values():
            node.kill()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hasvc.cli", *args], capture_output=True, text=True, timeout=60)


def test_transfer_leader_hands_leadership_to_the_member_named_and_writes_go_on(tmp_path) -> None:
    nodes = _start_group(tmp_path, 3)
    try:
        addresses = [node.client_address for node in nodes.values()]
        before = trio.run(send_numbered, addresses, 20, "t")
        leader = sole_leader(nodes)
        target = next(m for m in nodes if m != leader)
        done = _cli("transfer-leader", nodes[leader].client_address, "--to", target, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        outcome = json.loads(done.stdout)
        assert outcome["status"] == "OK" and outcome["leader_id"] == target, outcome
        assert outcome["term"] > outcome["previous_term"] and outcome["elapsed_seconds"] < 10
        assert member_status(nodes[target])["raft_role"] == "LEADER"
        assert sole_leader(nodes) == target  # and it plays SYNC_MASTER once caught up
        after = trio.run(send_numbered, addresses, 20, "u")  # the failover client finds the new leader
        read_back(nodes[target], before, "t")
        end = member_status(nodes[target])["committed_index"]
        wait_until(lambda: member_status(nodes[leader])["committed_index"] >= end, message="the old leader caught up")
        read_back(nodes[leader], after, "u")
        unknown = _cli("transfer-leader", nodes[target].client_address, "--to", "n9")
        assert unknown.returncode != 0, unknown.stdout
        assert "UNKNOWN_MEMBER" in unknown.stderr and "'n9' is not a member" in unknown.stderr, unknown.stderr
        # given a member that no longer leads, the command finds the leader it names and asks it
        back = _cli("transfer-leader", nodes[leader].client_address, "--to", leader, "--json")
        moved = json.loads(back.stdout)
        assert back.returncode == 0 and moved["status"] == "OK" and moved["leader_id"] == leader, moved
        again = _cli("transfer-leader", nodes[target].client_address, "--to", leader, "--json")  # it leads: nothing to do
        assert again.returncode == 0 and json.loads(again.stdout)["leader_id"] == leader, again.stdout + again.stderr
    finally:
        for node in nodes.values():
            node.kill()


def test_store_verify_and_dump_read_a_members_store_written_by_a_node(tmp_path) -> None:
    nodes = _start_group(tmp_path, 1)
    try:
        acked = trio.run(send_numbered, [nodes["n0"].client_address], 6, "m")
    finally:
        nodes["n0"].stop()  # SIGTERM: a clean close
    store = str(tmp_path / "n0")
    runner = CliRunner()
    done = runner.invoke(cli_main, ["store", "verify", store, "--member", "n0", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["ok"] and [part["part"] for part in report["parts"]] == ["dledger"]
    assert report["parts"][0]["messages"] == 6 and report["parts"][0]["noops"] >= 1
    done = runner.invoke(cli_main, ["store", "verify", store, "--member", "n0"])
    assert done.exit_code == 0 and "6 messages" in done.output and "status       clean" in done.output, done.output
    done = runner.invoke(cli_main, ["store", "dump", store, "--member", "n0", "--json"])
    assert done.exit_code == 0, done.output
    dumped = [json.loads(line) for line in done.output.splitlines()]
    assert {(d["offset"], base64.b64decode(d["body_base64"]).decode()) for d in dumped} == {
        (offset, f"m{number}") for number, offset in acked.items()
    }
    assert all(d["part"] == "dledger" and d["index"] >= 1 and d["crc_ok"] for d in dumped)
    done = runner.invoke(cli_main, ["store", "dump", store, "--member", "n0", "--from", str(acked[4]), "--count", "1"])
    assert done.exit_code == 0 and done.output.count("\n") == 1 and "dledger#" in done.output and "m4" in done.output
    done = runner.invoke(cli_main, ["store", "verify", store])
    assert done.exit_code != 0 and "a DLedger member's: give --member n0" in done.output, done.output  # by STORE/identity
    done = runner.invoke(cli_main, ["store", "dump", store, "--member", "n7"])
    assert done.exit_code != 0 and "not member n7's: give --member n0" in done.output, done.output
    data_file = next((tmp_path / "n0" / "dledger-n0" / "data").iterdir())
    content = bytearray(data_file.read_bytes())
    content[content.index(b"m3")] ^= 0xFF  # in a message body: the entry's body CRC no longer matches
    data_file.write_bytes(bytes(content))
    done = runner.invoke(cli_main, ["store", "verify", store, "--member", "n0"])
    entry_pos = acked[3] - 48  # the entry header precedes the record
    assert done.exit_code == 1 and f"CORRUPT at offset {entry_pos}: bodyCrc mismatch" in done.output, done.output


def test_the_raft_port_closes_bad_connections_only(tmp_path) -> None:
    nodes = _start_group(tmp_path, 3)
    try:
        n0 = nodes["n0"]
        raft_port = int(n0.ready["raft_listen"].rsplit(":", 1)[1])
        with socket.create_connection((LOOPBACK, raft_port), timeout=10) as garbage:  # not even a preface
            garbage.recv(wire.HELLO.size)
            garbage.sendall(os.urandom(200))
            assert _closed(garbage)
        for hello in (raft_wire.Hello("other-group", "n1", "n0"), raft_wire.Hello("sys", "n9", "n0"),
                      raft_wire.Hello("sys", "n1", "n2")):  # fmt: skip
            with socket.create_connection((LOOPBACK, raft_port), timeout=10) as stranger:
                _preface(stranger)
                stranger.sendall(raft_wire.encode_hello(hello))
                assert _closed(stranger), hello
        status = member_status(n0)
        assert status["mode"] == "dledger" and status["raft_connections_refused"] >= 4
        assert trio.run(send_numbered, [node.client_address for node in nodes.values()], 20, "c")  # the group still works
        leader = sole_leader(nodes)
        shown = member_status(nodes[leader])
        assert shown["raft_role"] == "LEADER" and shown["leader_id"] == leader and set(shown["peers"]) == set(nodes) - {leader}
        # A quorum acknowledged the sends; a member that started late on a busy machine may still
        # be reached by the leader's reconnect (its back-off doubles up to 1 s): wait for it.
        wait_until(lambda: all(peer["match_index"] >= 0 for peer in member_status(nodes[leader])["peers"].values()),
                   timeout=30, message="every follower matched the leader")  # fmt: skip
        # A well-formed frame no member could send (an acknowledgement past the leader's log, in
        # its term): that connection is closed, the leader goes on leading (it used to exit).
        impostor = next(m for m in nodes if m != leader)
        leader_port = int(nodes[leader].ready["raft_listen"].rsplit(":", 1)[1])
        refused_before = member_status(nodes[leader])["raft_connections_refused"]
        with socket.create_connection((LOOPBACK, leader_port), timeout=10) as rogue:
            _preface(rogue)
            rogue.sendall(raft_wire.encode_hello(raft_wire.Hello("sys", impostor, leader)) + raft_wire.encode(
                PushResponse(impostor, leader, shown["term"], PushType.APPEND, PushResult.SUCCESS, -1, 1 << 40, 0, 1 << 40)))
            assert _closed(rogue)
        assert nodes[leader].alive and member_status(nodes[leader])["raft_connections_refused"] > refused_before
        assert trio.run(send_numbered, [node.client_address for node in nodes.values()], 5, "d")  # still works
    finally:
        for node in nodes.values():
            node.kill()


def _preface(sock: socket.socket) -> None:
    """The connection preface of a port without a secret (docs/PROTOCOL.md §1)."""
    version, kind, auth_required, nonce = wire.decode_hello(_receive(sock, wire.HELLO.size))
    assert kind == wire.PORT_KIND_RAFT and not auth_required
    sock.sendall(wire.encode_auth(secret=None, server_nonce=nonce, client_nonce=wire.new_nonce()))
    status, _proof = wire.AUTH_OK.unpack(_receive(sock, wire.AUTH_OK.size))
    assert status == wire.AUTH_STATUS_OK


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "closed during the preface"
        data += chunk
    return data


def _closed(sock: socket.socket) -> bool:
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def test_smooth_upgrade_a_classic_group_becomes_a_dledger_group_and_old_offsets_stay_readable(tmp_path) -> None:
    """RocketMQ's upgrade: every broker of a classic group (a master and its slaves, one log)
    restarts as a DLedger member on its own store; the old log is sealed (dividedCommitlogOffset),
    old offsets are served from it, new entries start at the next segment boundary."""
    from tests.cluster import Cluster, caught_up, send_many

    classic = Cluster(tmp_path, segment_size=1048576)
    try:
        master = classic.start_master("n0", role="sync")
        slaves = [classic.start_slave(master.ha_address, name) for name in ("n1", "n2")]
        old = trio.run(send_many, master.address, 200, 8)
        assert {r.status for r in old.values()} == {"PUT_OK"}
        for slave in slaves:
            wait_until(lambda slave=slave: caught_up(master, slave), message="slaves caught up")
        classic_end = _status_at(master.address)["max_offset"]
    finally:
        classic.close()  # SIGTERM: clean exits
    nodes = _start_group(tmp_path, 3, "--upgrade-from-classic")  # the explicit step: each store becomes a member's
    try:
        addresses = [node.client_address for node in nodes.values()]
        new = trio.run(send_numbered, addresses, 30, "new")
        assert min(new.values()) >= 1048576 > classic_end, (min(new.values()), classic_end)  # after the divide
        for member, node in nodes.items():
            status = member_status(node)
            wait_until(lambda node=node: member_status(node)["committed_offset"] > max(new.values()), message=f"{member} committed")

            async def check(node=node) -> None:
                async with hc.connect(node.client_address) as client:
                    for i in (0, 99, 199):  # classic offsets, from the sealed log
                        record = await client.read_record(old[i].offset)
                        assert bytes(record.body).startswith(f"m{i}:".encode()), (i, old[i].offset)

            trio.run(check)
            read_back(node, new, "new")
            assert status["mode"] == "dledger"
    finally:
        for node in nodes.values():
            node.kill()


def test_an_empty_member_joins_an_upgraded_group_at_its_divide(tmp_path) -> None:
    """n0 and n1 come from a classic master and slave, n2 starts empty: it learns the divide from
    their HELLO and places its entries at the same offsets, so every new offset reads the same
    on all three; the old offsets are read from n0 and n1 (n2 has no classic log)."""
    from tests.cluster import Cluster, caught_up, send_many

    classic = Cluster(tmp_path, segment_size=1048576)
    try:
        master = classic.start_master("n0", role="sync")
        slave = classic.start_slave(master.ha_address, "n1")
        old = trio.run(send_many, master.address, 50, 8)
        wait_until(lambda: caught_up(master, slave), message="the slave caught up")
    finally:
        classic.close()
    nodes = _start_group(tmp_path, 3, "--upgrade-from-classic")  # n2's empty store: the flag changes nothing
    try:
        addresses = [node.client_address for node in nodes.values()]
        new = trio.run(send_numbered, addresses, 30, "new")
        assert min(new.values()) >= 1048576
        last = max(new.values())
        for member, node in nodes.items():
            wait_until(lambda node=node: member_status(node)["committed_offset"] > last, message=f"{member} committed")
            read_back(node, new, "new")
        assert "where n" in (tmp_path / "n2.log").read_text()  # it adopted the divide from a peer's HELLO

        async def old_on(node) -> bytes:
            async with hc.connect(node.client_address) as client:
                return bytes((await client.read_record(old[0].offset)).body)

        assert trio.run(old_on, nodes["n0"]).startswith(b"m0:")
    finally:
        for node in nodes.values():
            node.kill()


def _status_at(address: str) -> dict:
    with hc.BlockingClient(address) as client:
        return client.status()


def test_a_batch_keeps_its_tags_keys_properties_and_queue_on_every_member(tmp_path) -> None:
    nodes = _start_group(tmp_path, 3)
    try:
        addresses = [node.client_address for node in nodes.values()]

        async def send() -> list:
            async with hc.connect_cluster(addresses, retry_sends=True) as client:
                return await client.send_batch("Props", [b"one", b"two", b"three"], tags="tagA", keys="k1 k2",
                                               properties={"color": "blue"}, queue_id=3)  # fmt: skip

        results = trio.run(send)
        assert [r.status for r in results] == ["PUT_OK"] * 3 and [r.queue_offset for r in results] == [0, 1, 2]
        last = max(r.offset for r in results)
        for member, node in nodes.items():
            wait_until(lambda node=node: member_status(node)["committed_offset"] > last, message=f"{member} committed")

            async def check(node=node) -> None:
                async with hc.connect(node.client_address) as client:
                    for result, body in zip(results, (b"one", b"two", b"three")):
                        record = await client.read_record(result.offset)
                        assert (record.topic, record.queue_id, record.queue_offset) == ("Props", 3, result.queue_offset)
                        assert bytes(record.body) == body and record.properties.get("TAGS") == "tagA"
                        assert record.properties.get("KEYS") == "k1 k2" and record.properties.get("color") == "blue"

            trio.run(check)
    finally:
        for node in nodes.values():
            node.kill()


def test_a_second_member_with_the_same_self_refuses_to_run(tmp_path) -> None:
    nodes = _start_group(tmp_path, 3)
    try:
        peers = nodes["n0"].args[nodes["n0"].args.index("--peers") + 1]
        second = subprocess.run([sys.executable, "-m", "hasvc.cli", "node", "--store", str(tmp_path / "again"), "--listen",
                                 f"{LOOPBACK}:0", "--group", "sys", "--peers", peers, "--self", "n0"],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert second.returncode != 0 and "READY" not in second.stdout
        assert "is a member with --self n0 running already?" in second.stderr, second.stderr[-2000:]
        assert nodes["n0"].alive and member_status(nodes["n0"])["self_id"] == "n0"  # the first goes on
    finally:
        for node in nodes.values():
            node.kill()


def test_a_follower_names_the_leaders_client_address_and_a_client_given_only_it_finds_the_leader(tmp_path) -> None:
    nodes = _start_group(tmp_path, 3)
    try:
        leader = sole_leader(nodes)
        follower = next(m for m in nodes if m != leader)
        leader_address = nodes[leader].client_address
        wait_until(lambda: member_status(nodes[follower])["leader_client_address"] == leader_address,
                   message="the follower knows the leader's client port")  # fmt: skip

        async def refused() -> str:
            async with hc.connect(nodes[follower].client_address) as client:
                result = await client.send("DL", b"to a follower")
                assert result.status == "SERVICE_NOT_AVAILABLE", result
                return result.reason

        assert f"client {leader_address}" in trio.run(refused)
        acked = trio.run(send_numbered, [nodes[follower].client_address], 10, "only")  # one follower's address, no more
        read_back(nodes[leader], acked, "only")
        assert member_status(nodes[leader])["leader_client_address"] == leader_address
    finally:
        for node in nodes.values():
            node.kill()


async def _pull_from_zero(node: Node):
    async with hc.connect(node.client_address) as client:
        return await client.pull("DL", 0, 0, count_max=1000)


def test_retention_deletes_head_files_but_waits_for_a_member_that_is_down(tmp_path) -> None:
    # disk_clean_ratio=1.0: never forced, whatever else fills the (shared) disk (at 87 % here once,
    # every pass was forced and deleted what the member that is down needs: that is the next test's)
    nodes = start_retention_group(tmp_path, ("disk_clean_ratio=1.0",))
    try:
        addresses = [node.client_address for node in nodes.values()]
        first = trio.run(send_numbered, addresses, 400, "a")  # about 100 entries a 16 KiB data file
        leader = sole_leader(nodes)
        end = member_status(nodes[leader])["ledger_end_index"]
        wait_until(lambda: all(member_status(n)["ledger_begin_index"] > 0 for n in nodes.values()),
                   message="every member deleted its head files")  # fmt: skip
        for node in nodes.values():
            status = member_status(node)
            assert status["min_offset"] > min(first.values()) and status["retention_floor_index"] <= end + 1
        down = next(m for m in nodes if m != leader)
        down_end = member_status(nodes[down])["ledger_end_index"]
        nodes[down].kill()
        second = trio.run(send_numbered, addresses, 400, "b")
        for member in nodes:
            if member != down:
                passes_after(nodes[member], 3)
                status = member_status(nodes[member])
                # what the member that is down still needs stays, on every member
                assert status["ledger_begin_index"] <= down_end, (member, status, down_end)
        nodes[down].start()  # same store: it is caught up from where it stopped
        leader = sole_leader(nodes)
        end = member_status(nodes[leader])["ledger_end_index"]
        wait_until(lambda: all(member_status(n)["committed_index"] >= end for n in nodes.values()), message="caught up")
        wait_until(lambda: all(member_status(n)["ledger_begin_index"] > down_end for n in nodes.values()),
                   message="retention goes on once the member is back")  # fmt: skip
        for node in nodes.values():
            status = member_status(node)
            assert not any(peer["behind_log_start"] for peer in status["peers"].values()), status
            minimum = status["min_offset"]
            read_back(node, {n: o for n, o in second.items() if o >= minimum}, "b")
            assert any(o < minimum for o in second.values())  # the head is gone here too
            pulled = trio.run(_pull_from_zero, node)  # a consumer from queue offset 0 skips what retention removed
            assert pulled.status == "OK" and pulled.records, pulled
            assert all(r.physical_offset >= minimum for r in pulled.records)
            assert pulled.next_queue_offset - len(pulled.records) > 0  # the start moved past the removed ones
        shown = _cli("status", nodes[leader].client_address)
        assert shown.returncode == 0 and "log          entries [" in shown.stdout, shown.stdout + shown.stderr
        begin = int(shown.stdout.split("log          entries [")[1].split(",")[0])
        assert begin > down_end and "retention keeps from" in shown.stdout, shown.stdout
        nodes[leader].kill()  # a SIGKILL, and the store reopens with its head deleted
        nodes[leader].start()
        sole_leader(nodes)
        wait_until(lambda: member_status(nodes[leader])["committed_index"] >= end, message="the old leader recovered")
        minimum = member_status(nodes[leader])["min_offset"]
        read_back(nodes[leader], {n: o for n, o in second.items() if o >= minimum}, "b")
    finally:
        for node in nodes.values():
            node.kill()
    runner = CliRunner()
    for member in nodes:
        done = runner.invoke(cli_main, ["store", "verify", str(tmp_path / member), "--member", member, "--json"])
        assert done.exit_code == 0 and json.loads(done.output)["ok"], done.output
        done = runner.invoke(cli_main, ["store", "dump", str(tmp_path / member), "--member", member, "--json"])
        assert done.exit_code == 0, done.output
        dumped = {base64.b64decode(json.loads(line)["body_base64"]).decode() for line in done.output.splitlines()}
        assert "b399" in dumped and "a0" not in dumped


async def _pull_all(node: Node) -> list[tuple[int, int, int, bytes]]:
    """(queue id, queue offset, offset, body) of every message the consume queues of DL index."""
    found = []
    async with hc.connect(node.client_address) as client:
        for queue_id in range(4):
            pulled = await client.pull("DL", queue_id, 0, count_max=1000)
            assert pulled.status in ("OK", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_FOUND_NULL"), pulled
            found += [(queue_id, r.queue_offset, r.physical_offset, bytes(r.body)) for r in pulled.records]
    return found


def _dump(path, member: str) -> dict[int, tuple[int, str]]:
    done = CliRunner().invoke(cli_main, ["store", "dump", str(path), "--member", member, "--json"])
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in done.output.splitlines()]
    return {item["index"]: (item["term"], item["body_base64"]) for item in lines if item["part"] == "dledger"}


def test_a_member_stranded_by_a_forced_clean_is_reset_and_converges(tmp_path) -> None:
    # disk_clean_ratio=0.01: every retention pass is forced (the disk is above it): a leader keeps
    # only what the followers whose match index it knows need. The leader is restarted after the
    # member went down: the new one never heard from it, and deletes what it still needs (its
    # followers keep the floor it announces, held at -1 by the member it does not know).
    nodes = start_retention_group(tmp_path, ("disk_clean_ratio=0.01",))
    try:
        addresses, leader, down, down_end = one_member_down(nodes)
        nodes[leader].stop()
        nodes[leader].start()
        leader = sole_leader(nodes)
        second = trio.run(send_numbered, addresses, 400, "b")
        wait_until(lambda: member_status(nodes[leader])["ledger_begin_index"] > down_end + 1,
                   message="the leader deleted entries the member that is down needs")  # (a follower keeps its floor)  # fmt: skip
        nodes[down].start()  # stranded: the next entry it needs is gone everywhere
        leader = sole_leader(nodes)
        wait_until(lambda: all_caught_up(nodes, leader), timeout=60, message="the stranded member caught up")
        status = member_status(nodes[down])
        assert status["ledger_begin_index"] > down_end + 1 and status["min_offset"] > min(second.values()), status
        with open(nodes[down].log_path) as log:
            assert "reset by the leader" in log.read()
        third = trio.run(send_numbered, addresses, 60, "c")  # replicated to the reset member by APPEND
        wait_until(lambda: all_caught_up(nodes, leader), message="caught up again")
        # Forced cleans go on deleting; the data file holding the committed entry always stays.
        last_file = max(third.values()) // RETENTION_SEGMENT_SIZE
        kept = {n: o for n, o in third.items() if o // RETENTION_SEGMENT_SIZE == last_file}
        read_back(nodes[down], kept, "c")
        nodes[down].kill()  # a SIGKILL after the reset: the store reopens as it was
        nodes[down].start()
        leader = sole_leader(nodes)
        wait_until(lambda: all_caught_up(nodes, leader), message="the reset member recovered")
        read_back(nodes[down], kept, "c")
        for node in nodes.values():
            passes_after(node, 3)  # no writes: the cleans have deleted all they can
        minimum = max(member_status(n)["min_offset"] for n in nodes.values())
        pulls = {m: [p for p in trio.run(_pull_all, n) if p[2] >= minimum] for m, n in nodes.items()}
        assert pulls[down] and all(p == pulls[down] for p in pulls.values()), "consume queues differ"
        assert {p[3] for p in pulls[down]} >= {b"c%d" % n for n in kept}
        for member in sorted(nodes, key=lambda m: m == leader):  # the leader last: no election, no new no-op
            nodes[member].stop()
    finally:
        for node in nodes.values():
            node.kill()
    dumps = {m: _dump(tmp_path / m, m) for m in nodes}
    first, last = max(min(d) for d in dumps.values()), min(max(d) for d in dumps.values())
    assert first <= last and all({i: d[i] for i in range(first, last + 1)} == {i: dumps[down][i] for i in range(first, last + 1)}
                                 for d in dumps.values())  # fmt: skip
    data = {m: set(os.listdir(tmp_path / m / f"dledger-{m}" / "data")) for m in nodes}
    common = set.intersection(*data.values())
    assert common
    for name in common:
        contents = {(tmp_path / m / f"dledger-{m}" / "data" / name).read_bytes() for m in nodes}
        assert len(contents) == 1, f"data file {name} differs"
    for member in nodes:
        done = CliRunner().invoke(cli_main, ["store", "verify", str(tmp_path / member), "--member", member, "--json"])
        assert done.exit_code == 0 and json.loads(done.output)["ok"], done.output


def test_a_member_serves_prometheus_metrics_from_its_status(tmp_path) -> None:
    """``hasvc node --metrics-listen``: STATUS's numbers as gauges, the role, per-peer gauges and
    the put path's counters, on every member; READY names the address."""
    import urllib.request

    nodes = start_dledger_group(tmp_path, 3, group="metrics",
                                member_args=lambda member: ["--metrics-listen", f"{LOOPBACK}:{free_port()}"])  # fmt: skip
    try:
        leader = sole_leader(nodes)
        trio.run(send_numbered, [node.client_address for node in nodes.values()], 5, "m")

        def scrape(member: str) -> str:
            address = nodes[member].ready["metrics_listen"]
            return urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()

        text = scrape(leader)
        assert 'hasvc_raft_role{role="LEADER"} 1.0' in text
        assert "hasvc_appended_messages_total 5.0" in text
        assert 'hasvc_put_latency_seconds_count{status="PUT_OK"} 5.0' in text
        for line in ("hasvc_term ", "hasvc_committed_index ", "hasvc_raft_strangers_evicted ", "hasvc_client_bytes_queued ",
                     "hasvc_raft_bytes_queued ", "hasvc_raft_connections_muted ", "hasvc_peer_bytes_queued{"):
            assert line in text, line
        followers = [member for member in nodes if member != leader]
        assert all(f'hasvc_peer_match_index{{peer="{member}"}}' in text for member in followers)
        assert 'hasvc_raft_role{role="FOLLOWER"} 1.0' in scrape(followers[0])
    finally:
        for node in nodes.values():
            node.kill()
