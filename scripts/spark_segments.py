"""spark-submit entry point: `spark-submit [--master URL] scripts/spark_segments.py ARGS...` runs
`hasvc spark segments ARGS...` with spark-submit's master (see README, "Spark")."""

import sys

from hasvc.cli import main

if __name__ == "__main__":
    main(["spark", "segments", *sys.argv[1:]])
