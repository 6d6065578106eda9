"""``hasvc proxy`` refusing to start, as the command line's exit codes say (hasvc/cli/common.py,
docs/commands.md): a configuration it cannot use -- an address, a certificate, an ACL file, a
setting -- exits 2, a listen address in use exits 3; each in one line of stderr, without a
traceback, before it looks for a broker (none runs here: a proxy that got that far would wait for
a master and fail otherwise)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("grpc")

NOWHERE = "127.0.0.1:1"  # no broker: a proxy that passed its checks would wait for one


def _proxy(*arguments: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("HASVC_DEBUG", "HASVC_SECRET")}
    return subprocess.run([sys.executable, "-m", "hasvc.cli", "proxy", "--brokers", NOWHERE, *arguments],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip


def _check(done: subprocess.CompletedProcess, code: int, text: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert len(lines) == 1 and text in lines[0], done.stderr


def test_a_listen_address_in_use_exits_3_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        _check(_proxy("--listen", address), 3, f"cannot listen on {address}")
        _check(_proxy("--listen", "127.0.0.1:0", "--metrics-listen", address), 3, f"cannot listen on {address}")


def test_a_certificate_that_is_not_one_exits_2_naming_the_file(tmp_path):
    junk = tmp_path / "cert.pem"
    junk.write_text("not a certificate\n")
    _check(_proxy("--listen", "127.0.0.1:0", "--tls-listen", "127.0.0.1:0", "--tls-cert", str(junk), "--tls-key", str(junk)),
           2, str(junk))  # fmt: skip


def test_an_acl_file_that_is_missing_or_not_toml_exits_2_naming_it(tmp_path):
    bad = tmp_path / "acl.toml"
    bad.write_text("[[account]\n")
    _check(_proxy("--listen", "127.0.0.1:0", "--acl", str(bad)), 2, f"the ACL file {bad} is not TOML")
    missing = tmp_path / "missing.toml"
    _check(_proxy("--listen", "127.0.0.1:0", "--acl", str(missing)), 2, str(missing))


def test_an_address_or_a_setting_it_cannot_use_exits_2():
    _check(_proxy("--listen", "8081"), 2, "HOST:PORT")
    _check(_proxy("--listen", "127.0.0.1:0", "--set", "calls_max=many"), 2, "expected an integer")
    _check(_proxy("--listen", "127.0.0.1:0", "--set", "call_max=5"), 2, "did you mean calls_max")
    _check(_proxy("--listen", "127.0.0.1:0", "--set", "slave_timeout_ms=5"), 2, "not a proxy setting")
    _check(_proxy("--listen", "127.0.0.1:0", "--set", "calls_max=0"), 2, "calls_max=0 (from --set): must be >0 (default")
