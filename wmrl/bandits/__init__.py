"""Synthetic bandits that reproduce the WMRL theory (docs/method.md 2 and 4)."""
