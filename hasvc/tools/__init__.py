"""Benchmarks, drills, demos and the crash writer: library code the CLI runs (layer L3; product code never imports it)."""
