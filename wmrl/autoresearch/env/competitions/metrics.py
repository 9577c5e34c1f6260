"""The metrics competitions are graded by: a fixed registry of known rules, by name.

A competition's own grading code is never imported or run (it is arbitrary code from a
downloaded directory, and the grader runs as the trainer's user). A competition names its
metric in its own words instead (MLE-bench: ``grader.name`` in its config.yaml, e.g.
"auc-roc" or "multi-class-log-loss"; MLE-Dojo has no such field, so the user names it), and
``metric_for_name`` maps those words to one entry of ``METRICS`` through ``ALIASES``, or
refuses, naming the unknown metric and the known ones.

A submission's prediction columns are every column of the competition's sample submission
but the id column. Each metric reads their cells as one kind of value (``reads``):

    labels         a class label per cell (accuracy, the F1s), compared as both benchmarks
                   compare them: pandas reads the files and scikit-learn compares the
                   values, so a boolean word pandas reads as a boolean (True, TRUE, true,
                   False, FALSE, false) is the number 1 or 0 (True == 1 == 1.0), a cell
                   that is a number stands for its value ("007", "7.0" and "7" are one
                   label, ``ids.canonical_id``), and any other cell is its text, exactly
                   (case counts: "tRuE" is text, as pandas reads it)
    label_lists    space-separated labels, best first (MAP@k); each label compared by
                   ``ids.canonical_id`` (booleans are not numbers here: the benchmarks split
                   the cell's text and compare strings)
    integers       whole numbers in the 64-bit range (quadratic weighted kappa's grades)
    numbers        finite numbers
    probabilities  finite numbers in [0, 1]

A benchmark's own code may read a metric's predictions more strictly than the rule does
(``benchmark_reads``): MLE-bench's ROC AUC refuses predictions outside [0, 1]
(``prepare_for_auroc_metric``, which its AUC competitions' grade.py call), MLE-Dojo's
passes any numbers to scikit-learn.

and scores the columns one of three ways (``columns``):

    one    exactly one prediction column
    mean   the single-column rule on every column, averaged (MLE-bench's "column-wise ROC
           AUC", "mean column-wise RMSLE", MCRMSE)
    rows   one rule over whole rows (multi-class log loss over the class-probability
           columns, the answers one-hot in the same columns)

Each rule is written out in numpy (tests check them against scikit-learn). ``check_pred`` /
``check_true`` say why values cannot be scored (a probability row of zeros, a
log of a number <= -1, an AUC column with one class): for a submission that makes it
INVALID, for a competition's answers the competition is refused when it is imported.
Whatever else a metric raises on a submission's values is that submission's INVALID too
(``grading``): nothing a submission holds is the grader's failure.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import numpy as np
import pandas as pd

from wmrl.autoresearch.env import metrics as task_metrics
from wmrl.autoresearch.env.ids import canonical_id

READS = ("labels", "label_lists", "integers", "numbers", "probabilities")
COLUMNS = ("one", "mean", "rows")

# Probabilities are clipped to [EPS, 1 - EPS] before a log, as Kaggle's log losses do.
EPS = 1e-15
# How far a one-hot row of the answers may sum from 1.
ROW_SUM_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class CompetitionMetric(task_metrics.Metric):
    """A task metric (``fn(y_true, y_pred)`` on ``[n, c]`` arrays as ``parse_column`` reads
    them, ``higher_is_better``, the task type the card names) with how it reads cells and
    scores columns, and the checks its values must pass."""

    reads: str = "numbers"
    columns: str = "one"
    check_pred: Callable[[np.ndarray], str | None] | None = None
    check_true: Callable[[np.ndarray], str | None] | None = None


class ValuesError(ValueError):
    """Cells that cannot be read as the metric's kind of value (the message says which)."""


# -- reading cells ---------------------------------------------------------------------------

_INTEGER = re.compile(r"-?\d+", re.ASCII)
# The words pandas' CSV reader takes for booleans (its default true_values / false_values),
# as the numbers scikit-learn compares them with: True == 1, False == 0.
BOOLEAN_LABELS = {"True": "1", "TRUE": "1", "true": "1", "False": "0", "FALSE": "0", "false": "0"}
INT64 = (-(2**63), 2**63 - 1)


def label(cell: str) -> str:
    """A class label's compared form (the ``labels`` rule of the module docstring)."""
    form = canonical_id(cell)
    return BOOLEAN_LABELS.get(form, form)


def parse_column(cells: np.ndarray, reads: str, name: str) -> np.ndarray:
    """Column ``name``'s text cells ``[n]`` as ``reads`` values; ValuesError naming the
    column and the first bad cell otherwise."""
    if reads == "labels":
        forms = {cell: label(cell) for cell in set(cells)}
        values = np.array([forms[c] for c in cells], dtype=object)
        if any(v == "" for v in values):
            raise ValuesError(f"column {name!r} has empty cells")
        return values
    if reads == "label_lists":
        out = np.empty(len(cells), dtype=object)
        out[:] = [tuple(canonical_id(token) for token in c.split()) for c in cells]
        return out
    if reads == "integers":
        forms = [canonical_id(c) for c in cells]
        bad = next((f for f in forms if not _INTEGER.fullmatch(f)), None)
        if bad is not None:
            raise ValuesError(f"column {name!r} must hold whole numbers, found {bad[:40]!r}")
        # A grade's digits are at most MAX_CELL_CHARS, so int() is cheap; past int64 it is
        # the submission's error (numpy would raise OverflowError), said so.
        values = [int(f) for f in forms]
        big = next((v for v in values if not INT64[0] <= v <= INT64[1]), None)
        if big is not None:
            digits = len(str(abs(big)))
            raise ValuesError(
                f"column {name!r} holds a whole number of {digits} digits ({str(big)[:24]}"
                f"{'...' if digits > 23 else ''}), outside the 64-bit integer range"
            )
        return np.array(values, dtype=np.int64)
    values = pd.to_numeric(pd.Series(cells, dtype=object), errors="coerce").to_numpy(float)
    if not np.all(np.isfinite(values)):
        raise ValuesError(f"column {name!r} must hold finite numbers (found NaN, inf or text)")
    if reads == "probabilities" and (values.min() < 0.0 or values.max() > 1.0):
        raise ValuesError(f"column {name!r} must hold probabilities in [0, 1]")
    return values


def parse_columns(frame: pd.DataFrame, columns: list[str], reads: str) -> np.ndarray:
    """``frame``'s text ``columns`` as one ``[n, c]`` array of ``reads`` values."""
    parsed = [parse_column(frame[c].to_numpy(dtype=object), reads, c) for c in columns]
    return np.stack(parsed, axis=1)


# -- single-column rules ([n] arrays) ---------------------------------------------------------


def accuracy(y_true, y_pred) -> float:
    return float(np.mean(y_true == y_pred))


def _class_counts(y_true, y_pred):
    """Per class of the union of true and predicted labels: true positives, false positives,
    false negatives, support (scikit-learn's default labels)."""
    classes = sorted(set(y_true) | set(y_pred), key=str)
    tp = np.array([np.sum((y_true == c) & (y_pred == c)) for c in classes], float)
    fp = np.array([np.sum((y_true != c) & (y_pred == c)) for c in classes], float)
    fn = np.array([np.sum((y_true == c) & (y_pred != c)) for c in classes], float)
    return tp, fp, fn, tp + fn


def _f1s(tp, fp, fn) -> np.ndarray:
    denom = 2 * tp + fp + fn
    return np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)


def f1_binary(y_true, y_pred) -> float:
    """F1 of the positive class "1" (Kaggle's binary F1; 0 when it is never true nor
    predicted)."""
    tp = float(np.sum((y_true == "1") & (y_pred == "1")))
    fp = float(np.sum((y_true != "1") & (y_pred == "1")))
    fn = float(np.sum((y_true == "1") & (y_pred != "1")))
    return 0.0 if 2 * tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def f1_micro(y_true, y_pred) -> float:
    tp, fp, fn, _ = _class_counts(y_true, y_pred)
    return float(_f1s(np.array([tp.sum()]), np.array([fp.sum()]), np.array([fn.sum()]))[0])


def f1_weighted(y_true, y_pred) -> float:
    """Per-class F1 weighted by each class's share of the true labels."""
    tp, fp, fn, support = _class_counts(y_true, y_pred)
    return float(np.sum(_f1s(tp, fp, fn) * support) / support.sum())


def quadratic_weighted_kappa(y_true, y_pred) -> float:
    """Cohen's kappa with quadratic weights on the sorted union of grades, the weight of a
    pair (i, j) being (i - j)^2 in positions of that list (scikit-learn's
    ``cohen_kappa_score(weights="quadratic")``), in O(n + k) memory: no k x k matrix.

    With t, p the rows' positions, the observed weighted sum is sum((t - p)^2) and the
    expected one (the outer product of the two histograms over n) expands to
    n * (var t + var p + (mean t - mean p)^2), population variances: both are sums over the
    n rows. kappa = 1 - observed / expected."""
    grades = np.union1d(y_true, y_pred)
    if len(grades) == 1:
        return 1.0  # every grade the same, on both sides: perfect agreement
    t = np.searchsorted(grades, y_true).astype(float)
    p = np.searchsorted(grades, y_pred).astype(float)
    observed = float(np.sum((t - p) ** 2))
    expected = len(t) * float(np.var(t) + np.var(p) + (np.mean(t) - np.mean(p)) ** 2)
    return 1.0 - observed / expected


def binary_log_loss(y_true, y_prob) -> float:
    p = np.clip(np.asarray(y_prob, float), EPS, 1 - EPS)
    y = np.asarray(y_true, float)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def mse(y_true, y_pred) -> float:
    d = np.asarray(y_true, float) - np.asarray(y_pred, float)
    return float(np.mean(d * d))


def rmsle(y_true, y_pred) -> float:
    d = np.log1p(np.asarray(y_pred, float)) - np.log1p(np.asarray(y_true, float))
    return float(np.sqrt(np.mean(d * d)))


def average_precision_at(k: int) -> Callable:
    """MAP@k: per row, the precision at each of the first k predicted labels that is a true
    label not predicted earlier in the row, summed and divided by min(true labels, k); the
    mean over rows. A row's truth may list several labels (space-separated)."""

    def score(y_true, y_pred) -> float:
        total = 0.0
        for actual, predicted in zip(y_true, y_pred, strict=True):
            hits, found, seen = 0.0, 0, set()
            for rank, label in enumerate(predicted[:k], start=1):
                if label in actual and label not in seen:
                    found += 1
                    hits += found / rank
                seen.add(label)
            total += hits / min(len(actual), k)
        return total / len(y_true)

    return score


# -- checks --------------------------------------------------------------------------------


def _binary_truth(values: np.ndarray) -> str | None:
    for j in range(values.shape[1]):
        column = values[:, j]
        if not np.isin(column, (0.0, 1.0)).all():
            return "the answers must be 0 or 1"
        if len(np.unique(column)) < 2:
            return "an answer column holds one class (the metric is undefined)"
    return None


def _above_minus_one(values: np.ndarray) -> str | None:
    if np.any(values <= -1.0):
        return "values must be greater than -1 (the metric takes log(1 + x))"
    return None


def _rows_sum_to_one(values: np.ndarray) -> str | None:
    if np.any(np.abs(values.sum(axis=1) - 1.0) > ROW_SUM_TOLERANCE):
        return f"each row's probabilities must sum to 1 (within {ROW_SUM_TOLERANCE:g})"
    return None


def _rows_with_mass(values: np.ndarray) -> str | None:
    if np.any(values.sum(axis=1) <= 0.0):
        return "a row's class probabilities are all 0 (they are rescaled to sum to 1)"
    return None


def _one_hot_truth(values: np.ndarray) -> str | None:
    if not np.isin(values, (0.0, 1.0)).all() or _rows_sum_to_one(values):
        return "the answers must be one-hot rows (one 1 per row, 0 elsewhere)"
    return None


def _not_constant(values: np.ndarray) -> str | None:
    if any(len(np.unique(values[:, j])) < 2 for j in range(values.shape[1])):
        return "an answer column is constant (the metric is undefined)"
    return None


def _non_empty_truth(values: np.ndarray) -> str | None:
    if any(len(cell) == 0 for cell in values.ravel()):
        return "an answer cell lists no label"
    return None


# -- the registry ---------------------------------------------------------------------------


def _on_one(rule: Callable) -> Callable:
    return lambda y_true, y_pred: float(rule(y_true[:, 0], y_pred[:, 0]))


def _on_mean(rule: Callable) -> Callable:
    def score(y_true, y_pred) -> float:
        return float(np.mean([rule(y_true[:, j], y_pred[:, j]) for j in range(y_true.shape[1])]))

    return score


def multiclass_log_loss(y_true, y_prob) -> float:
    """-mean over rows of sum_c y_c log p_c; y one-hot, p each row divided by its sum (as
    Kaggle rescales a submission's rows) then clipped to [EPS, 1 - EPS]."""
    p = np.asarray(y_prob, float)
    p = np.clip(p / p.sum(axis=1, keepdims=True), EPS, 1 - EPS)
    return float(-np.mean(np.sum(np.asarray(y_true, float) * np.log(p), axis=1)))


def _metric(name, rule, higher, task_type, reads, columns="one", **checks) -> CompetitionMetric:
    wrap = {"one": _on_one, "mean": _on_mean, "rows": lambda f: f}[columns]
    return CompetitionMetric(
        name=name,
        fn=wrap(rule),
        higher_is_better=higher,
        task_type=task_type,
        needs_scores=reads in ("numbers", "probabilities") and task_type == "classification",
        reads=reads,
        columns=columns,
        **checks,
    )


_C, _R = "classification", "regression"
_MAX_K = 100  # MAP@k for k in 1..100

METRICS: dict[str, CompetitionMetric] = {
    m.name: m
    for m in [
        _metric("accuracy", accuracy, True, _C, "labels"),
        _metric("f1", f1_binary, True, _C, "labels"),
        _metric("f1_macro", task_metrics.f1_macro, True, _C, "labels"),
        _metric("f1_micro", f1_micro, True, _C, "labels"),
        _metric("f1_weighted", f1_weighted, True, _C, "labels"),
        _metric("qwk", quadratic_weighted_kappa, True, _C, "integers"),
        _metric("roc_auc", task_metrics.roc_auc, True, _C, "numbers", check_true=_binary_truth),
        _metric(
            "mean_roc_auc", task_metrics.roc_auc, True, _C, "numbers", "mean",
            check_true=_binary_truth,
        ),
        _metric("logloss", binary_log_loss, False, _C, "probabilities", check_true=_binary_truth),
        _metric(
            "multiclass_logloss", multiclass_log_loss, False, _C, "probabilities", "rows",
            check_pred=_rows_with_mass, check_true=_one_hot_truth,
        ),
        _metric("rmse", task_metrics.rmse, False, _R, "numbers"),
        _metric("mse", mse, False, _R, "numbers"),
        _metric("mae", task_metrics.mae, False, _R, "numbers"),
        _metric("r2", task_metrics.r2, True, _R, "numbers", check_true=_not_constant),
        _metric(
            "rmsle", rmsle, False, _R, "numbers",
            check_pred=_above_minus_one, check_true=_above_minus_one,
        ),
        _metric(
            "mean_rmsle", rmsle, False, _R, "numbers", "mean",
            check_pred=_above_minus_one, check_true=_above_minus_one,
        ),
        _metric("mcrmse", task_metrics.rmse, False, _R, "numbers", "mean"),
    ]
}  # fmt: skip

# A competition's words for a metric, normalised (``normalise_name``), to a registry name.
ALIASES: dict[str, str] = {
    **{alias: "accuracy" for alias in (
        "accuracy", "classification-accuracy", "multi-class-classification-accuracy",
        "categorization-accuracy", "multiclass-accuracy",
    )},
    **{alias: "f1" for alias in ("f1", "f1-score", "binary-f1", "f1-binary")},
    **{alias: "f1_macro" for alias in ("f1-macro", "macro-f1", "macro-f1-score")},
    **{alias: "f1_micro" for alias in ("f1-micro", "micro-f1", "micro-f1-score")},
    **{alias: "f1_weighted" for alias in ("f1-weighted", "weighted-f1", "weighted-f1-score")},
    **{alias: "qwk" for alias in (
        "qwk", "quadratic-weighted-kappa", "quadratic-kappa", "cohen-kappa-quadratic",
    )},
    **{alias: "roc_auc" for alias in (
        "auc", "roc-auc", "auc-roc", "roc-auc-score", "area-under-the-roc-curve",
    )},
    **{alias: "mean_roc_auc" for alias in (
        "mean-roc-auc", "column-wise-roc-auc", "mean-column-wise-roc-auc", "mean-auc",
    )},
    **{alias: "logloss" for alias in ("logloss", "log-loss", "binary-log-loss")},
    **{alias: "multiclass_logloss" for alias in (
        "multiclass-logloss", "multi-class-log-loss", "multiclass-log-loss",
        "multi-class-logloss", "categorical-cross-entropy",
    )},
    **{alias: "rmse" for alias in (
        "rmse", "root-mean-squared-error", "root-mean-square-error",
    )},
    **{alias: "mse" for alias in ("mse", "mean-squared-error")},
    **{alias: "mae" for alias in ("mae", "mean-absolute-error")},
    **{alias: "r2" for alias in ("r2", "r-squared", "coefficient-of-determination")},
    **{alias: "rmsle" for alias in (
        "rmsle", "root-mean-squared-log-error", "root-mean-squared-logarithmic-error",
    )},
    **{alias: "mean_rmsle" for alias in (
        "mean-rmsle", "column-wise-rmsle", "mean-column-wise-rmsle",
    )},
    **{alias: "mcrmse" for alias in (
        "mcrmse", "mean-column-wise-rmse", "mean-columnwise-root-mean-squared-error",
    )},
}  # fmt: skip

_MAP_AT = re.compile(r"(?:map|mean-average-precision)-?(\d{1,3})", re.ASCII)


def normalise_name(words: str) -> str:
    """Lower case, every run of other characters than letters and digits one "-": "Column-wise
    ROC AUC" is "column-wise-roc-auc", "f1_macro" is "f1-macro", "MAP@5" is "map-5"."""
    return re.sub(r"[^a-z0-9]+", "-", words.lower()).strip("-")


def get_competition_metric(name: str) -> CompetitionMetric:
    """A registry entry by its exact name (``METRICS``, or ``map@k`` for k in 1..100); a
    ValueError listing the names otherwise."""
    if name in METRICS:
        return METRICS[name]
    m = re.fullmatch(r"map@(\d{1,3})", name, re.ASCII)
    if m and 1 <= int(m[1]) <= _MAX_K:
        return _metric(name, average_precision_at(int(m[1])), True, _C, "label_lists",
                       check_true=_non_empty_truth)  # fmt: skip
    raise ValueError(f"unknown competition metric {name!r}; known: {', '.join(known_names())}")


def known_names() -> list[str]:
    return [*sorted(METRICS), "map@k (k = 1..100)"]


def metric_for_name(words: str) -> CompetitionMetric:
    """The registry entry a competition's name for its metric stands for (``ALIASES``, a
    registry name, or MAP@k spelled "map@5", "MAP-5", "mean average precision @ 5"); a
    ValueError naming the unknown words and the known metrics otherwise."""
    if words in METRICS:
        return METRICS[words]
    key = normalise_name(words)
    if key in ALIASES:
        return METRICS[ALIASES[key]]
    m = _MAP_AT.fullmatch(key)
    if m and 1 <= int(m[1]) <= _MAX_K:
        return get_competition_metric(f"map@{int(m[1])}")
    raise ValueError(
        f"unknown metric {words!r}: no known rule by that name (known: "
        f"{', '.join(known_names())}); the competition's own grading code is never run, so "
        "name one of these for it (--metric or --metrics)"
    )


# Where a benchmark's own code reads a metric's predictions more strictly than its rule:
# (benchmark, metric) -> the reading it gets instead (module docstring).
BENCHMARK_READS = {("mlebench", "roc_auc"): "probabilities"}


def benchmark_reads(metric: CompetitionMetric, benchmark: str) -> str:
    """How a competition of ``benchmark`` reads ``metric``'s predictions."""
    return BENCHMARK_READS.get((benchmark, metric.name), metric.reads)


def score(metric: CompetitionMetric, y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """The metric on parsed ``[n, c]`` answers and predictions; ValuesError when the
    predictions fail the metric's check or the score is not a finite number."""
    problem = metric.check_pred(y_pred) if metric.check_pred else None
    if problem:
        raise ValuesError(f"predictions: {problem}")
    value = metric.fn(y_true, y_pred)
    if not math.isfinite(value):
        raise ValuesError(f"the score is not finite ({value})")
    return float(value)
