"""The layer rule of ``hasvc/__init__.py``, enforced: every import of every module under
``commitlog/`` and ``hasvc/`` is read with ``ast`` (module level and inside functions), and the
clock and entropy reads are found by their call sites.

The rule, precisely:
1. ``commitlog`` imports no ``hasvc`` and none of ``NO_IO_MODULES`` (trio, sockets, event loops).
2. The pure packages (``hasvc.state``, ``hasvc.protocol``) import, besides the standard library,
   only ``commitlog``, ``hasvc.config`` and each other; and none of ``NOT_PURE_MODULES`` (the
   above plus threads, processes, signals, the clock and entropy: ``time``, ``datetime``,
   ``secrets``). ``random`` is imported only for the type of an rng passed in: no use of its
   module-level (unseeded, shared) generator, no ``random.Random()`` without a seed. Entropy from
   ``os`` (``os.urandom``, ``os.getrandom``) is read only at the sites in ``ALLOWED_ENTROPY``.
3. ``commitlog`` reads the clock (``time.time``, ``time.monotonic``, ... ``datetime.now``) only in
   the functions of ``ALLOWED_CLOCK_READS``, each with its reason; new ones take the clock as an
   argument instead.
4. No product module (``commitlog``, ``hasvc`` outside tools/testing/cli) imports ``hasvc.tools``,
   ``hasvc.testing`` or ``hasvc.cli``; ``hasvc.tools`` and ``hasvc.testing`` import no ``hasvc.cli``.
   ``hasvc.__main__`` (``python -m hasvc``) is the CLI's entry and counts as the CLI.
5. ``hasvc.spark`` (what Spark executors import) imports no trio and no hasvc outside itself.
6. The mode is an axis: the classic drivers (``CLASSIC_DRIVERS``) and the Raft member's
   (``hasvc.broker.raft``) import nothing of each other; both build on the shared put path, client
   port and store tasks.
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NO_IO_MODULES = frozenset({"trio", "socket", "ssl", "select", "selectors", "asyncio"})
NOT_PURE_MODULES = NO_IO_MODULES | frozenset(
    {"threading", "_thread", "subprocess", "multiprocessing", "concurrent", "signal",
     "time", "datetime", "secrets"}
)  # fmt: skip
PURE_PACKAGES = ("hasvc.state", "hasvc.protocol")
PURE_MAY_IMPORT = ("commitlog", "hasvc.config", *PURE_PACKAGES)
CLI_LAYER = ("hasvc.cli", "hasvc.__main__")  # hasvc.__main__: ``python -m hasvc``, the CLI's entry
UPPER_LAYERS = ("hasvc.tools", "hasvc.testing", *CLI_LAYER)
CLASSIC_DRIVERS = ("hasvc.broker.broker", "hasvc.broker.ha_master", "hasvc.broker.ha_slave", "hasvc.replicator")
RAFT_DRIVERS = ("hasvc.broker.raft",)
CLOCK_CALLS = frozenset(
    {"time.time", "time.time_ns", "time.monotonic", "time.monotonic_ns", "time.perf_counter",
     "time.perf_counter_ns", "datetime.now", "datetime.utcnow", "datetime.datetime.now", "date.today"}
)  # fmt: skip
ENTROPY_CALLS = frozenset({"os.urandom", "os.getrandom"})

# (module, function) -> why it may read the clock. "*" allows the whole module.
ALLOWED_CLOCK_READS = {
    ("commitlog.commit_log", "now_ms"): "the store timestamp of a record (RocketMQ's storeTimestamp)",
    ("commitlog.log_recovery", "LogRecovery.recover"): "the recovery report's duration",
    ("commitlog.store", "MessageStore.disk_full"): "the append path's clock for disk_full_at(now), the decision",
    ("commitlog.services", "*"): "the threaded driver of the store's background loops",
}
# (module, function) -> why it may draw entropy.
ALLOWED_ENTROPY = {
    ("hasvc.protocol.wire", "new_nonce"): "the handshake nonce (the codec still draws it itself)",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    """Every module of the product, tools and CLI: what the rule covers."""
    paths = [*(ROOT / "commitlog").rglob("*.py"), *(ROOT / "hasvc").rglob("*.py")]
    return {module_name(path): path for path in paths}


class _Reader(ast.NodeVisitor):
    """Collects (imported module, line) and (dotted call, enclosing function, line) of one module."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.imports: list[tuple[str, int]] = []
        self.calls: list[tuple[str, str, int]] = []
        self.random_uses: list[tuple[str, int]] = []  # random.X read, or random.Random() without a seed
        self.scope: list[str] = []

    def visit_Import(self, node: ast.Import) -> None:
        self.imports += [(alias.name, node.lineno) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            base = ".".join([*anchor, *([base] if base else [])])
        self.imports.append((base, node.lineno))
        # ``from hasvc import tools`` imports the module hasvc.tools; ``from os import urandom`` is a read.
        self.imports += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]

    def _scoped(self, node) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        dotted = _dotted(node.func)
        if dotted:
            self.calls.append((dotted, ".".join(self.scope) or "<module>", node.lineno))
        if dotted in ("random.Random", "Random") and not node.args and not node.keywords:
            self.random_uses.append(("random.Random()", node.lineno))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id == "random" and node.attr != "Random":
            self.random_uses.append((f"random.{node.attr}", node.lineno))
        self.generic_visit(node)


def _dotted(node) -> str | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(names)])


def read(module: str, source: str, is_package: bool = False) -> _Reader:
    reader = _Reader(module, is_package)
    reader.visit(ast.parse(source))
    return reader


def _within(name: str, packages) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def _top(name: str) -> str:
    return name.partition(".")[0]


def violations(module: str, reader: _Reader) -> list[str]:
    """What ``module`` does against the rule, one line each (empty when it keeps it)."""
    found = []
    product = not _within(module, UPPER_LAYERS)
    pure = _within(module, PURE_PACKAGES)
    for name, line in reader.imports:
        where = f"{module}:{line} imports {name}"
        if _within(module, ("commitlog",)) and (_top(name) == "hasvc" or _top(name) in NO_IO_MODULES):
            found.append(f"{where}: commitlog is storage, below hasvc and trio")
        if pure and _top(name) in NOT_PURE_MODULES:
            found.append(f"{where}: a pure package takes time and randomness as arguments")
        if pure and _top(name) not in sys.stdlib_module_names and not _within(name, PURE_MAY_IMPORT):
            found.append(f"{where}: a pure package imports only the standard library and {PURE_MAY_IMPORT}")
        if product and _within(name, UPPER_LAYERS):
            found.append(f"{where}: product code never imports tools, testing or the CLI")
        if _within(module, ("hasvc.tools", "hasvc.testing")) and _within(name, CLI_LAYER):
            found.append(f"{where}: nothing imports the CLI")
        if _within(module, ("hasvc.spark",)) and (_top(name) == "trio" or (
                _top(name) == "hasvc" and not _within(name, ("hasvc.spark",)))):  # fmt: skip
            found.append(f"{where}: Spark's executors import no trio and no hasvc beyond hasvc.spark")
        if (_within(module, CLASSIC_DRIVERS) and _within(name, RAFT_DRIVERS)) or (
                _within(module, RAFT_DRIVERS) and _within(name, CLASSIC_DRIVERS)):  # fmt: skip
            found.append(f"{where}: the classic and Raft drivers share the put path, never each other")
        if pure and name.startswith("random.") and name != "random.Random":
            found.append(f"{where}: a pure package takes its rng as an argument (random.Random for its type only)")
        if name in ENTROPY_CALLS and (pure or _within(module, ("commitlog",))):
            found.append(f"{where}: a pure package takes randomness as an argument")
    for use, line in reader.random_uses if pure else ():
        found.append(f"{module}:{line} uses {use}: a pure package takes its rng as an argument")
    for call, function, line in reader.calls:
        where = f"{module}:{line} {function} calls {call}"
        clock_allowed = (module, function) in ALLOWED_CLOCK_READS or (module, "*") in ALLOWED_CLOCK_READS
        if call in CLOCK_CALLS and _within(module, ("commitlog",)) and not clock_allowed:
            found.append(f"{where}: commitlog takes the time as an argument (or list the site in ALLOWED_CLOCK_READS)")
        if call in ENTROPY_CALLS and (pure or _within(module, ("commitlog",))) and (module, function) not in ALLOWED_ENTROPY:
            found.append(f"{where}: a pure package takes randomness as an argument")
    return found


def test_every_module_keeps_the_layer_rule():
    modules = source_modules()
    assert "hasvc.cli" in modules and "commitlog.store" in modules and "hasvc.protocol.wire" in modules
    assert {"hasvc.broker.raft", "hasvc.broker.raft.driver", "hasvc.broker.raft.broker", "hasvc.proxy"} <= set(modules)
    found = [
        problem
        for module, path in sorted(modules.items())
        for problem in violations(module, read(module, path.read_text(), path.name == "__init__.py"))
    ]
    assert not found, "\n".join(found)


def test_the_allowed_sites_still_exist():
    """An allow-list entry whose site is gone is removed, so the list only shrinks."""
    modules = source_modules()
    sites = set()
    for module in {module for module, _ in [*ALLOWED_CLOCK_READS, *ALLOWED_ENTROPY]}:
        reader = read(module, modules[module].read_text())
        sites |= {(module, function) for call, function, _ in reader.calls if call in CLOCK_CALLS | ENTROPY_CALLS}
        sites.add((module, "*"))
    assert set(ALLOWED_CLOCK_READS) | set(ALLOWED_ENTROPY) <= sites


def test_the_rule_catches_each_kind_of_violation():
    """The checker is not vacuous: one sample of each forbidden edge is reported."""
    samples = {
        ("commitlog.x", "import trio\n"): "commitlog is storage",
        ("commitlog.x", "from hasvc import config\n"): "commitlog is storage",
        ("commitlog.x", "import time\ndef f():\n    return time.monotonic()\n"): "takes the time as an argument",
        ("hasvc.state.x", "import time\n"): "takes time and randomness",
        ("hasvc.state.x", "from secrets import randbelow\n"): "takes time and randomness",
        ("hasvc.state.x", "import random\nrandom.shuffle([])\n"): "takes its rng as an argument",
        ("hasvc.state.x", "from random import choice\n"): "takes its rng as an argument",
        ("hasvc.state.x", "import random\nrng = random.Random()\n"): "takes its rng as an argument",
        ("hasvc.state.x", "import os\nos.urandom(4)\n"): "randomness as an argument",
        ("hasvc.protocol.x", "from os import getrandom\n"): "randomness as an argument",
        ("hasvc.protocol.x", "from hasvc import transport\n"): "only the standard library",
        ("hasvc.protocol.x", "from ..broker import Broker\n"): "only the standard library",
        ("hasvc.broker", "from hasvc.tools import drill\n"): "never imports tools",
        ("hasvc.ha_master", "from hasvc import cli\n"): "never imports tools",
        ("hasvc.tools.drill", "import hasvc.cli.store\n"): "nothing imports the CLI",
        ("hasvc.spark.jobs", "import trio\n"): "Spark's executors",
        ("hasvc.broker.raft.driver", "from hasvc.tools import drill\n"): "never imports tools",
        ("hasvc.broker.raft.peers", "from hasvc.cli import node\n"): "never imports tools",
        ("hasvc.state.raft.role", "from hasvc.broker.raft.driver import RaftDriver\n"): "only the standard library",
        ("hasvc.protocol.raft", "from ..broker.raft import broker\n"): "only the standard library",
        ("hasvc.broker.raft.broker", "from hasvc.broker.ha_master import HAService\n"): "never each other",
        ("hasvc.broker.ha_master", "from hasvc.broker.raft import driver\n"): "never each other",
        ("hasvc.broker.broker", "from .raft.broker import RaftBroker\n"): "never each other",
    }
    for (module, source), reason in samples.items():
        problems = violations(module, read(module, source))
        assert any(reason in problem for problem in problems), (module, source, problems)
    assert not violations("hasvc.state.x", read("hasvc.state.x", "import dataclasses\nfrom commitlog import epoch\n"))
    rng_argument = "import random\ndef step(rng: random.Random, seed: int):\n    return rng.random(), random.Random(seed)\n"
    assert not violations("hasvc.state.x", read("hasvc.state.x", rng_argument))
    assert not violations("hasvc.cli.x", read("hasvc.cli.x", "from hasvc.tools import drill\n"))
    shared = "from hasvc.broker.put_service import PutService\nfrom hasvc.state.raft.role import RaftRole\n"
    assert not violations("hasvc.broker.raft.broker", read("hasvc.broker.raft.broker", shared))


def test_pure_packages_pull_in_no_trio():
    """The same rule at run time, transitively: importing every pure module loads no trio.
    (``socket`` is not checked here: crc32c's use of importlib.metadata loads it through
    ``email.utils``; the pure modules' own imports of it are refused above.)"""
    pure = sorted(module for module in source_modules() if _within(module, PURE_PACKAGES))
    code = (
        "import importlib, sys\n"
        f"for name in {pure!r}: importlib.import_module(name)\n"
        "bad = [m for m in sys.modules if m.partition('.')[0] == 'trio']\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_commitlog_imports_neither_trio_nor_hasvc():
    code = (
        "import sys\n"
        "import commitlog.store, commitlog.services, commitlog.inspect, commitlog.scan\n"
        "bad = [m for m in sys.modules if m == 'trio' or m.startswith('trio.') or m == 'hasvc' or m.startswith('hasvc.')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_everything_works_without_the_native_module():
    code = (
        "from commitlog import native, scan, record\n"
        "assert not native.AVAILABLE and not scan.NATIVE_AVAILABLE and record._native_write is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"HASVC_NO_NATIVE": "1", "PATH": ""})


def test_spark_executors_need_no_trio():
    """What Spark's workers import (the data source and the columnar decoder) pulls in no trio."""
    code = (
        "import sys\n"
        "import hasvc.spark, hasvc.spark.datasource, commitlog.columnar\n"
        "bad = [m for m in sys.modules if m == 'trio' or m.startswith('trio.')]\n"
        "assert not bad, bad\n"
    )
    try:
        import pyspark  # noqa: F401
    except ImportError:  # pragma: no cover - the spark extra is part of the test install
        import pytest

        pytest.skip("pyspark not installed")
    subprocess.run([sys.executable, "-c", code], check=True)
