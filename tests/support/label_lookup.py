"""A script that tries to read a built-in task's hidden labels from data installed with it.

The built-in tasks come from datasets bundled with installed packages (scikit-learn,
palmerpenguins, vega_datasets) and from scikit-learn's generators, all of which a sandboxed
script can import. This attacker looks every public row (train and test) up in those
copies and submits the label of what it matched:

* packaged copies, with the column names the suite's builder gives them, matched by exact
  value, by value rounded to 6, 3 or 1 decimals (a row matches the copy's row that agrees
  on at least half of its cells), by nearest neighbour on standardised numeric columns
  (also within blocks of rows that agree exactly on the string and numeric-code columns
  both sides share), by nearest-neighbour vote (k=5) and by a one-to-one assignment of all
  public rows to the copy's rows (train rows also by their label);
* generated tasks: the task's generator call (which the builder's code names) re-run with
  plausible seeds (small integers, and those the builder once derived from the suite seed
  and a task's position); the seed whose rows share most cells with the train rows is
  matched as above;
* row order: the ids as ``default_rng(seed).permutation`` of the copy's rows, seeds 0-299
  (the split shuffles the rows it is given, then numbers them);
* as a script (``main``), first of all the suite's builder itself where it can be imported:
  it rebuilds the task, hidden labels included (the namespaces sandbox does not hold it).

Source labels are mapped to the task's (e.g. 0/1 for roc_auc) by how they co-occur on the
matched train rows. Every way is scored on the train rows (whose labels are public), and
``attack`` submits the test predictions of the best one, as a script would choose.

Imported by the tests (``lookups``: every way's predictions), and run as a sandboxed script
(``script_source``: this file with the task's settings appended), which shows that the
copies are readable there.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pandas as pd

ROUNDINGS = (None, 6, 3, 1)
ROW_ORDER_SEEDS = 300
ASSIGN_MAX_ROWS = 2500
SHARED_VALUE_ROWS = 20  # a cell value held by more copy rows than this is no evidence
CODE_VALUES = 15  # numeric columns with at most this many values are blocked on
CLASSIFICATION = ("accuracy", "f1_macro", "roc_auc")


def packaged_copies() -> dict[str, pd.DataFrame]:
    """Every installed copy of a built-in task's source, named as the builder names its
    columns (the car's name, the penguins' study year and the day's year kept: more to
    match on)."""
    from sklearn import datasets

    def sk(loader, **kw):
        frame = loader(as_frame=True, **kw).frame
        frame.columns = [str(c).replace(" (cm)", "").replace(" ", "_") for c in frame.columns]
        return frame

    loaders = {
        "iris": lambda: sk(datasets.load_iris),
        "wine": lambda: sk(datasets.load_wine),
        "breast_cancer": lambda: sk(datasets.load_breast_cancer),
        "digits": lambda: sk(datasets.load_digits),
        "diabetes": lambda: sk(datasets.load_diabetes),
        "diabetes_raw": lambda: sk(datasets.load_diabetes, scaled=False),
        "penguins": _penguins,
        "cars": _cars,
        "weather": _weather,
    }
    out = {}
    for name, load in loaders.items():
        # not installed, or hidden from the sandbox's view
        with contextlib.suppress(ImportError, OSError):
            out[name] = load()
    return out


def _penguins() -> pd.DataFrame:
    from palmerpenguins import load_penguins

    return load_penguins()


def _cars() -> pd.DataFrame:
    from vega_datasets import data

    cars = data.cars()
    cars["Year"] = pd.to_datetime(cars["Year"]).dt.year
    return cars


def _weather() -> pd.DataFrame:
    from vega_datasets import data

    weather = data.seattle_weather()
    day = pd.to_datetime(weather.pop("date"))
    weather.insert(0, "month", day.dt.month)
    weather.insert(0, "year", day.dt.year)
    return weather


def plausible_seeds(suite_seeds=(0, 1), positions: int = 100) -> list[int]:
    """Seeds a generator call may have had: small integers, and those the builder once
    derived from a suite seed and a task's position (``default_rng([seed, i])``)."""
    derived = [
        int(np.random.default_rng([s, i]).integers(1 << 30))
        for s in suite_seeds
        for i in range(positions)
    ]
    return list(range(64)) + derived


def regenerate(call: dict, seed: int) -> pd.DataFrame:
    """The generator's frame for one seed, with the builder's column names."""
    from sklearn import datasets

    X, y = getattr(datasets, call["maker"])(random_state=seed, **call["kwargs"])
    prefix = "f" if call["maker"] == "make_classification" else "x"
    frame = pd.DataFrame(X, columns=[f"{prefix}{i}" for i in range(X.shape[1])])
    frame[call["target"]] = y
    return frame


def regenerated_copy(call: dict, train: pd.DataFrame, seeds) -> tuple[int, pd.DataFrame]:
    """The seed whose regenerated rows share most cells (to 6 decimals) with the first
    200 train rows, and its frame."""
    num = [c for c in train.columns if c != call["target"] and _numeric(train, c)]
    cells = np.unique(np.round(train[num].head(200).to_numpy(float), 6))
    best = (-1, None, None)
    for seed in seeds:
        frame = regenerate(call, seed)
        values = np.round(frame[[c for c in num if c in frame]].to_numpy(float), 6)
        hits = int(pd.Series(values.ravel()).isin(cells).sum())
        if hits > best[0]:
            best = (hits, seed, frame)
    return best[1], best[2]


# -- matching: each way gives, per public row, the copy rows it matched (-1: none) ---------


def _numeric(df: pd.DataFrame, col: str) -> bool:
    return pd.api.types.is_numeric_dtype(df[col]) and not pd.api.types.is_bool_dtype(df[col])


def _shared(public: pd.DataFrame, source: pd.DataFrame, skip: set) -> tuple[list, list]:
    cols = [c for c in public.columns if c in source.columns and c not in skip]
    num = [c for c in cols if _numeric(public, c) and _numeric(source, c)]
    return num, [c for c in cols if c not in num]


def _cell_key(v: float, decimals) -> float | None:
    if v != v:
        return None
    return float(v) if decimals is None else round(float(v), decimals)


def hash_match(public, source, cols, decimals) -> np.ndarray:
    """The copy row that agrees (exactly, or rounded to ``decimals``) with at least half of
    a public row's known cells, voting cell by cell."""
    votes = [{} for _ in range(len(public))]
    for c in cols:
        index: dict = {}
        for j, v in enumerate(source[c].to_numpy(float)):
            key = _cell_key(v, decimals)
            if key is not None:
                index.setdefault(key, []).append(j)
        for i, v in enumerate(public[c].to_numpy(float)):
            rows = index.get(_cell_key(v, decimals), ())
            for j in rows if len(rows) <= SHARED_VALUE_ROWS else ():
                votes[i][j] = votes[i].get(j, 0) + 1
    known = public[cols].notna().sum(axis=1).to_numpy()
    out = np.full(len(public), -1)
    for i, v in enumerate(votes):
        if v:
            j, n = max(v.items(), key=lambda kv: kv[1])
            if n >= max(1, known[i] / 2):
                out[i] = j
    return out


def _standardise(public, source, cols):
    mu, sd = source[cols].mean(), source[cols].std().replace(0, 1).fillna(1)
    a = ((public[cols] - mu) / sd).fillna(0).to_numpy(float)
    b = ((source[cols] - mu) / sd).fillna(0).to_numpy(float)
    return a, b


def block_columns(public, source, num, strings) -> list[str]:
    """Columns to block on: shared string columns, and shared numeric codes (at most
    CODE_VALUES values) whose public values all occur in the copy."""
    out = list(strings)
    for c in num:
        values = set(source[c].dropna().unique())
        seen = public[c].dropna()
        if 1 < len(values) <= CODE_VALUES and len(seen) and seen.isin(values).all():
            out.append(c)
    return out


def nn_match(public, source, num, blocks, k=1) -> np.ndarray:
    """The k nearest copy rows (standardised numeric columns) of every public row, among
    those that agree with it on every block column (all rows where fewer than k do)."""
    from sklearn.neighbors import NearestNeighbors

    a, b = _standardise(public, source, [c for c in num if c not in blocks] or num)
    key = lambda df: df[blocks].astype(object).map(repr).agg("|".join, axis=1).to_numpy()
    public_keys = key(public) if blocks else np.zeros(len(public))
    source_keys = key(source) if blocks else np.zeros(len(source))
    out = np.full((len(public), k), -1)
    everyone = np.arange(len(source))
    for g in np.unique(public_keys):
        rows = np.flatnonzero(public_keys == g)
        cand = np.flatnonzero(source_keys == g)
        cand = cand if len(cand) >= k else everyone
        near = NearestNeighbors(n_neighbors=k).fit(b[cand])
        out[rows] = cand[near.kneighbors(a[rows], return_distance=False)]
    return out


def assign_match(public, source, num, target, is_train) -> np.ndarray:
    """One copy row per public row, each used at most once, minimising the total squared
    distance (train rows also by their label, which the copy holds too)."""
    from scipy.optimize import linear_sum_assignment
    from scipy.spatial.distance import cdist

    a, b = _standardise(public, source, num)
    cost = cdist(a, b, "sqeuclidean")
    if _numeric(source, target) and _numeric(public, target):
        ya, yb = _standardise(public, source, [target])
        cost[is_train] += 3.0 * (ya[is_train] - yb.T) ** 2
    rows, cols = linear_sum_assignment(cost)
    out = np.full(len(public), -1)
    out[rows] = cols
    return out


def row_order_match(public, labelled, id_col, seed) -> np.ndarray:
    """The ids as ``default_rng(seed).permutation`` of the copy's labelled rows."""
    perm = labelled[np.random.default_rng(seed).permutation(len(labelled))]
    ids = pd.to_numeric(public[id_col], errors="coerce").fillna(-1).to_numpy().astype(int)
    ok = (ids >= 0) & (ids < len(labelled))
    out = np.full(len(public), -1)
    out[ok] = perm[ids[ok]]
    return out


def _row_order_agreement(public, source, labelled, target, id_col, is_train, seed) -> float:
    m = row_order_match(public[is_train], labelled, id_col, seed)
    ok = m >= 0
    task = public[is_train][target].to_numpy()[ok].astype(str)
    copy = source[target].to_numpy()[m[ok]].astype(str)
    return float(np.mean(task == copy)) if ok.any() else 0.0


def matchings(public, source, target, id_col, is_train):
    """(way, matched copy rows [n] or [n, k]) for every way of matching the public rows."""
    num, strings = _shared(public, source, {target, id_col})
    if num:
        for d in ROUNDINGS:
            yield f"hash{'' if d is None else d}", hash_match(public, source, num, d)
        blocks = block_columns(public, source, num, strings)
        yield "nn", nn_match(public, source, num, [])
        if blocks:
            yield "nn_blocked", nn_match(public, source, num, blocks)
        yield "knn5", nn_match(public, source, num, blocks, k=5)
        if len(public) <= ASSIGN_MAX_ROWS and len(source) <= ASSIGN_MAX_ROWS:
            yield "assign", assign_match(public, source, num, target, is_train)
    labelled = np.flatnonzero(source[target].notna().to_numpy())
    if len(labelled) == len(public):
        seed = max(
            range(ROW_ORDER_SEEDS),
            key=lambda s: _row_order_agreement(
                public, source, labelled, target, id_col, is_train, s
            ),
        )
        yield "row_order", row_order_match(public, labelled, id_col, seed)


# -- predictions -----------------------------------------------------------------------------


def predictions(matched, source_y, is_train, train_y, metric) -> np.ndarray:
    """Task predictions from matched copy rows ([n] or [n, k]; -1: unmatched): labels
    mapped to the task's by their co-occurrence on matched train rows (for roc_auc the
    share of matches whose label maps to 1), the mean target for regression. An unmatched
    row gets the commonest train label (or the mean)."""
    matched = np.asarray(matched).reshape(len(matched), -1)
    hit = (matched >= 0).all(axis=1)
    classification = metric in CLASSIFICATION
    fallback = pd.Series(train_y).mode().iloc[0] if classification else float(np.mean(train_y))
    safe = np.where(matched >= 0, matched, 0)
    if not classification:
        values = pd.to_numeric(pd.Series(source_y), errors="coerce").to_numpy(float)[safe]
        known = hit & ~np.isnan(values).all(axis=1)
        mean = np.nanmean(np.where(known[:, None], values, 0.0), axis=1)
        return np.where(known, mean, fallback)
    first = safe[:, 0]
    learn = hit & is_train
    pairs = pd.DataFrame({"copy": source_y[first[learn]], "task": train_y[learn[is_train]]})
    mapping = pairs.groupby("copy")["task"].agg(lambda t: t.mode().iloc[0]).to_dict()
    mapped = np.vectorize(lambda v: mapping.get(v, fallback), otypes=[object])(source_y[safe])
    if metric == "roc_auc":
        score = (mapped.astype(str) == "1").mean(axis=1)
        return np.where(hit, score, float(str(fallback) == "1"))
    return np.where(hit, _row_votes(mapped), fallback)


def _row_votes(labels: np.ndarray) -> np.ndarray:
    """The commonest label of each row of ``labels`` [n, k] (ties: the first seen)."""
    codes, names = pd.factorize(labels.ravel())
    counts = np.zeros((len(labels), len(names)), int)
    np.add.at(counts, (np.repeat(np.arange(len(labels)), labels.shape[1]), codes), 1)
    return np.asarray(names, dtype=object)[counts.argmax(axis=1)]


def train_score(metric: str, y_true, y_pred) -> float:
    """How well a way's predictions fit the train labels (higher is better)."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if metric == "roc_auc":
        from sklearn.metrics import roc_auc_score

        y = y_true.astype(str) == "1"
        return float(roc_auc_score(y, y_pred.astype(float))) if 0 < y.mean() < 1 else 0.0
    if metric in ("accuracy", "f1_macro"):
        return float(np.mean(y_true.astype(str) == y_pred.astype(str)))
    return -float(np.sqrt(np.mean((y_true.astype(float) - y_pred.astype(float)) ** 2)))


def lookups(train, test, target, id_col, metric, sources) -> dict[str, tuple[float, np.ndarray]]:
    """Every way on every copy: ``{copy/way: (train score, test predictions)}``."""
    public = pd.concat([train, test], ignore_index=True)
    is_train = np.arange(len(public)) < len(train)
    train_y = train[target].to_numpy()
    out = {}
    for name, source in sources.items():
        if target not in source.columns:
            continue
        source_y = source[target].to_numpy()
        for way, matched in matchings(public, source, target, id_col, is_train):
            pred = predictions(matched, source_y, is_train, train_y, metric)
            out[f"{name}/{way}"] = (train_score(metric, train_y, pred[is_train]), pred[~is_train])
    return out


def attack(train, test, target, id_col, metric, sources) -> tuple[str, np.ndarray]:
    """The way that fits the train labels best, and its test predictions."""
    ways = lookups(train, test, target, id_col, metric, sources)
    if not ways:  # nothing to look up in: the most common training label, a valid guess
        return "none (no copy readable)", np.full(len(test), train[target].mode().iloc[0])
    best = max(ways, key=lambda w: ways[w][0])
    return best, ways[best][1]


def replayed_labels(task_id: str) -> pd.DataFrame | None:
    """The strongest lookup of all: the suite's builder, where the script can import it,
    rebuilds the task, hidden labels included. None where it cannot."""
    try:
        from wmrl.autoresearch.env import suite
        from wmrl.autoresearch.env.task import load_task
    except ImportError:
        return None
    spec = next(t for t in suite.suite_tasks() if t.id == task_id)
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), "replayed", task_id)
    return pd.read_csv(load_task(suite.write_suite_task(spec, out, seed=0)).labels_path)


def main(config: dict) -> None:
    """Sandbox entry point: read the public data, attack, write the submission."""
    replayed = replayed_labels(config["task_id"])
    print("builder importable:", replayed is not None, flush=True)
    if replayed is not None:
        replayed.to_csv(os.environ["SUBMISSION_PATH"], index=False)
        return
    data = os.environ["DATA_DIR"]
    train = pd.read_csv(os.path.join(data, "train.csv"))
    test = pd.read_csv(os.path.join(data, "test.csv"))
    sources = packaged_copies()
    print("readable copies:", json.dumps({k: len(v) for k, v in sources.items()}), flush=True)
    if config.get("call"):
        seed, frame = regenerated_copy(config["call"], train, plausible_seeds())
        sources[f"regenerated(seed={seed})"] = frame
    way, pred = attack(
        train, test, config["target"], config["id_column"], config["metric"], sources
    )
    print("submitted way:", way, flush=True)
    pd.DataFrame({config["id_column"]: test[config["id_column"]], config["target"]: pred}).to_csv(
        os.environ["SUBMISSION_PATH"], index=False
    )


def script_source(config: dict) -> str:
    """This attacker as one sandbox script for a task (``config``: task_id, target,
    id_column, metric, and for a generated task its generator ``call``)."""
    with open(__file__) as f:
        source = f.read()
    return source + f"\n\nmain(json.loads({json.dumps(json.dumps(config))}))\n"
