"""spark-submit entry point: `spark-submit [--master URL] scripts/spark_stats.py ARGS...` runs
`hasvc spark stats ARGS...` with spark-submit's master (see README, "Spark")."""

import sys

from hasvc.cli import main

if __name__ == "__main__":
    main(["spark", "stats", *sys.argv[1:]])
