"""Task metrics, written out in numpy so the grader's numbers are easy to audit.

Each metric knows its direction: the percentile on a leaderboard must count a
lower RMSE as better, a higher accuracy as better.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Metric:
    """A scoring rule. ``needs_scores``: predictions are real-valued scores (AUC)."""

    name: str
    fn: Callable[[np.ndarray, np.ndarray], float]
    higher_is_better: bool
    task_type: str  # "classification" | "regression"
    needs_scores: bool = False


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Fraction of exact label matches. y_true, y_pred: [n] labels (any dtype)."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return float(np.mean(y_true == y_pred))


def f1_macro(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes present in y_true or y_pred.

    A class never predicted and never true does not exist; a class with no
    true and no predicted positives is skipped (sklearn's convention too).
    """
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    f1s = []
    for c in np.union1d(y_true, y_pred):
        tp = np.sum((y_true == c) & (y_pred == c))
        fp = np.sum((y_true != c) & (y_pred == c))
        fn = np.sum((y_true == c) & (y_pred != c))
        denom = 2 * tp + fp + fn
        f1s.append(0.0 if denom == 0 else 2 * tp / denom)
    return float(np.mean(f1s))


def roc_auc(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """Binary ROC AUC by the rank-sum (Mann-Whitney) formula, ties counted half.

    y_true: [n] in {0, 1}; y_score: [n] real, higher = more likely positive.
    """
    y_true = np.asarray(y_true).astype(int)
    y_score = np.asarray(y_score, dtype=float)
    pos, neg = y_score[y_true == 1], y_score[y_true == 0]
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError("roc_auc needs both classes in y_true")
    # Average ranks (1-based) handle ties exactly.
    order = np.argsort(y_score, kind="mergesort")
    ranks = np.empty(len(y_score), dtype=float)
    sorted_scores = y_score[order]
    i = 0
    while i < len(sorted_scores):
        j = i
        while j + 1 < len(sorted_scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = ranks[y_true == 1].sum()
    return float((rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Root mean squared error."""
    d = np.asarray(y_true, float) - np.asarray(y_pred, float)
    return float(np.sqrt(np.mean(d * d)))


def mae(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean absolute error."""
    return float(np.mean(np.abs(np.asarray(y_true, float) - np.asarray(y_pred, float))))


def r2(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Coefficient of determination 1 - SS_res / SS_tot (can be negative)."""
    y_true, y_pred = np.asarray(y_true, float), np.asarray(y_pred, float)
    ss_res = np.sum((y_true - y_pred) ** 2)
    ss_tot = np.sum((y_true - y_true.mean()) ** 2)
    if ss_tot == 0:
        return 0.0
    return float(1.0 - ss_res / ss_tot)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("accuracy", accuracy, True, "classification"),
        Metric("f1_macro", f1_macro, True, "classification"),
        Metric("roc_auc", roc_auc, True, "classification", needs_scores=True),
        Metric("rmse", rmse, False, "regression"),
        Metric("mae", mae, False, "regression"),
        Metric("r2", r2, True, "regression"),
    ]
}


def get_metric(name: str) -> Metric:
    """Look a metric up by name, with an error that lists the valid names."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; choose one of {sorted(METRICS)}")
    return METRICS[name]


def percentile(score: float, reference_scores: list[float], higher_is_better: bool) -> float:
    """Mid-rank position of ``score`` among the reference scores, in [0, 1].

    Beating every reference gives 1, losing to all gives 0, a tie counts half
    (so a submission identical to the only reference gets 0.5). With no
    references the position is undefined; we return 0.5 rather than reward
    or punish the agent for a missing leaderboard.
    """
    ref = np.asarray(reference_scores, dtype=float)
    if ref.size == 0:
        return 0.5
    if not higher_is_better:
        ref, score = -ref, -score
    worse = np.sum(ref < score)
    ties = np.sum(ref == score)
    return float((worse + 0.5 * ties) / ref.size)
