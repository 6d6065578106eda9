"""A full disk under real brokers: a small tmpfs (mounted here, as root) holds the stores. No
process exits; puts answer DISK_FULL; reads go on; writes resume by themselves once space frees."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys

import trio

from hasvc import client as hc
from tests.cluster import Cluster, send_many, small_tmpfs, status, wait_until

MESSAGE_SIZE = 32 * 1024
SEGMENT_SIZE = 8 * 1024 * 1024
# Sends before a 64 MiB disk must have answered DISK_FULL (it holds ~2,000 of 32 KiB): a bound,
# so a broker that never refuses fails the test instead of running forever.
SENDS_MAX = 4000


def fill_until_refused(client, *, topic: str = "T") -> tuple[int, object]:
    """Send 32 KiB messages until one is not PUT_OK: (how many were PUT_OK, the refusal)."""
    body = b"x" * MESSAGE_SIZE
    for sent in range(SENDS_MAX):
        result = client.send(topic, body)
        if result.status != "PUT_OK":
            return sent, result
    raise AssertionError(f"{SENDS_MAX} sends of {MESSAGE_SIZE} bytes all PUT_OK on a small disk")


def write_filler(path: str, size: int) -> None:
    with open(path, "wb") as file:
        file.write(b"\0" * size)


def test_a_master_above_the_ratio_answers_disk_full_before_the_disk_is_full(tmp_path):
    """disk_max_used_space_ratio 0.5 on a 64 MiB disk, filled at full speed by 32 producers: the
    log stops below half the disk (the ratio is measured again after every file the master
    creates: measured once a second, the disk filled between two measurements and the master
    died), every refusal is DISK_FULL for the ratio, and the master goes on serving reads."""
    with small_tmpfs(tmp_path / "disk", "64m") as disk:
        cluster = Cluster(disk, segment_size=SEGMENT_SIZE)
        try:
            master = cluster.start_master(role="async", disk_max_used_space_ratio=0.5)
            results = trio.run(functools.partial(send_many, master.address, SENDS_MAX, 32, topic="T", size=MESSAGE_SIZE))
            refusals = [result for result in results.values() if result.status != "PUT_OK"]
            assert refusals, "no put refused"
            assert {result.status for result in refusals} == {"DISK_FULL"}, refusals[:3]
            assert all("disk_max_used_space_ratio" in result.reason for result in refusals), refusals[:3]
            stat = os.statvfs(disk)
            with hc.BlockingClient(master.address) as client:
                found = client.status()
                assert found["max_offset"] <= 0.5 * stat.f_blocks * stat.f_frsize, found["max_offset"]
                assert "disk_max_used_space_ratio" in found["disk_full"]
                assert client.pull("T", 0, 0, count_max=1).records  # reads go on
                assert client.send("T", b"more").status == "DISK_FULL"
            assert master.alive
            assert master.stop() == 0
        finally:
            cluster.close()


def test_a_master_on_a_full_disk_never_exits_and_writes_again_once_space_frees(tmp_path):
    """No ratio (1.0): the disk really fills (no next segment, no consume-queue file, no spare
    for the warm-up). The master answers DISK_FULL and stays up, its slave (on another disk)
    still gets everything stored; a filler file deleted, puts succeed again by themselves; a
    clean stop still works."""
    with small_tmpfs(tmp_path / "disk", "64m") as disk:
        filler = os.path.join(disk, "filler")
        write_filler(filler, 24 * 1024 * 1024)
        cluster = Cluster(disk, segment_size=SEGMENT_SIZE)
        elsewhere = Cluster(tmp_path, segment_size=SEGMENT_SIZE)  # the slave's store: not the full disk
        try:
            master = cluster.start_master(role="async", flush="sync")
            slave = elsewhere.start_slave(master.ha_address)
            with hc.BlockingClient(master.address) as client:
                stored, refusal = fill_until_refused(client)
                assert refusal.status == "DISK_FULL", refusal
                assert stored > 0
                for _ in range(20):  # refused again and again: still up
                    assert client.send("T", b"x" * MESSAGE_SIZE).status == "DISK_FULL"
                assert client.pull("T", 0, 0, count_max=1).records
                wait_until(lambda: status(slave)["max_offset"] == client.status()["max_offset"], timeout=30.0,
                           message="the slave to have everything the master stored")  # fmt: skip
                assert master.alive
                os.unlink(filler)
                wait_until(lambda: client.send("T", b"again").status == "PUT_OK", timeout=30.0,
                           message="a put to succeed once the filler is gone")  # fmt: skip
                assert "disk_full" not in client.status()
            assert master.alive
            assert "Traceback" not in master.log()
            assert master.stop() == 0
        finally:
            elsewhere.close()
            cluster.close()


def test_a_master_on_a_disk_already_full_refuses_to_start_in_one_line(tmp_path):
    with small_tmpfs(tmp_path / "disk", "16m") as disk:
        with open(os.path.join(disk, "filler"), "wb") as file:
            with contextlib.suppress(OSError):  # ENOSPC: the disk is full
                while True:
                    file.write(b"\0" * (1024 * 1024))
                    file.flush()
        done = subprocess.run([sys.executable, "-m", "hasvc.cli", "master", "--store", os.path.join(disk, "m"),
                               "--listen", "127.0.0.1:0", "--ha-listen", "127.0.0.1:0"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode != 0
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        error = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert len(error) == 1 and "full" in error[0] and disk in error[0], done.stderr[-2000:]
