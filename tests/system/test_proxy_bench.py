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


def test_bench_proxy_acl_pairs_sends_signed_calls_through_the_acl_proxy(tmp_path):
    """``--acl-pairs``: the official client's signed sends are stored through the proxy with
    --acl (a refusal would count no message), beside the proxy without it."""
    from hasvc.tools.bench.proxy import run_acl_bench

    lines = []
    result = run_acl_bench(senders=[2], seconds=0.5, size=1024, pairs=1, json_path=str(tmp_path / "acl.json"), echo=lines.append)
    (row,) = result["runs"]
    assert row["acl_off"][0] > 0 and row["acl_on"][0] > 0, row
    assert row["ratio_median"] > 0 and "on/off per pair" in lines[-1]


def test_proxy_cpu_consumer_mode_drains_its_backlog_with_each_official_consumer(tmp_path):
    """``scripts/dev/proxy_cpu.py consumer``: each official consumer (SimpleConsumer, PushConsumer, and
    the SimpleConsumer acking one message at a time) acknowledges the whole backlog once, with the
    CPU a message, the progress records a message and the proxy's counters at its stop."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, os.path.join(root, "scripts", "dev", "proxy_cpu.py"), "consumer", "96", "60"],
                          env={**os.environ, "HOME": str(tmp_path)}, cwd=root, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    row, stopping = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    for name in ("simple", "push", "one_at_a_time"):
        run = row[name]
        assert run["count"] == 96 and run["errors"] == 0 and run["duplicates"] == 0, (name, run)
        assert 0 < run["records_per_message"] <= 2, (name, run)  # a delivery and an ack event a message at most
        assert set(run["cpu_us"]) == {"proxy", "master", "slave", "client", "proxy_main", "proxy_trio", "proxy_grpc"}
        assert run["cpu_us"]["proxy"] > 0 and run["cpu_us"]["proxy_main"] > 0, (name, run)
    assert row["one_at_a_time"]["ack_ms"] > 0
    assert "'acked': 288" in stopping["proxy_stopping"] and "bridge {'trio_hops'" in stopping["proxy_stopping"]
