"""The records that flow between the phases of one AutoResearch RL step, and its metrics.

The step is `wmrl.experiment.step.run_step` over the trainer's phases (`Trainer` in
wmrl/autoresearch/trainer.py), each a method with a typed record in and out (purejaxrl's
`Transition`, tunix's `TrainExample`):

    sample -> route -> act: (submit anchors, score, exchange anchors) -> correct -> update
      Sampled   Routed        Scored     Exchanged                       Corrected  Updated

and `step_metrics` turns the records into the step's metrics and anchor pairs. Arrays are
numpy, N = B*G rows of width L (prompt P columns, then the completion).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import jax
import numpy as np

from wmrl.autoresearch.env.grader import Status, static_outcome
from wmrl.autoresearch.state import Pending, Replay
from wmrl.core.correct import StepCorrection
from wmrl.models.train_steps import TrainState


class Sampled(NamedTuple):
    """sample: G scripts for each of the step's B tasks."""

    step: int  # 0-based
    row_tasks: list  # [N] the task of each row
    rows: dict  # tokens, input_mask [N, L]; loss_mask, old_logp [N, L] float32
    scripts: list[str]  # [N] decoded completions


class Routed(NamedTuple):
    """route: which whole groups are anchors (executed for real), and where the anchor
    outcomes this step trains on go (the anchor positions). They are the same groups but
    under `correction.adaptive_rho` with `rl.anchor_lag`, where the previous step's count
    (its outcomes, trained on now) can differ from this step's (executing now): the
    positions are then the first ones of this step's draw in that count."""

    is_anchor: np.ndarray  # [B] bool: the anchor positions
    picked_by: np.ndarray  # [B] the rule that picked each executed anchor (2 = uncertainty)
    anchor_rows: np.ndarray  # [N] bool
    anchor_idx: np.ndarray  # [A*G] indices of the anchor positions' rows
    wm_out: dict | None  # WM outputs when uncertainty routing needed them first
    submit_idx: np.ndarray  # [A'*G] indices of the rows executed (submitted) this step
    rho: float  # the target anchor fraction in force


class Scored(NamedTuple):
    """score: what is computed while the anchors execute."""

    r_wm: np.ndarray  # [N] float32 raw WM scores (zeros without a WM)
    ref_logp: jax.Array  # [N, L] reference policy's log-probs (on device)
    # [N] the WM's P(timeout) under each row's limit (None: no runtime head, or no WM)
    p_timeout: np.ndarray | None = None
    outputs: dict | None = None  # the WM's outputs (cost routing reads its runtime head)


class Exchanged(NamedTuple):
    """exchange anchors: the batch this step trains on, with the anchor outcomes in the
    anchor positions (this step's own, or with `rl.anchor_lag` the previous step's rows
    spliced in with their sampling log-probs and WM scores)."""

    rows: dict  # as Sampled.rows
    ref_logp: jax.Array  # [N, L] (on device)
    r_wm: np.ndarray  # [N]
    r_env: np.ndarray  # [N] float32 real rewards (anchor positions)
    status: np.ndarray  # [N] int32 (UNGRADED outside the anchor positions)
    origin: list  # [N] (step, row) each position trains on
    trained_tasks: list  # [N]
    collected: int  # anchor outcomes trained on (0: none yet, the lag's first step)
    new_executions: int  # of those, executions not taken from a journal
    pending: Pending  # what the next step trains on (rl.anchor_lag) or nothing
    # The anchor positions' real observation fields (WM targets), unknown elsewhere: runtime
    # (s, NaN), exception class (index into ERROR_TYPES, -1), validation metric (NaN).
    runtime_s: np.ndarray | None = None
    error_type: np.ndarray | None = None
    validation: np.ndarray | None = None
    # [N] the scripts sampled this step (the anchor positions' trained scripts, spliced in
    # with the lag, are decoded from their tokens where a verifier needs them).
    scripts: list | None = None
    # [N] float32 the WM's P(timeout) of each position's script when it was scored (NaN where
    # unknown), recorded with the anchor pairs (`wmrl.autoresearch.anchor_metrics`).
    p_timeout: np.ndarray | None = None
    # Cost-aware routing (`wmrl.autoresearch.cost_routing`; None otherwise): [N] rows outside
    # the anchor positions that finished under the cap (`r_env`, `status` filled in) and rows
    # it cut; every row's WM score and P(timeout) given a run past its cap; the anchor
    # positions that ran past theirs; the cap in force (s); the rows run capped, how many of
    # them were executed now (not journal hits); the sandbox seconds of the step's outcomes.
    real_rows: np.ndarray | None = None
    cut: np.ndarray | None = None
    r_cut: np.ndarray | None = None
    p_cut: np.ndarray | None = None
    past_cap: np.ndarray | None = None
    cap_s: float | None = None
    capped_rows: int = 0
    capped_new: int = 0
    execution_s: float | None = None


class Corrected(NamedTuple):
    """correct: the shared correction's result (`wmrl.core.correct.StepCorrection`: rewards,
    advantages, the new correction state, diagnostics) and what the step fed it."""

    result: StepCorrection
    static: np.ndarray  # [N] int status known without execution, -1 elsewhere
    env_valid: np.ndarray  # [N] bool graded anchor positions


class Updated(NamedTuple):
    """update: the policy and the WM after this step."""

    policy: TrainState
    wm: TrainState
    replay: Replay
    policy_metrics: dict


def no_exchange(sampled: Sampled, scored: Scored, pending: Pending) -> Exchanged:
    """An exchange with no anchor outcome (warm-up compiles the later phases on it)."""
    n = len(sampled.scripts)
    return Exchanged(
        rows=sampled.rows, ref_logp=scored.ref_logp, r_wm=scored.r_wm,
        r_env=np.zeros(n, np.float32), status=np.full(n, int(Status.UNGRADED), np.int32),
        origin=[(sampled.step, i) for i in range(n)], trained_tasks=list(sampled.row_tasks),
        collected=0, new_executions=0, pending=pending,
        runtime_s=np.full(n, np.nan, np.float32), error_type=np.full(n, -1, np.int32),
        validation=np.full(n, np.nan, np.float32), scripts=list(sampled.scripts),
        p_timeout=np.full(n, np.nan, np.float32) if scored.p_timeout is None
        else np.asarray(scored.p_timeout, np.float32),
    )  # fmt: skip


def static_outcomes(trained: list[str], anchor_idx, status, names: bool) -> np.ndarray:
    """[N] int: the status each row's script (`trained`: the scripts the rows train on)
    gets without executing it (`grader.static_outcome`, `rl.static_check`), -1 where only
    execution can tell. WM rows: MALFORMED when the sandbox pool's own pre-execution check
    fails ("compile"), RUNTIME_ERROR when the script reads a name it never defines ("names").
    Anchor rows get the same verdict, except that MALFORMED is the pool's own (their real
    `status`); it only keeps their pairs out of the monotone map and is recorded with each
    pair, so its precision can be measured."""
    static = np.full(len(trained), -1, np.int32)
    for i, text in enumerate(trained):
        got = static_outcome(text.encode("utf-8", "surrogatepass"), names=names)
        static[i] = -1 if got is None else int(got[0])
    malformed = int(Status.MALFORMED)
    static[anchor_idx] = np.where(
        status[anchor_idx] == malformed,
        malformed,
        np.where(static[anchor_idx] == malformed, -1, static[anchor_idx]),
    )
    return static


def corpus_mean_reward(executions: list[dict], static_check: bool, names: bool) -> float:
    """The `static_anchors` control's shared reward before any anchor outcome: the mean real
    reward of the executed training corpus's scripts that the static check (when on) does not
    flag, like the anchor rows it is later taken from."""
    rewards = [
        r["reward"] for r in executions
        if r["split"] == "train" and r.get("reward") is not None
        and not (static_check and static_outcome(
            r["script"].encode("utf-8", "surrogatepass"), names=names))
    ]  # fmt: skip
    return float(np.mean(rewards)) if rewards else 0.5


ANCHOR_DIAGNOSTICS = (
    "bias_reduction", "residual_before", "residual_after", "wm_rank_corr", "wm_stream_corr",
    "wm_stream_collapsed_groups",
)  # fmt: skip


def _scalar(v):
    """A stat as JSON: bool, int, float, or None for NaN (an undefined diagnostic)."""
    v = np.asarray(v)
    if v.dtype == bool:
        return bool(v)
    if np.issubdtype(v.dtype, np.integer):
        return int(v)
    return None if np.isnan(v) else float(v)


def step_metrics(
    s: Sampled,
    r: Routed,
    x: Exchanged,
    c: Corrected,
    u: Updated,
    uses_wm: bool,
    seconds,
    rho: float = 1.0,
) -> dict:
    """The step's record in metrics.jsonl (without the run's counters); `rho` is the target
    anchor fraction in force (`anchor_fraction` the realised one)."""
    n_rows, n_anchor = len(s.scripts), len(r.submit_idx)
    counts = Counter(Status(int(v)).name for v in x.status[r.anchor_idx] if x.collected)
    wm_rows = ~r.anchor_rows
    metrics = {
        "step": s.step + 1,
        **seconds,
        "rho": rho,
        "anchor_fraction": n_anchor / n_rows,
        "anchor_groups_uncertainty": int((np.asarray(r.picked_by) == 2).sum()),
        # Executions submitted this step (with anchor_lag they finish during the next).
        "real_executions_step": n_anchor,
        "anchor_outcomes_from_step": (x.origin[r.anchor_idx[0]][0] + 1) if x.collected else None,
        "reused_from_journal": x.collected - x.new_executions,
        "mean_script_tokens": float(x.rows["loss_mask"].sum() / n_rows),
        "anchor_status": dict(counts),
        "static_malformed": int((c.static[wm_rows] == int(Status.MALFORMED)).sum()),
        "static_runtime_error": int((c.static[wm_rows] == int(Status.RUNTIME_ERROR)).sum()),
        "policy_kl": _mean(u.policy_metrics, "kl"),
        **{k: _scalar(v) for k, v in c.result.stats.as_dict().items()},
    }
    if uses_wm:
        err = np.abs(x.r_wm - x.r_env)[c.env_valid]
        metrics["wm_anchor_mae"] = float(err.mean()) if c.env_valid.any() else None
    if not uses_wm or not x.collected:  # no WM, or no anchor outcome this step
        metrics.update(dict.fromkeys(ANCHOR_DIAGNOSTICS))
    return metrics


def anchor_pairs(x: Exchanged, c: Corrected) -> list[dict]:
    """pairs.jsonl records: the graded anchor positions' (raw WM, calibrated, real), and the
    WM's P(timeout) (`p_timeout`) where it has a runtime head."""
    cal, st = np.asarray(c.result.calibrated), c.static
    pairs = [
        {"step": x.origin[i][0] + 1, "row": x.origin[i][1], "task_id": x.trained_tasks[i].id,
         "status": int(x.status[i]), "r_wm": float(x.r_wm[i]), "r_cal": float(cal[i]),
         "r_env": float(x.r_env[i]), "static": bool(st[i] >= 0),
         "static_status": Status(int(st[i])).name if st[i] >= 0 else None}
        for i in np.nonzero(c.env_valid)[0]
    ]  # fmt: skip
    if x.p_timeout is not None:
        for p, i in zip(pairs, np.nonzero(c.env_valid)[0], strict=True):
            if np.isfinite(x.p_timeout[i]):
                p["p_timeout"] = float(x.p_timeout[i])
    return pairs


def _mean(metrics: dict, name: str):
    if name not in metrics:
        return None
    s, c = metrics[name]
    return float(s) / max(float(c), 1.0)
