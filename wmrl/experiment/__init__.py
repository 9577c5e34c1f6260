"""What every experiment shares: the step driver (`step`) and the typed configuration."""
