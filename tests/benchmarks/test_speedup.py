"""The speedup benchmark: its figures against hand-computed numbers, the CLI on hand-written
finished runs (fast), and one end-to-end run of the tiny setting (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.rl_fixtures import load_config
from tests.support.speedup_fixtures import ev, finished_benchmark
from wmrl.autoresearch import config as rlconfig
from wmrl.autoresearch.experiment import time_to_target
from wmrl.benchmarks import speedup_figures, speedup_runner

ROOT = Path(__file__).resolve().parents[2]


REAL = [ev(0.0, 0.20), ev(50.0, 0.30), ev(100.0, 0.45), ev(150.0, 0.40)]
WMRL = [ev(0.0, 0.20), ev(20.0, 0.41), ev(40.0, 0.50), ev(60.0, 0.52)]


def test_time_to_reward_first_eval_at_or_above():
    assert time_to_target(REAL, 0.40) == 100.0  # 0.45 at t=100 is the first >= 0.40
    assert time_to_target(REAL, 0.45) == 100.0
    assert time_to_target(REAL, 0.20) == 0.0  # the warm start already has it
    assert time_to_target(REAL, 0.46) is None
    assert time_to_target([ev(0.0, None), ev(5.0, 0.3)], 0.1) == 5.0  # ungraded skipped


def test_time_to_target_ratio():
    # real's final reward is 0.40, first reached by real at t=100 and by wmrl at t=20 (0.41).
    out = speedup_figures.time_to_target_ratio({"real": REAL, "wmrl": WMRL})
    assert out["target"] == 0.40 and out["t_real"] == 100.0 and out["t_mode"] == 20.0
    assert out["ratio"] == pytest.approx(5.0) and out["note"] is None
    # wmrl never reaches 0.40: no ratio, and the note says so.
    slow = [ev(0.0, 0.20), ev(30.0, 0.35)]
    out = speedup_figures.time_to_target_ratio({"real": REAL, "wmrl": slow})
    assert out["ratio"] is None and out["t_mode"] is None and "never reached" in out["note"]
    # real ends where the warm start was: reached at t=0 by both, no ratio.
    flat = [ev(0.0, 0.20), ev(50.0, 0.10), ev(90.0, 0.20)]
    out = speedup_figures.time_to_target_ratio({"real": flat, "wmrl": WMRL})
    assert out["ratio"] is None and out["t_real"] == 0.0 and "warm start" in out["note"]
    # real's own warm-start evaluation is at or above its final reward (0.30 >= 0.25) while
    # wmrl's step-0 evaluation (0.20) is below it: t_real = 0, t_wmrl = 20, and 0 / 20 would
    # be a ratio of 0 made of the step-0 evaluation's noise; no ratio.
    noisy = [ev(0.0, 0.30), ev(50.0, 0.28), ev(100.0, 0.25)]
    out = speedup_figures.time_to_target_ratio({"real": noisy, "wmrl": WMRL})
    assert out["t_real"] == 0.0 and out["t_mode"] == 20.0 and out["ratio"] is None
    assert out["note"].startswith("real's warm-start evaluation") and "warm start" in out["note"]


def test_executions_to_target_ratio_with_and_without_the_wms_pretraining():
    """Real executions at the first evaluation reaching the target: real 24 (0.45 at its
    third), wmrl 6 (0.41 at its second); 24 / 6 = 4, and counting 18 executions spent on
    the WM before RL 24 / (6 + 18) = 1."""
    real = [ev(0.0, 0.20, 0), ev(50.0, 0.30, 12), ev(100.0, 0.45, 24), ev(150.0, 0.40, 36)]
    wmrl = [ev(0.0, 0.20, 0), ev(20.0, 0.41, 6), ev(40.0, 0.50, 12)]
    curves = {"real": real, "wmrl": wmrl}
    assert speedup_figures.executions_to_target(real, 0.40) == 24
    assert speedup_figures.executions_to_target(wmrl, 0.60) is None
    out = speedup_figures.executions_to_target_ratio(curves, 0.40, "wmrl", pretraining=18)
    assert out == {"e_real": 24, "e_mode": 6, "ratio": 4.0, "ratio_with_pretraining": 1.0}
    never = speedup_figures.executions_to_target_ratio(curves, 0.60, "wmrl", pretraining=18)
    assert never["ratio"] is None and never["ratio_with_pretraining"] is None
    # The warm start already had it: reached with no execution, no ratio.
    warm = speedup_figures.executions_to_target_ratio(curves, 0.20, "wmrl", pretraining=18)
    assert warm["e_mode"] == 0 and warm["ratio"] is None
    # Only real's warm start had it (0 executions against wmrl's 6): no ratio of 0 either.
    only_real = {"real": [ev(0.0, 0.45, 0), ev(50.0, 0.40, 12)], "wmrl": wmrl}
    out = speedup_figures.executions_to_target_ratio(only_real, 0.40, "wmrl", pretraining=18)
    assert out["e_real"] == 0 and out["e_mode"] == 6 and out["ratio"] is None
    assert out["ratio_with_pretraining"] is None


def test_analyse_reports_the_executions_ratios(tmp_path):
    """On the hand-written runs (real's final 0.4 reached at 32 executions; wmrl's 0.45 at 4)
    with 12 WM pretraining executions in wmrl's summary: 8x, and 32 / 16 = 2x counting them;
    a run saved before the count was kept has no second ratio."""
    from wmrl.benchmarks import speedup

    finished_benchmark(tmp_path)
    runs = speedup_runner.load_runs(tmp_path, ("real", "wmrl"))
    plain = speedup.analyse(runs)
    assert plain["executions_to_target"] == {"real": 32, "wmrl": 4}
    assert plain["executions_to_target_ratio"] == 8.0
    assert plain["executions_to_target_ratio_with_pretraining"] is None
    runs["wmrl"]["summary"]["wm_pretraining_executions"] = {"corpus": 10, "policy_samples": 2,
                                                            "total": 12}  # fmt: skip
    out = speedup.analyse(runs)
    assert out["executions_to_target_ratio_with_pretraining"] == 2.0
    assert out["wm_pretraining_executions"] == {"wmrl": 12}
    text = speedup.format_table(out)
    assert "executions_to_target_ratio (real / wmrl, same target): 8.00" in text
    assert "pretraining executions (12): 2.00" in text
    # Over seeds the count is a mean (12 and 13 executions: 12.5), printed as one.
    other = speedup.analyse(runs)
    other["wm_pretraining_executions"] = {"wmrl": 13}
    over = speedup.aggregate([out, other], [0, 1])
    assert over["wm_pretraining_executions"] == {"wmrl": 12.5}
    assert "pretraining executions (12.5): " in speedup.format_table(over)


def test_reward_at_equal_wall_clock():
    # Modes reach 150 s and 60 s: compare at 60 s. real's last eval at or before 60 is t=50.
    t, rewards = speedup_figures.reward_at_equal_wall_clock({"real": REAL, "wmrl": WMRL})
    assert t == 60.0
    assert rewards == {"real": 0.30, "wmrl": 0.52}
    assert speedup_figures.reward_at_wall_clock(REAL, 49.9) == 0.20
    assert speedup_figures.reward_at_wall_clock([ev(0.0, 0.1), ev(10.0, None)], 10.0) == 0.1
    assert speedup_figures.reward_at_wall_clock([ev(5.0, 0.1)], 1.0) is None


def test_noise_robust_views_of_equal_wall_clock():
    # Over [0, 60]: real holds 0.20 for 50 s then 0.30 for 10 s; wmrl 0.20, 0.41, 0.50 for
    # 20 s each (its eval at 60 s starts a new segment of length 0).
    assert speedup_figures.time_average_reward(REAL, 60.0) == pytest.approx(
        (50 * 0.2 + 10 * 0.3) / 60
    )
    assert speedup_figures.time_average_reward(WMRL, 60.0) == pytest.approx(
        (20 * 0.2 + 20 * 0.41 + 20 * 0.5) / 60
    )
    assert speedup_figures.time_average_reward(REAL, 0.0) is None
    assert speedup_figures.recent_mean_reward(REAL, 60.0) == pytest.approx(0.25)  # only two so far
    assert speedup_figures.recent_mean_reward(WMRL, 60.0) == pytest.approx((0.41 + 0.5 + 0.52) / 3)
    assert speedup_figures.recent_mean_reward([ev(0.0, None), ev(5.0, 0.3)], 10.0) == 0.3
    assert speedup_figures.recent_mean_reward(REAL, -1.0) is None


def test_standard_error_of_the_evaluation_at_equal_wall_clock():
    curve = [
        {**ev(0.0, 0.2), "heldout_reward_se": 0.05},
        {**ev(30.0, 0.4), "heldout_reward_se": 0.03},
    ]
    assert speedup_figures.se_at_wall_clock(curve, 29.0) == 0.05
    assert speedup_figures.se_at_wall_clock(curve, 30.0) == 0.03
    assert speedup_figures.se_at_wall_clock(REAL, 60.0) is None  # runs from before the field
    assert speedup_figures.se_at_wall_clock(curve, -1.0) is None


def step(n, wall, execute, anchor_fraction=1.0):
    return {"step": n, "wall_time_s": wall, "execute_s": execute,
            "anchor_fraction": anchor_fraction}  # fmt: skip


def test_step_times_from_cumulative_wall_clock():
    steps = [step(2, 18.0, 0), step(1, 10.0, 0), step(3, 26.5, 0)]  # order does not matter
    assert speedup_figures.step_times(steps) == [10.0, 8.0, 8.5]


def test_amdahl_hand_numbers():
    # real: cumulative 10, 18, 26, 34 -> steps 10, 8, 8, 8; warmup 1 -> T_real = 8.
    # execute_s 5, 6, 6, 6 -> E_real = 6. wmrl anchors a = 0.25 (first step ignored).
    # T_free = (8 - 6) + 0.25 * 6 = 3.5; bound = 8 / 3.5 = 16/7.
    # wmrl: cumulative 12, 16, 20, 24 -> T_wmrl = 4; per-step 8 / 4 = 2; reached 2 / (16/7).
    real = [step(1, 10, 5), step(2, 18, 6), step(3, 26, 6), step(4, 34, 6)]
    wmrl = [step(1, 12, 9, 0.5), step(2, 16, 1, 0.25), step(3, 20, 1, 0.25), step(4, 24, 1, 0.25)]
    out = speedup_figures.amdahl(real, wmrl, warmup=1)
    assert out["real_step_s"] == pytest.approx(8.0)
    assert out["real_execute_s"] == pytest.approx(6.0)
    assert out["anchor_fraction"] == pytest.approx(0.25)
    assert out["free_wm_step_s"] == pytest.approx(3.5)
    assert out["execute_share"] == pytest.approx(0.75)
    assert out["amdahl_bound"] == pytest.approx(16 / 7)
    assert out["per_step_speedup"] == pytest.approx(2.0)
    assert out["amdahl_fraction_reached"] == pytest.approx(2.0 * 7 / 16)
    # warmup 0 keeps the compile steps: T_real = 34/4, E_real = 23/4, a = 1.25/4, T_wmrl = 6.
    out = speedup_figures.amdahl(real, wmrl, warmup=0)
    T, E, a = 8.5, 5.75, 0.3125
    assert out["amdahl_bound"] == pytest.approx(T / ((T - E) + a * E))
    assert out["per_step_speedup"] == pytest.approx(T / 6.0)
    # one step only: the warmup cannot drop it.
    out = speedup_figures.amdahl([step(1, 10, 4)], [step(1, 5, 1, 0.5)], warmup=1)
    assert out["amdahl_bound"] == pytest.approx(10 / (6 + 2))
    assert out["per_step_speedup"] == pytest.approx(2.0)
    assert speedup_figures.amdahl([], wmrl)["amdahl_bound"] is None


def test_calibration_mae_and_bins():
    pairs = [
        {"r_wm": 0.05, "r_cal": 0.15, "r_env": 0.2},
        {"r_wm": 0.15, "r_cal": 0.25, "r_env": 0.2},
        {"r_wm": 0.95, "r_cal": 0.75, "r_env": 0.8},
    ]
    cal = speedup_figures.calibration(pairs, bins=2)
    assert cal["n"] == 3
    assert cal["raw"]["mae"] == pytest.approx((0.15 + 0.05 + 0.15) / 3)
    assert cal["debiased"]["mae"] == pytest.approx((0.05 + 0.05 + 0.05) / 3)
    # two bins over [0, 1]: [0, 0.5) holds the first two pairs, [0.5, 1] the third.
    assert cal["raw"]["score"] == pytest.approx([0.10, 0.95])
    assert cal["raw"]["real"] == pytest.approx([0.20, 0.80])


def test_static_check_precision_and_recall_hand_numbers():
    pair = lambda status, verdict: {"status": status, "static_status": verdict}
    pairs = [
        pair(1, "RUNTIME_ERROR"),
        pair(1, "RUNTIME_ERROR"),
        pair(2, "RUNTIME_ERROR"),  # right
        pair(5, "RUNTIME_ERROR"),  # wrong: it ran
        pair(1, None),
        pair(5, None),
        pair(0, "MALFORMED"),  # one real RUNTIME_ERROR missed
    ]
    steps = [{"static_runtime_error": 3, "static_malformed": 1}, {"static_runtime_error": 2}]
    got = speedup_figures.static_check_stats(pairs, steps)
    assert got["flagged_runtime_error"] == 4 and got["precision"] == 3 / 4
    assert got["anchor_runtime_errors"] == 3 and got["recall"] == 2 / 3
    assert got["wm_rows_static_runtime_error"] == 5 and got["wm_rows_static_malformed"] == 1
    assert speedup_figures.static_check_stats([{"status": 5}], []) is None  # `real`: no verdicts


def test_within_group_correlation_hand_numbers():
    def pair(step, task, r_wm, r_env, verdict=None):
        return {"step": step, "task_id": task, "r_wm": r_wm, "r_cal": r_wm, "r_env": r_env,
                "static_status": verdict}  # fmt: skip

    pairs = [
        pair(1, "a", 0.5, 0.1, "RUNTIME_ERROR"), pair(1, "a", 0.6, 0.9),  # stream 0.1, 0.6
        pair(1, "b", 0.7, 0.8), pair(1, "b", 0.3, 0.6),
        pair(2, "a", 0.9, 0.0),  # a group of one: no within-group signal, left out
    ]  # fmt: skip
    got = speedup_figures.within_group_correlation(pairs)
    # Centred: stream (-0.25, 0.25, 0.2, -0.2), raw (-0.05, 0.05, 0.2, -0.2), real (-0.4, 0.4,
    # 0.1, -0.1); correlation = sum(xy) / sqrt(sum(x^2) sum(y^2)).
    assert got["groups"] == 2
    assert got["stream"] == pytest.approx(0.24 / (0.205 * 0.34) ** 0.5)
    assert got["raw_wm"] == pytest.approx(0.08 / (0.085 * 0.34) ** 0.5)
    # Older runs record only `static` (then always MALFORMED, reward 0).
    old = [{**p, "static_status": None, "static": p["static_status"] is not None} for p in pairs]
    assert (
        speedup_figures.stream_reward(old[0]) == 0.0
        and speedup_figures.stream_reward(pairs[0]) == 0.1
    )
    assert speedup_figures.within_group_correlation(pairs[4:])["stream"] is None


def test_eval_se_stats_over_the_graded_evaluations():
    curve = [
        {"wall_time_s": 0.0, "heldout_reward": 0.5, "heldout_reward_se": 0.04},
        {"wall_time_s": 10.0, "heldout_reward": None, "heldout_reward_se": 0.9},  # ungraded
        {"wall_time_s": 20.0, "heldout_reward": 0.6, "heldout_reward_se": 0.02},
        {"wall_time_s": 30.0, "heldout_reward": 0.7},  # a run from before the field
    ]
    st = speedup_figures.eval_se_stats(curve)
    assert st["mean"] == pytest.approx(0.03) and st["max"] == 0.04 and st["n"] == 2
    assert speedup_figures.eval_se_stats(curve[3:]) == {"mean": None, "max": None, "n": 0}


def test_shared_config_budget_and_steps(tmp_path):

    base = load_config()
    c = speedup_runner.shared_config(base, tmp_path)
    assert c.data_dir == str(tmp_path / "shared" / "data")
    assert c.init_dir == str(tmp_path / "shared" / "init")
    assert c.rl.steps == base.rl.steps and c.rl.max_wall_time_s == 0.0
    c = speedup_runner.shared_config(base, tmp_path, budget_s=300.0)
    assert c.rl.max_wall_time_s == 300.0 and c.rl.steps == speedup_runner.UNLIMITED_STEPS
    # every mode evaluated at the same wall-clock points, not by step count: 12 points from
    # 300 / 32 s to 300 s, each 32 ** (1 / 11) = 1.3703 times the previous
    assert c.rl.eval_every == speedup_runner.UNLIMITED_STEPS and c.rl.eval_every_s == 0.0
    pts = np.asarray(c.rl.eval_at_s)
    assert len(pts) == 12 and pts[0] == pytest.approx(9.375) and pts[-1] == pytest.approx(300.0)
    np.testing.assert_allclose(pts[1:] / pts[:-1], 1.370350, rtol=1e-5)
    rlconfig.validate_autoresearch_config(c)  # the grid passes the config's own check
    base.rl.eval_every_s = 20.0  # a cadence the user gave is kept, no grid added
    c = speedup_runner.shared_config(base, tmp_path, budget_s=300.0)
    assert c.rl.eval_every_s == 20.0 and c.rl.eval_at_s == ()
    base.rl.eval_every_s = 0.0
    base.rl.eval_at_s = (50.0, 100.0)  # so are points
    assert speedup_runner.shared_config(base, tmp_path, budget_s=300.0).rl.eval_at_s == (
        50.0,
        100.0,
    )
    base.rl.eval_at_s = ()
    c = speedup_runner.shared_config(base, tmp_path, budget_s=300.0, steps=7)
    assert c.rl.steps == 7 and c.rl.eval_samples == base.rl.eval_samples
    assert speedup_runner.shared_config(base, tmp_path, eval_samples=5).rl.eval_samples == 5
    assert base.data_dir == "" and base.rl.max_wall_time_s == 0.0  # the input is not changed
    assert speedup_runner.mode_config(c, "real").mode == "real" and c.mode == "wmrl"


def test_fresh_process_runs_logs_and_reports_failure(tmp_path):
    from tests.support.speedup_fixtures import child_writes

    marker, log = tmp_path / "marker", tmp_path / "run.log"
    seconds = speedup_runner._in_fresh_process(
        child_writes, (str(marker), str(log), False), "x", str(log)
    )
    assert seconds > 0 and int(marker.read_text()) != os.getpid()  # another process wrote it
    assert log.read_text() == "child output\n"
    with pytest.raises(RuntimeError, match=r"(?s)mode_x failed \(exit code 3\).*child output"):
        speedup_runner._in_fresh_process(
            child_writes, (str(marker), str(log), True), "mode_x", str(log)
        )


@pytest.mark.real
def test_a_killed_benchmark_takes_its_mode_process_with_it(tmp_path):
    """SIGKILL to the benchmark's process (no handler runs) still ends the spawned mode
    process: it would otherwise train on into a run directory the next command reuses."""
    import signal
    import time

    marker = tmp_path / "child.pid"
    code = (
        "from tests.support.speedup_fixtures import child_sleeps\n"
        "from wmrl.benchmarks import speedup_runner\n"
        f"speedup_runner._in_fresh_process(child_sleeps, ({str(marker)!r},), 'x', None)\n"
    )
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=root)
    deadline = time.monotonic() + 120
    while not marker.exists() or not marker.read_text():
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    child = int(marker.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(child), "the mode process outlived the benchmark"


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie waits to be reaped, it does not run)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- the CLI on finished runs written by hand (no RL: every mode's summary.json exists) ------


def bench_cmd(workdir, *flags):
    return [sys.executable, "-m", "wmrl.benchmarks.speedup", f"--workdir={workdir}", *flags]


def run_bench(cmd, timeout):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.real
def test_cli_reuses_finished_runs_and_reports(tmp_path):
    finished_benchmark(tmp_path)
    out = tmp_path / "elsewhere" / "result.json"
    proc = run_bench(bench_cmd(tmp_path, f"--out={out}", "--modes=real,wmrl"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reusing the finished run" in proc.stdout and "shared stages" not in proc.stdout
    data = json.loads(out.read_text())
    # real's final 0.4: real first at 40 s, wmrl first at 8 s (0.45) -> 5x.
    assert data["time_to_target_ratio"] == pytest.approx(5.0)
    assert data["final_heldout_reward"] == {"real": 0.4, "wmrl": 0.5}
    # equal wall-clock = 16 s: real's last eval at or before it is t=0 (0.2).
    assert data["heldout_reward_at_equal_wall_clock"] == {"real": 0.2, "wmrl": 0.5}
    assert data["heldout_reward_last3_at_equal_wall_clock"]["real"] == pytest.approx(0.2)
    # per step (first dropped): real 10 s, wmrl 4 s -> 2.5x; Amdahl: 10 / (4 + 0.25*6) = 20/11.
    assert data["per_step_speedup"] == pytest.approx(2.5)
    assert data["amdahl_bound"] == pytest.approx(20 / 11)
    assert data["amdahl_fraction_reached"] == pytest.approx(2.5 * 11 / 20)
    assert data["wall_time_s"] == {"real": 40, "wmrl": 16}
    assert data["real_executions"] == {"real": 32, "wmrl": 8}
    assert data["wm_calls"] == {"real": 0, "wmrl": 32}
    assert set(data["curves"]) == {"real", "wmrl"} and len(data["curves"]["wmrl"]) == 3
    assert data["config"]["rl.steps"] == load_config().rl.steps
    assert data["machine"]["cpu_count"] == os.cpu_count()
    assert (tmp_path / "speedup.png").stat().st_size > 0
    assert "time_to_target_ratio" in proc.stdout and "5.00x" in proc.stdout  # the table


@pytest.mark.real
def test_cli_ablations_and_refused_config(tmp_path):
    modes = (
        "real", "wm_only", "debias_only", "denoise_only", "wmrl", "static_anchors", "permuted_wm",
    )  # fmt: skip
    finished_benchmark(tmp_path, modes)
    proc = run_bench(bench_cmd(tmp_path, "--ablations"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "speedup.json").read_text())
    assert set(data["final_heldout_reward"]) == set(modes)
    # both controls are compared with wmrl seed by seed (the K = 3 proof's two differences)
    assert {"wmrl - static_anchors", "wmrl - permuted_wm"} <= set(data["paired"])
    # wm_only never reaches real's final reward 0.4
    assert data["time_to_target_s"]["wm_only"] is None
    # a mode directory holding another config is refused before anything runs
    (tmp_path / "real" / "summary.json").unlink()
    shared = speedup_runner.shared_config(load_config(), tmp_path)
    other = speedup_runner.mode_config(shared, "real")
    other.seed = other.seed + 123  # a valid config of another run: its seed differs
    (tmp_path / "real" / "config.json").write_text(other.to_json_best_effort())
    proc = run_bench(bench_cmd(tmp_path), timeout=120)
    assert proc.returncode == 2 and "different config" in proc.stderr
    proc = run_bench(bench_cmd(tmp_path, "--modes=real,static_anchors"), timeout=120)
    assert proc.returncode == 2 and "--modes" in proc.stderr


T975 = {1: 12.706204736174698, 2: 4.302652729911275}  # Student-t 0.975 quantiles (tables)


def t_interval(xs):
    """The 95% t-interval of the mean, written out for the test."""
    n = len(xs)
    m = sum(xs) / n
    sd = (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5
    return m, [m - T975[n - 1] * sd / n**0.5, m + T975[n - 1] * sd / n**0.5]


def test_mean_ci95_hand_numbers():
    from wmrl.experiment.stats import mean_ci95

    got = mean_ci95([0.1, 0.3, 0.8])
    # mean 0.4, sd sqrt(0.13), half-width 4.3027 * sqrt(0.13 / 3) = 0.8957
    assert got["mean"] == pytest.approx(0.4) and got["n"] == 3
    assert got["ci95"] == pytest.approx([0.4 - 0.895668, 0.4 + 0.895668], abs=1e-5)
    assert got["ci95"] == pytest.approx(t_interval([0.1, 0.3, 0.8])[1])
    got = mean_ci95([1.0, None, 3.0])  # a seed without the figure: left out, still listed
    assert got["n"] == 2 and got["per_seed"] == [1.0, None, 3.0]
    assert got["ci95"] == pytest.approx([2.0 - 12.706205, 2.0 + 12.706205], abs=1e-5)
    assert mean_ci95([0.5])["ci95"] is None and mean_ci95([None])["mean"] is None


@pytest.mark.real
def test_cli_seeds_paired_differences_hand_numbers(tmp_path):
    # Seed 0: the fixture's runs; seed 1: wmrl evals 0.2, 0.65, 0.7 at 0, 4, 16 s. Equal
    # wall-clock is static_anchors' last evaluation, 10 s. Time-averaged held-out reward over
    # [0, 10]: real 0.2 and static_anchors 0.2 in both seeds; wmrl (8 * 0.2 + 2 * 0.45) / 10 =
    # 0.25, then (4 * 0.2 + 6 * 0.65) / 10 = 0.47. At 10 s: wmrl 0.45, 0.65; static 0.25.
    modes = ("real", "wmrl", "static_anchors")
    finished_benchmark(tmp_path, modes)
    finished_benchmark(tmp_path, modes, 1, [ev(0, 0.2, 0, 0), ev(4, 0.65, 4, 2), ev(16, 0.7, 8, 4)])
    proc = run_bench(bench_cmd(tmp_path, "--seeds=2"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "static_anchors-seed1: reusing" in proc.stdout
    data = json.loads((tmp_path / "speedup.json").read_text())
    assert data["seeds"] == [0, 1] and len(data["per_seed"]) == 2
    assert data["per_seed"][1]["heldout_reward_time_average"]["wmrl"] == pytest.approx(0.47)
    pair = data["paired"]["wmrl - static_anchors"]["heldout_reward_time_average"]
    mean, ci = t_interval([0.05, 0.27])
    assert pair["mean"] == pytest.approx(mean) and pair["ci95"] == pytest.approx(ci)
    assert pair["per_seed"] == pytest.approx([0.05, 0.27])
    pair = data["paired"]["wmrl - static_anchors"]["heldout_reward_at_equal_wall_clock"]
    assert pair["ci95"] == pytest.approx(t_interval([0.20, 0.40])[1])
    assert data["paired"]["wmrl - real"]["heldout_reward_time_average"]["mean"] == (
        pytest.approx(0.16)
    )
    # real's final 0.4, reached by real at 40 s, by wmrl at 8 s and at 4 s: ratios 5 and 10.
    ratio = data["over_seeds"]["time_to_target_ratio"]
    assert ratio["per_seed"] == pytest.approx([5.0, 10.0])
    assert ratio["ci95"] == pytest.approx(t_interval([5.0, 10.0])[1])
    final = data["over_seeds"]["final_heldout_reward"]["wmrl"]
    assert final["mean"] == pytest.approx(0.6) and final["per_seed"] == pytest.approx([0.5, 0.7])
    # the older keys keep their shapes and hold the means over seeds
    assert data["time_to_target_ratio"] == pytest.approx(7.5)
    assert data["final_heldout_reward"] == pytest.approx(
        {"real": 0.4, "wmrl": 0.6, "static_anchors": 0.25}
    )
    assert data["curves"]["wmrl"][1]["heldout_reward"] == 0.45  # the first seed's curves
    assert "paired by seed" in proc.stdout and "wmrl - static_anchors" in proc.stdout
    proc = run_bench(bench_cmd(tmp_path, "--seeds=0"), timeout=120)
    assert proc.returncode == 2 and "--seeds" in proc.stderr
    # Both seeds from the JSON, in a new workdir: nothing runs, the same figures.
    merge = f"--merge={tmp_path / 'speedup.json'}"
    proc = run_bench(bench_cmd(tmp_path / "next", "--seeds=2", merge), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RL seeds [0, 1] taken from" in proc.stdout and "shared stages ->" not in proc.stdout
    again = json.loads((tmp_path / "next" / "speedup.json").read_text())
    assert again["paired"] == data["paired"]
    proc = run_bench(bench_cmd(tmp_path / "next", f"--merge={tmp_path / 'no.json'}"), timeout=120)
    assert proc.returncode == 2 and "--merge" in proc.stderr and "no.json" in proc.stderr


def test_merge_takes_earlier_seeds_and_pairs_them_as_one_run(tmp_path):
    """Seed 0 measured in one workdir, seed 1 in another (two machines): `merge` gives the
    figures of the two-seed benchmark run in one place, hand numbers of the CLI test above;
    a JSON of another benchmark is refused naming `--merge` and what differs."""
    from wmrl.benchmarks import speedup
    from wmrl.config_errors import ConfigError

    modes = ("real", "wmrl", "static_anchors")
    first, second = tmp_path / "first", tmp_path / "second"
    finished_benchmark(first, modes)
    finished_benchmark(second, modes, 1, [ev(0, 0.2, 0, 0), ev(4, 0.65, 4, 2), ev(16, 0.7, 8, 4)])
    config = load_config()
    part = speedup.benchmark(config, first, modes, progress=False, out=tmp_path / "part.json")
    assert part["per_seed"][0]["stages_fingerprint"] is None  # hand-written runs: no stages
    data = speedup.benchmark(config, second, modes, progress=False, seeds=2,
                             merge=[tmp_path / "part.json"])  # fmt: skip
    assert data["process_s"]["reused"] == [f"{m}-seed1" for m in modes]  # seed 0 not rerun
    assert data["seeds"] == [0, 1] and data["merged"]["seeds"] == [0]
    assert data["per_seed"][0]["merged_from"] == str(tmp_path / "part.json")
    pair = data["paired"]["wmrl - static_anchors"]["heldout_reward_time_average"]
    assert pair["per_seed"] == pytest.approx([0.05, 0.27])
    assert pair["ci95"] == pytest.approx(t_interval([0.05, 0.27])[1])
    assert data["over_seeds"]["time_to_target_ratio"]["per_seed"] == pytest.approx([5.0, 10.0])
    assert data["final_heldout_reward"]["wmrl"] == pytest.approx(0.6)
    assert data["curves"]["wmrl"][1]["heldout_reward"] == 0.45  # seed 0's, from the JSON
    assert data["stages_shared"] is True and "merged_from" not in data
    # The merged JSON merges again: all its seeds from it, nothing runs.
    again = speedup.benchmark(config, tmp_path / "empty", modes, progress=False, seeds=2,
                              merge=[second / "speedup.json"], out=tmp_path / "o.json")  # fmt: skip
    assert (tmp_path / "empty" / "speedup.png").stat().st_size > 0
    assert again["paired"] == data["paired"] and again["process_s"]["modes_s"] == {}
    refused = [
        (dict(budget_s=60.0), "--budget_s=None, this one 60.0"),
        (dict(seeds=1, merge=[second / "speedup.json"]), "outside --seeds=1"),
        (dict(modes=("real", "wmrl")), "ran modes"),
        (dict(merge=[tmp_path / "part.json", tmp_path / "part.json"]), "in two files"),
    ]
    for kwargs, message in refused:
        kwargs = {"modes": modes, "seeds": 2, "merge": [tmp_path / "part.json"], **kwargs}
        with pytest.raises(ConfigError, match=r"--merge") as e:
            speedup.benchmark(config, tmp_path / "x", progress=False, **kwargs)
        assert message in str(e.value)
    for field, value in (("rl.group_size", 2 * config.rl.group_size),
                         ("wm.pretrain_steps", config.wm.pretrain_steps + 1)):  # fmt: skip
        other = load_config()  # any field, also one the JSON's `config` does not list
        other.update_from_flattened_dict({field: value})
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            speedup.benchmark(other, tmp_path / "x", modes, progress=False, seeds=2,
                              merge=[tmp_path / "part.json"])  # fmt: skip
    assert "wm.pretrain_steps" not in part["config"] and part["config_all"]["wm.pretrain_steps"]
    # Another machine's paths are not the benchmark's identity.
    moved = load_config()
    moved.data_dir, moved.init_dir = str(tmp_path / "elsewhere"), str(tmp_path / "init2")
    speedup.benchmark(moved, second, modes, progress=False, seeds=2,
                      merge=[tmp_path / "part.json"])  # fmt: skip


def test_stages_fingerprint_is_the_params_bits(tmp_path):
    """The digest of saved params: equal for the same bits saved twice, different for one
    changed bit; for a one-leaf tree, the sha256 of its layout and bytes written out."""
    import hashlib

    from wmrl.benchmarks import speedup
    from wmrl.experiment import stages as xstages

    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    for name in ("a/warmstart", "b/warmstart", "c/warmstart"):
        xstages.save_params(tmp_path / name, params)
    flipped = params["w"].copy()
    flipped.view(np.uint32)[0, 0] ^= 1
    xstages.save_params(tmp_path / "c" / "wm_pretrain", {"w": flipped})
    by_hand = hashlib.sha256(b"['w']:float32:(2, 3);" + params["w"].tobytes()).hexdigest()
    assert xstages.params_digest(tmp_path / "a" / "warmstart") == by_hand
    assert speedup.stages_fingerprint(tmp_path / "b") == {"warmstart": by_hand}
    c = speedup.stages_fingerprint(tmp_path / "c")
    assert c["warmstart"] == by_hand and c["wm_pretrain"] != by_hand
    assert speedup.stages_fingerprint(tmp_path / "missing") is None


def test_seed_configs_share_the_stages(tmp_path):
    from wmrl.autoresearch.stages import _fingerprint

    base = speedup_runner.shared_config(load_config(), tmp_path)
    c1, c2 = speedup_runner.seed_config(base, 1), speedup_runner.seed_config(base, 2)
    assert speedup_runner.seed_config(base, 0).rl.seed == -1  # the one-seed layout, reused
    assert speedup_runner.seeds_of(base, 3) == [0, 1, 2]
    assert rlconfig.trainer_config(c2).seed == 2 and rlconfig.trainer_config(base).seed == 0
    for stage in ("warmstart", "policy_samples", "wm_pretrain"):  # shared: one config
        assert _fingerprint(c1, stage) == _fingerprint(base, stage)
    assert speedup_runner.run_dir(tmp_path, "wmrl", 0) == tmp_path / "wmrl"
    assert speedup_runner.run_dir(tmp_path, "wmrl", 2) == tmp_path / "wmrl-seed2"
    base.rl.seed = -2
    with pytest.raises(rlconfig.ConfigError, match=r"config\.rl\.seed"):
        rlconfig.validate_autoresearch_config(base)


# -- end to end on the tiny setting ----------------------------------------------------------


@pytest.mark.slow
def test_benchmark_end_to_end_tiny(tmp_path):
    from tests.support.rl_fixtures import tiny_flags

    flags = tiny_flags("", "", rl__steps=2)  # '' = the benchmark's shared dirs
    proc = run_bench(bench_cmd(tmp_path / "bench", "--modes=real,wmrl", *flags), timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "bench" / "speedup.json").read_text())
    for key in ("time_to_target_ratio", "final_heldout_reward",
                "heldout_reward_at_equal_wall_clock", "amdahl_bound", "amdahl_fraction_reached",
                "per_step_speedup", "wall_time_s", "real_executions", "wm_calls", "curves",
                "config", "machine"):  # fmt: skip
        assert key in data, key
    assert set(data["final_heldout_reward"]) == {"real", "wmrl"}
    assert (tmp_path / "bench" / "speedup.png").exists()
    # 2 steps x 2 tasks x 2 samples: real executes all 8, wmrl the anchor groups only.
    assert data["real_executions"]["real"] == 8
    assert data["wm_calls"] == {"real": 0, "wmrl": 8}
    assert data["real_executions"]["wmrl"] < 8
    for m in ("real", "wmrl"):
        assert [e["step"] for e in data["curves"][m]] == [0, 2]
        assert json.loads((tmp_path / "bench" / m / "summary.json").read_text())["mode"] == m
    assert (tmp_path / "bench" / "shared" / "init" / "warmstart" / "done.json").exists()
    assert "time_to_target_ratio" in proc.stdout
    # The second executions ratio counts the WM's pretraining executions: here the executed
    # corpus of the one training task (no policy samples), read from the data stage's log.
    log = tmp_path / "bench" / "shared" / "data" / "trajectories" / "executions.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    corpus = sum(r["split"] == "train" and r["task_id"] == "iris-species" for r in records)
    assert corpus == 6 and data["wm_pretraining_executions"] == {"wmrl": corpus}
    assert "executions_to_target_ratio_with_pretraining" in data
    assert f"pretraining executions ({corpus})" in proc.stdout


@pytest.mark.slow
def test_benchmark_end_to_end_tiny_multiturn(tmp_path):
    """`--config=configs/autoresearch_multiturn.py` works unchanged: the tiny
    setting at K = 2, 2 steps of `real` and `wmrl`, every turn of `real` executed."""
    from tests.support.rl_fixtures import tiny_flags
    from wmrl.autoresearch.presets import TINY_MULTITURN_SETTING

    turns = {k.replace(".", "__"): v for k, v in TINY_MULTITURN_SETTING.items()}
    flags = tiny_flags("", "", rl__steps=2, **turns)
    cmd = bench_cmd(
        tmp_path / "bench", "--config=configs/autoresearch_multiturn.py", "--modes=real,wmrl",
        *flags,
    )  # fmt: skip
    proc = run_bench(cmd, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "bench" / "speedup.json").read_text())
    assert set(data["final_heldout_reward"]) == {"real", "wmrl"}
    for key in ("time_to_target_ratio", "amdahl_bound", "per_step_speedup", "curves"):
        assert key in data, key
    # 2 steps x 2 tasks x 2 episodes x 2 turns: real executes every turn of every episode.
    assert data["real_executions"]["real"] == 16
    assert 0 < data["real_executions"]["wmrl"] < 16 and data["wm_calls"]["wmrl"] > 0
    for m in ("real", "wmrl"):
        summary = json.loads((tmp_path / "bench" / m / "summary.json").read_text())
        assert len(summary["final_heldout_reward_by_turn"]) == 2
        assert summary["final_heldout_reward_by_turn"][-1] == pytest.approx(
            summary["final_heldout_reward"]
        )


def test_multiturn_figures_per_mode_over_seeds_and_paired(tmp_path):
    """Multi-turn runs: turn 1, best of K and their difference (the feedback gain)
    per mode, over seeds and paired; single-turn runs give None and no table line."""
    from wmrl.benchmarks import speedup, speedup_report

    by_turn = {  # (seed, mode): warm start's and final policy's best of the first t turns
        (0, "real"): ([0.2, 0.3, 0.35], [0.3, 0.4, 0.5]),
        (0, "wmrl"): ([0.2, 0.3, 0.35], [0.25, 0.45, 0.5]),
        (1, "real"): ([0.2, 0.3, 0.35], [0.2, 0.3, 0.3]),
        (1, "wmrl"): ([0.2, 0.3, 0.35], [0.4, 0.5, 0.6]),
    }
    load = lambda i: speedup_runner.load_runs(tmp_path, ("real", "wmrl"), i)
    for i in (0, 1):
        finished_benchmark(tmp_path, ("real", "wmrl"), i)
    results = [speedup.analyse(load(i)) for i in (0, 1)]
    single = speedup.aggregate(results, [0, 1])
    assert single["final_heldout_feedback_gain"] == {"real": None, "wmrl": None}
    assert "best of K" not in speedup_report.format_table(single)
    for (i, m), (warm, final) in by_turn.items():
        path = speedup_runner.run_dir(tmp_path, m, i) / "summary.json"
        s = json.loads(path.read_text())
        s["warmstart_heldout_reward_by_turn"], s["final_heldout_reward_by_turn"] = warm, final
        s["final_heldout_improved_fraction"] = 0.25 * (i + 1)
        path.write_text(json.dumps(s))
    results = [speedup.analyse(load(i)) for i in (0, 1)]
    assert results[0]["final_heldout_reward_turn1"] == {"real": 0.3, "wmrl": 0.25}
    assert results[0]["final_heldout_reward_best_of_k"] == {"real": 0.5, "wmrl": 0.5}
    assert results[1]["final_heldout_feedback_gain"] == pytest.approx({"real": 0.1, "wmrl": 0.2})
    assert results[1]["warmstart_heldout_feedback_gain"]["real"] == pytest.approx(0.15)
    out = speedup.aggregate(results, [0, 1])
    gain = out["over_seeds"]["final_heldout_feedback_gain"]["wmrl"]  # 0.25, 0.2
    assert gain["per_seed"] == pytest.approx([0.25, 0.2])
    assert gain["ci95"] == pytest.approx(t_interval([0.25, 0.2])[1])
    fraction = out["over_seeds"]["final_heldout_improved_fraction"]["real"]
    assert fraction["mean"] == pytest.approx(0.375)
    pair = out["paired"]["wmrl - real"]["final_heldout_feedback_gain"]  # 0.05, 0.1
    assert pair["per_seed"] == pytest.approx([0.05, 0.1])
    assert out["final_heldout_feedback_gain"]["real"] == pytest.approx(0.15)  # mean of seeds
    text = speedup_report.format_table(out)
    assert "turn 1 -> best of K turns: real 0.2500 -> 0.4000" in text
    assert "final feedback gain (best of K - turn 1): real +0.1500" in text
    assert "wmrl - real, final_heldout_feedback_gain: +0.0750" in text
