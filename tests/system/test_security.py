"""System tests of the security policy: TLS on a DLedger group's ports (and mutual TLS between its
members), TLS files checked at start by every command that takes them, and settings a command
would not apply refused. Real processes on loopback; certificates made with the openssl command."""

import os
import shutil
import socket
import ssl
import subprocess
import sys

import pytest

from hasvc import client as hc
from tests.cluster import certificate_authority, start_dledger_group, wait_until

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command makes the certificates")

COMMAND_TIMEOUT_SECONDS = 60


def _leader(nodes, ca) -> str:
    found = []

    def one() -> bool:
        found[:] = []
        for member, node in nodes.items():
            with hc.BlockingClient(node.client_address, tls_ca=ca) as client:
                if client.status()["role"] == "SYNC_MASTER":
                    found.append(member)
        return len(found) == 1

    wait_until(one, timeout=60, message="one member playing SYNC_MASTER")
    return found[0]


def _group_takes_writes(tmp_path, *, mutual: bool) -> None:
    ca, issued = certificate_authority(str(tmp_path), ["n0", "n1", "n2"])

    def tls(member):
        key, cert = issued[member]
        return ["--tls-cert", cert, "--tls-key", key, *(["--tls-ca", ca] if mutual else [])]

    nodes = start_dledger_group(tmp_path, 3, group="tls", member_args=tls)
    try:
        leader = _leader(nodes, ca)
        with hc.BlockingClient(nodes[leader].client_address, tls_ca=ca) as client:
            for number in range(20):
                assert client.send("Secure", f"m{number}".encode(), queue_id=0).status == "PUT_OK"
        follower = next(member for member in nodes if member != leader)

        def replicated() -> bool:
            with hc.BlockingClient(nodes[follower].client_address, tls_ca=ca) as client:
                return len(client.pull("Secure", 0, 0, count_max=32).records) == 20

        wait_until(replicated, message=f"the 20 messages on {follower}")
        # Both ports speak TLS: a plaintext client gets no HELLO from either.
        raft_host, raft_port = nodes[leader].ready["raft_listen"].rsplit(":", 1)
        with pytest.raises(Exception):  # noqa: B017 (whatever a plaintext client makes of a TLS port)
            with hc.BlockingClient(nodes[leader].client_address) as client:
                client.status()
        if mutual:
            assert _tls_handshake_refused(raft_host, int(raft_port), ca)
    finally:
        for node in nodes.values():
            node.stop()


def _tls_handshake_refused(host: str, port: int, ca: str) -> bool:
    """A TLS client without a certificate is refused by the Raft port (mutual TLS): TLS 1.3
    tells the client after its handshake, at its first read."""
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = False
    with socket.create_connection((host, port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw) as tls:
                tls.sendall(b"\0" * 8)
                return tls.recv(64) == b""
        except (ssl.SSLError, ConnectionResetError):
            return True


def test_a_group_over_tls_elects_a_leader_and_takes_writes(tmp_path):
    _group_takes_writes(tmp_path, mutual=False)


def test_a_group_over_mutual_tls_elects_a_leader_and_takes_writes(tmp_path):
    _group_takes_writes(tmp_path, mutual=True)


def _run(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hasvc.cli", *args], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_SECONDS, env={**os.environ, **(env or {})})  # fmt: skip


def _bad_files(tmp_path):
    """(what, key, cert, the file the error must name) for each kind of bad file."""
    ca, issued = certificate_authority(str(tmp_path), ["a", "b"])
    key, cert = issued["a"]
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    return [("unparseable certificate", key, str(garbage), str(garbage)),
            ("unparseable key", str(garbage), cert, str(garbage)),
            ("mismatched key", issued["b"][0], cert, issued["b"][0])]  # fmt: skip


def _commands(tmp_path, key, cert):
    store = str(tmp_path / "store")
    # The proxy's brokers are unreachable (a closed port): it must fail on the file, not wait for them.
    return {
        "master": ["master", "--store", store, "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key],
        "slave": ["slave", "--store", store, "--listen", "127.0.0.1:0", "--master-ha", "127.0.0.1:9", "--tls-cert", cert,
                  "--tls-key", key],
        "node": ["node", "--store", store, "--listen", "127.0.0.1:0", "--group", "g", "--peers", "n0-127.0.0.1:0",
                 "--self", "n0", "--tls-cert", cert, "--tls-key", key],
        "proxy": ["proxy", "--listen", "127.0.0.1:0", "--brokers", "127.0.0.1:9", "--tls-listen", "127.0.0.1:0",
                  "--tls-cert", cert, "--tls-key", key],
    }  # fmt: skip


@pytest.mark.parametrize("command", ["master", "slave", "node", "proxy"])
def test_a_bad_certificate_or_key_is_one_line_at_start(tmp_path, command):
    for what, key, cert, named in _bad_files(tmp_path):
        done = _run(*_commands(tmp_path, key, cert)[command])
        assert done.returncode != 0, (what, done.stdout)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (what, done.stderr)
        assert named in lines[0], (what, lines[0])
        assert "Traceback" not in done.stderr
        assert not os.path.exists(tmp_path / "store"), "nothing starts before the files are checked"


def test_a_node_refuses_a_setting_it_would_not_apply(tmp_path):
    done = _run("node", "--store", str(tmp_path / "s"), "--listen", "127.0.0.1:0", "--group", "g", "--peers", "n0-127.0.0.1:0",
                "--self", "n0", "--set", "metrics_listen=127.0.0.1:0")  # fmt: skip
    assert done.returncode == 2
    assert "metrics_listen is not used by a DLedger member" in done.stderr


def test_a_node_refuses_a_missing_certificate_given_as_a_setting(tmp_path):
    done = _run("node", "--store", str(tmp_path / "s"), "--listen", "127.0.0.1:0", "--group", "g", "--peers", "n0-127.0.0.1:0",
                "--self", "n0", "--set", "tls_cert=/nonexistent.pem", "--set", "tls_key=/nonexistent.pem")  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "/nonexistent.pem" in done.stderr


def test_node_help_says_what_a_missing_secret_allows_and_lists_the_tls_options():
    done = _run("node", "--help")
    text = " ".join(done.stdout.split())
    for option in ("--tls-cert", "--tls-key", "--tls-ca"):
        assert option in text
    assert "forged HELLO" in text
