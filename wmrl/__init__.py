"""wmrl: World Model RL in JAX."""

__version__ = "0.1.0"
