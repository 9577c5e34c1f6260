"""Rank and calibration statistics of scores against outcomes, no model code: `ranks` and
`spearman` (jnp, jit- and vmap-able, over a mask of valid entries), `interval_ece` (jnp), and
the ROC `auc` and `within_group_auc` (numpy, host-side reports). The intervals over seeds that
the benchmarks report are `wmrl.experiment.stats`'s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


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


def ranks(x: jax.Array, valid: jax.Array | None = None) -> jax.Array:
    """Ranks of `x` [N] among its `valid` entries (default: all), 0-based, ties at their
    average rank (so constant inputs rank equally); invalid entries get 0.

    Without a mask, the order of a sort, ties averaged; with one, pairwise counts over the
    valid entries. The two give the same ranks; each is the computation its callers always
    compiled, so that no reported figure moves in its last bit (XLA's fusion, and with it
    the order of a jitted reduction, follows the graph)."""
    if valid is None:
        order = jnp.argsort(x)
        r = (
            jnp.empty_like(x, dtype=jnp.float32)
            .at[order]
            .set(jnp.arange(x.shape[0], dtype=jnp.float32))
        )
        same = x[:, None] == x[None, :]
        return jnp.sum(same * r[None, :], axis=1) / jnp.sum(same, axis=1)
    v = valid.astype(jnp.float32)
    less = (x[None, :] < x[:, None]) * v[None, :]
    same = (x[None, :] == x[:, None]) * v[None, :]
    return jnp.where(valid, less.sum(1) + (same.sum(1) - 1.0) / 2.0, 0.0)


def spearman(
    x: jax.Array, y: jax.Array, valid: jax.Array | None = None, undefined: float = jnp.nan
) -> jax.Array:
    """Spearman rank correlation of `x`, `y` [N] over their `valid` entries (default: all):
    the Pearson correlation of their `ranks`. `undefined` where it is not defined (fewer than
    two entries, or no variation on either side): NaN by default; a pooled report that reads
    "no rank information" as 0 passes 0."""
    if valid is None:
        rx, ry = ranks(x), ranks(y)
        rx, ry = rx - rx.mean(), ry - ry.mean()
        # Exactly 0 where undefined (a side without variation has all-zero centred ranks).
        r = jnp.sum(rx * ry) / jnp.sqrt(jnp.sum(rx * rx) * jnp.sum(ry * ry) + 1e-12)
        if undefined == 0.0:
            return r
        defined = (x.shape[0] >= 2) & (jnp.ptp(x) > 0) & (jnp.ptp(y) > 0)
        return jnp.where(defined, r, undefined)
    v = valid.astype(jnp.float32)
    n = v.sum()
    rx, ry = ranks(x, valid), ranks(y, valid)
    rx = (rx - (rx * v).sum() / jnp.maximum(n, 1.0)) * v
    ry = (ry - (ry * v).sum() / jnp.maximum(n, 1.0)) * v
    sxx, syy = (rx * rx).sum(), (ry * ry).sum()
    defined = (n >= 2) & (sxx > 0) & (syy > 0)
    return jnp.where(
        defined, (rx * ry).sum() / jnp.sqrt(jnp.where(defined, sxx * syy, 1.0)), undefined
    )


def auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """ROC AUC of `scores` [N] for the boolean `positive` [N]: the probability that a
    positive scores above a negative, ties counting one half. None unless both classes occur."""
    scores, positive = np.asarray(scores), np.asarray(positive, bool)
    pos, neg = scores[positive], scores[~positive]
    if not len(pos) or not len(neg):
        return None
    above = pos[:, None] > neg[None, :]
    tied = pos[:, None] == neg[None, :]
    return float((above + 0.5 * tied).mean())


def within_group_auc(scores: np.ndarray, positive: np.ndarray) -> tuple[float, int]:
    """Mean over groups (rows of `scores`, `positive` [groups, G]) with both outcomes of their
    `auc`: how well the scores order the rows where GRPO compares them. Returns (the mean,
    the number of such groups); the mean is NaN when there is none."""
    aucs = [a for s, y in zip(scores, positive, strict=True) if (a := auc(s, y)) is not None]
    return (float(np.mean(aucs)) if aucs else float("nan")), len(aucs)
