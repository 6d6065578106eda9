"""Ctrl-C at the command line's boundary (hasvc.cli.HasvcGroup): bare, or inside trio's exception
groups beside the cancellations it caused, it is one line on stderr and exit 130; a command that
says more in its KeyboardInterrupt (a drill: the round, where its stores are) has that line."""

from __future__ import annotations

import click
import pytest
import trio
from click.testing import CliRunner

from hasvc.cli import HasvcGroup
from hasvc.cli.common import EXIT_INTERRUPTED


class _Said(KeyboardInterrupt):
    pass


@pytest.mark.parametrize(("raised", "line"), [
    (KeyboardInterrupt(), "Error: interrupted"),
    (BaseExceptionGroup("nursery", [KeyboardInterrupt()]), "Error: interrupted"),
    (BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [trio.Cancelled._create(source="explicit"),
                                                               KeyboardInterrupt()])]), "Error: interrupted"),
    (BaseExceptionGroup("nursery", [_Said("drill interrupted in round 3: ...")]), "Error: drill interrupted in round 3: ..."),
])  # fmt: skip
def test_ctrl_c_is_one_line_and_exit_130(raised, line):
    @click.group(cls=HasvcGroup)
    def group() -> None:
        pass

    @group.command()
    def run() -> None:
        raise raised

    result = CliRunner().invoke(group, ["run"])
    assert result.exit_code == EXIT_INTERRUPTED, (result.exit_code, result.output)
    assert result.stderr.splitlines() == [line]
