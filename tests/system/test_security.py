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
                "--self", "n0", "--set", "ha_listen=127.0.0.1:0")  # fmt: skip
    assert done.returncode == 2
    assert "ha_listen is not used by a DLedger member" in done.stderr


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


# --- the proxy: one policy for its listeners, and client authentication (--acl) ---

ACL_FILE = """
[[account]]
access_key = "orders-app"
secret_key = "orders-secret-key"
topics = ["Orders*"]
groups = ["orders-*"]
actions = ["pub", "sub"]
"""


@pytest.fixture(scope="module")
def acl_proxy(tmp_path_factory):
    from tests.cluster import Cluster
    from tests.system.test_proxy_system import start_proxy

    root = tmp_path_factory.mktemp("acl")
    acl_file = root / "acl.toml"
    acl_file.write_text(ACL_FILE)
    cluster = Cluster(root, segment_size=4 * 1024 * 1024)
    master = cluster.start_master(role="async")
    slave = cluster.start_slave(master.ha_address)
    proxy = start_proxy(cluster, master, slave, "proxy-acl", "--acl", str(acl_file), "--metrics-listen", "127.0.0.1:0")
    yield proxy, master
    cluster.close()


def _drive(proxy, steps, home, *, access_key="", secret_key="", tz=None):
    from tests.system.test_proxy_system import drive

    env = {"RMQ_DRIVER_AK": access_key, "RMQ_DRIVER_SK": secret_key, **({"TZ": tz} if tz else {})}
    return drive(proxy, steps, home, env=env)


def _stored(master, topic) -> int:
    with hc.BlockingClient(master.address) as client:
        return sum(len(client.pull(topic, queue, 0, count_max=32).records) for queue in range(4))


def _code(name: str) -> int:
    from hasvc.proxy.pb import definition

    return definition.Code.Value(name)


def _client_log(home) -> str:
    with open(os.path.join(home, "logs", "rocketmq_python", "rocketmq_client.log"), errors="replace") as file:
        return file.read()


def _refusals(proxy) -> dict:
    import urllib.request

    text = urllib.request.urlopen(f"http://{proxy.ready['metrics_listen']}/metrics", timeout=10).read().decode()
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("hasvc_proxy_acl_refused_total{")}  # fmt: skip


@pytest.mark.parametrize("access_key, secret_key, reason", [("", "", "unsigned"), ("bogus-ak", "bogus-sk", "unknown_key"),
                                                           ("orders-app", "wrong-secret", "bad_signature")])  # fmt: skip
def test_the_official_client_with_bad_credentials_stores_nothing(acl_proxy, tmp_path, access_key, secret_key, reason):
    proxy, master = acl_proxy
    topic = f"Orders-{reason}"
    before = _refusals(proxy).get(reason, 0)
    (result,) = _drive(proxy, [{"op": "produce", "topic": topic, "count": 3, "catch": True}], tmp_path,
                       access_key=access_key, secret_key=secret_key)  # fmt: skip
    # The client's startup fails (its route query is refused); the status is in its own log, as it
    # reports it: "query topic raise exception, 40100, <the proxy's reason>" (Code.UNAUTHORIZED).
    assert isinstance(result, dict) and "route" in result["message"], result
    assert f"query topic raise exception, {_code('UNAUTHORIZED')}, " in _client_log(tmp_path)
    assert _stored(master, topic) == 0
    assert _refusals(proxy)[reason] > before


def test_the_official_client_with_its_credentials_sends_and_consumes(acl_proxy, tmp_path):
    proxy, master = acl_proxy
    topic = "Orders-allowed"
    steps = [{"op": "produce", "topic": topic, "count": 5},
             {"op": "consume", "group": "orders-readers", "topic": topic, "want": 5}]  # fmt: skip
    sent, consumed = _drive(proxy, steps, tmp_path, access_key="orders-app", secret_key="orders-secret-key")
    assert len(sent) == 5 and all("id" in s for s in sent)
    assert sorted(m["id"] for m in consumed) == sorted(s["id"] for s in sent)
    assert _stored(master, topic) == 5


def test_a_client_stamping_its_local_time_far_from_utc_is_accepted(acl_proxy, tmp_path):
    """The official Python client signs its local time with a Z (datetime.now()): UTC+14 here."""
    proxy, master = acl_proxy
    (sent,) = _drive(proxy, [{"op": "produce", "topic": "Orders-kiribati", "count": 1}], tmp_path,
                     access_key="orders-app", secret_key="orders-secret-key", tz="Pacific/Kiritimati")  # fmt: skip
    assert "id" in sent[0]
    assert _stored(master, "Orders-kiribati") == 1


def test_a_topic_or_group_outside_the_accounts_patterns_is_forbidden(acl_proxy, tmp_path):
    proxy, master = acl_proxy
    before = _refusals(proxy).get("not_permitted", 0)
    steps = [{"op": "produce", "topic": "Payments", "count": 2, "catch": True},
             {"op": "consume", "group": "payments-readers", "topic": "Orders-allowed", "want": 1, "rounds": 1, "catch": True}]  # fmt: skip
    produced, consumed = _drive(proxy, steps, tmp_path, access_key="orders-app", secret_key="orders-secret-key")
    assert "route" in produced["message"], produced
    assert f"query topic raise exception, {_code('FORBIDDEN')}, " in _client_log(tmp_path)
    assert consumed["error"] == "ForbiddenException", consumed
    assert _stored(master, "Payments") == 0
    assert _refusals(proxy)["not_permitted"] >= before + 2


def test_the_proxy_refuses_a_non_loopback_listener_without_acl(tmp_path):
    done = _run("proxy", "--listen", "0.0.0.0:0", "--brokers", "127.0.0.1:9")
    assert done.returncode == 2  # a configuration the proxy refuses (docs/operations.md, exit codes)
    assert done.stderr.strip().splitlines() == ["Error: refusing to listen on 0.0.0.0:0 without client authentication: give "
                                                "--acl FILE (docs/security.md), or --insecure to let anyone who reaches it "
                                                "send and consume"]  # fmt: skip


def test_the_proxy_refuses_a_bad_acl_file_in_one_line(tmp_path):
    acl_file = tmp_path / "acl.toml"
    acl_file.write_text('[[account]]\naccess_key = "a"\nsecret_key = "b"\nactions = ["publish"]\n')
    done = _run("proxy", "--listen", "127.0.0.1:0", "--brokers", "127.0.0.1:9", "--acl", str(acl_file))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(acl_file) in lines[0] and "actions" in lines[0], lines


def test_a_masters_ha_port_with_a_ca_takes_only_slaves_with_a_certificate_it_signed(tmp_path):
    from tests.cluster import Cluster

    ca, issued = certificate_authority(str(tmp_path), ["m", "s"])
    cluster = Cluster(tmp_path)
    try:
        master = cluster._start("master", "m", ["--role", "sync", "--tls-cert", issued["m"][1], "--tls-key", issued["m"][0],
                                               "--tls-ca", ca], {})  # fmt: skip
        cluster._start("slave", "s", ["--master-ha", master.ha_address, "--tls-cert", issued["s"][1], "--tls-key",
                                       issued["s"][0], "--tls-ca", ca], {})  # fmt: skip
        wait_until(lambda: slave_acking_tls(master, ca), message="the slave with a certificate acking")
        host, port = master.ha_address.rsplit(":", 1)
        assert _tls_handshake_refused(host, int(port), ca)
    finally:
        cluster.close()


def slave_acking_tls(master, ca) -> bool:
    with hc.BlockingClient(master.address, tls_ca=ca) as client:
        slaves = client.status()["slaves"]
    return bool(slaves) and slaves[0]["ack_offset"] >= 0


# --- the official Node.js client (tests/system/node: `npm install` there, as .ci/run does) ---

NODE_DIR = os.path.join(os.path.dirname(__file__), "node")
NODE_CLIENT_INSTALLED = shutil.which("node") is not None and os.path.isdir(
    os.path.join(NODE_DIR, "node_modules", "rocketmq-client-nodejs"))  # fmt: skip


def _drive_node(proxy, steps, *, access_key="", secret_key=""):
    import json

    done = subprocess.run(["node", os.path.join(NODE_DIR, "rmq_node_driver.js"), proxy.address, json.dumps(steps)],
                          capture_output=True, text=True, timeout=120, cwd=NODE_DIR,
                          env={**os.environ, "RMQ_DRIVER_AK": access_key, "RMQ_DRIVER_SK": secret_key})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + "\nproxy log:\n" + proxy.log()[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not NODE_CLIENT_INSTALLED, reason="needs node and `npm install` in tests/system/node")
def test_the_nodejs_client_with_bogus_credentials_stores_nothing_and_with_its_own_sends_and_consumes(acl_proxy):
    proxy, master = acl_proxy
    (refused,) = _drive_node(proxy, [{"op": "produce", "topic": "Orders-node-bogus", "count": 2}],
                             access_key="bogus-ak", secret_key="bogus-sk")  # fmt: skip
    assert refused.get("code") == _code("UNAUTHORIZED") and refused["error"] == "UnauthorizedException", refused
    assert _stored(master, "Orders-node-bogus") == 0
    steps = [{"op": "produce", "topic": "Orders-node", "count": 3},
             {"op": "consume", "group": "orders-node", "topic": "Orders-node", "want": 3},
             {"op": "produce", "topic": "Payments-node", "count": 1}]  # fmt: skip
    sent, consumed, forbidden = _drive_node(proxy, steps, access_key="orders-app", secret_key="orders-secret-key")
    assert [s["i"] for s in sent] == [0, 1, 2], sent
    assert sorted(m["id"] for m in consumed) == sorted(s["id"] for s in sent)
    assert forbidden.get("code") == _code("FORBIDDEN") and forbidden["error"] == "ForbiddenException", forbidden
    assert _stored(master, "Orders-node") == 3 and _stored(master, "Payments-node") == 0


def test_the_dledger_drill_passes_over_mutual_tls(tmp_path):
    from tests.cluster import self_signed_certificate

    key, cert = self_signed_certificate(str(tmp_path))  # its own CA: every member's, verified both ways
    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "drill", "--mode", "dledger", "--rounds", "2", "--producers", "4",
                           "--fault", "mixed", "--seed", "3", "--tls-cert", cert, "--tls-key", key, "--tls-ca", cert],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "TLS (mutual)" in done.stdout and "0 lost, 0 duplicated: OK" in done.stdout


def test_an_old_signature_is_refused_as_expired_on_every_kind_of_call(acl_proxy):
    """Raw gRPC calls signed with the right key two days ago: a replay. Unary, server-streaming
    and the bidirectional Telemetry stream each get UNAUTHORIZED, and nothing is stored."""
    import datetime
    import hashlib
    import hmac

    import grpc

    from hasvc.proxy.pb import definition, service, service_grpc

    proxy, master = acl_proxy
    stamp = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)).strftime("%Y%m%dT%H%M%SZ")
    signature = hmac.new(b"orders-secret-key", stamp.encode(), hashlib.sha1).hexdigest()
    metadata = (("x-mq-date-time", stamp), ("x-mq-client-id", "replay@1"),
                ("authorization", f"MQv2-HMAC-SHA1 Credential=orders-app, SignedHeaders=x-mq-date-time, Signature={signature}"))  # fmt: skip
    before = _refusals(proxy).get("expired", 0)
    unauthorized = _code("UNAUTHORIZED")
    with grpc.insecure_channel(proxy.address) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        message = definition.Message(body=b"replayed")
        message.topic.name = "Orders-replayed"
        message.system_properties.message_id = "01AABBCCDDEEFF001122334400000001"
        message.system_properties.message_type = definition.NORMAL
        sent = stub.SendMessage(service.SendMessageRequest(messages=[message]), metadata=metadata, timeout=10)
        assert sent.status.code == unauthorized and "outside the window" in sent.status.message
        request = service.ReceiveMessageRequest(batch_size=1)
        request.group.name, request.message_queue.topic.name = "orders-x", "Orders-replayed"
        received = list(stub.ReceiveMessage(request, metadata=metadata, timeout=10))
        assert [r.status.code for r in received] == [unauthorized]
        telemetry = list(stub.Telemetry(iter([service.TelemetryCommand()]), metadata=metadata, timeout=10))
        assert [t.status.code for t in telemetry] == [unauthorized]
    assert _stored(master, "Orders-replayed") == 0
    assert _refusals(proxy)["expired"] == before + 3


def test_a_node_refuses_raft_off_loopback_without_a_secret(tmp_path):
    done = _run("node", "--store", str(tmp_path / "s"), "--listen", "127.0.0.1:0", "--group", "g",
                "--peers", "n0-127.0.0.1:7001;n1-192.0.2.1:7001;n2-192.0.2.2:7001", "--self", "n0",
                env={"HASVC_SECRET": ""})  # fmt: skip
    assert done.returncode == 2
    assert "refusing Raft traffic off loopback (192.0.2.1) without a secret" in done.stderr
    assert "could speak as a member" in done.stderr
    assert not os.path.exists(tmp_path / "s")
