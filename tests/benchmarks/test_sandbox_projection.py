"""The on-paper projection (wmrl/benchmarks/sandbox_projection.py) against hand-computed
schedules."""

import json

import numpy as np
import pytest

from wmrl.benchmarks.sandbox_projection import makespan, project, run


def test_makespan_is_greedy_list_scheduling_in_submission_order():
    assert makespan(np.array([3.0, 1.0, 1.0, 1.0]), 2) == 3.0  # 3 | 1+1+1
    assert makespan(np.array([1.0, 1.0, 1.0, 3.0]), 2) == 4.0  # 1+1 | 1+3: order matters
    assert makespan(np.array([2.0] * 5), 8) == 2.0
    assert makespan(np.array([]), 4) == 0.0


def test_projection_with_constant_costs(tmp_path):
    costs = np.array([1.0])  # every script 1 s: real = 3 + ceil(32/S), wmrl = max(3, ceil(8/S))
    for slots, real, wmrl in [(2, 3 + 16, 4), (8, 3 + 4, 3), (32, 3 + 1, 3)]:
        r = project(costs, slots, 32, 8, 3.0, trials=3)
        assert r["real_step_s"] == pytest.approx(real)
        assert r["wmrl_step_s"] == pytest.approx(wmrl)
        assert r["speedup"] == pytest.approx(real / wmrl)
    log = tmp_path / "executions.jsonl"
    log.write_text("".join(json.dumps({"runtime_s": t}) + "\n" for t in (0.5, 30.0)))
    res = run(str(log), [8], learner_s=3.0, overhead_s=0.1, time_limit_s=20.0, trials=10)
    assert res["cost_max_s"] == pytest.approx(20.1)  # capped at the time limit, plus overhead
    assert res["tiny_batch"][0]["scripts_per_step"] == 32
    assert res["batch_grows_with_slots"][0]["learner_s"] == pytest.approx(3.0)
