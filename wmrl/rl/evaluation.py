"""The held-out evaluation's report from the executed scripts' outcomes."""

from __future__ import annotations

from collections import Counter

import numpy as np

from wmrl.envs.autoresearch.grader import Status


def heldout_summary(tasks: list, k: int, status: np.ndarray, reward: np.ndarray) -> dict:
    """Mean reward (with its standard error over the scripts), status rates and per-task
    means of k scripts per held-out task; status [T*k] int, reward [T*k] float64 (NaN where
    ungraded), task t's scripts at [t*k, (t+1)*k)."""
    graded = status != int(Status.UNGRADED)
    counts = Counter(Status(int(s)).name for s in status[graded])
    per_task = {}
    for i, t in enumerate(tasks):
        rs = reward[i * k : (i + 1) * k][graded[i * k : (i + 1) * k]]
        per_task[t.id] = float(np.mean(rs)) if len(rs) else None
    return {
        "heldout_reward": float(np.mean(reward[graded])) if graded.any() else None,
        # Its standard error over the scripts (sampling noise of the evaluation itself).
        "heldout_reward_se": (
            float(np.std(reward[graded], ddof=1) / np.sqrt(graded.sum()))
            if graded.sum() > 1
            else None
        ),
        "heldout_status_rates": {
            s.name: counts.get(s.name, 0) / max(int(graded.sum()), 1)
            for s in Status
            if s != Status.UNGRADED
        },
        "heldout_per_task": per_task,
        "heldout_ungraded": int((~graded).sum()),
    }
