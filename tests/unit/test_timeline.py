"""The drills' timeline recorder (hasvc.tools.timeline): what its summary says for acknowledgements,
faults, failover gaps and pauses recorded at known times; the picture drawn from a summary
(hasvc.tools.timeline_plot, skipped without matplotlib); and ``--plot`` refused in one line, before
anything starts, when matplotlib is not installed."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree

import pytest
from click.testing import CliRunner

from hasvc.tools.timeline import Timeline

T0 = 1000.0  # a time.monotonic() reading


def _recorded() -> Timeline:
    """10 writes/s for 2 s at 5 ms, a kill at 2.0 s, the first PUT_OK of a send started after it at
    3.505 s (one send started before the kill and answered at 3.25 s by a retry: not the gap's end),
    100 writes/s at 2 ms from there to 5 s, the killed member back at 4.0 s, a pause 5.0-6.0 s, a write at 6.05 s."""
    timeline = Timeline()
    for index in range(20):
        started = T0 + index * 0.1
        timeline.ack(started, started + 0.005)
    timeline.ack(T0 + 1.99, T0 + 3.25)  # caught by the failover: its latency is the wait
    fault = timeline.fault("kill master a", T0 + 2.0)
    for index in range(150):
        started = T0 + 3.505 + index * 0.01
        timeline.ack(started - 0.002, started)
    fault.close(T0 + 4.0)
    timeline.pause(T0 + 5.0)
    timeline.resume(T0 + 6.0)
    timeline.ack(T0 + 6.05, T0 + 6.055)
    timeline.pause(T0 + 6.1)  # the checks after the last round: not drawn
    timeline.resume(T0 + 9.0)
    assert timeline.gap_from_acks("failover", T0 + 2.0) == pytest.approx(1.505)
    return timeline


def test_the_summary_counts_each_bucket_and_places_faults_gaps_and_pauses_from_the_first_write():
    summary = _recorded().summary()
    json.dumps(summary)  # plain JSON, for the --report
    assert summary["bucket_seconds"] == 0.1  # a drill of seconds: fine buckets (1 s ones would show 6 points)
    assert summary["seconds"] == pytest.approx(6.055)
    assert sum(summary["acked"]) == 172
    bucket = summary["acked"]
    assert bucket[:20] == [1] * 20 and bucket[20:32] == [0] * 12 and bucket[32] == 1  # the retried send, answered at 3.25 s
    assert bucket[35:50] == [10] * 15 and bucket[50:60] == [0] * 10 and bucket[60:] == [1]
    assert summary["p50_ms"][5] == pytest.approx(5.0) and summary["p50_ms"][40] == pytest.approx(2.0)
    assert summary["max_ms"][32] == pytest.approx(1260.0)  # the failover shows in the latency of the send it caught
    assert summary["p99_ms"][25] is None  # no write acknowledged: no latency (a break, not a zero)
    assert summary["faults"] == [{"label": "kill master a", "from": 2.0, "to": 4.0}]
    assert summary["gaps"] == [{"label": "failover", "at": 2.0, "seconds": 1.505}]
    assert summary["paused"] == [{"from": 5.0, "to": 6.0}]


def test_a_gap_counts_only_sends_started_after_the_fault_and_a_fault_never_closed_runs_to_the_end():
    timeline = Timeline()
    timeline.ack(T0, T0 + 0.01)
    timeline.ack(T0 + 0.5, T0 + 2.0)  # started before the kill, answered after it: a retry, not the new master's first
    timeline.fault("partition-leader n0", T0 + 1.0)
    assert timeline.gap_from_acks("failover", T0 + 1.0, sent_after=T0 + 1.1) is None  # nothing started after it yet
    timeline.ack(T0 + 1.2, T0 + 2.5)
    assert timeline.gap_from_acks("failover", T0 + 1.0, sent_after=T0 + 1.1) == pytest.approx(1.5)
    timeline.pause(T0 + 3.0)  # never resumed: the drill ended paused (not drawn)
    summary = timeline.summary()
    assert summary["faults"][0]["to"] == summary["seconds"] == pytest.approx(2.5)  # the last thing recorded
    assert summary["paused"] == [] and summary["gaps"][0]["seconds"] == pytest.approx(1.5)


def test_a_long_drill_gets_wider_buckets_and_an_empty_one_an_empty_summary():
    timeline = Timeline()
    for second in range(0, 600, 3):
        timeline.ack(T0 + second, T0 + second + 0.001)
    summary = timeline.summary()
    assert summary["bucket_seconds"] == 2.0 and len(summary["acked"]) <= 400 and sum(summary["acked"]) == 200
    empty = Timeline().summary()
    assert empty["acked"] == [] and empty["faults"] == [] and empty["seconds"] == 0.0


def _svg_ids(path) -> dict[str, ElementTree.Element]:
    tree = ElementTree.parse(path)
    return {element.get("id"): element for element in tree.iter() if element.get("id")}


def test_the_picture_has_the_rate_the_latencies_the_shaded_fault_the_gap_and_the_pause(tmp_path):
    pytest.importorskip("matplotlib")
    from hasvc.tools.timeline_plot import draw

    path = tmp_path / "drill.svg"
    draw(_recorded().summary(), str(path), "a drill")
    ids = _svg_ids(path)
    for expected in ("acked-rate", "latency-p50", "latency-p99", "latency-max", "fault-window-0", "failover-gap-0", "paused-0"):
        assert expected in ids, expected
    assert "fault-window-1" not in ids
    shading = ids["fault-window-0"].find(".//{http://www.w3.org/2000/svg}path")
    assert shading is not None and "fill: #d62728" in shading.get("style", "")  # red, the fault's colour
    rate = ids["acked-rate"].find(".//{http://www.w3.org/2000/svg}path")
    assert rate.get("d").count("L") > 60  # a step per bucket, not an empty line


def test_plot_is_refused_in_one_line_before_the_drill_starts_when_matplotlib_is_missing(monkeypatch, tmp_path):
    from hasvc.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    result = CliRunner().invoke(main, ["drill", "--rounds", "1", "--plot", str(tmp_path / "drill.svg")])
    assert result.exit_code == 3, result.output
    assert result.output.strip().splitlines() == [
        "Error: --plot needs matplotlib, which is not installed: pip install -e '.[bench]'"
    ]  # nothing started: no "drill: ..." line, no stores
    result = CliRunner().invoke(main, ["drill-plot", str(tmp_path / "missing.json"), str(tmp_path / "x.svg")])
    assert result.exit_code == 2 and "missing.json" in result.output


def test_a_picture_format_matplotlib_does_not_write_or_a_missing_directory_is_refused_in_one_line(tmp_path):
    pytest.importorskip("matplotlib")
    from hasvc.cli import main

    result = CliRunner().invoke(main, ["drill", "--plot", str(tmp_path / "drill.gif")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1 and ".svg, .png, .pdf" in result.output
    result = CliRunner().invoke(main, ["drill", "--plot", str(tmp_path / "no" / "drill.svg")])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        f"Error: --plot {tmp_path / 'no' / 'drill.svg'}: no directory {tmp_path / 'no'} to write it in"
    ]


def test_drill_plot_redraws_a_report_and_refuses_one_without_a_timeline(tmp_path):
    pytest.importorskip("matplotlib")
    from hasvc.cli import main

    report = tmp_path / "report.json"
    report.write_text(json.dumps({"mode": "sync", "rounds": [], "producers": 4, "seed": 1, "acknowledged": 172, "ok": True,
                                  "timeline": _recorded().summary()}))  # fmt: skip
    result = CliRunner().invoke(main, ["drill-plot", str(report), str(tmp_path / "again.svg")])
    assert result.exit_code == 0, result.output
    assert "fault-window-0" in _svg_ids(tmp_path / "again.svg")
    report.write_text(json.dumps({"mode": "sync", "ok": True}))
    result = CliRunner().invoke(main, ["drill-plot", str(report), str(tmp_path / "none.svg")])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        f"Error: {report}: no timeline in this report (hasvc drill --report writes one)"
    ]


def test_the_demo_says_where_its_picture_is_or_how_to_get_one(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    from hasvc.tools.demo import _picture

    drill = SimpleNamespace(root=str(tmp_path), timeline=_recorded())
    lines: list[str] = []
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "matplotlib", None)
        _picture(drill, "demo", lines.append)
    assert lines == ["no picture of the failover: matplotlib is not installed (pip install -e '.[bench]')"]
    assert not (tmp_path / "failover.svg").exists()
    pytest.importorskip("matplotlib")
    lines.clear()
    _picture(drill, "demo", lines.append)
    assert lines == [f"picture of the failover (writes/s and latency over time, the fault shaded): {tmp_path / 'failover.svg'}"]
    assert "fault-window-0" in _svg_ids(tmp_path / "failover.svg")
