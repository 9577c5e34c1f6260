"""The 95% intervals over seeds that the benchmarks report: two methods, each named for what
it is, so a results table can say which one it shows.

* **Student-t** (`mean_ci95`): `mean +- t_{0.975, n-1} * sd / sqrt(n)` over the seeds. The
  AutoResearch benchmark's (`wmrl.benchmarks.speedup`), which runs 3 seeds a mode and pairs
  them: with 3 values the t quantile (4.30) gives an honest width, where a percentile
  bootstrap of 3 values is far too narrow (it can only resample those 3).
* **Percentile bootstrap** (`mean_bootstrap_ci95`, `bootstrap_ci`, `bootstrap_diff_ci`): the
  2.5 and 97.5 percentiles of 10000 resampled means (a fixed seed: the same numbers every
  time). The embodied benchmark's (`wmrl.benchmarks.embodied`), which runs 5-30 seeds a mode
  and compares unpaired modes (each mode's seeds resampled on their own); figures such as
  "real episodes to the target" are skewed, which a percentile interval follows.

Both take per-seed values with None for a seed without the figure (left out, still listed in
`per_seed`) and return `{"mean", "ci95": [lo, hi] or None, "n", "per_seed"}`.
"""

from __future__ import annotations

import numpy as np


def mean_ci95(values) -> dict:
    """Mean over seeds with its two-sided 95% Student-t interval: `{"mean", "ci95": [lo, hi],
    "n", "per_seed"}`, over the values that are not None (`per_seed` keeps them all, None
    included). `mean +- t_{0.975, n-1} * sd / sqrt(n)` (sd with ddof=1). `ci95` is None with
    fewer than 2 values; `mean` None with none."""
    from scipy.stats import t as student_t

    per_seed = [None if v is None else float(v) for v in values]
    v = np.asarray([x for x in per_seed if x is not None], float)
    out = {"mean": float(v.mean()) if len(v) else None, "ci95": None, "n": len(v),
           "per_seed": per_seed}  # fmt: skip
    if len(v) >= 2:
        half = float(student_t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
        out["ci95"] = [out["mean"] - half, out["mean"] + half]
    return out


def _resampled_means(values, rng, reps: int) -> np.ndarray | None:
    """`reps` bootstrap means of the non-None values (None if there are none)."""
    v = np.asarray([x for x in values if x is not None], float)
    return v[rng.integers(0, len(v), (reps, len(v)))].mean(1) if len(v) else None


def _percentile_interval(draws: np.ndarray) -> list[float]:
    return [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]


def bootstrap_ci(values, reps: int = 10000, seed: int = 0) -> list[float] | None:
    """95% percentile-bootstrap interval of the mean of the non-None values (None if none)."""
    means = _resampled_means(values, np.random.default_rng(seed), reps)
    return None if means is None else _percentile_interval(means)


def bootstrap_diff_ci(a, b, reps: int = 10000, seed: int = 0) -> list[float] | None:
    """95% percentile-bootstrap interval of mean(a) - mean(b), each mode's seeds resampled on
    their own (the modes' seeds are separate runs, not pairs)."""
    rng = np.random.default_rng(seed)
    ma, mb = _resampled_means(a, rng, reps), _resampled_means(b, rng, reps)
    return None if ma is None or mb is None else _percentile_interval(ma - mb)


def mean_bootstrap_ci95(values) -> dict:
    """Mean over seeds with its 95% percentile-bootstrap interval (`bootstrap_ci`), in the
    layout of `mean_ci95`: `{"mean", "ci95", "n", "per_seed"}` (`per_seed` as given)."""
    v = [x for x in values if x is not None]
    return {
        "mean": float(np.mean(v)) if v else None,
        "ci95": bootstrap_ci(v),
        "n": len(v),
        "per_seed": list(values),
    }
