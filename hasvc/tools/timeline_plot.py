"""The picture of a drill: acknowledged writes per second and latency over time, faults shaded.

Draws a ``Timeline.summary()`` (``hasvc.tools.timeline``) with matplotlib, which is imported only
here and only when a picture is asked for (the ``bench`` extra). Two panels sharing the time axis:
acknowledged writes per second (each bucket's count divided by its width), and the latency of the
writes acknowledged in each bucket (p50, p99 and max, log scale). Fault windows are shaded red on
both, the stretches when the producers stood still for the drill's checks grey, and each
failover's gap (the fault to the first PUT_OK of a send started after it) is a bar with its length
written on it. The SVG's elements carry ids (``fault-window-N``, ``failover-gap-N``, ``paused-N``,
``acked-rate``, ``latency-p50`` ...) so that a test or a script can find them.
"""

from __future__ import annotations

import json
import math
import os

EXTRA_HINT = "pip install -e '.[bench]'"
FORMATS = (".svg", ".png", ".pdf")  # what matplotlib writes without a backend of the desktop's


class PlotError(Exception):
    """The picture cannot be drawn (matplotlib missing, a file name matplotlib cannot write)."""


def check_can_plot(path: str) -> None:
    """PlotError (one line; naming the extra if matplotlib is missing) unless matplotlib imports and
    ``path`` can be written: a format it writes, in a directory that exists. Called before a drill
    starts anything, so that a long drill does not end unable to draw."""
    if os.path.splitext(path)[1].lower() not in FORMATS:
        raise PlotError(f"--plot {path}: the picture is written as {', '.join(FORMATS)} (by the file name's suffix)")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise PlotError(f"--plot {path}: no directory {directory} to write it in")
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        raise PlotError(f"--plot needs matplotlib, which is not installed: {EXTRA_HINT}") from None


def draw(summary: dict, path: str, title: str = "") -> None:
    """Writes the picture of ``summary`` to ``path`` (its format from the suffix)."""
    check_can_plot(path)
    from matplotlib.figure import Figure  # noqa: PLC0415 (the bench extra, only when drawing)
    from matplotlib.lines import Line2D  # noqa: PLC0415

    bucket = summary["bucket_seconds"]
    times = [bucket * (index + 0.5) for index in range(len(summary["acked"]))]
    figure = Figure(figsize=(11, 6.5), layout="constrained")
    rate_axes, latency_axes = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    rates = [count / bucket for count in summary["acked"]]
    (line,) = rate_axes.step(times, rates, where="mid", color="tab:blue", linewidth=1.2, label="acknowledged writes/s")
    line.set_gid("acked-rate")
    rate_axes.set_ylabel("acknowledged writes / s")
    rate_axes.set_ylim(bottom=0, top=max(rates, default=1) * 1.18 or 1)
    for name, color in (("max", "tab:gray"), ("p99", "tab:red"), ("p50", "tab:green")):
        values = [math.nan if value is None else value for value in summary[f"{name}_ms"]]  # no writes: a break in the line
        if any(value == value for value in values):
            (line,) = latency_axes.plot(times, values, ".-" if name != "max" else ".", color=color, markersize=3,
                                        linewidth=1, label=f"latency {name}")  # fmt: skip
            line.set_gid(f"latency-{name}")
    latency_axes.set_yscale("log")
    latency_axes.set_ylabel("latency (ms), per bucket")
    latency_axes.set_xlabel(f"seconds since the drill's first write ({bucket:g} s buckets)")
    for number, pause in enumerate(summary["paused"]):
        for axes in (rate_axes, latency_axes):
            span = axes.axvspan(pause["from"], pause["to"], color="0.85", alpha=0.6, linewidth=0,
                                label="producers paused (the drill's checks)" if number == 0 and axes is rate_axes else None)  # fmt: skip
            span.set_gid(f"paused-{number}" if axes is rate_axes else f"paused-{number}-latency")
    for number, fault in enumerate(summary["faults"]):
        for axes in (rate_axes, latency_axes):
            span = axes.axvspan(fault["from"], fault["to"], color="tab:red", alpha=0.15, linewidth=0,
                                label="fault window (to the member's return)" if number == 0 and axes is rate_axes else None)  # fmt: skip
            span.set_gid(f"fault-window-{number}" if axes is rate_axes else f"fault-window-{number}-latency")
        rate_axes.annotate(fault["label"], (fault["from"], 0.0), xycoords=("data", "axes fraction"), xytext=(2, 3),
                           textcoords="offset points", va="bottom", fontsize=7, color="tab:red", rotation=90)  # fmt: skip
    top = max(rates, default=1) * 1.08 or 1
    for number, gap in enumerate(summary["gaps"]):
        (bar,) = rate_axes.plot([gap["at"], gap["at"] + gap["seconds"]], [top, top], color="black", marker="|", markersize=8,
                                linewidth=1)  # fmt: skip
        bar.set_gid(f"failover-gap-{number}")
        near_the_end = gap["at"] + gap["seconds"] > 0.8 * summary["seconds"]  # the label left of the bar, inside the axes
        rate_axes.annotate(f"{gap['label']} {gap['seconds']:.2f} s", (gap["at"] if near_the_end else gap["at"] + gap["seconds"], top),
                           xytext=(-3 if near_the_end else 3, 2), textcoords="offset points", fontsize=7,
                           ha="right" if near_the_end else "left")  # fmt: skip
    handles, labels = [], []
    for axes in (rate_axes, latency_axes):
        more = axes.get_legend_handles_labels()
        handles += more[0]
        labels += more[1]
    if summary["gaps"]:
        handles.append(Line2D([], [], color="black", marker="|", markersize=8, linewidth=1))
        labels.append("gap: fault -> first PUT_OK of a send started after it")
    figure.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.savefig(path)


def draw_report(report_path: str, path: str) -> None:
    """Redraws the picture from a drill's JSON ``--report`` (its ``timeline``)."""
    try:
        with open(report_path) as file:
            report = json.load(file)
    except ValueError as error:
        raise PlotError(f"{report_path}: not a drill's JSON report ({error})") from None
    if not isinstance(report, dict) or not isinstance(report.get("timeline"), dict):
        raise PlotError(f"{report_path}: no timeline in this report (hasvc drill --report writes one)")
    try:
        draw(report["timeline"], path, report_title(report))
    except (KeyError, TypeError, ValueError) as error:
        raise PlotError(f"{report_path}: its timeline cannot be drawn ({type(error).__name__}: {error})") from None


def report_title(report: dict) -> str:
    """The picture's title from a drill report's fields."""
    parts = [f"hasvc drill --mode {report['mode']}" if report.get("mode") else "hasvc drill"]
    if report.get("fault"):
        parts.append(f"--fault {report['fault']}")
    if report.get("nodes"):
        parts.append(f"--nodes {report['nodes']}")
    rounds = report.get("rounds")
    parts.append(f"({len(rounds) if isinstance(rounds, list) else rounds} round(s), {report.get('producers')} producers, "
                 f"seed {report.get('seed')}): {report.get('acknowledged')} acknowledged, "
                 f"{'OK' if report.get('ok') else 'FAILED'}")  # fmt: skip
    return " ".join(parts)


def finish(report: dict, plot: str | None, echo) -> None:
    """What every drill does at its end with ``--plot``: draw its report's timeline and say where."""
    if plot:
        draw(report["timeline"], plot, report_title(report))
        echo(f"picture: {plot}")
