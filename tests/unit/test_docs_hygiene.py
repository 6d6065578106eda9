"""The docs and help texts are reference for users, not a lab notebook.

README.md, every docs/**/*.md and every click command's help (walked from ``hasvc.cli.main``)
must not carry the labels of a development history ("run 32", "stop 36", "issue 18": nobody
outside the sessions that wrote them can look them up) nor paths of a temporary directory
(``/tmp/...``: a developer's scratch files, gone on any other machine). The history of runs lives
in git and in the closing notes; docs/performance.md holds the current figures and docs/design/
the reasons with the measurements that decided them.

No placeholder under the temporary directory is allowed either: walkthroughs use a relative
directory (``data/m``) or ``$(mktemp -d)``, which say the same without naming a machine's path.
Upstream trackers are cited as ``apache/rocketmq#3015``, which does not read as a label.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

import click
import pytest

from hasvc.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]

# "run 32", "Runs 30 and 30b", "stop 36", "issue 18", "issue #18"; not "--runs 3" (an option) nor
# "runs 0.76× the pair" (a ratio).
LABEL = re.compile(r"(?<![\w-])(?:[Rr]uns?|[Ss]tops?|[Ii]ssues?) #?\d+(?!\d|[.,]\d|×)")
# /tmp/..., /var/tmp/... (and a bare "/tmp" at the end of a word).
TEMP_PATH = re.compile(r"(?<![\w.])/(?:var/)?tmp\b")

README_LINES_MAX = 250  # the bound: a README for users, the rest in docs/


def problems(text: str) -> list[str]:
    """Each offending line as 'line N: ...', empty when the text is clean."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for pattern, what in ((LABEL, "label"), (TEMP_PATH, "temporary path")):
            match = pattern.search(line)
            if match:
                found.append(f"line {number}: {what} {match.group(0)!r}: {line.strip()[:160]}")
    return found


def doc_files() -> list[pathlib.Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def test_the_patterns_catch_what_they_are_for_and_not_options():
    assert problems("the ratios of run 32 (stop 36)") and problems("issue 18 said") and problems("Runs 30 and 30b")
    assert problems("`--report /tmp/drill.json`") and problems("--dir /var/tmp/x")
    assert problems("see issue #40")
    assert not problems("hasvc bench sync-write --runs 3 --duration 5") and not problems(
        "the group runs 0.76× the pair"
    )
    assert not problems("apache/rocketmq#3015; 3 runs of 3 s; a store in data/m or $(mktemp -d)")


@pytest.mark.parametrize("path", doc_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_docs_carry_no_run_labels_nor_temporary_paths(path):
    found = problems(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)}:\n" + "\n".join(found)


def test_the_readme_carries_no_run_labels_nor_temporary_paths():
    found = problems((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not found, "README.md:\n" + "\n".join(found)


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES_MAX, (
        f"README.md has {lines} lines (at most {README_LINES_MAX}: move the rest to docs/)"
    )


def first_commands(text: str) -> list[str]:
    """The first line of each of the first two ```sh blocks: the README's two commands."""
    return [block.split("\n", 1)[1].split("\n", 1)[0] for block in text.split("```sh")[1:3]]


def test_the_readme_starts_with_the_two_commands_and_ci_runs_the_test_command_verbatim():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = first_commands(readme)
    assert commands[0].startswith("python3 -m venv .venv && ") and "hasvc demo" in commands[0]
    assert "pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert commands[1] in ci


def walk_commands(command: click.Command, parent: click.Context | None = None, name: str = "hasvc"):
    """Every command under ``command`` (itself included) with the context its help renders in."""
    context = click.Context(command, info_name=name, parent=parent)
    yield context
    if isinstance(command, click.Group):
        for child_name in command.list_commands(context):
            child = command.get_command(context, child_name)
            if child is not None:
                yield from walk_commands(child, context, child_name)


def help_texts(context: click.Context) -> str:
    """The rendered --help and the raw help of every parameter, hidden ones included."""
    command = context.command
    parts = [command.get_help(context)]
    parts += [command.help or "", command.short_help or "", command.epilog or ""]
    parts += [getattr(param, "help", None) or "" for param in command.params]
    return "\n".join(parts)


COMMANDS = list(walk_commands(main))


def test_every_command_is_walked():
    paths = {context.command_path for context in COMMANDS}
    assert {"hasvc", "hasvc master", "hasvc node", "hasvc store verify", "hasvc proxy", "hasvc bench proxy"} <= paths


@pytest.mark.parametrize("context", COMMANDS, ids=lambda context: context.command_path)
def test_help_texts_carry_no_run_labels_nor_temporary_paths(context):
    found = problems(help_texts(context))
    assert not found, f"{context.command_path} --help:\n" + "\n".join(found)


@pytest.mark.parametrize("context", COMMANDS, ids=lambda context: context.command_path)
def test_every_tls_certificate_and_key_option_says_what_it_is(context):
    for param in context.command.params:
        if isinstance(param, click.Option) and param.name in ("tls_cert", "tls_key"):
            assert param.help, f"{context.command_path} {param.opts[0]} has no help text"


# -- links ------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Written by the branch that builds the settings table (`hasvc config list`); the README draft links
# to it already. Remove once it is merged.
PENDING_TARGETS: set[str] = set()


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def linked_files() -> list[pathlib.Path]:
    return [ROOT / "README.md", *doc_files()]


@pytest.mark.parametrize("path", linked_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_a_heading(path):
    # The README draft is written for the repository's root, where it will replace README.md.
    base = ROOT if path.name == "README.draft.md" else path.parent
    broken = []
    for target in LINK.findall(re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file_part, _, fragment = target.partition("#")
        resolved = (base / file_part).resolve() if file_part else path
        if str(resolved.relative_to(ROOT)) in PENDING_TARGETS:
            continue
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment}")
    assert not broken, f"{path.relative_to(ROOT)}:\n" + "\n".join(broken)


# -- scripts/bench_peers writes between its markers in docs/performance.md ---------------------


def load_bench_peers():
    spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "scripts" / "bench_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def a_point(rate: float, p50_us: float) -> dict:
    return {
        "acked_per_second": rate,
        "acked_per_second_min": rate,
        "acked_per_second_max": rate,
        "p50_us": p50_us,
        "p99_us": 2 * p50_us,
        "cpu_percent": {"master": 90.0, "load generator": 5.0},
    }


def test_bench_peers_rewrites_only_its_part_of_performance_md(tmp_path):
    bench_peers = load_bench_peers()
    text = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert text.count(bench_peers.BEGIN_MARKER) == 1 and text.count(bench_peers.END_MARKER) == 1
    before, rest = text.split(bench_peers.BEGIN_MARKER)
    after = rest.split(bench_peers.END_MARKER)[1]
    report = tmp_path / "performance.md"
    report.write_text(text, encoding="utf-8")
    results = {
        "redis SET+WAIT @64": a_point(50_000, 900),
        "hasvc SYNC_MASTER, ASYNC_FLUSH, 1 msg/request @64": a_point(75_000, 700),
    }
    settings = {
        "args": "--skip postgres",
        "date": "2030-01-01",
        "runs": 3,
        "duration": 3.0,
        "machine": "2 cores, 24 GiB",
        "load_before": "0.5",
        "redis_threads": 1,
        "pgbench_jobs": 2,
        "pgbench_protocol": "prepared",
    }
    for _ in range(2):  # and again over its own output
        bench_peers.write_report(results, str(report), str(tmp_path / "benchmarks.png"), settings, {"python": "3.11"})
    written = report.read_text(encoding="utf-8")
    assert written.startswith(before + bench_peers.BEGIN_MARKER) and written.endswith(bench_peers.END_MARKER + after)
    generated = written[len(before) : len(written) - len(after)]
    assert "| 64 | 75,000 (75,000–75,000) | 50,000 (50,000–50,000) | 1.50× |" in generated
    assert "Generated by `scripts/bench_peers --skip postgres` on 2030-01-01" in generated
    assert "![throughput and p99 latency by concurrency](benchmarks.png)" in generated
    assert not problems(generated)


def test_bench_peers_starts_a_report_that_has_no_markers_yet(tmp_path):
    bench_peers = load_bench_peers()
    report = tmp_path / "new.md"
    settings = {
        "args": "",
        "date": "2030-01-01",
        "runs": 1,
        "duration": 1.0,
        "machine": "2 cores, 24 GiB",
        "load_before": "0.5",
        "redis_threads": 1,
        "pgbench_jobs": 2,
        "pgbench_protocol": "prepared",
    }
    bench_peers.write_report({}, str(report), None, settings, {})
    written = report.read_text(encoding="utf-8")
    assert written.startswith(bench_peers.NEW_REPORT_TITLE) and written.count(bench_peers.BEGIN_MARKER) == 1
    assert written.rstrip().endswith(bench_peers.END_MARKER)
