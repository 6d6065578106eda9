"""``hasvc bench sync-write``'s set-up of the local brokers, without starting any (the runs are
tests/system/test_bench.py's)."""

import pytest

from hasvc.tools.bench import sync_write


class _FakeBrokers:
    """Stands in for LocalPair / LocalGroup: records the settings the bench gave it."""

    made: list[dict] = []

    def __init__(self, **kwargs):
        _FakeBrokers.made.append(kwargs)
        self.master = {"listen": "127.0.0.1:1"}
        self.pids = {}

    def wait_connected(self):
        pass

    def close(self):
        pass


@pytest.fixture
def fake_brokers(monkeypatch):
    _FakeBrokers.made = []
    monkeypatch.setattr(sync_write, "LocalPair", _FakeBrokers)
    monkeypatch.setattr(sync_write, "LocalGroup", _FakeBrokers)
    monkeypatch.setattr(sync_write, "run_once", lambda *args, **kwargs: sync_write.RunResult(
        10, 1, 1.0, {"p50_us": 1.0, "p99_us": 1.0, "p999_us": 1.0}, {"PUT_OK": 10}, {"load generator": 1.0}))  # fmt: skip
    return _FakeBrokers.made


@pytest.mark.parametrize("role", ["sync", "dledger"])
def test_the_local_brokers_keep_256_mib_of_page_cache_behind_the_flush_as_bench_peers_gives_them(fake_brokers, role):
    """A DLedger group's members, like a classic pair, get ``page_cache_keep_size`` (256 MiB,
    scripts/bench_peers' value): without it a group's CPU a message rose within one bench as its
    page cache grew into memory the host had taken back; 0 gives the store's default."""
    common = dict(producers=1, connections=1, size=16, batch=1, duration=0.1, runs=1, role=role, flush="async",
                  master=None, slave_flush_before_ack=False, load_generator="python", echo=lambda *_: None)  # fmt: skip
    data = sync_write.bench_sync_write(**common)
    assert fake_brokers[-1]["settings"] == {"page_cache_keep_size": str(256 * 1024 * 1024)}
    assert data["settings"]["page_cache_keep_size"] == 256 * 1024 * 1024
    sync_write.bench_sync_write(**common, page_cache_keep_size=0)
    assert fake_brokers[-1]["settings"] is None
