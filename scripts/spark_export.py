"""spark-submit entry point: `spark-submit [--master URL] scripts/spark_export.py ARGS...` runs
`hasvc spark export ARGS...` with spark-submit's master (see README, "Spark")."""

import sys

from hasvc.cli import main

if __name__ == "__main__":
    main(["spark", "export", *sys.argv[1:]])
