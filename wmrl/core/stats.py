"""Rank and calibration statistics of scores against outcomes (pure jnp, no model code)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _normal_quantile(p):
    """Inverse standard-normal CDF via `jax.scipy.special.ndtri`."""
    return jax.scipy.special.ndtri(p)


def interval_ece(
    mean: jax.Array, var: jax.Array, target: jax.Array, levels: jax.Array | None = None
) -> jax.Array:
    """Expected calibration error of central Gaussian intervals.

    For each level p the interval `mu +- z_{(1+p)/2} sigma` should contain the
    truth a fraction p of the time; ECE = mean_p |coverage(p) - p|.
    """
    if levels is None:
        levels = jnp.linspace(0.1, 0.9, 9)
    z = _normal_quantile((1 + levels) / 2)  # [L]
    inside = jnp.abs(target - mean)[None] <= z[:, None] * jnp.sqrt(var)[None]
    coverage = jnp.mean(inside.astype(jnp.float32), axis=1)
    return jnp.mean(jnp.abs(coverage - levels))


def _ranks(x: jax.Array) -> jax.Array:
    """Ranks with ties given their average rank (so constant inputs rank equally)."""
    order = jnp.argsort(x)
    ranks = (
        jnp.empty_like(x, dtype=jnp.float32)
        .at[order]
        .set(jnp.arange(x.shape[0], dtype=jnp.float32))
    )
    same = x[:, None] == x[None, :]
    return jnp.sum(same * ranks[None, :], axis=1) / jnp.sum(same, axis=1)


def spearman(x: jax.Array, y: jax.Array) -> jax.Array:
    """Spearman rank correlation of two `[N]` vectors (Pearson correlation of ranks)."""
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return jnp.sum(rx * ry) / jnp.sqrt(jnp.sum(rx * rx) * jnp.sum(ry * ry) + 1e-12)
