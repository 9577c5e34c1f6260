"""A simple learned scorer on script features: the baseline the neural world model must beat.

A user who knows their tasks can list what makes a script fail or score well without any
neural network: the model family and its size, whether the script imputes on a task with
missing values or encodes the categorical columns, whether it names the card's target and
id columns right, whether it writes the submission with the id column, how long it is.
`features(script, facts)` turns a script and its task card's facts into such a vector
(`FEATURE_NAMES`: card facts, then script facts, then the interactions that make a failure,
e.g. no imputer on a task with missing values); `FeatureScorer` is a ridge regression on
them with a Gaussian predictive variance (`fit(rows)`, `predict(rows) -> (mean, variance)`),
its penalty chosen by exact leave-one-out error, refit from scratch on every call to `fit`
(cheap: hundreds of rows, a few dozen features), so that a trainer can refit it online on
the corpus plus the anchor pairs collected so far.

Every feature is read off the text with regular expressions and `grader.static_outcome`;
nothing is executed. The features run in the trainer's process, so their cost is bounded:
they read at most the first `MAX_SCRIPT_BYTES` characters of a script (a longer one is
MALFORMED before the sandbox, as the pool has it; its length is the one thing read of the
rest), and every pattern does a bounded amount of work per character (no pattern starts
at many places and scans on from each to the end of the text).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from collections.abc import Sequence

import numpy as np

from wmrl.autoresearch.env.grader import MAX_SCRIPT_BYTES, Status, static_outcome

METRIC_NAMES = ("accuracy", "f1_macro", "roc_auc", "rmse", "mae", "r2")

# Model family -> the estimator classes that make it (the first family whose class the
# script calls is the script's model; classes of the sklearn families the corpus uses).
FAMILIES: dict[str, tuple[str, ...]] = {
    "dummy": ("DummyClassifier", "DummyRegressor"),
    "linear": ("LogisticRegression", "Ridge", "LinearRegression"),
    "lasso": ("Lasso",),
    "knn": ("KNeighborsClassifier", "KNeighborsRegressor"),
    "tree": ("DecisionTreeClassifier", "DecisionTreeRegressor"),
    "forest": ("RandomForestClassifier", "RandomForestRegressor"),
    "extra_trees": ("ExtraTreesClassifier", "ExtraTreesRegressor"),
    "hgb": ("HistGradientBoostingClassifier", "HistGradientBoostingRegressor"),
    "gb": ("GradientBoostingClassifier", "GradientBoostingRegressor"),
    "svm": ("SVC", "SVR"),
    "mlp": ("MLPClassifier", "MLPRegressor"),
    "naive_bayes": ("GaussianNB",),
}
TREE_ENSEMBLES = ("forest", "extra_trees", "gb")
DENSE_ONLY = ("hgb", "naive_bayes")  # reject the sparse output of a default OneHotEncoder
NAN_TOLERANT = ("hgb",)  # fits on NaN without an imputer


@dataclasses.dataclass(frozen=True)
class CardFacts:
    """What a task card says (the prompt's facts), plus the limit a script runs under."""

    task_type: str  # "classification" | "regression"
    metric: str
    target: str
    id_column: str
    has_missing: bool
    has_categorical: bool
    n_rows: int
    n_features: int
    time_limit_s: float  # the task's own limit, capped by suite.time_limit_s


@dataclasses.dataclass(frozen=True)
class Row:
    """One script of one task; `reward` is the real one (fit) or None (predict)."""

    script: str
    facts: CardFacts
    reward: float | None = None


def card_facts(task, cap_s: float = 0.0) -> CardFacts:
    """A loaded task's facts (reads its train.csv once); `cap_s` = `suite.time_limit_s`."""
    from wmrl.autoresearch.data import time_limit
    from wmrl.autoresearch.env.make_task import task_info

    info = task_info(task)
    with open(task.public_dir / "train.csv", encoding="utf-8-sig", newline="") as fh:
        header = len(next(csv.reader(fh), []))
    return CardFacts(
        task_type=task.type, metric=task.metric_name, target=task.target,
        id_column=task.id_column, has_missing=info.has_missing,
        has_categorical=info.has_categorical, n_rows=info.n_rows,
        n_features=max(header - 2, 0), time_limit_s=time_limit(task, cap_s),
    )  # fmt: skip


_LITERAL = re.compile(r"""(['"])([^'"\n]{1,80})\1""")
_NUMBER = r"([0-9][0-9_]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+)"


def _param(script: str, name: str) -> float | None:
    """The first numeric value given to keyword `name` (`name=12`), or None."""
    m = re.search(rf"\b{name}\s*=\s*{_NUMBER}", script)
    if m is None:
        return None
    try:
        return float(m.group(1).replace("_", ""))
    except ValueError:
        return None


def model_family(script: str) -> str | None:
    """The family of the estimator the script calls last (the model after preprocessing)."""
    best, where = None, -1
    for family, classes in FAMILIES.items():
        for cls in classes:
            for m in re.finditer(rf"\b{cls}\s*\(", script):
                if m.start() > where:
                    best, where = family, m.start()
    return best


def _near_miss(literals: set[str], name: str) -> bool:
    """A literal that is almost `name` (another case, or an extra underscore) but not it:
    the typo that makes a KeyError."""
    key = name.lower().strip("_")
    return any(s != name and s.lower().strip("_") == key for s in literals)


_FRAME_OPENING = re.compile(r"DataFrame\(\s*\{")


def _submission_frame(script: str) -> str | None:
    r"""The text of the dict of the last `DataFrame({...})` the script builds (up to its
    first `}`), or None: what `re.findall(r"DataFrame\(\s*\{([^}]*)\}")` finds last, in
    linear time. That pattern scans from every opening to the next `}`, so a script of
    unclosed openings cost the square of its length (20 s at 256 KiB); here each opening
    is followed to its `}` once, and an opening with none after it ends the search (no later
    one can have one)."""
    last, pos = None, 0
    while (m := _FRAME_OPENING.search(script, pos)) is not None:
        close = script.find("}", m.end())
        if close < 0:
            break
        last, pos = script[m.end() : close], close + 1
    return last


def card_features(f: CardFacts) -> dict[str, float]:
    return {
        "card_classification": float(f.task_type == "classification"),
        **{f"card_metric_{m}": float(f.metric == m) for m in METRIC_NAMES},
        "card_has_missing": float(f.has_missing),
        "card_has_categorical": float(f.has_categorical),
        "card_log_rows": math.log1p(f.n_rows),
        "card_log_features": math.log1p(f.n_features),
        "card_log_limit_s": math.log(max(f.time_limit_s, 1e-3)),
    }


def script_features(script: str, f: CardFacts) -> dict[str, float]:
    """The script's own facts, and the interactions with the card that make a failure.

    Only the first `MAX_SCRIPT_BYTES` characters are read (module docstring): a script with
    more has more bytes than the pool accepts, so it is MALFORMED without being compiled or
    encoded, and `log_chars` is its whole length."""
    n_chars = len(script)
    if n_chars > MAX_SCRIPT_BYTES:
        script = script[:MAX_SCRIPT_BYTES]
        static = (Status.MALFORMED, f"script is over the {MAX_SCRIPT_BYTES:,}-byte limit")
    else:
        static = static_outcome(script.encode("utf-8", "surrogatepass"), names=True)
    family = model_family(script)
    literals = {m.group(2) for m in _LITERAL.finditer(script)}
    trees = _param(script, "n_estimators") or 0.0
    depth_none = re.search(r"\bmax_depth\s*=\s*None\b", script) is not None
    imputer = "SimpleImputer(" in script or "KNNImputer(" in script
    onehot = "OneHotEncoder(" in script
    ordinal = "OrdinalEncoder(" in script
    cat_passthrough = re.search(r"""\(\s*["']cat["']\s*,\s*["']passthrough["']""", script)
    cat_drop = re.search(r"""\(\s*["']cat["']\s*,\s*["']drop["']""", script)
    frame = _submission_frame(script)
    writes = "SUBMISSION_PATH" in script and ".to_csv(" in script
    frame_has_id = frame is not None and (
        re.search(r"\bID\b", frame) is not None or repr(f.id_column) in frame
        or f'"{f.id_column}"' in frame
    )  # fmt: skip
    proba = "predict_proba(" in script
    out = {
        "compiles": float(static is None or static[0] != Status.MALFORMED),
        "undefined_names": float(static is not None and static[0] == Status.RUNTIME_ERROR),
        "log_chars": math.log1p(n_chars),
        "log_lines": math.log1p(script.count("\n")),
        "reads_train": float("train.csv" in script),
        "reads_test": float("test.csv" in script),
        "names_target": float(f.target in literals),
        "names_id": float(f.id_column in literals),
        "target_near_miss": float(_near_miss(literals, f.target)),
        "id_near_miss": float(_near_miss(literals, f.id_column)),
        "writes_submission": float(writes),
        "submission_has_id": float(writes and frame_has_id),
        "index_false": float("index=False" in script),
        "imputer": float(imputer),
        "scaler": float("StandardScaler(" in script),
        "onehot": float(onehot),
        "ordinal": float(ordinal),
        "dense_onehot": float("sparse_output=False" in script),
        "select_k": float("SelectKBest(" in script),
        "holdout_validation": float("train_test_split(" in script),
        "functions": float(re.search(r"^def ", script, re.M) is not None),
        "predict_proba": float(proba),
        "fits": float(len(re.findall(r"\.fit\(", script))),
        **{f"family_{name}": float(family == name) for name in FAMILIES},
        "family_unknown": float(family is None),
        "log_trees": math.log1p(trees),
        "log_max_iter": math.log1p(_param(script, "max_iter") or 0.0),
        "depth_unlimited": float(depth_none),
        "log_neighbors": math.log1p(_param(script, "n_neighbors") or 0.0),
        "log10_C": math.log10(_param(script, "C") or 1.0),
        "log10_alpha": math.log10(_param(script, "alpha") or 1.0),
        "learning_rate": _param(script, "learning_rate") or 0.0,
        "log_width": math.log1p(_param(script, "hidden_layer_sizes") or 0.0),
    }
    # The interactions with the card that make a failure or a time-out.
    nan_ok = family in NAN_TOLERANT
    out["missing_unhandled"] = float(f.has_missing and not imputer and not nan_ok)
    out["categorical_unencoded"] = float(
        f.has_categorical and cat_drop is None
        and (cat_passthrough is not None or not (onehot or ordinal))
    )  # fmt: skip
    out["sparse_to_dense_only"] = float(
        family in DENSE_ONLY and onehot and "sparse_output=False" not in script
    )
    out["auc_without_proba"] = float(f.metric == "roc_auc" and not proba)
    # Work of a tree ensemble against the time it has: log(trees * rows * features / limit).
    ensemble = family in TREE_ENSEMBLES and trees > 0
    out["log_ensemble_work_per_s"] = 0.0
    if ensemble:
        work = math.log(trees) + math.log1p(f.n_rows) + math.log1p(f.n_features)
        out["log_ensemble_work_per_s"] = work - math.log(max(f.time_limit_s, 1e-3))
    return out


def feature_dict(script: str, facts: CardFacts) -> dict[str, float]:
    return {**card_features(facts), **script_features(script, facts)}


_EXAMPLE = CardFacts("classification", "accuracy", "target", "id", False, False, 100, 4, 20.0)
FEATURE_NAMES: tuple[str, ...] = tuple(feature_dict("", _EXAMPLE))


def features(script: str, facts: CardFacts) -> np.ndarray:
    """[len(FEATURE_NAMES)] float64: the script's feature vector on a task with these facts."""
    return np.array(list(feature_dict(script, facts).values()), np.float64)


def feature_matrix(rows: Sequence[Row]) -> np.ndarray:
    return np.stack([features(r.script, r.facts) for r in rows]) if rows else np.zeros((0, 0))


RIDGE_PENALTIES = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


@dataclasses.dataclass
class FeatureScorer:
    """Ridge regression of the reward on `features` (standardised), with the penalty of
    `penalties` that has the least exact leave-one-out squared error on the fit rows, and a
    Gaussian predictive variance: the residual variance times `1 + x' (X'X + l I)^-1 x`.
    `fit(rows)` refits from scratch (rows with a reward); `predict(rows)` returns
    `(mean [n], variance [n])`; `fit_features` / `predict_features` do the same on feature
    vectors. Before any fit it predicts 0.5 with variance 0.25 (nothing
    known about a reward in [0, 1])."""

    penalties: tuple[float, ...] = RIDGE_PENALTIES
    penalty: float | None = None  # the chosen one, after fit
    _fit: dict | None = None

    def fit(self, rows: Sequence[Row]) -> FeatureScorer:
        rows = [r for r in rows if r.reward is not None and math.isfinite(r.reward)]
        if len(rows) < 2:
            raise ValueError(
                f"FeatureScorer.fit needs at least 2 rows with a reward, got {len(rows)}"
            )
        return self.fit_features(feature_matrix(rows), np.array([r.reward for r in rows]))

    def predict(self, rows: Sequence[Row]) -> tuple[np.ndarray, np.ndarray]:
        if not rows:
            return np.zeros(0), np.zeros(0)
        return self.predict_features(feature_matrix(rows))

    def fit_features(self, X: np.ndarray, y: np.ndarray) -> FeatureScorer:
        """`fit` on feature vectors [n, len(FEATURE_NAMES)] and rewards [n] (a caller that
        refits often keeps each row's vector: `features` costs a few ms per script)."""
        X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
        mu, sd = X.mean(0), X.std(0)
        sd = np.where(sd > 0, sd, 1.0)
        Z, y0 = (X - mu) / sd, y.mean()
        U, s, Vt = np.linalg.svd(Z, full_matrices=False)
        uy = U.T @ (y - y0)
        best = None
        for lam in self.penalties:
            shrink = s**2 / (s**2 + lam)
            resid = (y - y0) - U @ (shrink * uy)
            hat = (U**2) @ shrink + 1.0 / len(y)  # the intercept's leverage too
            loo = float(np.mean((resid / np.maximum(1.0 - hat, 1e-6)) ** 2))
            if best is None or loo < best[0]:
                best = (loo, lam, resid, shrink)
        _, lam, resid, shrink = best
        w = Vt.T @ (shrink / np.where(s > 0, s, 1.0) * uy)
        dof = max(len(y) - float(shrink.sum()) - 1.0, 1.0)
        # (Z'Z + l I)^-1 in the SVD basis, for the variance of the fitted mean.
        inv = (Vt.T / (s**2 + lam)) @ Vt + (np.eye(len(mu)) - Vt.T @ Vt) / lam
        self.penalty = lam
        self._fit = {"mu": mu, "sd": sd, "w": w, "b": y0, "noise": float(resid @ resid) / dof,
                     "inv": inv, "n": len(y)}  # fmt: skip
        return self

    def predict_features(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`predict` from feature vectors [n, len(FEATURE_NAMES)]."""
        if self._fit is None:
            return np.full(len(X), 0.5), np.full(len(X), 0.25)
        f = self._fit
        Z = (np.asarray(X, np.float64) - f["mu"]) / f["sd"]
        mean = Z @ f["w"] + f["b"]
        lever = np.einsum("ij,jk,ik->i", Z, f["inv"], Z) + 1.0 / f["n"]
        return mean, f["noise"] * (1.0 + lever)

    def coefficients(self) -> dict[str, float]:
        """The fitted weight of each feature (per standard deviation of it)."""
        if self._fit is None:
            return {}
        return dict(zip(FEATURE_NAMES, self._fit["w"].tolist(), strict=True))
