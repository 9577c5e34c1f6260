"""The built-in task suite: 26 training and 9 + 48 held-out tasks, built by one command.

    python -m wmrl.envs.autoresearch.suite --out=DIR [--only=ID,ID] [--workers=N]

Everything is offline and seeded: scikit-learn's bundled datasets, the
palmerpenguins and vega_datasets packages (their bundled CSVs), and
scikit-learn generators. Tasks differ in what the right solution is: missing
values (no imputer -> crash), string columns (no encoder -> crash), class
imbalance (F1/AUC reward metric-aware models), high dimension, large n under
a tight time limit (slow models time out), noisy targets. Each task.json
records its provenance and licence. Held-out tasks (``split: heldout``) must
never be trained on; 48 of them form a generated family (`heldout_family`), so that an
evaluation can use many held-out tasks of one kind.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from absl import app, flags
from sklearn import datasets

from wmrl.envs.autoresearch.make_task import build_leaderboard, write_task

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


@dataclasses.dataclass(frozen=True)
class SuiteTask:
    id: str
    load: Callable[[np.random.Generator], pd.DataFrame]
    target: str
    metric: str
    summary: str
    provenance: dict
    split: str = "train"
    time_limit_s: float = 60.0
    memory_mb: int = 2048


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
        random_state=int(rng.integers(1 << 30)),
    )
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(d)])
    if cat:
        df = _categorise(df, [f"f{i}" for i in range(cat)], rng)
    if missing:
        df = _inject_missing(df, missing, rng)
    df["target"] = y
    return df


def _regress(maker, rng, missing=0.0, cat=0, **kw):
    X, y = maker(random_state=int(rng.integers(1 << 30)), **kw)
    df = pd.DataFrame(X, columns=[f"x{i}" for i in range(X.shape[1])])
    if cat:
        df = _categorise(df, [f"x{i}" for i in range(cat)], rng)
    if missing:
        df = _inject_missing(df, missing, rng)
    df["target"] = y
    return df


def _penguins(_rng) -> pd.DataFrame:
    from palmerpenguins import load_penguins

    return load_penguins()


def _cars(_rng) -> pd.DataFrame:
    from vega_datasets import data

    df = data.cars()
    df["Year"] = pd.to_datetime(df["Year"]).dt.year
    return df


def _weather(_rng) -> pd.DataFrame:
    from vega_datasets import data

    df = data.seattle_weather()
    d = pd.to_datetime(df["date"])
    df = df.drop(columns=["date"])
    df.insert(0, "month", d.dt.month)
    df.insert(0, "year", d.dt.year)
    return df


def _with(df_fn, fn):
    return lambda rng: fn(df_fn(rng), rng)


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
        ),
        T(
            "wine-cultivar",
            _sk_loader(datasets.load_wine),
            "target",
            "accuracy",
            "Wine cultivar from 13 chemical measurements (features on very different scales).",
            SKLEARN,
        ),
        T(
            "breast-cancer-auc",
            _sk_loader(datasets.load_breast_cancer),
            "target",
            "roc_auc",
            "Malignant vs benign tumours from 30 cell-nucleus features.",
            SKLEARN,
        ),
        T(
            "digits-8x8",
            _sk_loader(datasets.load_digits),
            "target",
            "accuracy",
            "Handwritten digits as 64 pixel intensities.",
            SKLEARN,
        ),
        T(
            "diabetes-progression",
            _sk_loader(datasets.load_diabetes),
            "target",
            "rmse",
            "Disease progression one year after baseline (small n, noisy target).",
            SKLEARN,
        ),
        T(
            "penguins-species",
            _penguins,
            "species",
            "accuracy",
            "Penguin species; string columns and missing values.",
            PENGUINS,
        ),
        T(
            "penguins-body-mass",
            _penguins,
            "body_mass_g",
            "rmse",
            "Penguin body mass; string columns and missing values.",
            PENGUINS,
        ),
        T(
            "cars-mpg",
            _cars,
            "Miles_per_Gallon",
            "mae",
            "Car fuel economy; missing horsepower, string origin and name columns.",
            VEGA,
        ),
        T(
            "seattle-weather-type",
            _weather,
            "weather",
            "f1_macro",
            "Seattle weather type from daily measurements; strongly imbalanced classes.",
            VEGA,
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
            _with(_sk_loader(datasets.load_breast_cancer), lambda d, r: _inject_missing(d, 0.1, r)),
            "target",
            "accuracy",
            "Tumour classification with 10% of measurements missing.",
            SKLEARN,
        ),
        T(
            "wine-noisy-labels",
            _with(
                _sk_loader(datasets.load_wine),
                lambda d, r: d.assign(target=_flip_labels(d["target"], 0.2, r)),
            ),
            "target",
            "accuracy",
            "Wine cultivar with 20% of labels randomised.",
            SKLEARN,
        ),
        T(
            "diabetes-mae",
            _sk_loader(datasets.load_diabetes),
            "target",
            "mae",
            "Diabetes progression scored by MAE (robust losses help).",
            SKLEARN,
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
            _with(_penguins, lambda d, r: d.dropna(subset=["sex"])),
            "sex",
            "roc_auc",
            "Penguin sex from measurements; string columns, missing values.",
            PENGUINS,
            split="heldout",
        ),
        T(
            "heldout-cars-horsepower",
            _cars,
            "Horsepower",
            "rmse",
            "Car horsepower; missing values and string columns.",
            VEGA,
            split="heldout",
        ),
        T(
            "heldout-weather-temp",
            _weather,
            "temp_max",
            "mae",
            "Seattle daily maximum temperature; a string weather column.",
            VEGA,
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
            _with(
                _sk_loader(datasets.load_digits),
                lambda d, r: d.assign(target=_flip_labels(d["target"], 0.15, r)),
            ),
            "target",
            "f1_macro",
            "Digits with 15% of labels randomised.",
            SKLEARN,
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
# (`wmrl.rl.evaluation.heldout_se`); their ids are `heldout-family-01` onwards.
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


def build_suite(
    out: str | Path, only: list[str] | None = None, workers: int | None = None, seed: int = 0
) -> list[Path]:
    """Write every task (or those in ``only``) and compute all leaderboards in one pool."""
    from wmrl.envs.autoresearch.pool import SandboxPool

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    specs = [t for t in suite_tasks() if only is None or t.id in only]
    dirs = []
    for i, spec in enumerate(specs):
        rng = np.random.default_rng([seed, i])
        df = spec.load(rng)
        dirs.append(
            write_task(
                df,
                out / spec.id,
                task_id=spec.id,
                target=spec.target,
                metric=spec.metric,
                time_limit_s=spec.time_limit_s,
                memory_mb=spec.memory_mb,
                provenance=spec.provenance,
                summary=spec.summary,
                split=spec.split,
                seed=seed + i,
            )
        )
    t0 = time.monotonic()
    with SandboxPool(workers) as pool:
        for k, d in enumerate(dirs):
            board = build_leaderboard(d, pool)
            print(
                f"[{k + 1}/{len(dirs)}] {d.name}: {len(board['scores'])} reference scores "
                f"({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
    index = [{"id": s.id, "split": s.split, "metric": s.metric} for s in specs]
    (out / "suite.json").write_text(json.dumps(index, indent=2))
    return dirs


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
