"""The embodied benchmark's statistics and its JSON, on hand-written finished runs (the
benchmark reuses a run whose summary.json exists instead of training it)."""

import json
import re

import numpy as np
import pytest

from wmrl.benchmarks import embodied as bench
from wmrl.experiment.renamed import KEYS
from wmrl.experiment.stats import bootstrap_ci, bootstrap_diff_ci


def test_bootstrap_interval_brackets_the_mean_and_shrinks_with_agreement():
    lo, hi = bootstrap_ci([100, 200, 300, 400])
    assert lo < 250 < hi and lo >= 100 and hi <= 400
    assert bootstrap_ci([5, 5, 5]) == [5.0, 5.0]
    assert bootstrap_ci([]) is None


def test_difference_interval_by_hand_and_against_the_normal_approximation():
    # no spread in either mode: the difference is exact
    assert bootstrap_diff_ci([0.5, 0.5], [0.4, 0.4, 0.4]) == pytest.approx([0.1, 0.1])
    assert bootstrap_diff_ci([], [0.4]) is None
    assert bootstrap_diff_ci([0.5, None], [0.4]) == pytest.approx([0.1, 0.1])
    # many seeds: the percentile interval approaches mean difference +- 1.96 x its standard
    # error, sqrt(var_a / n_a + var_b / n_b) (population variances: the bootstrap's)
    rng = np.random.default_rng(7)
    a, b = rng.normal(0.47, 0.03, 200), rng.normal(0.49, 0.02, 300)
    se = np.sqrt(a.var() / len(a) + b.var() / len(b))
    d = a.mean() - b.mean()
    lo, hi = bootstrap_diff_ci(a, b, reps=20000)
    assert lo == pytest.approx(d - 1.96 * se, abs=0.15 * se)
    assert hi == pytest.approx(d + 1.96 * se, abs=0.15 * se)


def test_to_target_and_budget_by_hand():
    curve = [
        {"heldout_success": s, "real_executions": e, "wall_time_s": w}
        for s, e, w in ((0.3, 0, 0.0), (0.4, 100, 5.0), (0.5, 200, 9.0))
    ]
    assert bench.to_target(curve, 0.45, "real_executions") == (200, True)
    assert bench.to_target(curve, 0.45, "wall_time_s") == (9.0, True)
    assert bench.to_target(curve, 0.9, "real_executions") == (200, False)  # censored: the total
    assert bench.success_at_budget(curve, 150) == 0.4
    # 135 of 300 successes is the target 0.45, also as a float32 mean stored in a run
    at = [{"heldout_success": float(np.float32(135) / np.float32(300)), "real_executions": 64}]
    assert at[0]["heldout_success"] < 0.45
    assert bench.to_target(at, 0.45, "real_executions") == (64, True)
    below = [{"heldout_success": 134 / 300, "real_executions": 64}]
    assert bench.to_target(below, 0.45, "real_executions") == (64, False)


def _old_keys(record):
    """`record` under the key names runs wrote before `wmrl.experiment.renamed.KEYS`."""
    old = {new: old for old, new in KEYS.items()}
    if isinstance(record, dict):
        return {old.get(k, k): _old_keys(v) for k, v in record.items()}
    return [_old_keys(v) for v in record] if isinstance(record, list) else record


def fake_run(wd, success, episodes, wm_episodes=0, auc=0.6, cost_s=0.0, legacy=False):
    """A finished run's summary.json and metrics.jsonl (`legacy`: under the old key names)."""
    wd.mkdir(parents=True)
    curve = [
        {
            "step": i,
            "real_executions": e,
            "wm_episodes": 0,
            "wall_time_s": float(i),
            "heldout_success": s,
            "heldout_success_se": 0.02,
        }
        for i, (s, e) in enumerate(zip(success, episodes, strict=True))
    ]
    summary = {
        "target_success": 0.45,
        "steps": len(curve) - 1,
        "heldout_curve": curve,
        "warmstart_heldout_success": success[0],
        "final_heldout_success": success[-1],
        "real_executions": episodes[-1],
        "wm_episodes": wm_episodes,
        "wall_time_s": float(len(curve) - 1),
        "stage_real_executions": {"expert_demos": 240, "wm_pretrain_rollouts": 50},
        "real_episode_cost_s": cost_s,
    }
    (wd / "summary.json").write_text(json.dumps(summary))
    steps = [
        {
            "kind": "step",
            "step": i + 1,
            "anchor_auc": auc,
            "real_success": 0.4,
            "imagined_success": 0.5,
            "imagined_success_calibrated": 0.45,
            "bias_reduction": 0.1,
            "wm_stream_corr": 0.1 * i,
            "wm_groups_flat": 0.25,
            "residual_before": 0.2,
        }
        for i in range(4)
    ]
    if legacy:
        summary, steps = _old_keys(summary), _old_keys(steps)
        (wd / "summary.json").write_text(json.dumps(summary))
    (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))


def test_benchmark_json_on_finished_runs(tmp_path):
    # real reaches 0.45 at 600 and 900 episodes; wmrl at 150 and 300 (of 300 and 400)
    fake_run(tmp_path / "real_s0", [0.3, 0.4, 0.46], [0, 300, 600])
    fake_run(tmp_path / "real_s1", [0.3, 0.44, 0.47], [0, 600, 900])
    fake_run(tmp_path / "wmrl_s0", [0.3, 0.45, 0.5], [0, 150, 300], 900, auc=0.7)
    fake_run(tmp_path / "wmrl_s1", [0.3, 0.4, 0.46], [0, 150, 300], 900, auc=0.5)
    for m in bench.ABLATIONS:
        fake_run(tmp_path / f"{m}_s0", [0.3, 0.35, 0.4], [0, 150, 300], 900)
    res = bench.run_benchmark(tmp_path, seeds=2, ablation_seeds=1)
    assert res["real_executions_to_target"]["real"]["mean"] == 750
    assert res["real_executions_to_target"]["wmrl"]["mean"] == 225
    assert res["real_executions_to_target"]["real"]["per_seed"] == [600, 900]
    assert res["ratio_real_over_wmrl"]["executions_to_target"] == pytest.approx(750 / 225)
    assert res["ratio_real_over_wmrl"][
        "executions_to_target_counting_wm_pretrain_rollouts"
    ] == pytest.approx(750 / 275)
    assert res["reached_target"]["wm_only"] == 0  # never reached: censored at its total
    assert res["success_at_budget"]["budget_real_executions"] == 300
    # within 300 real episodes: seed 0 of real had its 0.4 evaluation, seed 1 only its warm start
    assert res["success_at_budget"]["real"]["mean"] == pytest.approx((0.4 + 0.3) / 2)
    assert res["success_at_budget"]["wmrl"]["mean"] == pytest.approx(0.48)
    lo, hi = res["final_heldout_success"]["wmrl"]["ci95"]
    assert lo <= 0.48 <= hi
    assert res["wm_diagnostics"]["anchor_auc_by_quarter"] == pytest.approx([0.6] * 4)
    assert res["wm_diagnostics"]["wm_stream_corr_by_quarter"] == pytest.approx([0, 0.1, 0.2, 0.3])
    assert res["wm_diagnostics"]["wm_groups_flat_by_quarter"] == pytest.approx([0.25] * 4)
    # the goal: 750 / 225 = 3.3 >= 3 and wmrl's final 0.48 >= real's 0.465
    assert res["goal"]["met"] and res["goal"]["ratio"] == pytest.approx(750 / 225)
    assert res["goal"]["final_wmrl_minus_real"] == pytest.approx(0.48 - 0.465)
    lo, hi = res["goal"]["final_wmrl_minus_real_ci95"]
    assert lo <= 0.48 - 0.465 <= hi
    assert "modelled_robot_time_to_target_s" not in res  # no latency declared
    assert res["real_episode_cost_s"] == 0.0 and "not a robot's" in res["cost_note"]
    json.dumps(res)  # serialisable
    assert np.isfinite(res["benchmark_s"])
    # the same runs read at --target=0.4: real at 300 and 600, wmrl at 150 and 150
    res = bench.run_benchmark(tmp_path, seeds=2, ablation_seeds=1, target=0.4)
    assert res["target_success"] == 0.4
    assert res["real_executions_to_target"]["real"]["per_seed"] == [300, 600]
    assert res["real_executions_to_target"]["wmrl"]["per_seed"] == [150, 150]
    assert res["ratio_real_over_wmrl"]["executions_to_target"] == pytest.approx(450 / 150)


def test_runs_written_under_the_old_key_names_are_read_as_todays(tmp_path):
    """Finished runs whose summary.json and metrics.jsonl have `real_episodes`,
    `stage_real_episodes`, `bias_before`, ... (written before one name) give the same
    benchmark JSON as the same runs under today's keys."""
    results = []
    for legacy in (False, True):
        root = tmp_path / f"legacy_{legacy}"
        fake_run(root / "real_s0", [0.3, 0.4, 0.46], [0, 300, 600], legacy=legacy)
        fake_run(root / "wmrl_s0", [0.3, 0.45, 0.5], [0, 150, 300], 900, legacy=legacy)
        res = bench.run_benchmark(root, seeds=1, ablation_seeds=0)
        results.append({k: v for k, v in res.items() if k not in ("benchmark_s", "machine")})
    old = json.loads((tmp_path / "legacy_True" / "wmrl_s0" / "summary.json").read_text())
    assert "real_episodes" in old and "real_executions" not in old
    assert "bias_before" in (tmp_path / "legacy_True" / "wmrl_s0" / "metrics.jsonl").read_text()
    assert results[0] == results[1]
    assert results[1]["real_executions_to_target"]["wmrl"]["per_seed"] == [150]
    assert results[1]["stage_real_executions"]["wm_pretrain_rollouts"] == 50


def test_goal_not_met_and_declared_latency(tmp_path):
    """wmrl 3.3x cheaper but ending lower: the goal is not met; a declared per-episode latency
    gives the modelled robot time to target (episodes x cost), labelled as a model."""
    fake_run(tmp_path / "real_s0", [0.3, 0.4, 0.50], [0, 300, 600], cost_s=20.0)
    fake_run(tmp_path / "wmrl_s0", [0.3, 0.46, 0.46], [0, 180, 300], 900, cost_s=20.0)
    res = bench.run_benchmark(tmp_path, seeds=1, ablation_seeds=0)
    assert res["goal"]["ratio"] == pytest.approx(600 / 180) and not res["goal"]["met"]
    assert res["modelled_robot_time_to_target_s"]["real"]["mean"] == pytest.approx(600 * 20.0)
    assert res["modelled_robot_time_to_target_s"]["wmrl"]["mean"] == pytest.approx(180 * 20.0)
    assert "a model, not a measurement" in res["cost_note"]


def test_a_finished_run_with_another_config_is_refused_not_reused(tmp_path):
    """--steps=80 over a folder of finished 40-step runs must not report them as 80-step
    ones: the benchmark refuses, naming the field. A copied folder (another init_dir in the
    saved config) is still reused."""
    from wmrl.config_errors import ConfigError

    for m in bench.MAIN_MODES:
        wd = tmp_path / f"{m}_s0"
        fake_run(wd, [0.3, 0.46], [0, 300], 900 if m == "wmrl" else 0)
        saved = bench.make_config(False, 0, m, 0, "/elsewhere/init", -1.0)
        (wd / "config.json").write_text(saved.to_json_best_effort())
    res = bench.run_benchmark(tmp_path, seeds=1, ablation_seeds=0)
    assert res["final_heldout_success"]["real"]["per_seed"] == [0.46]
    with pytest.raises(ConfigError, match=r"real_s0 holds a run with a different.*rl\.steps"):
        bench.run_benchmark(tmp_path, seeds=1, ablation_seeds=0, steps=80)
    # the target is analysis: the same runs are read at another --target, from their curves
    # (the summaries saved 0.45)
    res = bench.run_benchmark(tmp_path, seeds=1, ablation_seeds=0, target=0.5)
    assert res["target_success"] == 0.5 and res["reached_target"] == {"real": 0, "wmrl": 0}
    assert res["real_executions_to_target"]["real"]["per_seed"] == [300]  # censored at the total
    assert res["ratio_real_over_wmrl"]["executions_to_target"] is None and not res["goal"]["met"]
    res = bench.run_benchmark(tmp_path, seeds=1, ablation_seeds=0, target=0.3)
    assert res["reached_target"] == {"real": 1, "wmrl": 1}
    assert res["real_executions_to_target"]["wmrl"]["per_seed"] == [0]  # the warm start's 0.3


def test_set_overrides_parse_by_the_fields_type_and_bad_ones_name_the_flag(tmp_path):
    c = bench.make_config(
        False,
        0,
        "wmrl",
        3,
        "/x/init",
        -1.0,
        obs="image",
        overrides=("demos.episodes=2000", "image.bc_shift=0.02", "image.film=false"),
    )
    assert c.demos.episodes == 2000 and isinstance(c.demos.episodes, int)
    assert c.image.bc_shift == 0.02 and c.image.film is False and c.obs == "image"
    for item, msg in (
        ("demos.episodez=3", "no config field 'demos.episodez'"),
        ("demos.episodes=many", r"'many' is not of type int \(config.demos.episodes\)"),
        ("image.film=yes", r"'yes' is not of type bool"),
        ("demos=3", "scalar field"),
        ("demos.episodes", "expected field=value"),
        ("obs=image", "config.obs is set by --obs"),
        ("rl.seed=4", "config.rl.seed is set by --seeds"),
        ("target_success=0.3", "set by --target"),
    ):
        with pytest.raises(ValueError, match=r"--set=" + re.escape(item) + ".*" + msg):
            bench.make_config(False, 0, "wmrl", 0, "/x/init", -1.0, overrides=(item,))
    # a folder of runs made with other overrides is refused, naming the field
    for m in bench.MAIN_MODES:
        wd = tmp_path / f"{m}_s0"
        fake_run(wd, [0.3, 0.46], [0, 300], 900 if m == "wmrl" else 0)
        saved = bench.make_config(False, 0, m, 0, "/x/init", -1.0, overrides=("demos.episodes=9",))
        (wd / "config.json").write_text(saved.to_json_best_effort())
    res = bench.run_benchmark(tmp_path, seeds=1, ablation_seeds=0, overrides=("demos.episodes=9",))
    assert res["overrides"] == ["demos.episodes=9"] and res["observations"] == "state"
    from wmrl.config_errors import ConfigError

    with pytest.raises(ConfigError, match=r"demos\.episodes"):
        bench.run_benchmark(tmp_path, seeds=1, ablation_seeds=0)
