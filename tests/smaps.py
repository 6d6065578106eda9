"""This process's mappings of a file as the kernel reports them (``/proc/self/smaps``)."""

from __future__ import annotations

import re

# A mapping's header line: "start-end perms offset dev inode [path]" (no path for anonymous ones).
HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ ([0-9a-f]+) \S+ \d+\s*(.*)$")


def mappings_of(path: str) -> list[dict]:
    """One dict per mapping of ``path``, by file offset: ``start`` and ``end`` (file offsets),
    ``flags`` (the VmFlags, e.g. ``rr`` for MADV_RANDOM) and ``rss_kb`` (pages mapped in)."""
    found: list[dict] = []
    current: dict | None = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            header = HEADER.match(line.rstrip("\n"))
            if header is not None:
                low, high, offset = (int(header.group(i), 16) for i in (1, 2, 3))
                current = {"start": offset, "end": offset + high - low} if header.group(4) == path else None
                if current is not None:
                    found.append(current)
                continue
            fields = line.split()
            if current is not None and fields[0] == "Rss:":
                current["rss_kb"] = int(fields[1])
            elif current is not None and fields[0] == "VmFlags:":
                current["flags"] = set(fields[1:])
    return sorted(found, key=lambda mapping: mapping["start"])
