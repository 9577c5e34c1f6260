"""Environments: synthetic bandits and Mini AutoResearch (see DESIGN.md section 4)."""
