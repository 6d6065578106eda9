"""What scripts/dev/calls_per_put.py and scripts/dev/put_path_time.py share: a local SYNC_MASTER pair,
controller-managed pair (one controller, hooked too) or DLedger group started from this checkout with a ``sitecustomize`` hook (written to a temporary
directory put first on the brokers' PYTHONPATH only: no hasvc code changes), the load shape's
command-line arguments, and the wait for each broker's dump of what its hook measured. The hook
starts measuring on SIGUSR2 and dumps on SIGUSR1 (``signal_window``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))
sys.path.insert(0, ROOT)

from hasvc.tools.bench.sync_write import LocalControlledPair, LocalGroup, LocalPair  # noqa: E402

DUMP_WAIT_SECONDS = 30.0  # a broker writes its dump between two loop passes


def add_shape_arguments(parser: argparse.ArgumentParser, *, producers: int) -> None:
    """--mode, --nodes, --flush, and the load: --producers (default ``producers``),
    --connections, --batch, --seconds."""
    parser.add_argument("--mode", choices=("classic", "controller", "dledger"), default="classic")
    parser.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    parser.add_argument("--flush", choices=("async", "sync"), default="async",
                        help="classic: the master's flush; dledger: sync = a quorum fsyncs an entry before it counts")
    parser.add_argument("--producers", type=int, default=producers)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)


def start_hooked(args: argparse.Namespace, sitecustomize: str, environment: dict[str, str], *, prefix: str,
                 settings: dict[str, str] | None = None) -> tuple[LocalPair | LocalControlledPair | LocalGroup, str]:  # fmt: skip
    """The pair (``args.mode`` classic or controller, connected) or group (dledger), its brokers started with
    ``sitecustomize`` and ``environment`` (``{work}`` in a value: the work directory); returns
    it and the work directory (the caller removes it). ``settings`` as ``--set`` to every broker."""
    work = tempfile.mkdtemp(prefix=prefix)
    with open(os.path.join(work, "sitecustomize.py"), "w") as file:
        file.write(sitecustomize)
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", *environment)}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [work, ROOT, saved["PYTHONPATH"]]))
    os.environ.update({name: value.replace("{work}", work) for name, value in environment.items()})
    try:
        if args.mode == "classic":
            cluster = LocalPair(role="sync", flush=args.flush, settings=settings)
            cluster.wait_connected()
        elif args.mode == "controller":
            cluster = LocalControlledPair(flush=args.flush, settings=settings)
            cluster.wait_connected()
        else:
            cluster = LocalGroup(nodes=args.nodes, flush=args.flush, settings=settings)
    finally:  # only the brokers run with the hook
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return cluster, work


def signal_window(pids: dict[str, int], paths: dict[str, str], window):
    """SIGUSR2 to every broker, ``window()``, SIGUSR1 to every broker, then wait until each has
    written its dump at ``paths[name]`` (old ones removed first); ``window()``'s result."""
    for path in paths.values():
        if os.path.exists(path):
            os.remove(path)
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR2)
    result = window()
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + DUMP_WAIT_SECONDS
    while not all(os.path.exists(path) for path in paths.values()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no dump from {[name for name, path in paths.items() if not os.path.exists(path)]}")
        time.sleep(0.05)
    return result
