"""Runnable benchmarks: each prints a table and writes its figures with `--out=FILE.json`."""
