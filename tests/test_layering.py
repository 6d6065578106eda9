import subprocess
import sys


def test_commitlog_imports_neither_trio_nor_hasvc():
    code = (
        "import sys\n"
        "import commitlog.store, commitlog.services, commitlog.inspect, commitlog.scan\n"
        "bad = [m for m in sys.modules if m == 'trio' or m.startswith('trio.') or m == 'hasvc' or m.startswith('hasvc.')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_everything_works_without_the_native_module():
    code = (
        "from commitlog import native, scan, record\n"
        "assert not native.AVAILABLE and not scan.NATIVE_AVAILABLE and record._native_write is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"HASVC_NO_NATIVE": "1", "PATH": ""})


def test_spark_executors_need_no_trio():
    """What Spark's workers import (the data source and the columnar decoder) pulls in no trio."""
    code = (
        "import sys\n"
        "import hasvc.spark, hasvc.spark.datasource, commitlog.columnar\n"
        "bad = [m for m in sys.modules if m == 'trio' or m.startswith('trio.')]\n"
        "assert not bad, bad\n"
    )
    try:
        import pyspark  # noqa: F401
    except ImportError:  # pragma: no cover - the spark extra is part of the test install
        import pytest

        pytest.skip("pyspark not installed")
    subprocess.run([sys.executable, "-c", code], check=True)
