"""The benchmarks behind ``hasvc bench``: store (append, recover), sync_write, catch_up, spark_read."""
