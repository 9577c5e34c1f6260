"""Command-line tools (AOT compile checks)."""
