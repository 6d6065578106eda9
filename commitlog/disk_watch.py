"""The disk's fill (``disk_used_ratio``, as ``df`` shows it) and ``DiskWatch``: whether a store's
appends answer DISK_FULL (see ``commitlog.store``'s "A full disk and a failed sync")."""

from __future__ import annotations

import os

from commitlog.mapped_file import FilesCreated


class DiskWatch:
    """Whether appends must answer DISK_FULL. The disk's use is measured (``statvfs``) at most
    once per ``interval_seconds`` of the time given, and again as soon as this process has
    created a file since (``FilesCreated``): segments and consume-queue files are preallocated
    whole, so the disk's use jumps when one is made and hardly moves between (a master filling a
    64 MiB disk at full speed filled it between two measurements a second apart and never
    answered DISK_FULL). Others' writes are seen within the interval. ``no_room``: a segment
    could not be created: full until the next measurement is due (the append just before had
    the disk measured, or trusted a measurement, less than an interval ago)."""

    __slots__ = ("path", "ratio_max", "interval_seconds", "due_at", "files_created", "used_ratio", "full", "reason")

    def __init__(self, path: str, *, ratio_max: float, interval_seconds: float) -> None:
        self.path = path
        self.ratio_max = ratio_max
        self.interval_seconds = interval_seconds
        self.due_at = float("-inf")  # the next measurement, in the caller's (monotonic) seconds
        self.files_created = -1  # FilesCreated.count at the last measurement
        self.used_ratio = 0.0
        self.full = False
        self.reason = ""

    def full_at(self, now: float) -> bool:
        if now < self.due_at and self.files_created == FilesCreated.count:
            return self.full
        self.due_at = now + self.interval_seconds
        self.files_created = FilesCreated.count
        self.used_ratio = disk_used_ratio(self.path)
        self.full = self.used_ratio > self.ratio_max
        self.reason = (f"{self.path}: disk {self.used_ratio:.0%} used, above disk_max_used_space_ratio "
                       f"{self.ratio_max:.0%}" if self.full else "")  # fmt: skip
        return self.full

    def no_room(self, reason: str) -> None:
        self.full = True
        self.reason = reason
        self.files_created = FilesCreated.count


def disk_used_ratio(path: str) -> float:
    """The disk's fill as ``df`` shows it: used / (used + available to us). Blocks reserved for
    root, or held back by the volume, count as neither: ``1 - available / total`` called a disk
    that ``df`` shows 37 % full 74 % full, and retention began deleting segments regardless of age."""
    stat = os.statvfs(path)
    used = stat.f_blocks - stat.f_bfree
    capacity = used + stat.f_bavail
    if capacity <= 0:
        return 0.0
    return used / capacity
