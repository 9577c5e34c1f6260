"""What every experiment's `summary.json` says about its held-out curve, computed once.

An evaluation record (a `metrics.jsonl` line of kind `eval`) carries the held-out metric
(`heldout_reward` for AutoResearch, `heldout_success` for embodied), the training wall-clock
at which its policy existed (`wall_time_s`) and the real executions spent so far
(`real_executions`). A run's summary reports, from its evaluations in order:

* `warmstart_<metric>`, `final_<metric>`, `best_<metric>` (`curve_figures`);
* the cost (wall-clock, executions) at the first evaluation that reached the target
  (`first_reaching`; an ungraded evaluation, metric None, reaches nothing);
* the curve itself, a few keys per evaluation (`heldout_curve`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def curve_figures(evals: list[dict], metric: str) -> dict:
    """The warm start's (first evaluation), final and best value of `metric` (an ungraded
    evaluation counts 0 towards the best)."""
    return {
        f"warmstart_{metric}": evals[0][metric],
        f"final_{metric}": evals[-1][metric],
        f"best_{metric}": max((e[metric] or 0.0) for e in evals),
    }


def first_reaching(evals: list[dict], metric: str, target: float, key: str, tolerance: float = 0.0):
    """`key` of the first evaluation whose `metric` is at least `target` - `tolerance`; None
    if none is."""
    for e in evals:
        if e.get(metric) is not None and e[metric] >= target - tolerance:
            return e[key]
    return None


def heldout_curve(evals: list[dict], keys: Iterable[str]) -> list[dict]:
    """`keys` of every evaluation (None where an evaluation lacks one)."""
    keys = tuple(keys)
    return [{k: e.get(k) for k in keys} for e in evals]


def finite_mean(values: Iterable) -> float | None:
    """The mean of the values that are numbers (None and NaN dropped); None if none is."""
    kept = [float(v) for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(kept)) if kept else None
