"""A machine without a C compiler installs hasvc and runs it on the pure-Python paths.

The native module (``commitlog/_scan.c``) is optional (``setup.py``: ``optional=True``). This test
builds the package's wheel with a compiler that always fails, checks the wheel holds no native
module, and runs a store round trip from the unpacked wheel: appends, a reopen (recovery), the
reads. The whole suite's pure-Python run (``HASVC_NO_NATIVE=1``, in ``.ci/run``) shows every twin
gives the same results; this shows the install itself needs no compiler.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROUND_TRIP = r"""
import sys, commitlog, commitlog.native
from commitlog import record as rec
from commitlog.store import MessageStore
assert commitlog.__file__.startswith(sys.argv[1]), commitlog.__file__
assert commitlog.native.module is None
store = MessageStore.open(sys.argv[2])
for n in range(1, 40):
    assert store.append([rec.Message("T", b"x" * n, queue_id=0)]).status is rec.PutMessageStatus.PUT_OK
store.close()
store = MessageStore.open(sys.argv[2])
bodies = [record.body for record in store.pull("T", 0, 0, 100)]
assert bodies == [b"x" * n for n in range(1, 40)], len(bodies)
store.close()
print("round trip ok", len(bodies))
"""


def test_a_machine_without_a_c_compiler_installs_hasvc_and_runs_the_pure_python_paths(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    for package in ("commitlog", "hasvc"):
        shutil.copytree(os.path.join(ROOT, package), source / package,
                        ignore=shutil.ignore_patterns("*.so", "__pycache__"))  # fmt: skip
    environment = {**os.environ, "CC": "false", "CXX": "false", "LDSHARED": "false"}
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "wheel"), str(source)],
                           env=environment, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheels = list((tmp_path / "wheel").glob("hasvc-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        assert "commitlog/store.py" in names and "hasvc/cli/__init__.py" in names
        assert not [name for name in names if name.endswith(".so")], "the failing compiler built a module"
        wheel.extractall(tmp_path / "installed")
    installed = str(tmp_path / "installed")
    environment = {key: value for key, value in os.environ.items() if key != "HASVC_NO_NATIVE"}
    # -S: no site processing, so the checkout's editable install (a .pth finder that would serve
    # its own commitlog._scan) stays out; the environment's packages are on the path as plain paths
    paths = sysconfig.get_paths()
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([installed, paths["purelib"], paths["platlib"]]))
    ran = subprocess.run([sys.executable, "-S", "-c", ROUND_TRIP, installed, str(tmp_path / "store")],
                         env=environment, cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "round trip ok 39" in ran.stdout
