"""A programmatic solution author: varied, realistic scripts for a task card.

A ``ScriptSpec`` says what a script does (model, preprocessing, style, and
which mistake, if any); ``render`` turns it into Python source that follows
the script contract. ``sample_spec`` draws specs with mistakes at controlled
rates, so the executed corpus covers every rung of the reward ladder for the
world model to learn, and ``baseline_specs`` gives the fixed reference pool
that defines a task's leaderboard.

Mistakes (each a thing people really do):
    syntax_slip        an unclosed bracket or a broken indent       -> MALFORMED
    wrong_column       a typo in the target / id column name        -> RUNTIME_ERROR
    no_imputation      no imputer: fails where the data have NaNs   -> RUNTIME_ERROR on those tasks
    no_encoding        no encoder: fails on string columns          -> RUNTIME_ERROR on those tasks
    wrong_format       forgets the id column or the header          -> INVALID_SUBMISSION
    no_write           forgets to write the submission              -> NO_SUBMISSION
    too_slow           a huge model / grid search                   -> TIMEOUT on tight limits

Multi-turn episodes (``write_episodes``, executed by ``multiturn_corpus``): a fix episode
starts from one of these mistakes (``fixable_mistakes``: not too_slow) and corrects it in
turn 2; an improve episode starts from a good script with a weak model and proposes
stronger ones.
"""

from __future__ import annotations

import dataclasses
import random

MISTAKES = (
    "syntax_slip",
    "wrong_column",
    "no_imputation",
    "no_encoding",
    "wrong_format",
    "no_write",
    "too_slow",
)

# name -> (classification constructor, regression constructor); None: not offered
MODELS: dict[str, tuple[str | None, str | None]] = {
    "dummy": ("DummyClassifier(strategy='most_frequent')", "DummyRegressor(strategy='mean')"),
    "linear": ("LogisticRegression(C={C}, max_iter=1000)", "Ridge(alpha={alpha})"),
    "knn": ("KNeighborsClassifier(n_neighbors={k})", "KNeighborsRegressor(n_neighbors={k})"),
    "tree": (
        "DecisionTreeClassifier(max_depth={depth}, random_state={seed})",
        "DecisionTreeRegressor(max_depth={depth}, random_state={seed})",
    ),
    "forest": (
        "RandomForestClassifier(n_estimators={trees}, max_depth={depth}, random_state={seed})",
        "RandomForestRegressor(n_estimators={trees}, max_depth={depth}, random_state={seed})",
    ),
    "extra_trees": (
        "ExtraTreesClassifier(n_estimators={trees}, random_state={seed})",
        "ExtraTreesRegressor(n_estimators={trees}, random_state={seed})",
    ),
    "hgb": (
        "HistGradientBoostingClassifier(learning_rate={lr}, max_iter={iters}, random_state={seed})",
        "HistGradientBoostingRegressor(learning_rate={lr}, max_iter={iters}, random_state={seed})",
    ),
    "gb": (
        "GradientBoostingClassifier(n_estimators={trees}, learning_rate={lr}, random_state={seed})",
        "GradientBoostingRegressor(n_estimators={trees}, learning_rate={lr}, random_state={seed})",
    ),
    "svm": ("SVC(C={C}, probability={proba})", "SVR(C={C})"),
    "mlp": (
        "MLPClassifier(hidden_layer_sizes=({width},), max_iter={epochs}, random_state={seed})",
        "MLPRegressor(hidden_layer_sizes=({width},), max_iter={epochs}, random_state={seed})",
    ),
    "naive_bayes": ("GaussianNB()", None),
    "lasso": (None, "Lasso(alpha={alpha})"),
}

IMPORTS = {
    "DummyClassifier": "sklearn.dummy",
    "DummyRegressor": "sklearn.dummy",
    "LogisticRegression": "sklearn.linear_model",
    "Ridge": "sklearn.linear_model",
    "Lasso": "sklearn.linear_model",
    "KNeighborsClassifier": "sklearn.neighbors",
    "KNeighborsRegressor": "sklearn.neighbors",
    "DecisionTreeClassifier": "sklearn.tree",
    "DecisionTreeRegressor": "sklearn.tree",
    "RandomForestClassifier": "sklearn.ensemble",
    "RandomForestRegressor": "sklearn.ensemble",
    "ExtraTreesClassifier": "sklearn.ensemble",
    "ExtraTreesRegressor": "sklearn.ensemble",
    "HistGradientBoostingClassifier": "sklearn.ensemble",
    "HistGradientBoostingRegressor": "sklearn.ensemble",
    "GradientBoostingClassifier": "sklearn.ensemble",
    "GradientBoostingRegressor": "sklearn.ensemble",
    "SVC": "sklearn.svm",
    "SVR": "sklearn.svm",
    "MLPClassifier": "sklearn.neural_network",
    "MLPRegressor": "sklearn.neural_network",
    "GaussianNB": "sklearn.naive_bayes",
}


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """What the author reads off a task card (the agent sees the same facts)."""

    task_type: str
    metric: str
    target: str
    id_column: str
    has_missing: bool = False
    has_categorical: bool = False
    n_rows: int = 1000


@dataclasses.dataclass(frozen=True)
class ScriptSpec:
    model: str
    params: dict
    impute: bool = True
    encode: str = "onehot"  # onehot | ordinal | drop | none
    scale: bool = True
    select_k: int | None = None
    validate: bool = False  # print a hold-out score before the final fit
    style: str = "flat"  # flat | functions
    mistake: str | None = None
    seed: int = 0


def _model_expr(info: TaskInfo, spec: ScriptSpec) -> str:
    clf, reg = MODELS[spec.model]
    template = clf if info.task_type == "classification" else reg
    if template is None:
        raise ValueError(f"model {spec.model} does not do {info.task_type}")
    params = {"seed": spec.seed, "proba": info.metric == "roc_auc", **spec.params}
    return template.format(**params)


def _imports(model_expr: str, spec: ScriptSpec) -> list[str]:
    cls = model_expr.split("(")[0]
    lines = ["import os", "", "import numpy as np", "import pandas as pd"]
    lines.append("from sklearn.compose import ColumnTransformer")
    lines.append("from sklearn.pipeline import Pipeline")
    if spec.impute:
        lines.append("from sklearn.impute import SimpleImputer")
    enc = {"onehot": "OneHotEncoder", "ordinal": "OrdinalEncoder"}.get(spec.encode)
    extra = [enc] if enc else []
    if spec.scale:
        extra.append("StandardScaler")
    if extra:
        lines.append(f"from sklearn.preprocessing import {', '.join(sorted(extra))}")
    if spec.select_k:
        lines.append("from sklearn.feature_selection import SelectKBest")
    if spec.validate:
        lines.append("from sklearn.model_selection import train_test_split")
    lines.append(f"from {IMPORTS[cls]} import {cls}")
    return lines


DENSE_ONLY = ("hgb", "naive_bayes")  # estimators that reject sparse one-hot output


def _preprocessing(spec: ScriptSpec) -> list[str]:
    num_steps, cat_steps = [], []
    if spec.impute:
        num_steps.append('("impute", SimpleImputer(strategy="median"))')
        cat_steps.append('("impute", SimpleImputer(strategy="most_frequent"))')
    if spec.scale:
        num_steps.append('("scale", StandardScaler())')
    if spec.encode == "onehot":
        dense = ", sparse_output=False" if spec.model in DENSE_ONLY else ""
        cat_steps.append(f'("encode", OneHotEncoder(handle_unknown="ignore"{dense}))')
    elif spec.encode == "ordinal":
        cat_steps.append(
            '("encode", OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1))'
        )
    lines = [
        'num_cols = X.select_dtypes(include="number").columns.tolist()',
        "cat_cols = [c for c in X.columns if c not in num_cols]",
    ]
    transformers = []
    num = f"Pipeline([{', '.join(num_steps)}])" if num_steps else '"passthrough"'
    transformers.append(f'("num", {num}, num_cols)')
    if spec.encode == "drop":
        transformers.append('("cat", "drop", cat_cols)')
    elif spec.encode == "none":
        transformers.append('("cat", "passthrough", cat_cols)')
    else:
        cat = f"Pipeline([{', '.join(cat_steps)}])"
        transformers.append(f'("cat", {cat}, cat_cols)')
    lines.append("preprocess = ColumnTransformer([")
    lines += [f"    {t}," for t in transformers]
    lines.append("])")
    return lines


def render(info: TaskInfo, spec: ScriptSpec) -> str:
    """Python source for ``spec`` on a task described by ``info``."""
    model_expr = _model_expr(info, spec)
    target, id_col = info.target, info.id_column
    if spec.mistake == "wrong_column":
        target = target.capitalize() if target != target.capitalize() else target + "_"
    lines = [*_imports(model_expr, spec), ""]
    lines += [
        'DATA_DIR = os.environ["DATA_DIR"]',
        'train = pd.read_csv(os.path.join(DATA_DIR, "train.csv"))',
        'test = pd.read_csv(os.path.join(DATA_DIR, "test.csv"))',
        f"TARGET, ID = {target!r}, {id_col!r}",
        "X = train.drop(columns=[TARGET, ID])",
        "y = train[TARGET]",
        "X_test = test.drop(columns=[ID])",
        "",
    ]
    lines += _preprocessing(spec)
    steps = ['("preprocess", preprocess)']
    if spec.select_k:
        score_fn = "f_classif" if info.task_type == "classification" else "f_regression"
        lines[lines.index("from sklearn.feature_selection import SelectKBest")] = (
            f"from sklearn.feature_selection import SelectKBest, {score_fn}"
        )
        steps.append(f'("select", SelectKBest({score_fn}, k=min({spec.select_k}, X.shape[1])))')
    steps.append(f'("model", {model_expr})')
    build = ["model = Pipeline(["] + [f"    {s}," for s in steps] + ["])"]
    predict = (
        "model.predict_proba(X_test)[:, 1]" if info.metric == "roc_auc" else "model.predict(X_test)"
    )
    if spec.style == "functions":
        lines += ["", "", "def build_model():"] + ["    " + b for b in build]
        lines += ["    return model", "", "", "model = build_model()"]
    else:
        lines += ["", *build]
    if spec.validate:
        lines += [
            "X_tr, X_va, y_tr, y_va = train_test_split(X, y, test_size=0.2, random_state=0)",
            "model.fit(X_tr, y_tr)",
            'print("validation score:", model.score(X_va, y_va))',
        ]
    lines += ["model.fit(X, y)", f"pred = {predict}"]
    if spec.mistake == "wrong_format":
        lines.append(
            'pd.DataFrame({TARGET: pred}).to_csv(os.environ["SUBMISSION_PATH"], index=False)'
        )
    elif spec.mistake != "no_write":
        lines += [
            "submission = pd.DataFrame({ID: test[ID], TARGET: pred})",
            'submission.to_csv(os.environ["SUBMISSION_PATH"], index=False)',
        ]
    lines.append('print("done", len(pred))')
    source = "\n".join(lines) + "\n"
    if spec.mistake == "syntax_slip":
        source = source.replace("model.fit(X, y)", "model.fit(X, y", 1)
    return source


_PARAM_CHOICES = {
    "C": [0.1, 1.0, 10.0],
    "alpha": [0.1, 1.0, 10.0],
    "k": [5, 15, 31],
    "depth": [3, 6, 12, None],
    "trees": [50, 100, 200],
    "lr": [0.05, 0.1, 0.3],
    "iters": [50, 100, 200],
    "width": [32, 64],
    "epochs": [200, 400],
}
_MODEL_PARAMS = {
    "dummy": [],
    "linear": ["C", "alpha"],
    "knn": ["k"],
    "tree": ["depth"],
    "forest": ["trees", "depth"],
    "extra_trees": ["trees"],
    "hgb": ["lr", "iters"],
    "gb": ["trees", "lr"],
    "svm": ["C"],
    "mlp": ["width", "epochs"],
    "naive_bayes": [],
    "lasso": ["alpha"],
}
_MODEL_WEIGHTS = {
    "dummy": 0.3,
    "linear": 2,
    "knn": 1,
    "tree": 1,
    "forest": 2,
    "extra_trees": 1,
    "hgb": 2,
    "gb": 1,
    "svm": 1,
    "mlp": 1,
    "naive_bayes": 1,
    "lasso": 1,
}


def models_for(task_type: str) -> list[str]:
    idx = 0 if task_type == "classification" else 1
    return [m for m, ctors in MODELS.items() if ctors[idx] is not None]


def sample_spec(
    info: TaskInfo,
    rng: random.Random,
    mistake_rate: float = 0.3,
    mistake_weights: dict[str, float] | None = None,
) -> ScriptSpec:
    """Draw one script spec; a mistake happens with probability ``mistake_rate``."""
    names = models_for(info.task_type)
    model = rng.choices(names, weights=[_MODEL_WEIGHTS[m] for m in names])[0]
    params = {p: rng.choice(_PARAM_CHOICES[p]) for p in _MODEL_PARAMS[model]}
    mistake = None
    if rng.random() < mistake_rate:
        weights = mistake_weights or {m: 1.0 for m in MISTAKES}
        kinds = list(weights)
        mistake = rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
    # HistGradientBoosting handles NaN itself: skipping the imputer is then a choice.
    impute = mistake != "no_imputation" and not (model == "hgb" and rng.random() < 0.5)
    encode = "none" if mistake == "no_encoding" else rng.choice(["onehot", "onehot", "ordinal"])
    if mistake == "too_slow":
        model = "forest" if "forest" in names else model
        params = {"trees": 3000, "depth": None}
    return ScriptSpec(
        model=model,
        params=params,
        impute=impute,
        encode=encode,
        scale=rng.random() < 0.7,
        select_k=rng.choice([None, None, None, 5, 20]),
        validate=rng.random() < 0.3,
        style=rng.choice(["flat", "functions"]),
        mistake=mistake,
        seed=rng.randrange(1000),
    )


def baseline_specs(info: TaskInfo) -> list[ScriptSpec]:
    """The fixed reference pool whose scores make a task's leaderboard."""
    pool = [
        ScriptSpec("dummy", {}),
        ScriptSpec("linear", {"C": 1.0, "alpha": 1.0}),
        ScriptSpec("knn", {"k": 15}),
        ScriptSpec("tree", {"depth": 4}),
        ScriptSpec("forest", {"trees": 100, "depth": None}),
        ScriptSpec("hgb", {"lr": 0.1, "iters": 100}),
    ]
    pool.append(
        ScriptSpec("naive_bayes", {})
        if info.task_type == "classification"
        else ScriptSpec("lasso", {"alpha": 0.1})
    )
    return pool


def write_scripts(info: TaskInfo, n: int, seed: int, mistake_rate: float = 0.3) -> list[tuple]:
    """``n`` (spec, source) pairs for one task, reproducible from ``seed``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        spec = sample_spec(info, rng, mistake_rate)
        out.append((spec, render(info, spec)))
    return out


# -- multi-turn episodes (warm start of the multi-turn policy) ---------------------------------

# Mistakes a fix episode starts from: those that fail wherever they are made (no_imputation and
# no_encoding only where the task has missing values / string columns). too_slow is left out:
# it costs a task's whole time limit per execution and may not time out at all.
FIXABLE_MISTAKES = ("syntax_slip", "wrong_column", "wrong_format", "no_write")
WEAK_MODELS = ("dummy", "linear", "knn", "tree", "naive_bayes", "lasso")
STRONG_MODELS = ("forest", "hgb", "extra_trees", "gb")
EPISODE_KINDS = ("fix", "improve")


@dataclasses.dataclass(frozen=True)
class EpisodePlan:
    """What the author writes for one multi-turn episode, before anything is executed.

    ``fix``: turn 1 has one controlled mistake, turn 2 is the same script corrected (the
    smallest change that removes the mistake), later turns are improvement candidates.
    ``improve``: turn 1 is a good script with a weak model, every later turn a candidate with
    a stronger model on the same preprocessing. A candidate that does not beat the best
    validation score so far is replaced by that best script when the episode is executed
    (``multiturn_corpus.execute_episodes``): later turns keep or improve a good script.
    """

    kind: str
    specs: tuple[ScriptSpec, ...]  # turn 1 first; turn t > 1: the candidate for that turn

    @property
    def mistake(self) -> str | None:
        return self.specs[0].mistake


def fixable_mistakes(info: TaskInfo) -> list[str]:
    """The mistakes of ``FIXABLE_MISTAKES`` (plus the data-dependent ones) that fail on a task
    described by ``info``."""
    out = list(FIXABLE_MISTAKES)
    if info.has_missing:
        out.append("no_imputation")
    if info.has_categorical:
        out.append("no_encoding")
    return out


def corrected(spec: ScriptSpec) -> ScriptSpec:
    """``spec`` with its mistake removed (and what the mistake switched off switched on)."""
    fixed = dataclasses.replace(spec, mistake=None)
    if spec.mistake == "no_imputation":
        fixed = dataclasses.replace(fixed, impute=True)
    if spec.mistake == "no_encoding":
        fixed = dataclasses.replace(fixed, encode="onehot")
    return fixed


def _with_model(info: TaskInfo, spec: ScriptSpec, names, rng: random.Random) -> ScriptSpec:
    offered = [m for m in names if m in models_for(info.task_type)]
    model = rng.choice(offered)
    params = {p: rng.choice(_PARAM_CHOICES[p]) for p in _MODEL_PARAMS[model]}
    if model in ("forest", "extra_trees", "gb"):
        params["trees"] = min(params.get("trees", 100), 100)  # stays well inside time limits
    if model == "hgb":
        params["iters"] = min(params.get("iters", 100), 100)
    return dataclasses.replace(spec, model=model, params=params, mistake=None)


def plan_episode(
    info: TaskInfo, rng: random.Random, turns: int = 2, fix_fraction: float = 0.6
) -> EpisodePlan:
    """One episode of ``turns`` turns (>= 2), a fix episode with probability
    ``fix_fraction``."""
    if turns < 2:
        raise ValueError(f"a multi-turn episode needs turns >= 2, got {turns}")
    base = sample_spec(info, rng, mistake_rate=0.0)
    if rng.random() < fix_fraction:
        mistake = rng.choice(fixable_mistakes(info))
        first = dataclasses.replace(base, mistake=mistake)
        if mistake == "no_imputation":
            first = dataclasses.replace(first, impute=False)
            if first.model == "hgb":  # HistGradientBoosting handles NaN: no failure to fix
                first = _with_model(info, first, ("forest", "linear"), rng)
                first = dataclasses.replace(first, mistake=mistake)
        if mistake == "no_encoding":
            first = dataclasses.replace(first, encode="none")
        specs = [first, corrected(first)]
        kind = "fix"
    else:
        specs = [_with_model(info, base, WEAK_MODELS, rng)]
        kind = "improve"
    while len(specs) < turns:
        specs.append(_with_model(info, corrected(specs[-1]), STRONG_MODELS, rng))
    return EpisodePlan(kind, tuple(specs))


def write_episodes(
    info: TaskInfo, n: int, seed: int, turns: int = 2, fix_fraction: float = 0.6
) -> list[tuple[EpisodePlan, tuple[str, ...]]]:
    """``n`` (plan, turn sources) pairs for one task, reproducible from ``seed``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        plan = plan_episode(info, rng, turns, fix_fraction)
        out.append((plan, tuple(render(info, s) for s in plan.specs)))
    return out
