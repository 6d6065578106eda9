"""The command line's error boundary (hasvc.cli.common.explain): one line and a documented exit
code for whatever a command raises, trio's exception groups unwrapped to the leaf that says why."""

from __future__ import annotations

import errno

import click
import pytest
import trio

from commitlog.mapped_file import StoreError
from hasvc.cli.common import EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE, explain, meaningful_leaf
from hasvc.client import ClientError, ConnectError
from hasvc.protocol.wire import ProtocolError
from hasvc.transport import AuthenticationError


def _cancelled() -> trio.Cancelled:
    return trio.Cancelled._create(source="explicit")


def test_the_leaf_that_says_why_is_found_under_groups_and_sibling_cancellations():
    cause = StoreError("data/m/lock: the store is already open in another process")
    group = BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [_cancelled(), cause]), ValueError("later")])
    assert meaningful_leaf(group) is cause
    only = BaseExceptionGroup("x", [_cancelled()])
    assert isinstance(meaningful_leaf(only), trio.Cancelled)


@pytest.mark.parametrize(("error", "code", "text"), [
    (StoreError("m/lock: the store is already open in another process"), EXIT_UNAVAILABLE, "stop the other process"),
    (ConnectError("cannot connect to 127.0.0.1:1: Connection refused"), EXIT_UNAVAILABLE, "127.0.0.1:1"),
    (ClientError("OFFSET_ILLEGAL: offset 9 outside the log [0, 0)"), EXIT_FAILED, "OFFSET_ILLEGAL"),
    (AuthenticationError("127.0.0.1:5: requires a secret"), EXIT_UNAVAILABLE, "--secret-file"),
    (ProtocolError("unknown frame kind 99"), EXIT_UNAVAILABLE, "client port"),
    (OSError(errno.EADDRINUSE, "Address already in use"), EXIT_UNAVAILABLE, "cannot listen"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "conf.toml"), EXIT_USAGE, "conf.toml: No such file"),
    (ValueError("address '10971' is not HOST:PORT"), EXIT_USAGE, "HOST:PORT"),
    (click.UsageError("give --topic"), EXIT_USAGE, "give --topic"),
    (ModuleNotFoundError("No module named 'pyspark'"), EXIT_UNAVAILABLE, "pip install"),
    (KeyError("surprise"), EXIT_FAILED, "--debug"),
])  # fmt: skip
def test_each_kind_of_error_is_one_line_with_its_exit_code(error, code, text):
    for raised in (error, ExceptionGroup("nursery", [error]) if isinstance(error, Exception) else error):
        message, exit_code = explain(raised)
        assert exit_code == code and text in message and "\n" not in message
