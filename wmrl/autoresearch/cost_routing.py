"""Cost-aware routing (`routing = cost`, docs/method.md 3.11): the cap, the WM's score of a
script known to run past it, and what a run reports about it.

Every row outside the anchor groups runs for real under a short cap; the trainer
(`wmrl.autoresearch.trainer`, `.multiturn`) submits them with `cut_s` and the correction of
the rows the cap cuts is `wmrl.core.cut`. This module holds the host-side pieces:

* **The cap in force** (`CheapConfig`, `CapState`): fixed (`correction.cheap_limit_s`), or
  adaptive (`correction.cheap_quantile = q`): the q-quantile of the last `WINDOW` execution
  times of anchor rows. Anchors run in full under the real limit and are whole groups drawn
  at random, so their runtimes are an unbiased sample of the policy's (the capped rows'
  runtimes are censored at the cap and would pull the quantile down); about a fraction q of
  the capped rows then finish. The window starts as the executed training corpus's runtimes
  and the anchors replace them as they arrive; its state is checkpointed (`RunState.cap`),
  so a resumed run uses the same caps. The cap a row runs under is `min(cap, its limit)`;
  at its limit nothing is cut.
* **The WM's score given the cut** (`cut_scores`): P(timeout | ran past the cap) under the
  row's real limit from the runtime head's log-normal, `S(limit) / S(cap)`, mixed with the
  reward head as the WM score is (`score = (1 - p) r_head + p r_TIMEOUT`); without a runtime
  head, the WM's plain score.
* **What the anchors say about the cut** (`past_cap`, `cut_figures`): the anchor rows that
  ran past the cap (the rows the cap would have cut), their statuses, and the AUC of the
  WM's conditional P(timeout) for a TIMEOUT among them.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import numpy as np
from flax import struct
from scipy.special import log_ndtr

from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.grader import reward as status_reward
from wmrl.core.stats import auc

WINDOW = 64  # anchor execution times the adaptive cap is the quantile of


@dataclasses.dataclass(frozen=True)
class CheapConfig:
    """The cap of cost-aware routing: `limit_s` seconds, or (`limit_s = 0`) the `quantile`
    of the recent anchors' execution times."""

    limit_s: float = 0.0
    quantile: float = 0.0
    window: int = WINDOW

    @property
    def adaptive(self) -> bool:
        return not self.limit_s


@struct.dataclass
class CapState:
    """The adaptive cap's window of recent execution times (a ring buffer, checkpointed)."""

    runtimes: np.ndarray  # [W] float32 seconds
    next: np.ndarray  # int64 scalar: write position


def init_cap_state(corpus_runtimes, time_limit_s: float, window: int = WINDOW) -> CapState:
    """The window before any anchor: the last `window` finite runtimes of the executed
    training corpus (repeated if there are fewer; the limit if there are none), each at most
    `time_limit_s` (0 = no limit)."""
    rt = np.asarray([r for r in corpus_runtimes if r is not None and math.isfinite(r)], float)
    if time_limit_s:
        rt = np.minimum(rt, time_limit_s)
    if not len(rt):
        rt = np.asarray([time_limit_s or 1.0])
    rt = np.resize(rt[-window:], window)
    return CapState(runtimes=rt.astype(np.float32), next=np.int64(0))


def fold_runtimes(state: CapState | None, runtimes) -> CapState | None:
    """The window with these anchor execution times (seconds; NaN = unknown, skipped) in."""
    if state is None:
        return None
    rt = np.array(state.runtimes)
    j = int(state.next)
    for r in np.asarray(runtimes, float):
        if math.isfinite(r):
            rt[j] = r
            j = (j + 1) % len(rt)
    return state.replace(runtimes=rt, next=np.int64(j))


def cap_in_force(config: CheapConfig, state: CapState | None) -> float:
    """The cap (seconds) of the step that starts from `state`."""
    if not config.adaptive:
        return float(config.limit_s)
    return float(np.quantile(np.asarray(state.runtimes, float), config.quantile))


def row_caps(cap_s: float, limits: np.ndarray) -> np.ndarray:
    """[n] the cap each row runs under: the cap, or its limit where that is lower."""
    return np.minimum(cap_s, np.asarray(limits, float))


def cut_scores(wm_out: dict | None, limits: np.ndarray, caps: np.ndarray):
    """(r_cut, p_cut) [n] float32: the WM's score of each row given it ran past its cap, and
    its P(timeout | ran past the cap) under its limit (NaN without a runtime head, where
    r_cut is the plain score; zeros without a WM)."""
    n = len(limits)
    if wm_out is None:
        return np.zeros(n, np.float32), np.full(n, np.nan, np.float32)
    score = np.asarray(wm_out["score"], np.float32)
    if "runtime_log_var" not in wm_out or "score_raw" not in wm_out:
        return score, np.full(n, np.nan, np.float32)
    mu = np.log(np.maximum(np.asarray(wm_out["runtime_s"], float), 1e-30))
    sd = np.exp(0.5 * np.asarray(wm_out["runtime_log_var"], float))
    limits, caps = np.asarray(limits, float), np.asarray(caps, float)
    log_s = lambda x: log_ndtr(-(np.log(x) - mu) / sd)  # log P(runtime > x)
    binding = caps < limits
    p = np.where(binding, np.exp(np.minimum(log_s(limits) - log_s(caps), 0.0)), np.nan)
    p = np.where(binding, p, np.asarray(wm_out.get("p_timeout", np.zeros(n)), float))
    r_timeout = status_reward(Status.TIMEOUT)
    r_cut = (1.0 - p) * np.asarray(wm_out["score_raw"], float) + p * r_timeout
    return r_cut.astype(np.float32), p.astype(np.float32)


def past_cap(status, runtime_s, caps, limits, graded) -> np.ndarray:
    """[n] bool: graded rows, executed in full, that ran past the cap they would have had
    (a TIMEOUT, or a runtime above it) where that cap is below their limit."""
    status, runtime_s = np.asarray(status), np.asarray(runtime_s, float)
    over = (status == int(Status.TIMEOUT)) | (np.nan_to_num(runtime_s, nan=0.0) > caps)
    return np.asarray(graded, bool) & (np.asarray(caps) < np.asarray(limits)) & over


def cut_figures(status, p_cut, past) -> dict:
    """On the anchor rows past the cap: their statuses and the AUC of the WM's conditional
    P(timeout) for a TIMEOUT against the other past-cap rows (None where undefined)."""
    past = np.asarray(past, bool)
    status, p_cut = np.asarray(status)[past], np.asarray(p_cut, float)[past]
    known = np.isfinite(p_cut)
    timeout = status == int(Status.TIMEOUT)
    value = auc(p_cut[known], timeout[known]) if known.any() else None
    return {
        "anchor_past_cap_status": dict(Counter(Status(int(v)).name for v in status)),
        "anchor_past_cap_timeout_auc": value,
    }


def pending_with_cut_fields(pending):
    """`pending` (a `state.Pending`) with the cost-routing arrays, empty (NaN), if it lacks
    them: the layout every pending record of a cost-routing run has."""
    if pending.r_cut is not None:
        return pending
    n = len(pending.rows)
    empty = np.full(n, np.nan, np.float32)
    return pending.replace(r_cut=empty, p_cut=empty.copy(), cap_s=np.float32(np.nan))


class CostRouting:
    """The single-turn trainer's side of cost-aware routing (`Trainer.cost`): the cap in
    force, the capped rows' submission and collection (journalled in `cheap.jsonl`, reused on
    resume, cut ones as cut), the correction's inputs, and the step's figures.

    In modes with a WM stream the capped rows are every row outside the anchor groups (the
    anchor positions and this step's own anchors run in full). In `real` every group is
    executed, each row under the cap, and a cut row gets TIMEOUT's reward (lowering the
    limit: it changes the task; the evaluation still runs at the full limit)."""

    def __init__(self, tc, pool, journal, anchor_journal, time_limit):
        self.cfg, self.uses_wm, self.lag = tc.cheap, tc.spec.uses_wm, tc.anchor_lag
        self.debias_cfg = tc.debias
        self.pool, self.journal, self.anchor_journal = pool, journal, anchor_journal
        self.time_limit = time_limit  # task -> the limit a script of it runs under
        self.time_limit_cap_s = tc.time_limit_cap_s

    # -- state ----------------------------------------------------------------------------

    def initial_state(self, st, executions: list[dict]):
        from wmrl.core.cut import init_cut_state

        corr = st.correction
        if self.uses_wm:
            prior = float(np.asarray(corr.anchor_mean.prior))
            corr = corr.replace(cut=init_cut_state(self.debias_cfg, prior))
        cap = None
        if self.cfg.adaptive:
            runtimes = [r.get("runtime_s") for r in executions if r.get("split") == "train"]
            cap = init_cap_state(runtimes, self.time_limit_cap_s, self.cfg.window)
        return st.replace(correction=corr, cap=cap)

    def cap(self, st) -> float:
        return cap_in_force(self.cfg, st.cap)

    def limits(self, tasks) -> np.ndarray:
        return np.asarray([self.time_limit(t) for t in tasks], float)

    # -- the step -------------------------------------------------------------------------

    def capped_rows(self, n: int, r) -> np.ndarray:
        """The rows run under the cap besides the anchors: none in `real` (its anchors, every
        group, are capped themselves), else every row outside the anchor positions and this
        step's own anchors."""
        if not self.uses_wm:
            return np.zeros(0, np.int64)
        full = np.zeros(n, bool)
        full[r.anchor_idx] = True
        full[r.submit_idx] = True
        return np.nonzero(~full)[0]

    def anchor_caps(self, st, tasks) -> np.ndarray | None:
        """`real` only: the cap each anchor row runs under (None in the WM modes)."""
        return None if self.uses_wm else row_caps(self.cap(st), self.limits(tasks))

    def submit(self, st, s, r):
        """Submit the capped rows (before the anchors, so the step does not wait behind
        full-length executions); None when there are none."""
        rows = self.capped_rows(len(s.scripts), r)
        if not len(rows):
            return None
        tasks, scripts = [s.row_tasks[i] for i in rows], [s.scripts[i] for i in rows]
        caps = row_caps(self.cap(st), self.limits(tasks))
        from wmrl.autoresearch import execution

        return execution.submit(
            self.journal, self.pool, s.step, rows, tasks, scripts, "cheap", cut_s=caps
        )

    def collect(self, st, s, r, scored, x, sub):
        """The exchanged batch with the capped rows' outcomes in: real rewards where they
        finished, `cut` where the cap stopped them; every row's WM score given a run past
        the cap; the anchor positions that ran past theirs (with the lag, the previous
        step's rows, their scores and cap spliced in); the pending anchors' scores."""
        from wmrl.autoresearch import execution
        from wmrl.autoresearch.env.grader import Status

        n, cap = len(s.scripts), self.cap(st)
        limits = self.limits(s.row_tasks)
        r_cut, p_cut = cut_scores(scored.outputs if self.uses_wm else None, limits,
                                  row_caps(cap, limits))  # fmt: skip
        cut, real_rows, past = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        idx, seconds = r.anchor_idx, 0.0
        anchor_cap = cap
        prev = st.pending
        if x.collected and x.origin[idx[0]][0] != s.step and prev.r_cut is not None:
            keep = np.asarray(prev.rows) >= 0  # the previous step's rows, spliced in
            r_cut[idx], p_cut[idx] = np.asarray(prev.r_cut)[keep], np.asarray(prev.p_cut)[keep]
            anchor_cap = float(prev.cap_s)
        if x.collected:
            graded = x.status[idx] != int(Status.UNGRADED)
            seconds += float(np.nansum(x.runtime_s[idx]))
            if not self.uses_wm:  # `real`: its anchors ran capped; a cut is TIMEOUT's reward
                for i in idx:
                    rec = self.anchor_journal.done.get((s.step, int(i)))
                    cut[i] = bool(rec and rec.get("cut"))
                x.status[cut] = int(Status.TIMEOUT)
                x.r_env[cut] = status_reward(Status.TIMEOUT)
            else:
                pos_limits = self.limits(x.trained_tasks[i] for i in idx)
                caps = row_caps(anchor_cap, pos_limits)
                past[idx] = past_cap(x.status[idx], x.runtime_s[idx], caps, pos_limits, graded)
        pending = x.pending
        if self.lag and pending.valid and int(pending.step) == s.step:
            ex, m = r.submit_idx, len(pending.rows)
            pad = lambda v: np.concatenate([v[ex], np.full(m - len(ex), np.nan, np.float32)])
            pending = pending.replace(r_cut=pad(r_cut), p_cut=pad(p_cut), cap_s=np.float32(cap))
        else:
            pending = pending_with_cut_fields(pending)
        new = 0
        if sub is not None:
            out, new = execution.collect(self.journal, sub, flush=False)
            rows, was_cut = np.asarray(sub.rows), out["cut"].astype(bool)
            done = ~was_cut & (out["status"] != int(Status.UNGRADED))
            cut[rows[was_cut]] = True
            real_rows[rows[done]] = True
            x.r_env[rows[done]] = out["reward"][done]
            x.status[rows[done]] = out["status"][done]
            x.runtime_s[rows] = out["runtime_s"]
            x.error_type[rows[done]] = out["error_type"][done]
            seconds += float(np.nansum(out["runtime_s"]))
        return x._replace(
            pending=pending, r_cut=r_cut, p_cut=p_cut, cut=cut, real_rows=real_rows,
            past_cap=past, cap_s=cap, capped_rows=0 if sub is None else len(sub.rows),
            capped_new=new, execution_s=seconds,
        )  # fmt: skip

    def inputs(self, inputs, x):
        """The correction's inputs (`core.correct.StepInputs`) with the capped rows' in; on
        a batch without them (the warm-up's) nothing is cut."""
        if not self.uses_wm:
            return inputs
        n = len(x.r_wm)
        none = np.zeros(n, bool)
        get = lambda v, default: default if v is None else v
        return inputs._replace(
            real_rows=get(x.real_rows, none), cut_mask=get(x.cut, none),
            r_cut=get(x.r_cut, np.asarray(x.r_wm, np.float32)), past_cap=get(x.past_cap, none),
        )  # fmt: skip

    def finish(self, st, x, c, n_rows: int):
        """(the new state with the capped rows counted and the cap's window updated, the
        step's cost-routing metrics)."""
        cut = 0 if x.cut is None else int(x.cut.sum())
        under = 0 if x.real_rows is None else int(x.real_rows.sum())
        real = int((np.asarray(c.env_valid) & ~x.cut).sum()) + under
        extra = under - (0 if self.uses_wm else cut)  # `real`: a cut anchor is no outcome
        graded = np.asarray(c.env_valid)
        window = fold_runtimes(st.cap, np.asarray(x.runtime_s)[graded]) if self.uses_wm else st.cap
        metrics = {
            "cheap_limit_s": x.cap_s, "capped_rows": x.capped_rows, "cut_rows": cut,
            "real_row_share": real / n_rows,
            **cut_figures(x.status, x.p_cut, x.past_cap),
        }  # fmt: skip
        return st.replace(real_executions=st.real_executions + extra, cap=window), metrics

    def annotate_pairs(self, pairs: list[dict], x, c) -> list[dict]:
        """The anchor pairs with whether each ran past its cap, and the WM's score and
        P(timeout) given that (`r_cut`, `p_cut`, where known)."""
        for p, i in zip(pairs, np.nonzero(c.env_valid)[0], strict=True):
            p["past_cap"] = bool(x.past_cap[i])
            p["r_cut"] = float(x.r_cut[i])
            if np.isfinite(x.p_cut[i]):
                p["p_cut"] = float(x.p_cut[i])
        return pairs


def cost_summary(steps: list[dict], pairs: list[dict]) -> dict:
    """summary.json's cost-routing figures: the means over steps of the real-row share, the
    cut rows, the sandbox seconds and the cap in force, and on the run's anchor pairs the
    statuses of those past the cap and the WM's AUC for TIMEOUT among them."""
    mean = lambda k: float(np.mean([s[k] for s in steps])) if steps else None
    past = [p for p in pairs if p.get("past_cap")]
    status = np.asarray([p["status"] for p in past], int)
    p_cut = np.asarray([p.get("p_cut", np.nan) for p in past], float)
    figures = cut_figures(status, p_cut, np.ones(len(past), bool))
    return {
        "real_row_share": mean("real_row_share"), "cut_rows": mean("cut_rows"),
        "execution_s": mean("execution_s"), "cheap_limit_s": mean("cheap_limit_s"),
        "cut_rows_total": int(sum(s["cut_rows"] for s in steps)),
        "anchor_past_cap_rows": len(past), **figures,
    }  # fmt: skip
