"""Runnable benchmarks: each prints a table and writes JSON."""
