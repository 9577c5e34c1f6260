"""The built-in task suite: 26 training and 9 + 48 held-out tasks, built by one command.

    python -m wmrl.autoresearch.env.suite --out=DIR [--only=ID,ID] [--workers=N]

Everything is offline and seeded: scikit-learn's bundled datasets, the
palmerpenguins and vega_datasets packages (their bundled CSVs), and
scikit-learn generators. Tasks differ in what the right solution is: missing
values (no imputer -> crash), string columns (no encoder -> crash), class
imbalance (F1/AUC reward metric-aware models), high dimension, large n under
a tight time limit (slow models time out), noisy targets. Each task.json
records its provenance and licence. Held-out tasks (``split: heldout``) must
never be trained on; 48 of them form a generated family (`heldout_family`), so that an
evaluation can use many held-out tasks of one kind.

Every source can be imported inside the sandbox too (the sandbox mounts the site-packages
its scripts import from), so no task copies its source's rows: a script would look its test
rows up there and read their labels. A packaged dataset's rows are re-derived (`rederive`:
each row takes a neighbour's target and moves the way rows of its kind vary; shuffled), and
a generator runs on a state drawn from the task's own seeded stream (`generator_state`),
which no integer ``random_state`` reproduces. What remains is the copy as extra training
data: a nearest-neighbour lookup in it scores within noise of the baselines, no better
(tests/autoresearch/env/test_suite_lookup.py tries every lookup on every task). A task's
rows depend only on the suite seed and its id, not on which other tasks are built.
"""

from __future__ import annotations

import dataclasses
import json
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from absl import app, flags
from sklearn import datasets

from wmrl.autoresearch.env.make_task import build_leaderboard, write_task
from wmrl.autoresearch.env.metrics import get_metric

# The version of the rows this builder makes from a seed, recorded in every task it writes:
# raise it whenever they change, so that a suite an older builder wrote is refused rather
# than reused (`stale_tasks`). Version 2: packaged rows re-derived, generator states not
# integer seeds, seeds by task id (version 1, unrecorded: rows copied from the sources).
SUITE_VERSION = 2

SKLEARN = {"source": "scikit-learn bundled dataset", "licence": "BSD-3-Clause (scikit-learn)"}
GENERATED = {"source": "scikit-learn generator", "licence": "generated (no licence needed)"}
PENGUINS = {
    "source": "palmerpenguins (Gorman, Williams & Fraser 2014; Palmer Station LTER)",
    "licence": "CC0 data / MIT package",
}
VEGA = {
    "source": "vega_datasets local data (cars: StatLib; seattle-weather: NOAA)",
    "licence": "MIT package (per its metadata); public data",
}
REDERIVED = {
    "classification": (
        "rows re-derived from the packaged copy, so that a lookup there does not give their "
        "labels away: each row takes the label of a random one of its {neighbours} nearest "
        "rows, its numeric features move by {scale:g} (more where rows vary in many "
        "directions) times the difference of two rows of its class, rows shuffled"
    ),
    "regression": (
        "rows re-derived from the packaged copy, so that a lookup there does not give their "
        "targets away: each row's target is its out-of-fold prediction plus the residual of "
        "a random row with a similar prediction, its numeric features move by {scale:g} "
        "(more where rows vary in many directions) times the difference of two rows of its "
        "target quintile, rows shuffled"
    ),
}
GENERATED_NOTE = "generator run on a state drawn from the task's seeded stream (no integer seed)"

# `rederive` gives a row the label of a random one of this many nearest rows (itself
# included): more blurs the classes a model has to learn, fewer lets a row found in the
# copy tell its label.
NEIGHBOURS = 5
# How far `rederive` moves a row, in differences between two rows of its kind (a class's
# spread grows by about sqrt(1 + 2 * jitter**2)). A class keeps its label wherever its
# rows' neighbours agree, so a row found in the copy would tell it: such rows must move
# enough not to be found. A number is drawn anew for every row (`_redrawn_targets`), so
# a row found tells no more than the relation a model learns, and a small move suffices;
# a target quintile's rows differ nearly as much as all rows do, so a large one would
# drown the features.
JITTER = {"classification": 1.0, "regression": 0.3}
# Rows that vary in many independent directions are easier to find again (in high
# dimension a row stays nearer its original than any other row is): past this many
# directions, the move grows with the square root of their number.
PLAIN_DIRECTIONS = 4.0
# Numeric columns with at most this many values are codes (months, cylinders), kept.
CODE_LEVELS = 12
# Regression rows are grouped for `rederive` by their target's quantile, in this many bins.
TARGET_BINS = 5


@dataclasses.dataclass(frozen=True)
class SuiteTask:
    """One built-in task. ``load`` gives its rows; with ``packaged`` they come from a
    dataset installed with a package and are re-derived (`rederive`) before ``shape``
    (the task's own edits: missing values, label noise) runs on them."""

    id: str
    load: Callable[[np.random.Generator], pd.DataFrame]
    target: str
    metric: str
    summary: str
    provenance: dict
    split: str = "train"
    time_limit_s: float = 60.0
    memory_mb: int = 2048
    packaged: bool = False
    shape: Callable[[pd.DataFrame, np.random.Generator], pd.DataFrame] | None = None


def task_rng(seed: int, task_id: str) -> np.random.Generator:
    """The task's own stream: from the suite seed and the task id only."""
    return np.random.default_rng([seed, zlib.crc32(task_id.encode())])


def generator_state(rng: np.random.Generator) -> np.random.RandomState:
    """A scikit-learn ``random_state`` whose state comes from four 63-bit draws of ``rng``:
    a script that re-runs the generator with any integer seed gets other rows."""
    return np.random.RandomState(np.random.MT19937(rng.integers(0, 2**63, size=4)))


def task_frame(spec: SuiteTask, seed: int = 0) -> pd.DataFrame:
    """The rows the task is written from (before `write_task` splits them)."""
    rng = task_rng(seed, spec.id)
    frame = spec.load(rng)
    if spec.packaged:
        classification = get_metric(spec.metric).task_type == "classification"
        frame = rederive(frame, spec.target, classification, rng)
    if spec.shape is not None:
        frame = spec.shape(frame, rng)
    return frame


def rederive(
    frame: pd.DataFrame,
    target: str,
    classification: bool,
    rng,
    scale: float | None = None,
    neighbours: int = NEIGHBOURS,
) -> pd.DataFrame:
    """New rows from a packaged dataset's rows, whose targets a lookup in the copy (which
    every sandboxed script can read) does not give away.

    * Each row's target is drawn anew from the other rows (`_redrawn_targets`): finding
      its original in the copy tells no more about its target than its neighbours do, and
      a model learns that from the training rows.
    * Its numeric features move by ``scale`` (default: `JITTER` of the task's kind) times
      the difference between two random rows of its group (its class; for regression its
      target's quantile bin), times sqrt(directions / PLAIN_DIRECTIONS) where the group's
      rows vary in more independent directions than that (`_directions`). The move follows
      the way rows of its kind vary (correlated columns move together). A class row lands
      among its neighbours rather than next to its original; a regression row moves less
      and may be found, but its target is not its original's.

    Values stay on the column's grid (its decimals) and in its range; string columns and
    numeric codes (at most `CODE_LEVELS` values: months, cylinders) are kept, so leave out
    of the source what would single a row out (a name, a date); the rows are shuffled, so
    their order says nothing about the copy's.
    """
    if scale is None:
        scale = JITTER["classification" if classification else "regression"]
    frame = frame.iloc[rng.permutation(len(frame))].reset_index(drop=True)
    frame[target] = _redrawn_targets(frame, target, neighbours, classification, rng)
    cols = [
        c for c in frame.columns
        if c != target and pd.api.types.is_numeric_dtype(frame[c])
        and frame[c].nunique() > CODE_LEVELS
    ]  # fmt: skip
    if not cols:
        return frame
    X = frame[cols].to_numpy(float)
    groups = _groups(frame[target], classification)
    move = np.zeros_like(X)
    for rows in groups:
        j, k = rng.choice(rows, (2, len(rows)))
        move[rows] = np.nan_to_num(X[j] - X[k])
    scale *= np.sqrt(max(1.0, _directions(X, groups) / PLAIN_DIRECTIONS))
    out = frame.copy()
    for c, x in zip(cols, (X + scale * move).T, strict=True):
        lo, hi, places = frame[c].min(), frame[c].max(), _decimals(frame[c])
        out[c] = np.clip(np.round(x, places), lo, hi).astype(frame[c].dtype)
    return out


def _redrawn_targets(
    frame: pd.DataFrame, target: str, k: int, classification: bool, rng
) -> pd.Series:
    """Every labelled row's target drawn anew from what the other rows say about it: a
    class, the label of a random one of its ``k`` nearest labelled rows (itself included);
    a number, its out-of-fold prediction (`_smooth`) plus the residual of a random row of
    the same predicted quintile, so that no row keeps its own noise."""
    Z = _design(frame.drop(columns=[target]))
    y = frame[target]
    labelled = np.flatnonzero(y.notna().to_numpy())
    values = y.to_numpy()[labelled]
    out = y.copy()
    if classification:
        from sklearn.neighbors import NearestNeighbors

        near = NearestNeighbors(n_neighbors=min(k, len(labelled))).fit(Z[labelled])
        idx = near.kneighbors(Z[labelled], return_distance=False)
        pick = idx[np.arange(len(labelled)), rng.integers(0, idx.shape[1], len(labelled))]
        out.iloc[labelled] = values[pick]
        return out
    smooth = _smooth(Z[labelled], values.astype(float), int(rng.integers(2**31)))
    residual = values.astype(float) - smooth
    drawn = np.empty_like(smooth)
    for rows in _groups(pd.Series(smooth), classification=False):
        drawn[rows] = residual[rng.choice(rows, len(rows))]
    out.iloc[labelled] = smooth + drawn
    return out


def _design(feats: pd.DataFrame) -> np.ndarray:
    """Standardised numeric columns (missing: 0) and one-hot string columns."""
    num = [c for c in feats.columns if pd.api.types.is_numeric_dtype(feats[c])]
    spread = feats[num].std().replace(0, 1).fillna(1)
    parts = [((feats[num] - feats[num].mean()) / spread).fillna(0).to_numpy(float)]
    strings = [c for c in feats.columns if c not in num]
    if strings:
        parts.append(pd.get_dummies(feats[strings].astype(str)).to_numpy(float))
    return np.hstack(parts)


def _smooth(Z: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray:
    """Out-of-fold predictions of the target (5 folds) by whichever of a ridge regression
    and a 10-nearest-neighbour mean predicts it better: the relation a model can learn,
    without each row's own noise."""
    from sklearn.linear_model import RidgeCV
    from sklearn.model_selection import KFold, cross_val_predict
    from sklearn.neighbors import KNeighborsRegressor

    folds = KFold(5, shuffle=True, random_state=seed)
    fits = [
        cross_val_predict(model, Z, y, cv=folds)
        for model in (RidgeCV(alphas=np.logspace(-3, 3, 13)), KNeighborsRegressor(10))
    ]
    return min(fits, key=lambda f: float(np.mean((f - y) ** 2)))


def _directions(X: np.ndarray, groups: list[np.ndarray]) -> float:
    """How many independent directions rows vary in within their group: the participation
    ratio (sum of eigenvalues)**2 / sum of squares of the pooled within-group covariance
    of the standardised columns (1 for one direction, d for d equal ones)."""
    Z = (X - np.nanmean(X, 0)) / np.where(np.nanstd(X, 0) > 0, np.nanstd(X, 0), 1.0)
    Z = np.nan_to_num(Z)
    centred = np.concatenate([Z[g] - Z[g].mean(0) for g in groups if len(g) > 1])
    eig = np.linalg.eigvalsh(np.atleast_2d(np.cov(centred.T)))
    return float(eig.sum() ** 2 / (eig**2).sum())


def _groups(y: pd.Series, classification: bool) -> list[np.ndarray]:
    """Row indices of each class, or of each target quantile bin (missing: one group)."""
    if classification:
        keys = y.astype(str).to_numpy()
    else:
        bins = pd.qcut(y, TARGET_BINS, labels=False, duplicates="drop")
        keys = bins.fillna(-1).to_numpy()
    return [np.flatnonzero(keys == k) for k in np.unique(keys)]


def _decimals(col: pd.Series, most: int = 6) -> int:
    """The fewest decimal places that hold every value of the column (at most ``most``)."""
    x = col.dropna().to_numpy(float)
    for places in range(most):
        if np.allclose(np.round(x, places), x, rtol=0, atol=1e-9):
            return places
    return most


def _sk(loader) -> pd.DataFrame:
    frame = loader(as_frame=True).frame
    frame.columns = [str(c).replace(" (cm)", "").replace(" ", "_") for c in frame.columns]
    return frame


def _inject_missing(df: pd.DataFrame, frac: float, rng, exclude=("target",)) -> pd.DataFrame:
    df = df.copy()
    for col in df.columns:
        if col in exclude:
            continue
        mask = rng.random(len(df)) < frac
        df.loc[mask, col] = np.nan
    return df


def _categorise(df: pd.DataFrame, cols, rng, levels=5) -> pd.DataFrame:
    """Turn numeric columns into string bins with shuffled names (needs encoding)."""
    df = df.copy()
    for col in cols:
        names = np.array([f"{col}_{c}" for c in rng.permutation(list("abcdefghij")[:levels])])
        bins = pd.qcut(df[col], levels, labels=False, duplicates="drop")
        df[col] = names[bins.to_numpy().astype(int)]
    return df


def _flip_labels(y: pd.Series, frac: float, rng) -> pd.Series:
    y = y.copy()
    classes = y.unique()
    idx = rng.random(len(y)) < frac
    y[idx] = rng.choice(classes, idx.sum())
    return y


def _classif(n, d, informative, rng, classes=2, weights=None, sep=1.0, cat=0, missing=0.0):
    X, y = datasets.make_classification(
        n_samples=n,
        n_features=d,
        n_informative=informative,
        n_redundant=min(2, d - informative),
        n_classes=classes,
        weights=weights,
        class_sep=sep,
        random_state=generator_state(rng),
    )
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(d)])
    if cat:
        df = _categorise(df, [f"f{i}" for i in range(cat)], rng)
    if missing:
        df = _inject_missing(df, missing, rng)
    df["target"] = y
    return df


def _regress(maker, rng, missing=0.0, cat=0, **kw):
    X, y = maker(random_state=generator_state(rng), **kw)
    df = pd.DataFrame(X, columns=[f"x{i}" for i in range(X.shape[1])])
    if cat:
        df = _categorise(df, [f"x{i}" for i in range(cat)], rng)
    if missing:
        df = _inject_missing(df, missing, rng)
    df["target"] = y
    return df


def _penguins(_rng) -> pd.DataFrame:
    """The penguins table without the study year (when a bird was measured, not what it
    is; with island, species and sex it would narrow a row down to a handful)."""
    from palmerpenguins import load_penguins

    return load_penguins().drop(columns=["year"])


def _cars(_rng) -> pd.DataFrame:
    """The cars table without the car's name, which names one model of one year and
    would give its row away."""
    from vega_datasets import data

    df = data.cars().drop(columns=["Name"])
    df["Year"] = pd.to_datetime(df["Year"]).dt.year
    return df


def _weather(_rng) -> pd.DataFrame:
    """Seattle's days with the year and month of their date (the date itself would give a
    day's row away)."""
    from vega_datasets import data

    df = data.seattle_weather()
    day = pd.to_datetime(df.pop("date"))
    df.insert(0, "month", day.dt.month)
    df.insert(0, "year", day.dt.year)
    return df


def _sk_loader(loader):
    return lambda _rng: _sk(loader)


def suite_tasks() -> list[SuiteTask]:
    """All built-in tasks (ids are stable; held-out ones carry split="heldout")."""
    T = SuiteTask
    gen = GENERATED
    return [
        T(
            "iris-species",
            _sk_loader(datasets.load_iris),
            "target",
            "f1_macro",
            "Iris species from four flower measurements.",
            SKLEARN,
            packaged=True,
        ),
        T(
            "wine-cultivar",
            _sk_loader(datasets.load_wine),
            "target",
            "accuracy",
            "Wine cultivar from 13 chemical measurements (features on very different scales).",
            SKLEARN,
            packaged=True,
        ),
        T(
            "breast-cancer-auc",
            _sk_loader(datasets.load_breast_cancer),
            "target",
            "roc_auc",
            "Malignant vs benign tumours from 30 cell-nucleus features.",
            SKLEARN,
            packaged=True,
        ),
        T(
            "digits-8x8",
            _sk_loader(datasets.load_digits),
            "target",
            "accuracy",
            "Handwritten digits as 64 pixel intensities.",
            SKLEARN,
            packaged=True,
        ),
        T(
            "diabetes-progression",
            _sk_loader(datasets.load_diabetes),
            "target",
            "rmse",
            "Disease progression one year after baseline (small n, noisy target).",
            SKLEARN,
            packaged=True,
        ),
        T(
            "penguins-species",
            _penguins,
            "species",
            "accuracy",
            "Penguin species; string columns and missing values.",
            PENGUINS,
            packaged=True,
        ),
        T(
            "penguins-body-mass",
            _penguins,
            "body_mass_g",
            "rmse",
            "Penguin body mass; string columns and missing values.",
            PENGUINS,
            packaged=True,
        ),
        T(
            "cars-mpg",
            _cars,
            "Miles_per_Gallon",
            "mae",
            "Car fuel economy; missing horsepower, a string origin column.",
            VEGA,
            packaged=True,
        ),
        T(
            "seattle-weather-type",
            _weather,
            "weather",
            "f1_macro",
            "Seattle weather type from daily measurements; strongly imbalanced classes.",
            VEGA,
            packaged=True,
        ),
        T(
            "synth-easy",
            lambda r: _classif(2000, 20, 8, r),
            "target",
            "accuracy",
            "A separable synthetic problem.",
            gen,
        ),
        T(
            "synth-imbalanced-f1",
            lambda r: _classif(3000, 20, 6, r, weights=[0.95]),
            "target",
            "f1_macro",
            "Rare positive class (5%); accuracy-optimal models score poorly on F1.",
            gen,
        ),
        T(
            "synth-imbalanced-auc",
            lambda r: _classif(3000, 15, 5, r, weights=[0.93]),
            "target",
            "roc_auc",
            "Rare positive class, ranked by AUC: predict probabilities.",
            gen,
        ),
        T(
            "synth-high-dim",
            lambda r: _classif(400, 500, 10, r),
            "target",
            "accuracy",
            "400 rows, 500 features, 10 informative: regularise or select features.",
            gen,
        ),
        T(
            "synth-regression-noisy",
            lambda r: _regress(
                datasets.make_regression,
                r,
                n_samples=1500,
                n_features=30,
                n_informative=10,
                noise=60.0,
            ),
            "target",
            "rmse",
            "Linear signal under heavy noise.",
            gen,
        ),
        T(
            "friedman1",
            lambda r: _regress(
                datasets.make_friedman1, r, n_samples=2000, n_features=10, noise=1.0
            ),
            "target",
            "r2",
            "Friedman #1: non-linear with interactions; five irrelevant features.",
            gen,
        ),
        T(
            "friedman2",
            lambda r: _regress(datasets.make_friedman2, r, n_samples=1500, noise=50.0),
            "target",
            "mae",
            "Friedman #2: impedance of an RLC circuit.",
            gen,
        ),
        T(
            "hastie-10-2",
            lambda r: _regress(datasets.make_hastie_10_2, r, n_samples=3000).assign(
                target=lambda d: (d["target"] > 0).astype(int)
            ),
            "target",
            "accuracy",
            "Hastie et al. 10.2: a spherical boundary (boosting shines, linear fails).",
            gen,
        ),
        T(
            "large-n-tight",
            lambda r: _classif(60000, 20, 10, r),
            "target",
            "accuracy",
            "60k rows under a 15 s limit: slow models time out.",
            gen,
            time_limit_s=15.0,
        ),
        T(
            "large-n-regression",
            lambda r: _regress(
                datasets.make_regression,
                r,
                n_samples=50000,
                n_features=20,
                n_informative=12,
                noise=10.0,
            ),
            "target",
            "rmse",
            "50k rows under a 15 s limit.",
            gen,
            time_limit_s=15.0,
        ),
        T(
            "synth-missing",
            lambda r: _classif(2000, 15, 8, r, missing=0.15),
            "target",
            "accuracy",
            "15% of feature values missing: impute or use a NaN-aware model.",
            gen,
        ),
        T(
            "synth-categorical",
            lambda r: _classif(2000, 12, 8, r, cat=6),
            "target",
            "accuracy",
            "Half the features are string categories: encode them.",
            gen,
        ),
        T(
            "breast-cancer-missing",
            _sk_loader(datasets.load_breast_cancer),
            "target",
            "accuracy",
            "Tumour classification with 10% of measurements missing.",
            SKLEARN,
            packaged=True,
            shape=lambda d, r: _inject_missing(d, 0.1, r),
        ),
        T(
            "wine-noisy-labels",
            _sk_loader(datasets.load_wine),
            "target",
            "accuracy",
            "Wine cultivar with 20% of labels randomised.",
            SKLEARN,
            packaged=True,
            shape=lambda d, r: d.assign(target=_flip_labels(d["target"], 0.2, r)),
        ),
        T(
            "diabetes-mae",
            _sk_loader(datasets.load_diabetes),
            "target",
            "mae",
            "Diabetes progression scored by MAE (robust losses help).",
            SKLEARN,
            packaged=True,
        ),
        T(
            "moons",
            lambda r: _regress(datasets.make_moons, r, n_samples=2000, noise=0.3),
            "target",
            "accuracy",
            "Two interleaved half-moons: a non-linear boundary.",
            gen,
        ),
        T(
            "circles-auc",
            lambda r: _regress(datasets.make_circles, r, n_samples=2000, noise=0.15, factor=0.5),
            "target",
            "roc_auc",
            "Concentric circles, ranked by AUC.",
            gen,
        ),
        # ---- held-out: never trained on ---------------------------------------------------
        T(
            "heldout-penguins-sex",
            lambda _r: _penguins(_r).dropna(subset=["sex"]),
            "sex",
            "roc_auc",
            "Penguin sex from measurements; string columns, missing values.",
            PENGUINS,
            packaged=True,
            split="heldout",
        ),
        T(
            "heldout-cars-horsepower",
            _cars,
            "Horsepower",
            "rmse",
            "Car horsepower; missing values and a string origin column.",
            VEGA,
            packaged=True,
            split="heldout",
        ),
        T(
            "heldout-weather-temp",
            _weather,
            "temp_max",
            "mae",
            "Seattle daily maximum temperature; a string weather column.",
            VEGA,
            packaged=True,
            split="heldout",
        ),
        T(
            "heldout-imbalanced-missing",
            lambda r: _classif(3000, 20, 6, r, classes=3, weights=[0.85, 0.1], missing=0.1),
            "target",
            "f1_macro",
            "Three imbalanced classes with missing values.",
            gen,
            split="heldout",
        ),
        T(
            "heldout-friedman1-large",
            lambda r: _regress(datasets.make_friedman1, r, n_samples=40000, noise=1.0),
            "target",
            "rmse",
            "Friedman #1 with 40k rows under a 15 s limit.",
            gen,
            split="heldout",
            time_limit_s=15.0,
        ),
        T(
            "heldout-categorical-missing",
            lambda r: _classif(2500, 14, 8, r, classes=3, cat=5, missing=0.1),
            "target",
            "accuracy",
            "String categories and missing values together.",
            gen,
            split="heldout",
        ),
        T(
            "heldout-gaussian-quantiles",
            lambda r: _regress(
                datasets.make_gaussian_quantiles, r, n_samples=2000, n_features=6, n_classes=3
            ),
            "target",
            "accuracy",
            "Classes are nested Gaussian shells.",
            gen,
            split="heldout",
        ),
        T(
            "heldout-digits-noisy",
            _sk_loader(datasets.load_digits),
            "target",
            "f1_macro",
            "Digits with 15% of labels randomised.",
            SKLEARN,
            packaged=True,
            shape=lambda d, r: d.assign(target=_flip_labels(d["target"], 0.15, r)),
            split="heldout",
        ),
        T(
            "heldout-high-dim-regression",
            lambda r: _regress(
                datasets.make_regression,
                r,
                n_samples=300,
                n_features=400,
                n_informative=15,
                noise=5.0,
            ),
            "target",
            "r2",
            "300 rows, 400 features: a sparse linear model wins.",
            gen,
            split="heldout",
        ),
        *heldout_family(),
    ]


# Generated held-out tasks of the kind the tiny config evaluates on: the three kinds of
# `heldout-categorical-missing`, `heldout-imbalanced-missing` and
# `heldout-gaussian-quantiles` (target column `target`, a new `id` column, features f0.. or
# x0.., string categories and missing values), with sizes, dimensions, class counts and
# missing rates varying with the member's number. Many held-out tasks make one evaluation's
# standard error small where it counts the variance between tasks
# (`wmrl.autoresearch.evaluation.heldout_se`); their ids are `heldout-family-01` onwards.
HELDOUT_FAMILY = 48


def _family_member(j: int) -> SuiteTask:
    kind, n = j % 3, 1000 + 250 * (j % 4)
    d, informative, missing = 8 + (j * 5) % 9, 4 + j % 4, 0.05 + 0.05 * (j % 3)
    classes = 2 + (j // 3) % 2
    if kind == 0:
        cat = 2 + j % 4
        load = lambda r: _classif(n, d, informative, r, classes=classes, cat=cat, missing=missing)
        metric, what = "accuracy", f"{cat} string categories and missing values"
    elif kind == 1:
        weights = [0.85, 0.1] if classes == 3 else [0.88]
        load = lambda r: _classif(n, d, informative, r, classes=classes, weights=weights,
                                  missing=missing)  # fmt: skip
        metric, what = "f1_macro", f"{classes} imbalanced classes with missing values"
    else:
        f = 4 + j % 4
        load = lambda r: _regress(datasets.make_gaussian_quantiles, r, n_samples=n,
                                  n_features=f, n_classes=classes, missing=missing)  # fmt: skip
        metric, what = "accuracy", f"{classes} classes as nested Gaussian shells, missing values"
    return SuiteTask(
        f"heldout-family-{j:02d}", load, "target", metric,
        f"Generated: {what} ({n} rows).", GENERATED, split="heldout",
    )  # fmt: skip


def heldout_family(n: int = HELDOUT_FAMILY) -> list[SuiteTask]:
    """The generated held-out family's first `n` members (ids stable)."""
    return [_family_member(j) for j in range(1, n + 1)]


def write_suite_task(spec: SuiteTask, out: str | Path, seed: int = 0) -> Path:
    """Write one built-in task's files (its leaderboard still empty)."""
    kind = get_metric(spec.metric).task_type
    notes = REDERIVED[kind].format(scale=JITTER[kind], neighbours=NEIGHBOURS)
    provenance = {
        **spec.provenance,
        "notes": notes if spec.packaged else GENERATED_NOTE,
        "suite_version": SUITE_VERSION,
    }
    return write_task(
        task_frame(spec, seed),
        out,
        task_id=spec.id,
        target=spec.target,
        metric=spec.metric,
        time_limit_s=spec.time_limit_s,
        memory_mb=spec.memory_mb,
        provenance=provenance,
        summary=spec.summary,
        split=spec.split,
        seed=int(task_rng(seed, spec.id + "/split").integers(2**63)),
    )


def build_suite(
    out: str | Path,
    only: list[str] | None = None,
    workers: int | None = None,
    seed: int = 0,
    leaderboards: bool = True,
) -> list[Path]:
    """Write every task (or those in ``only``) and compute all leaderboards in one pool
    (``leaderboards=False``: the task files only, every leaderboard empty)."""
    from wmrl.autoresearch.env.pool import SandboxPool

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    specs = [t for t in suite_tasks() if only is None or t.id in only]
    dirs = [write_suite_task(spec, out / spec.id, seed) for spec in specs]
    if leaderboards:
        t0 = time.monotonic()
        with SandboxPool(workers) as pool:
            for k, d in enumerate(dirs):
                board = build_leaderboard(d, pool)
                print(
                    f"[{k + 1}/{len(dirs)}] {d.name}: {len(board['scores'])} reference scores "
                    f"({time.monotonic() - t0:.0f} s)",
                    flush=True,
                )
    index = [
        {"id": s.id, "split": s.split, "metric": s.metric, "suite_version": SUITE_VERSION}
        for s in specs
    ]
    (out / "suite.json").write_text(json.dumps(index, indent=2))
    return dirs


def stale_tasks(suite_dir: str | Path) -> list[str]:
    """Built-in tasks in a built suite that an older builder wrote (their rows are not
    what this builder makes: before version 2, copies of packaged rows a sandboxed script
    could look up). Tasks the suite does not know (made with `make_task`) are not
    judged."""
    index = json.loads((Path(suite_dir) / "suite.json").read_text())
    known = {t.id for t in suite_tasks()}
    return sorted(
        e["id"] for e in index
        if e.get("id") in known and e.get("suite_version") != SUITE_VERSION
    )  # fmt: skip


FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program, so modules import side-effect free."""
    flags.DEFINE_string("out", None, "directory to write the suite into")
    flags.DEFINE_list("only", None, "build only these task ids")
    flags.DEFINE_integer("workers", None, "sandbox slots (default: cores)")


def main(argv) -> None:
    del argv
    if not FLAGS.out:
        raise app.UsageError("--out is required")
    build_suite(FLAGS.out, FLAGS.only, FLAGS.workers)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
