"""``hasvc drill --plot``: the picture of a real drill (one round on loopback), read back from the SVG."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

SVG = "{http://www.w3.org/2000/svg}"


def test_a_one_round_drill_draws_its_failover_shaded_with_the_writes_around_it(tmp_path):
    """The report's timeline always; the picture where matplotlib is installed (the bench extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        matplotlib = None
    picture, report = tmp_path / "drill.svg", tmp_path / "drill.json"
    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "drill", "--rounds", "1", "--producers", "4", "--seed", "5",
                           "--report", str(report), *(["--plot", str(picture)] if matplotlib else [])],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    timeline = data["timeline"]
    assert sum(timeline["acked"]) == data["acknowledged"] > 0  # every PUT_OK is in the timeline, once
    (fault,) = timeline["faults"]
    (gap,) = timeline["gaps"]
    assert fault["label"] == "kill master a" and 0 < fault["from"] < fault["to"] <= timeline["seconds"]
    assert gap["at"] == fault["from"] and gap["seconds"] > 0
    bucket = timeline["bucket_seconds"]
    before = timeline["acked"][: int(fault["from"] / bucket)]
    after = timeline["acked"][int((gap["at"] + gap["seconds"]) / bucket) + 1 :]
    assert sum(before) > 0 and sum(after) > 0  # writes on both sides of the failover
    if matplotlib is None:
        pytest.skip("the picture needs matplotlib (pip install -e '.[bench]'); the report's timeline was checked")
    assert f"picture: {picture}" in done.stdout

    ids = {element.get("id"): element for element in ElementTree.parse(picture).iter() if element.get("id")}
    assert {"fault-window-0", "fault-window-0-latency", "failover-gap-0", "acked-rate", "latency-p50", "latency-p99"} <= ids.keys()
    assert "fault-window-1" not in ids
    shading = ids["fault-window-0"].find(f".//{SVG}path")
    assert "fill: #d62728" in shading.get("style", "") and "opacity: 0.15" in shading.get("style", "")
    rate = ids["acked-rate"].find(f".//{SVG}path").get("d")
    assert rate.count("L") >= len(timeline["acked"])  # a step for every bucket of the report
