"""spark-submit entry point: `spark-submit [--master URL] scripts/spark_audit.py ARGS...` runs
`hasvc spark audit ARGS...` with spark-submit's master (see README, "Spark")."""

import sys

from hasvc.cli import main

if __name__ == "__main__":
    main(["spark", "audit", *sys.argv[1:]])
