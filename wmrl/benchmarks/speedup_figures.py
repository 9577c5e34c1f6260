"""The speedup benchmark's figures: pure functions of held-out curves, step records and
anchor pairs (`wmrl.benchmarks.speedup` reports them, the ablations notebook plots them).

A curve is a run's `summary.json["heldout_curve"]` (evaluations with `wall_time_s`,
`heldout_reward`, `heldout_reward_se`); time to a reward is `wmrl.autoresearch.experiment
.time_to_target`, the same function the run's own summary uses.
"""

from __future__ import annotations

from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.grader import reward as _status_reward
from wmrl.autoresearch.experiment import time_to_target


def time_to_target_ratio(curves: dict[str, list[dict]], mode: str = "wmrl") -> dict:
    """Speedup in time to reach `real`'s final held-out reward: t_real / t_mode.

    The target is the reward of `real`'s last evaluation; t_real is the wall-clock at which
    `real` first reached it (possibly before its end), t_mode the same for `mode`. Returns
    `{"target", "t_real", "t_mode", "ratio", "note"}`; the ratio is None (with the reason in
    `note`) when `mode` never reaches the target, or when either mode has it at wall-clock 0
    (a warm-start evaluation already has real's final reward, so real did not improve on the
    warm start and the ratio would measure only the step-0 evaluation's noise: 0 or inf).
    """
    real = [e for e in curves["real"] if e.get("heldout_reward") is not None]
    out = {"target": None, "t_real": None, "t_mode": None, "ratio": None, "note": None}
    if not real:
        out["note"] = "real has no graded held-out evaluation"
        return out
    target = real[-1]["heldout_reward"]
    t_real, t_mode = time_to_target(real, target), time_to_target(curves[mode], target)
    out.update(target=target, t_real=t_real, t_mode=t_mode)
    if t_mode is None:
        out["note"] = f"{mode} never reached real's final held-out reward {target:.4g}"
    elif t_mode <= 0.0:
        out["note"] = (
            f"{mode} had real's final held-out reward {target:.4g} at wall-clock 0 "
            "(the warm start): real did not improve on the warm start"
        )
    elif t_real <= 0.0:
        out["note"] = (
            f"real's warm-start evaluation already had its final held-out reward {target:.4g}: "
            "real did not improve on the warm start"
        )
    else:
        out["ratio"] = t_real / t_mode
    return out


def executions_to_target(curve: list[dict], target: float) -> int | None:
    """Real RL executions (`real_executions`) at the first evaluation whose held-out reward
    reaches `target`; None if none does."""
    for e in _graded(curve):
        if e["heldout_reward"] >= target:
            return e["real_executions"]
    return None


def executions_to_target_ratio(
    curves: dict[str, list[dict]], target: float | None, mode: str = "wmrl",
    pretraining: int = 0,
) -> dict:  # fmt: skip
    """Speedup in real executions to reach `target` (`time_to_target_ratio`'s, real's final
    held-out reward): `E_real / E_mode`, and `E_real / (E_mode + pretraining)`, which counts
    the executions spent before RL on the mode's WM (`pretraining`: the run's
    `wm_pretraining_executions.total`, the executed corpus and policy samples; `real` has no
    WM). Returns `{"e_real", "e_mode", "ratio", "ratio_with_pretraining"}`; a ratio is None
    when either mode never reaches the target or either reaches it with no execution (a
    warm-start evaluation already had it: real did not improve on the warm start)."""
    out = {"e_real": None, "e_mode": None, "ratio": None, "ratio_with_pretraining": None}
    if target is None:
        return out
    e_real = executions_to_target(curves["real"], target)
    e_mode = executions_to_target(curves[mode], target)
    out.update(e_real=e_real, e_mode=e_mode)
    if e_real and e_mode:
        out["ratio"] = e_real / e_mode
        out["ratio_with_pretraining"] = e_real / (e_mode + pretraining)
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
    """Standard error (`heldout_reward_se`: counting the variance between held-out tasks;
    runs before that logged the SE over the scripts) of the evaluation `reward_at_wall_clock`
    picks; None if there is none or it has no standard error (runs before the field)."""
    e = _eval_at(curve, t)
    return e.get("heldout_reward_se") if e else None


def eval_se_stats(curve: list[dict]) -> dict:
    """The precision of a run's evaluations: `{"mean", "max"}` of `heldout_reward_se` over its
    graded evaluations that have one (None, None if none has), and `n`, how many."""
    se = [e["heldout_reward_se"] for e in _graded(curve) if e.get("heldout_reward_se") is not None]
    return {
        "mean": sum(se) / len(se) if se else None,
        "max": max(se) if se else None,
        "n": len(se),
    }


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
    `wmrl.autoresearch.plots.reliability` and the mean absolute error against the real reward."""
    from wmrl.autoresearch.plots import reliability

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
