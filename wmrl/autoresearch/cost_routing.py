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
