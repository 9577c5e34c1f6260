"""The held-out evaluation's standard errors on hand numbers."""

from types import SimpleNamespace

import numpy as np
import pytest

from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.evaluation import heldout_se, heldout_summary


def test_heldout_se_counts_the_spread_between_tasks():
    # 3 tasks x 2 scripts, the last script ungraded (infrastructure failure): per-task means
    # 0.2, 0.6, 1.0 -> sd 0.4, SE 0.4 / sqrt(3). Pooled over the 5 graded scripts: mean 0.52,
    # sample variance 0.488 / 4 = 0.122, SE sqrt(0.122 / 5).
    tasks = [SimpleNamespace(id=f"t{i}") for i in range(3)]
    reward = np.array([0.1, 0.3, 0.5, 0.7, 1.0, np.nan])
    status = np.array([int(Status.VALID)] * 5 + [int(Status.UNGRADED)])
    out = heldout_summary(tasks, 2, status, reward)
    assert out["heldout_per_task"] == pytest.approx({"t0": 0.2, "t1": 0.6, "t2": 1.0})
    assert out["heldout_reward"] == pytest.approx(0.52)
    assert out["heldout_reward_se"] == pytest.approx(0.4 / 3**0.5)
    assert out["heldout_reward_se_scripts"] == pytest.approx((0.122 / 5) ** 0.5)
    assert out["heldout_tasks"] == 3 and out["heldout_ungraded"] == 1
    # Tasks that agree: a small SE although the scripts inside each task spread widely.
    same = heldout_summary(tasks, 2, np.full(6, int(Status.VALID)),
                           np.array([0.1, 0.9, 0.0, 1.0, 0.2, 0.8]))  # fmt: skip
    assert same["heldout_reward_se"] == pytest.approx(0.0, abs=1e-12)
    assert same["heldout_reward_se_scripts"] > 0.15
    # One task: no between-task spread to measure, the scripts' SE stands in.
    one = heldout_summary(tasks[:1], 2, np.full(2, int(Status.VALID)), np.array([0.1, 0.3]))
    assert one["heldout_reward_se"] == pytest.approx(one["heldout_reward_se_scripts"])
    assert heldout_se([0.5]) is None
