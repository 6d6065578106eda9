"""``hasvc bench proxy`` end to end, as short as it goes: every run produces, and the consumers (the
official SimpleConsumer and PushConsumer, hasvc's client) drain exactly what the official client
produced through the proxy, each message once."""

import pytest

pytest.importorskip("hasvc.proxy.pb")

from hasvc.tools.bench.proxy import run_bench  # noqa: E402


def test_bench_proxy_runs_and_consumers_drain_what_was_produced(tmp_path):
    lines = []
    result = run_bench(senders=[2], seconds=0.5, size=1024, json_path=str(tmp_path / "bench.json"), echo=lines.append)
    (row,) = result["runs"]
    for name in ("official_null", "official_proxy", "hasvc"):
        assert row[name]["count"] > 0 and row[name]["errors"] == 0, (name, row[name])
    for name in ("official_consume", "official_push"):  # each group gets every message once
        assert row[name]["count"] == row["official_proxy"]["count"], (name, row[name])
        assert row[name]["errors"] == 0 and row[name]["duplicates"] == 0, (name, row[name])
    assert row["hasvc_consume"]["count"] == row["official_proxy"]["count"]
    assert (tmp_path / "bench.json").exists() and "gateway cost" in lines[1]
    for name in ("official_null", "official_proxy", "official_consume", "official_push"):  # each load generator's CPU shown
        assert row[name]["client_cpu_percent"] > 0, (name, row[name])
    assert set(row["official_null"]["cpu_us_per_message"]) == {"proxy"}
    assert set(row["official_push"]["cpu_us_per_message"]) == {"proxy", "master", "slave"}
    assert row["official_proxy"]["cpu_us_per_message"]["proxy"] > 0 and lines[2].strip().startswith("CPU  null send: client")
    assert lines[0] == f"proxy on {result['gateway']['loop']}, send lane on" and result["gateway"]["send_lane"] is True
