"""The page cache and a log's files: which pages it holds (``resident_pages``, what the tests of
page-cache handling look at) and letting it go of files (``drop_from_page_cache``, the catch-up
benchmark's ``--cold``)."""

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


def drop_from_page_cache(paths: list[str]) -> None:
    """``--cold``: write back, then let the page cache go of these files (a slave joining a
    master whose old log the cache has let go reads it from the disk). Pages a process maps stay:
    the master maps only what its recovery read, near the log's end."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
