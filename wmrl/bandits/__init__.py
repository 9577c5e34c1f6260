"""Synthetic bandits that reproduce the WMRL theory (DESIGN.md sections 2 and 4)."""
