"""The SYNC_MASTER pair that scripts/dev/cpu_per_put.py and scripts/dev/syscalls_per_put.py measure, from
another tree's code: kept here, beside the scripts, and not in ``hasvc`` so that they also measure
trees older than it (a `git archive` of an earlier main for an A/B)."""

import os
import sys


def take_load_option(args: list[str]) -> str | None:
    """``--load PATH`` (a built load generator) taken out of ``args``; None when absent."""
    if "--load" not in args:
        return None
    index = args.index("--load")
    load = args[index + 1]
    del args[index : index + 2]
    return load


def start_pair(tree: str, load: str | None):
    """Import ``hasvc`` from ``tree`` (and run its brokers from there), build the C load generator
    unless ``load`` names one, and start a master and a slave as scripts/bench_peers does
    (SYNC_MASTER, ASYNC_FLUSH, page_cache_keep_size 256 MiB). Returns (pair, load, host, port)
    once the slave is connected; the caller closes the pair."""
    sys.path.insert(0, tree)
    os.chdir(tree)  # the pair's `python -m hasvc.cli` runs TREE's code
    from hasvc.tools.bench.sync_write import LocalPair, build_c_load

    load = load or build_c_load()
    if load is None:
        raise SystemExit("a C compiler (cc) is needed to build scripts/hasvc_load.c")
    pair = LocalPair(role="sync", flush="async", settings={"page_cache_keep_size": str(256 << 20)})
    try:
        pair.wait_connected()
    except BaseException:
        pair.close()
        raise
    host, _, port = pair.master["listen"].rpartition(":")
    return pair, load, host, port
