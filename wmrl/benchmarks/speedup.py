"""Wall-clock speedup of WMRL over standard GRPO (`real`) on Mini AutoResearch.

    python -m wmrl.benchmarks.speedup --workdir=DIR [--budget_s=S] [--out=FILE.json]
        [--ablations] [--steps=N] [--config=configs/autoresearch_tiny.py --config.rl.steps=...]

Runs the shared stages once into DIR/shared (the data stage in DIR/shared/data, the warm start
and the world-model pretraining in DIR/shared/init, unless the config names other
`data_dir` / `init_dir`), then `real` and `wmrl` (with `--ablations` also `wm_only`,
`debias_only`, `denoise_only`), each in DIR/<mode>, one after the other, every one from the
same warm-start and WM checkpoints with the same seed and sandbox pool size.

Each stage and each mode runs in a fresh process, so no mode inherits another's JIT caches
(otherwise the second mode would skip the sampler's compilation). A mode whose
DIR/<mode>/summary.json exists is reused, and an interrupted mode resumes from its checkpoints,
so rerunning the same command finishes an interrupted benchmark; delete DIR/<mode> to rerun a
mode. A mode directory that holds a run with a different config is refused.

`--budget_s` gives every mode the same RL wall-clock budget (`rl.max_wall_time_s`) and, unless
`--steps` is given, lifts the step limit so that the budget alone ends each run; every mode is
then evaluated at the same training wall-clock points instead of every `rl.eval_every` steps,
plus at the end: `rl.eval_at_s` (default: 12 points spaced geometrically from budget / 32 to
the budget, so that a time ratio has the same resolution wherever the target is reached) or
every `rl.eval_every_s` seconds if that is set. Without it,
each mode runs `rl.steps` (or `--steps`), evaluated by step count. Wall-clock is RL training
time as `wmrl.rl` measures it (evaluations and checkpoint writes excluded, XLA compilation
done before the clock starts).

Writes `--out` (default DIR/speedup.json), DIR/speedup.png (held-out reward vs training
wall-clock and vs real executions, +-1 standard error bars) and prints a table. The figures
are defined next to the functions that compute them: `time_to_reward`, `time_to_target_ratio`,
`reward_at_equal_wall_clock`, `se_at_wall_clock`, `time_average_reward`,
`recent_mean_reward`, `amdahl`, `within_group_correlation` (how much GRPO signal the WM stream
carries, on the anchors) and `static_check_stats` (precision and recall of `rl.static_check`
on the anchors).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from wmrl.envs.autoresearch.grader import Status
from wmrl.envs.autoresearch.grader import reward as _status_reward
from wmrl.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
MODES = ("real", "wmrl")
ABLATIONS = ("wm_only", "debias_only", "denoise_only")
ALL_MODES = ("real", "wm_only", "debias_only", "denoise_only", "wmrl")
UNLIMITED_STEPS = 10**9  # the step limit under a wall-clock budget (the budget ends the run)
# Under a budget, held-out evaluations at EVAL_POINTS training wall-clock points spaced
# geometrically from budget / EVAL_SPAN to the budget (a constant ~1.37x apart): time ratios
# get the same relative resolution wherever the target is reached. (Evenly spaced points,
# budget / 8 apart, capped a measurable ratio at t_real / (budget / 8): about 2x when real
# reached its target at its second point.)
EVAL_POINTS = 12
EVAL_SPAN = 32.0

# Config fields copied into the JSON (`config`).
CONFIG_KEYS = (
    "seed", "routing", "target_reward", "suite.tasks", "suite.workers", "suite.time_limit_s",
    "rl.steps", "rl.max_wall_time_s", "rl.tasks_per_step", "rl.group_size", "rl.batch_size",
    "rl.eval_every", "rl.eval_every_s", "rl.eval_at_s", "rl.eval_samples", "rl.anchor_lag",
    "correction.rho", "correction.min_groups", "correction.uncertainty_share", "policy.d_model",
    "policy.num_layers", "wm.d_model", "wm.num_layers", "wm.num_members", "data.max_prompt_len",
    "data.max_new_tokens",
)  # fmt: skip


# -- the figures (pure functions of the curves and step records) -----------------------------


def time_to_reward(curve: list[dict], target: float) -> float | None:
    """Training wall-clock (s) of the first evaluation whose held-out reward is >= `target`;
    None if no evaluation reaches it. Evaluations without a reward (all ungraded) are skipped."""
    for e in curve:
        if e.get("heldout_reward") is not None and e["heldout_reward"] >= target:
            return e["wall_time_s"]
    return None


def time_to_target_ratio(curves: dict[str, list[dict]], mode: str = "wmrl") -> dict:
    """Speedup in time to reach `real`'s final held-out reward: t_real / t_mode.

    The target is the reward of `real`'s last evaluation; t_real is the wall-clock at which
    `real` first reached it (possibly before its end), t_mode the same for `mode`. Returns
    `{"target", "t_real", "t_mode", "ratio", "note"}`; the ratio is None (with the reason in
    `note`) when `mode` never reaches the target, or when it is reached at wall-clock 0 (the
    shared warm start already has real's final reward, so real did not improve on it).
    """
    real = [e for e in curves["real"] if e.get("heldout_reward") is not None]
    out = {"target": None, "t_real": None, "t_mode": None, "ratio": None, "note": None}
    if not real:
        out["note"] = "real has no graded held-out evaluation"
        return out
    target = real[-1]["heldout_reward"]
    t_real, t_mode = time_to_reward(real, target), time_to_reward(curves[mode], target)
    out.update(target=target, t_real=t_real, t_mode=t_mode)
    if t_mode is None:
        out["note"] = f"{mode} never reached real's final held-out reward {target:.4g}"
    elif t_mode <= 0.0:
        out["note"] = (
            f"{mode} had real's final held-out reward {target:.4g} at wall-clock 0 "
            "(the warm start): real did not improve on the warm start"
        )
    else:
        out["ratio"] = t_real / t_mode
    return out


def reward_at_wall_clock(curve: list[dict], t: float) -> float | None:
    """Held-out reward of the last evaluation at or before wall-clock `t` (evaluations without
    a reward skipped); None if there is none."""
    e = _eval_at(curve, t)
    return e["heldout_reward"] if e else None


def _eval_at(curve: list[dict], t: float) -> dict | None:
    """The last graded evaluation at or before wall-clock `t`, or None."""
    before = [e for e in _graded(curve) if e["wall_time_s"] <= t]
    return before[-1] if before else None


def se_at_wall_clock(curve: list[dict], t: float) -> float | None:
    """Standard error (over its scripts) of the evaluation `reward_at_wall_clock` picks; None
    if there is none or it has no standard error (runs before the field existed)."""
    e = _eval_at(curve, t)
    return e.get("heldout_reward_se") if e else None


def reward_at_equal_wall_clock(curves: dict[str, list[dict]]) -> tuple[float, dict]:
    """`(t, {mode: reward})`: t is the largest wall-clock every mode reached (the smallest of
    the modes' last evaluation times) and each reward is `reward_at_wall_clock(curve, t)`."""
    t = min(max(e["wall_time_s"] for e in c) for c in curves.values())
    return t, {m: reward_at_wall_clock(c, t) for m, c in curves.items()}


def _graded(curve: list[dict]) -> list[dict]:
    return sorted(
        (e for e in curve if e.get("heldout_reward") is not None), key=lambda e: e["wall_time_s"]
    )


def time_average_reward(curve: list[dict], t: float) -> float | None:
    """Mean held-out reward over training wall-clock [0, t], each evaluation's reward held
    until the next one (the area under the step curve / t): a figure that uses every
    evaluation, so one noisy evaluation moves it little. None if t <= 0 or no evaluation."""
    ev = [e for e in _graded(curve) if e["wall_time_s"] <= t]
    if t <= 0 or not ev:
        return None
    area = 0.0
    for e, nxt in zip(ev, [*ev[1:], None], strict=True):
        end = t if nxt is None else nxt["wall_time_s"]
        area += e["heldout_reward"] * (end - e["wall_time_s"])
    return area / (t - ev[0]["wall_time_s"]) if t > ev[0]["wall_time_s"] else None


def recent_mean_reward(curve: list[dict], t: float, k: int = 3) -> float | None:
    """Mean of the last `k` evaluations at or before wall-clock t (fewer if there are fewer):
    the held-out reward at t with less evaluation noise than the last evaluation alone."""
    ev = [e["heldout_reward"] for e in _graded(curve) if e["wall_time_s"] <= t][-k:]
    return sum(ev) / len(ev) if ev else None


def step_times(steps: list[dict]) -> list[float]:
    """Per-step wall-clock from the cumulative `wall_time_s` of the step records."""
    steps = sorted(steps, key=lambda r: r["step"])
    out, before = [], 0.0
    for r in steps:
        out.append(r["wall_time_s"] - before)
        before = r["wall_time_s"]
    return out


def _mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def _steady(values: list, warmup: int) -> list:
    """Drop the first `warmup` entries (compilation), unless that would leave none."""
    return values[warmup:] if len(values) > warmup else values


def amdahl(real_steps: list[dict], wmrl_steps: list[dict], warmup: int = 1) -> dict:
    """Per-step speedup of `wmrl` over `real` and the Amdahl bound on it.

    From the step records (metrics.jsonl, `"kind": "step"`), dropping the first `warmup` steps
    of each run (they include XLA compilation), keeping at least one:

    * `T_real`: mean wall-clock of a `real` step (differences of the cumulative `wall_time_s`).
      It splits into `E_real`, the mean `execute_s` (from submitting the step's scripts to
      the sandbox pool to the last result; the reference log-probs, computed meanwhile, hide
      inside it), and the rest `T_real - E_real` (generation, policy update, overheads).
    * `a`: the mean `anchor_fraction` of the `wmrl` steps (share of trajectories executed).
    * `T_free = (T_real - E_real) + a * E_real`: a `wmrl` step whose WM scoring and WM training
      cost nothing. Generation and the policy update are the same work in both modes (same
      batch), so they cost what they cost in `real`; executing the anchors takes the share `a`
      of real's execution time (execution time taken as proportional to the number executed).
    * `amdahl_bound = T_real / T_free = 1 / (1 - (1 - a) * E_real / T_real)`: Amdahl's law with
      the execution share `p = E_real / T_real` of the step sped up `1 / a` times. (The bound
      is slightly optimistic: work hidden inside the execution window, such as the reference
      log-probs, is scaled by `a` as well.)
    * `per_step_speedup = T_real / T_wmrl`, with `T_wmrl` the mean measured `wmrl` step, and
      `amdahl_fraction_reached = per_step_speedup / amdahl_bound` (1 = the WM costs nothing).

    Values are None where a run has no step records.
    """
    out = dict.fromkeys(
        ("real_step_s", "real_execute_s", "wmrl_step_s", "anchor_fraction", "free_wm_step_s",
         "execute_share", "amdahl_bound", "per_step_speedup", "amdahl_fraction_reached"),
    )  # fmt: skip
    out["warmup_steps"] = warmup
    if not real_steps or not wmrl_steps:
        return out
    real_steps = sorted(real_steps, key=lambda r: r["step"])
    wmrl_steps = sorted(wmrl_steps, key=lambda r: r["step"])
    T_real = _mean(_steady(step_times(real_steps), warmup))
    E_real = _mean(r["execute_s"] for r in _steady(real_steps, warmup))
    T_wmrl = _mean(_steady(step_times(wmrl_steps), warmup))
    a = _mean(r["anchor_fraction"] for r in _steady(wmrl_steps, warmup))
    T_free = (T_real - E_real) + a * E_real
    out.update(
        real_step_s=T_real, real_execute_s=E_real, wmrl_step_s=T_wmrl, anchor_fraction=a,
        free_wm_step_s=T_free, execute_share=E_real / T_real if T_real > 0 else None,
    )  # fmt: skip
    if T_free > 0 and T_wmrl > 0:
        out["amdahl_bound"] = T_real / T_free
        out["per_step_speedup"] = T_real / T_wmrl
        out["amdahl_fraction_reached"] = out["per_step_speedup"] / out["amdahl_bound"]
    return out


def mean_step_time(steps: list[dict], warmup: int = 1) -> float | None:
    """Mean per-step wall-clock after the first `warmup` steps (at least one kept)."""
    return _mean(_steady(step_times(steps), warmup)) if steps else None


def calibration(pairs: list[dict], bins: int = 10) -> dict:
    """Reliability of the WM on the anchor pairs (pairs.jsonl): for the raw WM score (`r_wm`)
    and the debiased one (`r_cal`), the binned `(mean score, mean real reward)` points of
    `wmrl.rl.plots.reliability` and the mean absolute error against the real reward."""
    from wmrl.rl.plots import reliability

    real = [p["r_env"] for p in pairs]
    out = {"n": len(pairs)}
    for key, name in (("r_wm", "raw"), ("r_cal", "debiased")):
        pred = [p[key] for p in pairs]
        mae = _mean(abs(x - y) for x, y in zip(pred, real, strict=True))
        if pairs:
            import numpy as np

            xs, ys = reliability(np.asarray(pred), np.asarray(real), bins)
            xs, ys = xs.tolist(), ys.tolist()
        else:
            xs, ys = [], []
        out[name] = {"mae": mae, "score": xs, "real": ys}
    return out


def stream_reward(pair: dict) -> float:
    """The reward the WM stream would have given an anchor pair's script: the static check's
    exact reward where it decides (`static_status`; older runs record only `static`, which
    was MALFORMED), else the calibrated WM score."""
    verdict = pair.get("static_status") or ("MALFORMED" if pair.get("static") else None)
    return pair["r_cal"] if verdict is None else _status_reward(Status[verdict])


def within_group_correlation(pairs: list[dict]) -> dict:
    """How much GRPO signal the WM stream carries, measured on the anchors (real outcome
    known): the Pearson correlation, over anchor groups (pairs of one step and task), of the
    group-centred stream reward (`stream_reward`) and raw WM score with the group-centred real
    reward. Advantages are group-centred, so this, not the correlation across tasks, is what
    decides whether WM groups push the policy the right way. None without enough groups."""
    import numpy as np

    groups: dict = {}
    for p in pairs:
        groups.setdefault((p["step"], p["task_id"]), []).append(
            (stream_reward(p), p["r_wm"], p["r_env"])
        )
    centred = [np.asarray(g) - np.mean(g, axis=0) for g in groups.values() if len(g) > 1]
    if not centred:
        return {"groups": 0, "stream": None, "raw_wm": None}
    x = np.concatenate(centred)
    corr = lambda a, b: float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else None
    return {
        "groups": len(centred),
        "stream": corr(x[:, 0], x[:, 2]),
        "raw_wm": corr(x[:, 1], x[:, 2]),
    }


def static_check_stats(pairs: list[dict], steps: list[dict]) -> dict | None:
    """How `rl.static_check = "names"` did, measured on the anchors (executed anyway): of the
    anchor scripts it would have called RUNTIME_ERROR, how many were (`precision`: status
    RUNTIME_ERROR or TIMEOUT, the same reward 0.1), and the share of the anchors' real
    RUNTIME_ERRORs it caught (`recall`); plus how many WM-stream rows took a static reward
    instead of a WM score. None when no pair records the verdict (`real`, older runs)."""
    if not any("static_status" in p for p in pairs):
        return None
    bad = (Status.RUNTIME_ERROR, Status.TIMEOUT)
    flagged = [p for p in pairs if p.get("static_status") == Status.RUNTIME_ERROR.name]
    confirmed = sum(p["status"] in bad for p in flagged)
    errors = [p for p in pairs if p["status"] == Status.RUNTIME_ERROR]
    caught = sum(p.get("static_status") == Status.RUNTIME_ERROR.name for p in errors)
    return {
        "anchor_pairs": len(pairs),
        "flagged_runtime_error": len(flagged),
        "precision": confirmed / len(flagged) if flagged else None,
        "anchor_runtime_errors": len(errors),
        "recall": caught / len(errors) if errors else None,
        "wm_rows_static_runtime_error": sum(s.get("static_runtime_error", 0) for s in steps),
        "wm_rows_static_malformed": sum(s.get("static_malformed", 0) for s in steps),
    }


# -- running the modes -----------------------------------------------------------------------


def geometric_points(budget_s: float, n: int = EVAL_POINTS, span: float = EVAL_SPAN):
    """`n` wall-clock points from `budget_s / span` to `budget_s`, each the previous times
    `span ** (1 / (n - 1))`."""
    return tuple(budget_s * span ** (i / (n - 1) - 1.0) for i in range(n))


def modes_for(ablations: bool) -> tuple[str, ...]:
    return ALL_MODES if ablations else MODES


def shared_config(config, workdir: str | os.PathLike, budget_s: float | None = None,
                  steps: int | None = None):  # fmt: skip
    """A copy of `config` with the shared data/init dirs under `workdir`/shared (unless the
    config names its own), the wall-clock budget and the step limit (see the module doc)."""
    c = config.copy_and_resolve_references()
    shared = Path(workdir) / "shared"
    if not c.data_dir:
        c.data_dir = str(shared / "data")
    if not c.init_dir:
        c.init_dir = str(shared / "init")
    if budget_s:
        c.rl.max_wall_time_s = float(budget_s)
        c.rl.steps = UNLIMITED_STEPS
        # Evaluate every mode at the same wall-clock points (a step-count cadence would give
        # the faster mode more, and the slower one coarser, evaluations).
        if not c.rl.get("eval_every_s", 0.0) and not c.rl.get("eval_at_s", ()):
            c.rl.eval_at_s = geometric_points(float(budget_s))
        c.rl.eval_every = UNLIMITED_STEPS
    if steps:
        c.rl.steps = int(steps)
    return c


def mode_config(config, mode: str):
    """The shared config with `mode` set (the only field that differs between modes)."""
    c = config.copy_and_resolve_references()
    c.mode = mode
    return c


def _redirect_output(log_path: str | None) -> None:
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def _stages_child(config, log_path, progress) -> None:
    """The stages of `wmrl.rl.experiment.run` before RL, into the shared dirs: the data
    stage, the warm start and the WM pretraining (built exactly as `run` builds them, so that
    every mode's `run` finds them done and loads them)."""
    _redirect_output(log_path)
    from wmrl.rl.experiment import prepare_stages, quiet_orbax

    quiet_orbax()
    prepare_stages(config, config.init_dir, progress)  # data_dir and init_dir are set


def _mode_child(config, workdir, log_path, progress) -> None:
    _redirect_output(log_path)
    from wmrl.rl.experiment import run

    run(config, workdir, progress=progress)


def _in_fresh_process(target, args, what: str, log_path: str | None) -> float:
    """Run `target(*args)` in a spawned process (no inherited JIT caches); returns seconds."""
    t0 = time.monotonic()
    p = multiprocessing.get_context("spawn").Process(target=target, args=args)
    p.start()
    try:
        p.join()
    except KeyboardInterrupt:  # e.g. a notebook's interrupt reaches the parent only
        p.terminate()
        p.join()
        raise
    if p.exitcode != 0:
        tail = ""
        if log_path and Path(log_path).exists():
            tail = "\n" + "\n".join(Path(log_path).read_text().splitlines()[-30:])
        raise RuntimeError(f"{what} failed (exit code {p.exitcode}){tail}")
    return time.monotonic() - t0


def stages_done(config) -> bool:
    """Whether the warm start and the WM pretraining (written after the data stage) are done."""
    init = Path(config.init_dir)
    return all((init / s / "done.json").exists() for s in ("warmstart", "wm_pretrain"))


def run_modes(config, workdir: str | os.PathLike, modes=MODES, progress: bool = True,
              log_to_files: bool = False) -> dict:  # fmt: skip
    """Run the shared stages (if a mode still has to run) and every mode not yet finished;
    returns `{"stages_s", "modes_s": {mode: s}, "reused": [modes]}`.

    `config` is the shared config (`shared_config`). With `log_to_files`, each process writes
    its output to DIR/shared/stages.log or DIR/<mode>/run.log instead of the terminal."""
    from wmrl.rl.experiment import check_resumable

    workdir = Path(workdir)
    todo = [m for m in modes if not (workdir / m / "summary.json").exists()]
    for m in modes:  # fail before anything runs
        check_resumable(mode_config(config, m), workdir / m)
    out = {"stages_s": None, "modes_s": {}, "reused": [m for m in modes if m not in todo]}
    for m in out["reused"]:
        print(f"{m}: reusing the finished run in {workdir / m}", flush=True)
    if not todo:
        return out
    if not stages_done(config):
        (workdir / "shared").mkdir(parents=True, exist_ok=True)
        log = str(workdir / "shared" / "stages.log") if log_to_files else None
        print(f"shared stages -> {config.data_dir}, {config.init_dir}", flush=True)
        out["stages_s"] = _in_fresh_process(_stages_child, (config, log, progress), "stages", log)
    for m in todo:
        c, d = mode_config(config, m), workdir / m
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(c.to_json_best_effort(indent=2) + "\n")
        log = str(d / "run.log") if log_to_files else None
        print(f"{m}: running in {d}", flush=True)
        out["modes_s"][m] = _in_fresh_process(_mode_child, (c, str(d), log, progress), m, log)
    return out


# -- results ---------------------------------------------------------------------------------


def load_runs(workdir: str | os.PathLike, modes=MODES) -> dict:
    """`{mode: {"summary", "steps", "pairs"}}` from the finished mode directories."""
    workdir = Path(workdir)
    runs = {}
    for m in modes:
        d = workdir / m
        runs[m] = {
            "summary": json.loads((d / "summary.json").read_text()),
            "steps": [r for r in read_jsonl(d / "metrics.jsonl") if r.get("kind") == "step"],
            "pairs": read_jsonl(d / "pairs.jsonl"),
        }
    return runs


def _get(config, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            return None
    return list(node) if isinstance(node, tuple) else node


def machine(runs: dict | None = None) -> dict:
    device = None
    for r in (runs or {}).values():
        device = device or r["summary"].get("device")
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "device": device,
    }


def analyse(runs: dict, config=None, budget_s: float | None = None, warmup: int = 1) -> dict:
    """The benchmark's JSON from the runs (`load_runs`); `real` and `wmrl` must be present."""
    curves = {m: r["summary"]["heldout_curve"] for m, r in runs.items()}
    ttt = time_to_target_ratio(curves, "wmrl")
    target = ttt["target"]
    t_equal, at_equal = reward_at_equal_wall_clock(curves)
    amd = amdahl(runs["real"]["steps"], runs["wmrl"]["steps"], warmup)
    per_mode = lambda key: {m: r["summary"].get(key) for m, r in runs.items()}
    to_target = {
        m: None if target is None else time_to_reward(c, target) for m, c in curves.items()
    }
    return {
        "time_to_target_ratio": ttt["ratio"],
        "time_to_target_note": ttt["note"],
        "time_to_target_reward": target,
        "time_to_target_s": to_target,
        "final_heldout_reward": per_mode("final_heldout_reward"),
        "heldout_reward_at_equal_wall_clock": at_equal,
        # The sampling noise of those single evaluations (standard error over their scripts).
        "heldout_reward_se_at_equal_wall_clock": {
            m: se_at_wall_clock(c, t_equal) for m, c in curves.items()
        },
        "equal_wall_clock_s": t_equal,
        # Less noisy views of the same comparison (every evaluation up to t_equal counts):
        "heldout_reward_time_average": {
            m: time_average_reward(c, t_equal) for m, c in curves.items()
        },
        "heldout_reward_last3_at_equal_wall_clock": {
            m: recent_mean_reward(c, t_equal, 3) for m, c in curves.items()
        },
        "amdahl_bound": amd["amdahl_bound"],
        "amdahl_fraction_reached": amd["amdahl_fraction_reached"],
        "per_step_speedup": amd["per_step_speedup"],
        "amdahl": amd,
        "step_time_s": {m: mean_step_time(r["steps"], warmup) for m, r in runs.items()},
        "steps": per_mode("steps"),
        "wall_time_s": per_mode("wall_time_s"),
        "real_executions": per_mode("real_executions"),
        "wm_calls": per_mode("wm_calls"),
        "warmstart_heldout_reward": per_mode("warmstart_heldout_reward"),
        "best_heldout_reward": per_mode("best_heldout_reward"),
        "static_check": {
            m: static_check_stats(r["pairs"], r["steps"]) for m, r in runs.items() if m != "real"
        },
        "wm_stream_within_group_corr": {
            m: within_group_correlation(r["pairs"]) for m, r in runs.items() if m != "real"
        },
        "curves": curves,
        "budget_s": budget_s,
        "config": {k: _get(config, k) for k in CONFIG_KEYS} if config is not None else None,
        "machine": machine(runs),
    }


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def table(result: dict) -> list[dict]:
    """One row per mode: the figures of the printed table (for pandas in the notebook)."""
    t_real = result["time_to_target_s"].get("real")
    rows = []
    for m in result["final_heldout_reward"]:
        t = result["time_to_target_s"][m]
        rows.append({
            "mode": m,
            "final_heldout_reward": result["final_heldout_reward"][m],
            "wall_time_s": result["wall_time_s"][m],
            "real_executions": result["real_executions"][m],
            "time_to_real_final_s": t,
            "speedup": t_real / t if t_real is not None and t else None,
        })  # fmt: skip
    return rows


def format_table(result: dict) -> str:
    head = (f"{'mode':<14}{'final held-out':>15}{'wall-clock s':>14}{'real execs':>12}"
            f"{'to real final s':>17}{'speedup':>9}")  # fmt: skip
    lines = [head]
    for r in table(result):
        lines.append(
            f"{r['mode']:<14}{_fmt(r['final_heldout_reward'], '.4f'):>15}"
            f"{_fmt(r['wall_time_s'], '.1f'):>14}{_fmt(r['real_executions'], 'd'):>12}"
            f"{_fmt(r['time_to_real_final_s'], '.1f', 'never'):>17}"
            f"{_fmt(r['speedup'], '.2f') + ('x' if r['speedup'] else ''):>9}"
        )
    a = result["amdahl"]
    ses = result.get("heldout_reward_se_at_equal_wall_clock") or {}
    lines += [
        "",
        f"time_to_target_ratio (real / wmrl, to real's final held-out reward "
        f"{_fmt(result['time_to_target_reward'], '.4f')}): "
        f"{_fmt(result['time_to_target_ratio'], '.2f')}"
        + (f"  ({result['time_to_target_note']})" if result["time_to_target_note"] else ""),
        f"held-out reward at equal wall-clock {result['equal_wall_clock_s']:.1f}s: "
        + ", ".join(
            f"{m} {_fmt(v, '.4f')}" + (f" +- {se:.4f}" if (se := ses.get(m)) is not None else "")
            for m, v in result["heldout_reward_at_equal_wall_clock"].items()
        )
        + (" (standard error over the evaluation's scripts)" if any(ses.values()) else ""),
        "less noisy, over the same window: mean of the last 3 evaluations "
        + ", ".join(
            f"{m} {_fmt(v, '.4f')}"
            for m, v in result.get("heldout_reward_last3_at_equal_wall_clock", {}).items()
        )
        + "; time-averaged held-out reward "
        + ", ".join(
            f"{m} {_fmt(v, '.4f')}"
            for m, v in result.get("heldout_reward_time_average", {}).items()
        ),
        f"per-step speedup {_fmt(result['per_step_speedup'], '.2f')}x "
        f"(real {_fmt(a['real_step_s'], '.2f')}s, wmrl {_fmt(a['wmrl_step_s'], '.2f')}s per step); "
        f"Amdahl bound {_fmt(result['amdahl_bound'], '.2f')}x (execution share "
        f"{_fmt(a['execute_share'], '.2f')}, anchor fraction {_fmt(a['anchor_fraction'], '.3f')}); "
        f"fraction reached {_fmt(result['amdahl_fraction_reached'], '.2f')}",
    ]
    corr = result.get("wm_stream_within_group_corr") or {}
    if corr:
        lines.append(
            "WM stream vs real reward on the anchors, within groups (correlation): "
            + ", ".join(
                f"{m} {_fmt(c['stream'], '.2f')} (raw WM {_fmt(c['raw_wm'], '.2f')})"
                for m, c in corr.items()
            )
        )
    return "\n".join(lines)


def plot_curves(curves: dict[str, list[dict]], path=None, target: float | None = None):
    """Held-out reward vs training wall-clock (left) and vs real executions (right), one line
    per mode; saved to `path` when given. Returns the figure."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no backend switch

    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    for m, curve in curves.items():
        ev = [e for e in curve if e.get("heldout_reward") is not None]
        y = [e["heldout_reward"] for e in ev]
        se = [e.get("heldout_reward_se") or 0.0 for e in ev]  # error bars: +-1 standard error
        for ax, x in zip(axes, ("wall_time_s", "real_executions"), strict=True):
            ax.errorbar([e[x] for e in ev], y, yerr=se, fmt="o-", ms=3, capsize=2, label=m)
    for ax, xlabel in zip(axes, ("training wall-clock (s)", "real executions"), strict=True):
        if target is not None:
            ax.axhline(target, color="grey", ls=":", lw=1, label="real's final")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean held-out reward")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_calibration(cal: dict):
    """Reliability curves of `calibration(...)`: raw and debiased WM scores vs real reward."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 5))
    ax = fig.subplots()
    for name in ("raw", "debiased"):
        c = cal[name]
        ax.plot(c["score"], c["real"], "o-", label=f"{name} WM score (MAE {_fmt(c['mae'], '.3f')})")
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    ax.set_xlabel("WM score (bin mean)")
    ax.set_ylabel("real reward (bin mean)")
    ax.set_title(f"WM calibration on {cal['n']} anchor trajectories")
    ax.legend()
    fig.tight_layout()
    return fig


def benchmark(config, workdir, modes=MODES, budget_s=None, steps=None, out=None,
              progress=True, log_to_files=False) -> dict:  # fmt: skip
    """Run (or resume, or reuse) the modes, then write the JSON and the plot; returns it."""
    from wmrl.rl.config import validate_autoresearch_config

    workdir = Path(workdir)
    config = shared_config(config, workdir, budget_s, steps)
    validate_autoresearch_config(config)
    timing = run_modes(config, workdir, modes, progress, log_to_files)
    result = analyse(load_runs(workdir, modes), config, budget_s)
    result["process_s"] = timing
    out = Path(out) if out else workdir / "speedup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot_curves(result["curves"], workdir / "speedup.png", result["time_to_target_reward"])
    return result


# -- command line ----------------------------------------------------------------------------


def define_flags() -> dict:
    """The command-line flags, defined only when run as a program (importing this module from
    a notebook or a spawned mode process defines none, and loads no config file)."""
    return {
        "config": config_flags.DEFINE_config_file(
            "config", str(ROOT / "configs" / "autoresearch_tiny.py"), "AutoResearch config file."
        ),
        "workdir": flags.DEFINE_string(
            "workdir", None, "Benchmark directory (shared/, one dir per mode).", required=True
        ),
        "budget_s": flags.DEFINE_float(
            "budget_s", None, "Equal RL wall-clock budget for every mode (s)."
        ),
        "out": flags.DEFINE_string("out", None, "JSON output (default: <workdir>/speedup.json)."),
        "ablations": flags.DEFINE_bool(
            "ablations", False, "Also run wm_only, debias_only, denoise_only."
        ),
        "steps": flags.DEFINE_integer(
            "steps", None, "RL steps per mode (default: config rl.steps; with --budget_s: none)."
        ),
    }


def main(argv, f: dict) -> None:
    del argv
    from wmrl.config_errors import ConfigError

    config, budget = f["config"].value, f["budget_s"].value
    workdir, out = f["workdir"].value, f["out"].value
    try:
        if config.get("experiment") != "autoresearch":
            raise ConfigError("config.experiment", "the speedup benchmark needs 'autoresearch'")
        if budget is not None and budget <= 0:
            raise ConfigError("--budget_s", f"must be > 0, got {budget}")
        result = benchmark(
            config, workdir, modes_for(f["ablations"].value), budget, f["steps"].value, out
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print()
    print(format_table(result))
    print(f"wrote {out or Path(workdir) / 'speedup.json'} and {Path(workdir) / 'speedup.png'}")


if __name__ == "__main__":
    _flags = define_flags()
    app.run(lambda argv: main(argv, _flags))
