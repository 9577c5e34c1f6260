"""Rank and calibration statistics of scores against outcomes (pure jnp, no model code), and
the mean over seeds with its 95% interval that the benchmarks report (numpy)."""

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


def mean_ci95(values) -> dict:
    """Mean over seeds with its two-sided 95% Student-t interval: `{"mean", "ci95": [lo, hi],
    "n", "per_seed"}`, over the values that are not None (`per_seed` keeps them all, None
    included). `mean +- t_{0.975, n-1} * sd / sqrt(n)` (sd with ddof=1): with 3 seeds
    t = 4.30, an honest width where a percentile bootstrap of 3 values would be far too
    narrow. `ci95` is None with fewer than 2 values; `mean` None with none."""
    import numpy as np
    from scipy.stats import t as student_t

    per_seed = [None if v is None else float(v) for v in values]
    v = np.asarray([x for x in per_seed if x is not None], float)
    out = {"mean": float(v.mean()) if len(v) else None, "ci95": None, "n": len(v),
           "per_seed": per_seed}  # fmt: skip
    if len(v) >= 2:
        half = float(student_t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
        out["ci95"] = [out["mean"] - half, out["mean"] + half]
    return out
