"""``hasvc bench proxy`` end to end, as short as it goes: every run produces, and the consumers drain
exactly what the official client produced through the proxy."""

import pytest

pytest.importorskip("hasvc.proxy.pb")

from hasvc.tools.bench.proxy import run_bench  # noqa: E402


def test_bench_proxy_runs_and_consumers_drain_what_was_produced(tmp_path):
    lines = []
    result = run_bench(senders=[2], seconds=0.5, size=1024, json_path=str(tmp_path / "bench.json"), echo=lines.append)
    (row,) = result["runs"]
    for name in ("official_null", "official_proxy", "hasvc"):
        assert row[name]["count"] > 0 and row[name]["errors"] == 0, (name, row[name])
    assert row["official_consume"]["count"] == row["official_proxy"]["count"]
    assert row["hasvc_consume"]["count"] == row["official_proxy"]["count"]
    assert (tmp_path / "bench.json").exists() and "gateway cost" in lines[0]
