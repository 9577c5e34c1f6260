"""The world model writes the feedback: a multi-turn observation predicted field by field.

For a WM-scored turn every field of the observation (`wmrl.autoresearch.env.observation`) comes
from a head of the world model, and the text is rendered by the same `render_observation` as a
real one, so the policy cannot tell the source by its form:

* **status**: the class head (a distribution over the ladder's statuses), with its TIMEOUT
  mass replaced by the runtime head's `p_timeout` under the script's time limit (the same
  probability the WM score mixes in), and MALFORMED ruled out for a script that compiles when
  the static check is on (the check is exact there); the most probable status.
* **error_type** (RUNTIME_ERROR only): the error-type head's most probable class other than
  "none" (the head is P(class | runtime error)); "other" without that head.
* **runtime_s**: the runtime head's median runtime, capped at the limit; a TIMEOUT's is the
  limit (what a real time-out reports), a MALFORMED script's 0 (never executed).
* **validation** (VALID only), two sources, `validation=`:
  `"leaderboard"` (default): the WM's expected reward given VALID, backed out of the reward
  head's score (`E[r] = sum_s P(s) r(s)`, `r(VALID) = 0.5 + 0.5 pct`), mapped to a metric value
  through the task's reference leaderboard (the inverse of the grader's percentile). It needs
  no validation labels, which the single-turn corpus does not have, and it agrees with the
  reward the WM gives the turn. `"head"`: the validation head's mean (`wm.validation_coef > 0`,
  trained where episode executions measured a validation metric).

The static check, where on, then fixes what it knows (`observation.static_observation`): a
script that does not compile is MALFORMED, one that reads a name it never binds a
RUNTIME_ERROR with error type NameError.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wmrl.autoresearch.env.grader import Status, check_script
from wmrl.autoresearch.env.grader import reward as status_reward
from wmrl.autoresearch.env.observation import (
    ERROR_TYPES,
    Observation,
    make_observation,
    static_observation,
)
from wmrl.autoresearch.env.task import Task

STATIC_CHECKS = ("off", "compile", "names")
VALIDATION_SOURCES = ("leaderboard", "head")
LADDER = [s for s in Status if s != Status.UNGRADED]  # the class head's classes, in order


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def status_probabilities(
    class_logits: np.ndarray, p_timeout: np.ndarray | None, compiles: np.ndarray | None = None
) -> np.ndarray:
    """[B, C] distribution over `LADDER`: the class head's softmax, its TIMEOUT mass replaced
    by `p_timeout` ([B]; the other statuses keep their relative odds), MALFORMED ruled out
    where `compiles` ([B] bool) is True."""
    p = _softmax(np.asarray(class_logits, np.float64))
    if compiles is not None:
        p[np.asarray(compiles, bool), int(Status.MALFORMED)] = 0.0
        p = p / np.maximum(p.sum(axis=1, keepdims=True), 1e-12)
    if p_timeout is not None:
        t = int(Status.TIMEOUT)
        rest = p.copy()
        rest[:, t] = 0.0
        rest = rest / np.maximum(rest.sum(axis=1, keepdims=True), 1e-12)
        pt = np.clip(np.asarray(p_timeout, np.float64), 0.0, 1.0)
        p = rest * (1.0 - pt)[:, None]
        p[:, t] = pt
    return p


def metric_from_percentile(task: Task, pct: float) -> float | None:
    """A metric value at leaderboard position `pct` in [0, 1]: the inverse of the grader's
    percentile (linear between the task's reference scores, in the metric's better
    direction); None without a leaderboard."""
    ref = np.asarray(task.reference_scores, np.float64)
    if ref.size == 0:
        return None
    sign = 1.0 if task.metric.higher_is_better else -1.0
    return float(sign * np.quantile(sign * ref, float(np.clip(pct, 0.0, 1.0))))


def valid_percentile(score: float, probs: np.ndarray) -> float:
    """The leaderboard position the reward head's `score` implies for a VALID submission:
    `score = sum_{s != VALID} P(s) r(s) + P(VALID) (0.5 + 0.5 pct)`, solved for pct and
    clipped to [0, 1] (`probs` [C] over `LADDER`)."""
    v = int(Status.VALID)
    others = sum(probs[int(s)] * status_reward(s) for s in LADDER if s != Status.VALID)
    r_valid = (score - others) / max(probs[v], 1e-6)
    return float(np.clip(2.0 * r_valid - 1.0, 0.0, 1.0))


def predict_observation(
    predicted: dict,
    tasks: Sequence[Task],
    scripts: Sequence[str],
    time_limits_s: Sequence[float],
    static: str = "names",
    validation: str = "leaderboard",
) -> list[Observation]:
    """One `Observation` per row from the world model's predictions.

    `predicted`: the WM score function's output with `outputs=True`
    (`wmrl.models.train_steps.make_wm_score_fn`), called with these `time_limits_s`: the fused
    `score`/`score_raw`, `p_timeout`, `runtime_s`, and under `outputs` the raw heads
    (`class_logits`, optional `error_logits`, `validation_mean`). `tasks`, `scripts` [B]: each
    row's task (its leaderboard and metric) and script text (the static check's input).
    `static`: one of `STATIC_CHECKS` (`rl.static_check`). Render with
    `observation.render_observation(obs, task.metric_name)`, the template of real ones."""
    if static not in STATIC_CHECKS:
        raise ValueError(f"static: must be one of {STATIC_CHECKS}, got {static!r}")
    if validation not in VALIDATION_SOURCES:
        raise ValueError(f"validation: must be one of {VALIDATION_SOURCES}, got {validation!r}")
    outputs = predicted.get("outputs")
    if outputs is None or "class_logits" not in outputs:
        raise ValueError("predicted: needs the raw head outputs (score function, outputs=True)")
    if "p_timeout" not in predicted:
        raise ValueError(
            "predicted: no runtime prediction; the world model needs its runtime head "
            "(config.wm.runtime_coef > 0) and the score function the rows' time limits"
        )
    if validation == "head" and "validation_mean" not in outputs:
        raise ValueError("validation='head' needs the validation head (wm.validation_coef > 0)")
    n = len(tasks)
    if not (len(scripts) == len(time_limits_s) == n == len(predicted["score"])):
        raise ValueError(
            f"predict_observation: {n} tasks, {len(scripts)} scripts, {len(time_limits_s)} "
            f"limits and {len(predicted['score'])} predicted rows must agree"
        )
    np_ = lambda x: np.asarray(x, np.float64)
    compiles = None
    if static != "off":
        compiles = np.array([check_script(s.encode("utf-8", "surrogatepass")) is None
                             for s in scripts])  # fmt: skip
    probs = status_probabilities(np_(outputs["class_logits"]), np_(predicted["p_timeout"]),
                                 compiles)  # fmt: skip
    status = probs.argmax(axis=1)
    runtime, limits = np_(predicted["runtime_s"]), np_(time_limits_s)
    score = np_(predicted.get("score_raw", predicted["score"]))
    err = None
    if "error_logits" in outputs:
        err = np_(outputs["error_logits"]).copy()
        err[:, ERROR_TYPES.index("none")] = -np.inf
    out = []
    for i in range(n):
        s = Status(int(status[i]))
        error_type = "none"
        if s == Status.RUNTIME_ERROR:
            error_type = "other" if err is None else ERROR_TYPES[int(err[i].argmax())]
        rt = min(runtime[i], limits[i])
        if s == Status.TIMEOUT:
            rt = limits[i]
        elif s == Status.MALFORMED:
            rt = 0.0
        val = None
        if s == Status.VALID:
            if validation == "head":
                val = float(outputs["validation_mean"][i])
            else:
                val = metric_from_percentile(tasks[i], valid_percentile(score[i], probs[i]))
        obs = make_observation(s, error_type, rt, val)
        if static != "off":
            obs = static_observation(scripts[i], obs, names=static == "names")
        out.append(obs)
    return out
