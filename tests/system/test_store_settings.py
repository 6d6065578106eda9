"""The store's own settings (StoreConfig's, which a broker has no field for) given with --set reach
the store of every process that opens one: a classic master and its slave, and a DLedger member.
``crc`` shows it on disk: records written with crc32 pass ``store verify --crc crc32`` and fail
the default crc32c check."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.cluster import SEGMENT, Cluster, caught_up, slave_acking, start_dledger_group, status, wait_until


def _hasvc(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hasvc.cli", *arguments], capture_output=True, text=True, timeout=60)


def _verify(store: str, *extra: str) -> int:
    return _hasvc("store", "verify", store, *extra).returncode


STORE_SETTINGS = {"crc": "crc32", "flush_interval_commitlog_ms": 100, "group_commit_waiters_max": 500,
                  "warm_ahead_size": 65536, "delete_segments_per_pass_max": 2}  # fmt: skip


def test_a_classic_pair_takes_the_stores_settings_from_set(tmp_path):
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    try:
        master = cluster.start_master(**STORE_SETTINGS)
        slave = cluster.start_slave(master.ha_address, **STORE_SETTINGS)
        wait_until(lambda: slave_acking(master), message="the slave's first report")
        for number in range(3):
            sent = _hasvc("send", master.address, "--topic", "T", f"message {number}")
            assert sent.returncode == 0, sent.stderr
        wait_until(lambda: caught_up(master, slave), message="the slave caught up")
        assert status(master)["max_offset"] > 0
        logs = master.log() + slave.log()
    finally:
        cluster.close()
    assert logs.count('"flush_interval_commitlog_ms": 100') == 2 and logs.count('"crc": "crc32"') == 2
    for name in ("master", "slave"):
        assert _verify(cluster.store(name), "--crc", "crc32") == 0, name
        assert _verify(cluster.store(name)) == 1, f"{name}: written with crc32c, not the crc32 given"


def test_a_dledger_member_takes_the_stores_settings_from_set(tmp_path):
    extra = [argument for name, value in STORE_SETTINGS.items() if name not in ("flush_interval_commitlog_ms",
                                                                               "group_commit_waiters_max")
             for argument in ("--set", f"{name}={value}")]  # fmt: skip
    nodes = start_dledger_group(tmp_path, 1, group="g", extra_args=extra)
    node = nodes["n0"]
    try:
        wait_until(lambda: _hasvc("send", node.client_address, "--topic", "T", "one").returncode == 0,
                   message="a put to the member once it leads")  # fmt: skip
        log = node.log()
    finally:
        node.stop()
    assert '"crc": "crc32"' in log and '"delete_segments_per_pass_max": 2' in log
    store = os.path.join(tmp_path, "n0")
    assert _verify(store, "--member", "n0", "--crc", "crc32") == 0
    assert _verify(store, "--member", "n0") == 1
