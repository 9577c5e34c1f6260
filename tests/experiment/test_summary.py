"""The held-out curve's figures every summary reports, on hand-written evaluations."""

import math

from wmrl.experiment.summary import curve_figures, finite_mean, first_reaching, heldout_curve

EVALS = [
    {"step": 0, "wall_time_s": 0.0, "real_executions": 0, "heldout_reward": 0.40},
    {"step": 2, "wall_time_s": 50.0, "real_executions": 64, "heldout_reward": None},
    {"step": 4, "wall_time_s": 90.0, "real_executions": 128, "heldout_reward": 0.55},
    {"step": 6, "wall_time_s": 140.0, "real_executions": 192, "heldout_reward": 0.50},
]


def test_warm_start_final_and_best():
    assert curve_figures(EVALS, "heldout_reward") == {
        "warmstart_heldout_reward": 0.40, "final_heldout_reward": 0.50,
        "best_heldout_reward": 0.55,
    }  # fmt: skip


def test_the_first_evaluation_that_reaches_the_target_gives_the_cost():
    assert first_reaching(EVALS, "heldout_reward", 0.5, "wall_time_s") == 90.0
    assert first_reaching(EVALS, "heldout_reward", 0.5, "real_executions") == 128
    assert first_reaching(EVALS, "heldout_reward", 0.4, "step") == 0  # the warm start
    assert first_reaching(EVALS, "heldout_reward", 0.56, "step") is None
    # A float32 mean stored as 0.54999998 reaches 0.55 within the tolerance only.
    stored = [{"m": 0.54999998, "step": 3}]
    assert first_reaching(stored, "m", 0.55, "step") is None
    assert first_reaching(stored, "m", 0.55, "step", tolerance=1e-6) == 3


def test_the_curve_and_the_means_over_defined_values():
    assert heldout_curve(EVALS[:2], ("step", "heldout_reward", "heldout_reward_se")) == [
        {"step": 0, "heldout_reward": 0.40, "heldout_reward_se": None},
        {"step": 2, "heldout_reward": None, "heldout_reward_se": None},
    ]
    assert finite_mean([0.5, None, math.nan, 0.25]) == 0.375
    assert finite_mean([None, math.nan]) is None
