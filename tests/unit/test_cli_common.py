"""The server commands' process settings (hasvc/cli/common.py)."""

import platform
import subprocess
import sys

import pytest

from hasvc.cli import common

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_a_server_process_keeps_freed_heap_for_the_next_large_copy():
    """After tune_malloc, 256 KiB allocations (a receive's copy at 32-message batches) come from
    the heap and freeing them gives nothing back to the kernel: brk is not called in a loop of
    them. Run in a child, so the settings do not leak into this process."""
    code = """
import ctypes, os, sys
from hasvc.cli.common import tune_malloc
assert tune_malloc()
libc = ctypes.CDLL(None)
libc.sbrk.restype = ctypes.c_void_p
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
first = libc.malloc(256 * 1024); libc.free(first)
top = libc.sbrk(0)
for _ in range(100):
    p = libc.malloc(256 * 1024)
    ctypes.memset(p, 1, 256 * 1024)
    libc.free(p)
print(top == libc.sbrk(0))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_the_environment_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert common.tune_malloc() is False

