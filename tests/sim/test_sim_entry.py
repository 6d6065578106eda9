"""``python -m hasvc.testing.sim``: one entry for the simulators, fixed seeds by default,
and a failure that prints the one command replaying it."""

import subprocess
import sys

from hasvc.testing import sim


def test_each_simulator_runs_from_the_one_entry():
    for simulator, seeds in (("classic", 5), ("raft", 5), ("raft-store", 2), ("controller", 3)):
        result = subprocess.run([sys.executable, "-m", "hasvc.testing.sim", simulator, "--seeds", str(seeds)],
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"OK {simulator}"), result.stdout
        assert f"({0}..{seeds - 1})" in result.stdout  # seeds from 0 unless told otherwise


def test_a_failing_seed_prints_its_replay(monkeypatch, capsys):
    def fail_on_seven(simulator, seed, nodes):
        if seed == 7:
            raise AssertionError("two leaders in term 3")
        return None

    monkeypatch.setattr(sim, "run_one", fail_on_seven)
    assert sim.main(["raft", "--seeds", "10", "--first-seed", "3", "--nodes", "5"]) == 1
    err = capsys.readouterr().err
    assert "FAIL raft seed 7: AssertionError('two leaders in term 3')" in err
    assert "replay: python -m hasvc.testing.sim raft --nodes 5 --seed 7" in err
