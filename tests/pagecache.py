"""Which pages of a file the page cache holds: what the tests of page-cache handling look at."""

import ctypes
import mmap
import os

PAGE = mmap.PAGESIZE


def resident_pages(path) -> list[bool]:
    """One flag per page of the file at ``path``: in the page cache or not (mincore over a fresh
    mapping, which does not fault anything in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = os.path.getsize(path)
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), size) as mapping:
        flags = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
        first = ctypes.c_char.from_buffer(mapping)
        try:
            if libc.mincore(ctypes.addressof(first), size, flags) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del first
        return [bool(flag & 1) for flag in flags.raw]

