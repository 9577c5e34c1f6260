"""The held-out evaluation's report from the executed scripts' outcomes."""

from __future__ import annotations

from collections import Counter

import numpy as np

from wmrl.envs.autoresearch.grader import Status


def heldout_se(per_task: list[float]) -> float | None:
    """Standard error of the held-out reward that counts the variance between held-out tasks:
    the standard error of the mean over tasks of the per-task mean rewards,
    `sd(m_1..m_T, ddof=1) / sqrt(T)`.

    The held-out tasks are a sample of a family of tasks, and each task's mean `m_t` is itself
    the mean of k sampled scripts, so `Var(m_t) = s2_between + s2_within / k`: the spread of
    the per-task means estimates both parts at once (a two-stage / cluster sample's standard
    error), where the standard error over the T*k scripts pooled counts only the scripts'
    spread as if they were independent draws from one task. It says how far another draw of
    tasks from the family and of scripts from the policy would move the evaluation. None with
    fewer than two tasks."""
    m = np.asarray(per_task, float)
    return float(np.std(m, ddof=1) / np.sqrt(len(m))) if len(m) >= 2 else None


def heldout_summary(tasks: list, k: int, status: np.ndarray, reward: np.ndarray) -> dict:
    """Mean reward (with its standard errors), status rates and per-task means of k scripts
    per held-out task; status [T*k] int, reward [T*k] float64 (NaN where ungraded), task t's
    scripts at [t*k, (t+1)*k).

    `heldout_reward_se` is `heldout_se` over the tasks with a graded script (between-task
    variance counted; with a single task, the standard error over its scripts);
    `heldout_reward_se_scripts` is the standard error over the graded scripts pooled (the
    evaluation's sampling noise alone, the older figure)."""
    graded = status != int(Status.UNGRADED)
    counts = Counter(Status(int(s)).name for s in status[graded])
    per_task = {}
    for i, t in enumerate(tasks):
        rs = reward[i * k : (i + 1) * k][graded[i * k : (i + 1) * k]]
        per_task[t.id] = float(np.mean(rs)) if len(rs) else None
    scripts_se = (
        float(np.std(reward[graded], ddof=1) / np.sqrt(graded.sum())) if graded.sum() > 1 else None
    )
    task_se = heldout_se([m for m in per_task.values() if m is not None])
    return {
        "heldout_reward": float(np.mean(reward[graded])) if graded.any() else None,
        "heldout_reward_se": scripts_se if task_se is None else task_se,
        "heldout_reward_se_scripts": scripts_se,
        "heldout_tasks": sum(m is not None for m in per_task.values()),
        "heldout_status_rates": {
            s.name: counts.get(s.name, 0) / max(int(graded.sum()), 1)
            for s in Status
            if s != Status.UNGRADED
        },
        "heldout_per_task": per_task,
        "heldout_ungraded": int((~graded).sum()),
    }
