"""What several command groups share: the client options and a record as JSON."""

from __future__ import annotations

import base64

import click

secret_option = click.option("--secret-file", type=click.Path(dir_okay=False, exists=True), help="Cluster secret (or HASVC_SECRET).")
tls_option = click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), help="CA to verify a TLS broker.")


def client_secret(secret_file):
    from hasvc.config import read_secret

    return read_secret(secret_file)


def record_json(offset: int, record, crc_ok: bool) -> dict:
    return {
        "offset": offset,
        "size": record.size,
        "topic": record.topic,
        "queue_id": record.queue_id,
        "queue_offset": record.queue_offset,
        "flag": record.flag,
        "sysflag": record.sysflag,
        "properties": record.properties,
        "born_timestamp": record.born_timestamp,
        "born_host": f"{record.born_host[0]}:{record.born_host[1]}",
        "store_timestamp": record.store_timestamp,
        "store_host": f"{record.store_host[0]}:{record.store_host[1]}",
        "reconsume_times": record.reconsume_times,
        "body_crc": record.body_crc,
        "crc_ok": crc_ok,
        "body_base64": base64.b64encode(bytes(record.body)).decode(),
    }


# glibc's malloc, as a server process sets it (the broker, a DLedger node, the proxy). A client
# connection's receive is copied out of the reused read buffer (wire.Buffer.feed): at 64 writers
# sending 32 messages a request those copies are up to 256 KiB, above glibc's default trim
# threshold, so every free gave the heap's top back (brk) and the next copy faulted fresh zeroed
# pages in: 0.11 brk a request at the master (scripts/dev/syscalls_per_put.py TREE 1 64 2 32), and,
# 3 alternating pairs of scripts/dev/cpu_per_put.py TREE 1 64 4 1 32, 108-122 -> 90-101 us of the
# master's CPU a request with these set. Allocations up to MALLOC_MMAP_THRESHOLD_BYTES come from
# the heap, and up to MALLOC_TRIM_THRESHOLD_BYTES of freed heap is kept for the next ones (what a
# busy server may hold beyond its live data). The environment's MALLOC_*_ variables win.
MALLOC_MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
MALLOC_TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def tune_malloc() -> bool:
    """Set glibc's trim and mmap thresholds for a server process (see above); False where there
    is no glibc ``mallopt`` (another libc: nothing is changed) or the environment sets them."""
    import ctypes
    import os

    if "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES) == 1


def start_busy_polling(busy_poll_us: int) -> None:
    """``busy_poll_us`` (hasvc/busy_poll.py) for this process's event loop, logged; a warning if
    this trio cannot be made to poll (the broker then runs as with 0)."""
    import logging

    from hasvc import busy_poll

    if busy_poll_us == 0:
        return
    if busy_poll.install(busy_poll_us):
        logging.getLogger("hasvc").info("busy polling: %d us before each sleep of the event loop", busy_poll_us)
    else:
        logging.getLogger("hasvc").warning("busy_poll_us=%d ignored: this trio's event loop is not the epoll one hasvc can poll", busy_poll_us)


# -- the error boundary: every command's errors become one line and a documented exit code -------
#
# Exit codes (docs/operations.md "Exit codes"; each command's help repeats the line):
EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and the answer is no: a refusal, a send not PUT_OK, a corrupt store, a loss
EXIT_USAGE = 2  # the command line, the configuration or a file it names is wrong (click's own code for usage errors)
EXIT_UNAVAILABLE = 3  # could not reach or start: a broker unreachable or refusing us, an address in use, a store in use
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell reports it)
EXIT_CODES_EPILOG = "Exit codes: 0 done, 1 failed or refused, 2 usage or configuration error, 3 unreachable or cannot start."
DEBUG_ENVIRONMENT = "HASVC_DEBUG"  # =1: a traceback instead of the one line (as --debug)


class CommandError(click.ClickException):
    """A user-caused error as one line with its exit code (``Error: what, where; hint``)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


def meaningful_leaf(error: BaseException) -> BaseException:
    """The first leaf of an exception group (trio's nurseries wrap what their tasks raised) that
    says something: not a cancellation the failure caused in a sibling task."""
    import trio

    leaves: list[BaseException] = []

    def walk(item: BaseException) -> None:
        if isinstance(item, BaseExceptionGroup):
            for inner in item.exceptions:
                walk(inner)
        else:
            leaves.append(item)

    walk(error)
    for leaf in leaves:
        if not isinstance(leaf, trio.Cancelled | GeneratorExit):
            return leaf
    return leaves[0]


def interruption(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C in ``error``: itself, or a leaf of trio's exception groups (a nursery wraps it,
    and the tasks it cancelled may fail beside it)."""
    if isinstance(error, BaseExceptionGroup):
        found = error.subgroup(KeyboardInterrupt)
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        return found
    return error if isinstance(error, KeyboardInterrupt) else None


def explain(error: BaseException) -> tuple[str, int]:
    """One line and an exit code for an error that reached the command line's boundary."""
    import errno

    from commitlog.mapped_file import StoreError
    from hasvc.client.results import ClientError, ConnectError
    from hasvc.protocol.wire import ProtocolError
    from hasvc.transport import AuthenticationError

    leaf = meaningful_leaf(error)
    text = str(leaf) or type(leaf).__name__
    if isinstance(leaf, click.UsageError):
        command = f" (see '{leaf.ctx.command_path} -h')" if leaf.ctx is not None else ""
        return leaf.format_message() + command, leaf.exit_code
    if isinstance(leaf, click.ClickException):
        return leaf.format_message(), leaf.exit_code
    if isinstance(leaf, StoreError):
        if "already open in another process" in text:
            return f"{text} (stop the other process, or give another --store)", EXIT_UNAVAILABLE
        return text, EXIT_UNAVAILABLE
    if isinstance(leaf, ConnectError):
        return text, EXIT_UNAVAILABLE
    if isinstance(leaf, ClientError):
        return text, EXIT_FAILED
    if isinstance(leaf, AuthenticationError):
        return f"{text} (check --secret-file or HASVC_SECRET, and that the address is a client port)", EXIT_UNAVAILABLE
    if isinstance(leaf, ProtocolError):
        return f"protocol error: {text} (is the address a hasvc client port?)", EXIT_UNAVAILABLE
    if isinstance(leaf, OSError):
        if leaf.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES) and leaf.filename is None:
            return f"cannot listen: {leaf.strerror or text}", EXIT_UNAVAILABLE
        if leaf.filename is not None:
            return f"{leaf.filename}: {leaf.strerror or text}", EXIT_USAGE
        return f"{leaf.strerror or text}", EXIT_UNAVAILABLE
    if isinstance(leaf, ValueError):
        return text, EXIT_USAGE
    if isinstance(leaf, ImportError):
        return f"{text} (an optional part is not installed: pip install 'hasvc[spark]' or 'hasvc[proxy]')", EXIT_UNAVAILABLE
    name = type(leaf).__name__
    if name == "StartError":  # a process a drill or demo started did not start: its own line says why
        return text, EXIT_UNAVAILABLE
    if name == "TooSlowError":
        return "timed out (is the address right and the broker running?)", EXIT_UNAVAILABLE
    return f"unexpected {name}: {text} (a bug: run again with --debug for the traceback, and report it)", EXIT_FAILED


def serve_until_signal(make_server, *, store: str | None = None) -> None:
    """Run the server ``make_server()`` builds (inside the trio loop) until SIGTERM or SIGINT: one
    line ``READY {json}`` on stdout once its ``run`` reports its addresses, then a clean shutdown
    (its nursery cancelled) on the signal -- what ``hasvc master|slave|node|controller`` share.
    An error after READY is logged whole and said in one line (exit 1). One before it, a start-up
    failure, goes on to the boundary (``hasvc.cli``), which says it in one line; with ``store``, a
    full disk met writing one of its small files (lock, abort, checkpoint) is said here (exit 3)."""
    import json
    import logging
    import signal
    import sys

    import trio

    from commitlog.mapped_file import is_disk_full

    ready = False

    async def serve() -> None:
        nonlocal ready
        server = make_server()
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                addresses = await nursery.start(server.run)
                ready = True
                click.echo("READY " + json.dumps(addresses))
                sys.stdout.flush()
                async for signum in signals:
                    logging.getLogger("hasvc").info("%s: shutting down", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(serve)
    except Exception as error:  # a start-up failure (groups included) is said by the boundary (hasvc.cli)
        if ready:  # not a start-up failure: the log gets the whole story
            logging.getLogger("hasvc").error("stopped by an error", exc_info=error)
            raise CommandError(f"stopped: {explain(error)[0]}", EXIT_FAILED) from None
        leaf = meaningful_leaf(error)
        if store is not None and isinstance(leaf, OSError) and is_disk_full(leaf):
            raise CommandError(f"{leaf.filename or store}: the disk is full: {leaf.strerror}", EXIT_UNAVAILABLE) from None
        raise


def debug_requested() -> bool:
    import os

    return os.environ.get(DEBUG_ENVIRONMENT, "") not in ("", "0")


def check_can_listen(addresses, hints=None) -> None:
    """Bind each (host, port) and let it go before anything is created on disk: a port in use is
    then one line naming the address, and no store directory is left behind. Port 0 always binds.
    ``hints``: address -> what to say when that one is in use (instead of the usual hint)."""
    import errno
    import socket

    from hasvc.config import format_address

    for address in addresses:
        if address is None or address[1] == 0:
            continue
        try:
            infos = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as error:
            raise CommandError(f"cannot listen on {format_address(address)}: {error.strerror} (a host name or IP address)",
                               EXIT_USAGE) from None  # fmt: skip
        family, kind, protocol, _, where = infos[0]
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as trio's listeners do
            try:
                probe.bind(where)
            except OSError as error:
                hint = "another process has it: stop it or choose another port" if error.errno == errno.EADDRINUSE else "not an address of this host?"
                hint = (hints or {}).get(address, hint)
                raise CommandError(f"cannot listen on {format_address(address)}: {error.strerror} ({hint})", EXIT_UNAVAILABLE) from None


def check_store_free(store: str) -> None:
    """A store already open in another process is refused before the broker starts (and logs
    anything): the store's lock (``STORE/lock``, an exclusive flock) is taken and let go, without writing to
    the file. Nothing is created for a store that does not exist yet."""
    import fcntl
    import os

    from commitlog.mapped_file import StoreError

    path = os.path.join(store, "lock")
    if not os.path.exists(path):
        return
    fd = os.open(path, os.O_RDONLY)  # read-only: a refused start changes no byte of the store
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"{path}: the store is already open in another process") from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
