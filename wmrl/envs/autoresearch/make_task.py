"""Build a task directory from any CSV: split, card, hidden labels, leaderboard.

    python -m wmrl.envs.autoresearch.make_task --csv=FILE --target=COL --metric=M \\
        --out=DIR [--test_fraction=0.25] [--time_limit=60] [--memory_mb=2048] \\
        [--id_column=COL] [--overwrite] [--executor=local|ray] \\
        [--ray_address=auto|local|ray://host:port]

The leaderboard is computed by running the fixed baseline pool
(``author.baseline_specs``) through the sandbox, so a task's percentiles are
relative to honest, executed solutions.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
from absl import app, flags

from wmrl.envs.autoresearch import author
from wmrl.envs.autoresearch.grader import Status
from wmrl.envs.autoresearch.metrics import get_metric
from wmrl.envs.autoresearch.task import (
    Task,
    TaskError,
    check_id,
    check_memory_mb,
    check_time_limit,
    load_task,
)


def task_info(task: Task) -> author.TaskInfo:
    """Facts the author (and the agent, via the card) knows about a task."""
    train = pd.read_csv(task.public_dir / "train.csv")
    feats = train.drop(columns=[task.target, task.id_column])
    return author.TaskInfo(
        task_type=task.type,
        metric=task.metric_name,
        target=task.target,
        id_column=task.id_column,
        has_missing=bool(feats.isna().any().any()),
        has_categorical=any(not pd.api.types.is_numeric_dtype(t) for t in feats.dtypes),
        n_rows=len(train),
    )


def describe(train: pd.DataFrame, test: pd.DataFrame, meta: dict, class_counts: dict | None) -> str:
    """The task card: what a careful data scientist would note before writing code."""
    metric = get_metric(meta["metric"])
    target, id_col = meta["target"], meta["id_column"]
    direction = "higher is better" if metric.higher_is_better else "lower is better"
    lines = [
        f"# Task {meta['id']}",
        "",
        meta.get("summary", ""),
        "",
        f"- Type: {meta['type']}",
        f"- Metric: {metric.name} ({direction})",
        f"- Target column: `{target}`; id column: `{id_col}`",
        f"- Rows: {len(train)} train, {len(test)} test; feature columns: {train.shape[1] - 2}",
        f"- Limits: {meta['time_limit_s']:g} s wall-clock, {meta['memory_mb']} MB memory, "
        "one CPU core, no network",
        "",
        "## Columns",
        "",
        "| column | kind | missing |",
        "|---|---|---|",
    ]
    for col in train.columns:
        if col in (target, id_col):
            continue
        kind = "numeric" if pd.api.types.is_numeric_dtype(train[col]) else "categorical"
        if kind == "categorical":
            kind += f" ({train[col].nunique()} values)"
        missing = int(train[col].isna().sum() + test[col].isna().sum())
        lines.append(f"| {col} | {kind} | {missing} |")
    if class_counts:
        lines += ["", "## Class balance (train)", ""]
        total = sum(class_counts.values())
        lines += [f"- {k}: {v} ({v / total:.1%})" for k, v in class_counts.items()]
    pred = "the probability of class 1" if metric.needs_scores else f"the predicted `{target}`"
    lines += [
        "",
        "## Submission",
        "",
        'Read `train.csv` and `test.csv` from `os.environ["DATA_DIR"]`; write a CSV to',
        f'`os.environ["SUBMISSION_PATH"]` with columns `{id_col}` and `{target}`: one row',
        f"per test row, {pred}. numpy, pandas and scikit-learn are installed.",
        "",
    ]
    return "\n".join(lines)


def write_task(
    df: pd.DataFrame,
    out: str | os.PathLike,
    *,
    task_id: str,
    target: str,
    metric: str,
    test_fraction: float = 0.25,
    time_limit_s: float = 60.0,
    memory_mb: int = 2048,
    provenance: dict | None = None,
    summary: str = "",
    split: str = "train",
    seed: int = 0,
    id_column: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the task files (leaderboard empty); raise TaskError on bad input.

    ``id_column``: a column of the CSV that already identifies its rows (unique, no
    missing values), used as the task's id column instead of a new ``id`` (or ``row_id``).
    ``out`` may already hold a task (it is replaced) or be an empty directory; anything
    else is refused unless ``overwrite``.
    """
    m = get_metric_or_task_error(metric)
    check_id(task_id)
    time_limit_s = check_time_limit(time_limit_s)
    memory_mb = check_memory_mb(memory_mb)
    if df.columns.duplicated().any():
        dups = sorted({str(c) for c in df.columns[df.columns.duplicated()]})
        raise TaskError(f"the CSV has duplicated column names: {dups}")
    if target not in df.columns:
        raise TaskError(f"target {target!r} absent from the CSV (columns: {list(df.columns)})")
    if not 0.0 < test_fraction < 1.0:
        raise TaskError(f"test fraction must be in (0, 1), got {test_fraction}")
    df = df[df[target].notna()].reset_index(drop=True)
    if id_column is not None:
        if id_column not in df.columns:
            raise TaskError(f"id column {id_column!r} absent from the CSV")
        if id_column == target:
            raise TaskError(f"id column {id_column!r} is the target")
        if df[id_column].isna().any() or df[id_column].duplicated().any():
            raise TaskError(f"id column {id_column!r} must be unique with no missing values")
    rng = np.random.default_rng(seed)
    df = df.iloc[rng.permutation(len(df))].reset_index(drop=True)
    if id_column is None:
        id_col = "id" if "id" not in df.columns else "row_id"
        df.insert(0, id_col, np.arange(len(df)))
    else:
        id_col = id_column
    class_counts = None
    if m.task_type == "classification":
        if m.needs_scores:
            classes = sorted(df[target].unique(), key=str)
            if len(classes) != 2:
                raise TaskError(f"metric roc_auc needs a binary target, {target} has {classes}")
            df[target] = (df[target] == classes[1]).astype(int)
        test_idx = _stratified_test_index(df[target], test_fraction, rng)
    else:
        if not pd.api.types.is_numeric_dtype(df[target]):
            raise TaskError(f"regression target {target!r} is not numeric")
        test_idx = rng.permutation(len(df))[: round(test_fraction * len(df))]
    is_test = np.zeros(len(df), bool)
    is_test[test_idx] = True
    train, test = df[~is_test], df[is_test]
    if len(train) < 10 or len(test) < 5:
        raise TaskError(f"too few rows to split: {len(train)} train / {len(test)} test")
    if m.task_type == "classification":
        class_counts = {str(k): int(v) for k, v in train[target].value_counts().items()}
    meta = {
        "id": task_id,
        "type": m.task_type,
        "metric": m.name,
        "target": target,
        "id_column": id_col,
        "time_limit_s": time_limit_s,
        "memory_mb": memory_mb,
        "split": split,
        "summary": summary,
        "provenance": provenance or {"source": "user CSV", "licence": "unknown"},
        "rows": {"train": len(train), "test": len(test)},
    }
    out = Path(out)
    _clear_out(out, overwrite)
    (out / "public").mkdir(parents=True)
    (out / "private").mkdir()
    os.chmod(out / "private", 0o700)  # unreadable to the sandbox's unprivileged uid
    train.to_csv(out / "public/train.csv", index=False)
    test.drop(columns=[target]).to_csv(out / "public/test.csv", index=False)
    test[[id_col, target]].to_csv(out / "private/test_labels.csv", index=False)
    (out / "public/description.md").write_text(describe(train, test, meta, class_counts))
    (out / "task.json").write_text(json.dumps(meta, indent=2))
    (out / "leaderboard.json").write_text(json.dumps({"metric": m.name, "scores": []}))
    return out


def _clear_out(out: Path, overwrite: bool) -> None:
    """Make room for a task at ``out``: replace a task, keep an empty directory, and delete
    anything else only when told to (``--overwrite``)."""
    if not out.exists() and not out.is_symlink():
        return
    is_task = out.is_dir() and not out.is_symlink() and (out / "task.json").is_file()
    if out.is_dir() and not out.is_symlink() and not is_task and not any(out.iterdir()):
        return
    if not is_task and not overwrite:
        raise TaskError(
            f"--out {out} exists and does not hold a task (no task.json); refusing to delete "
            "it: pass --overwrite to replace it, or choose another directory"
        )
    if out.is_dir() and not out.is_symlink():
        shutil.rmtree(out)
    else:
        out.unlink()


def get_metric_or_task_error(name: str):
    try:
        return get_metric(name)
    except ValueError as e:
        raise TaskError(str(e)) from e


def _stratified_test_index(y: pd.Series, fraction: float, rng: np.random.Generator) -> np.ndarray:
    idx = []
    for _, rows in y.groupby(y.astype(str)).groups.items():
        rows = rng.permutation(np.asarray(rows))
        k = round(fraction * len(rows))
        if len(rows) >= 2:
            k = min(max(k, 1), len(rows) - 1)
        idx.append(rows[:k])
    return np.concatenate(idx)


def build_leaderboard(task_dir: str | os.PathLike, pool=None) -> dict:
    """Run the baseline pool on the task through the sandbox; write leaderboard.json."""
    from wmrl.envs.autoresearch.pool import SandboxPool

    task = load_task(task_dir)
    info = task_info(task)
    specs = author.baseline_specs(info)
    own_pool = pool is None
    pool = pool or SandboxPool()
    try:
        futures = [pool.submit(task, author.render(info, s)) for s in specs]
        results = [f.result() for f in futures]
    finally:
        if own_pool:
            pool.close()
    entries = [
        {"name": s.model, "status": r.status.name, "score": r.score, "runtime_s": r.runtime_s}
        for s, r in zip(specs, results, strict=True)
    ]
    scores = sorted(e["score"] for e in entries if e["status"] == Status.VALID.name)
    board = {"metric": task.metric_name, "scores": scores, "entries": entries}
    (Path(task_dir) / "leaderboard.json").write_text(json.dumps(board, indent=2))
    return board


def read_csv(path: str) -> pd.DataFrame:
    """The input CSV, or a TaskError saying what is wrong with the file."""
    try:
        df = pd.read_csv(path, encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TaskError(f"CSV file {path} is not UTF-8 text ({e})") from e
    except pd.errors.EmptyDataError as e:
        raise TaskError(f"CSV file {path} is empty") from e
    except pd.errors.ParserError as e:
        raise TaskError(f"CSV file {path} could not be parsed: {e}") from e
    if df.empty:
        raise TaskError(f"CSV file {path} has a header but no rows")
    return df


FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program, so modules import side-effect free."""
    flags.DEFINE_string("csv", None, "input CSV file")
    flags.DEFINE_string("target", None, "target column")
    flags.DEFINE_string("metric", None, "accuracy | f1_macro | roc_auc | rmse | mae | r2")
    flags.DEFINE_string("out", None, "task directory to write (an existing task there is replaced)")
    flags.DEFINE_bool("overwrite", False, "replace --out even if it is not a task directory")
    flags.DEFINE_string(
        "id_column", None, "a column that already identifies the rows (default: add `id`)"
    )
    flags.DEFINE_string("id", None, "task id (default: the out dir's name)")
    flags.DEFINE_float("test_fraction", 0.25, "fraction of rows held out as the test set")
    flags.DEFINE_float("time_limit", 60.0, "wall-clock seconds per execution")
    flags.DEFINE_integer("memory_mb", 2048, "memory budget per execution")
    flags.DEFINE_integer("workers", None, "sandbox slots for the baselines (default: cores)")
    flags.DEFINE_enum("executor", "local", ["local", "ray"], "where the baselines run")
    flags.DEFINE_string("ray_address", "auto", "executor=ray: auto | local | ray://host:port")


def main(argv) -> None:
    del argv
    for name in ("csv", "target", "metric", "out"):
        if not getattr(FLAGS, name):
            raise app.UsageError(f"--{name} is required")
    if not os.path.isfile(FLAGS.csv):
        raise app.UsageError(f"CSV file {FLAGS.csv} does not exist")
    from wmrl.envs.autoresearch.executor import make_executor

    pool = make_executor(  # first: a bad --ray_address fails before anything is written
        executor=FLAGS.executor, workers=FLAGS.workers, ray_address=FLAGS.ray_address
    )
    with pool:
        try:
            out = write_task(
                read_csv(FLAGS.csv),
                FLAGS.out,
                task_id=FLAGS.id or Path(FLAGS.out).resolve().name,
                target=FLAGS.target,
                metric=FLAGS.metric,
                test_fraction=FLAGS.test_fraction,
                time_limit_s=FLAGS.time_limit,
                memory_mb=FLAGS.memory_mb,
                provenance={"source": os.path.basename(FLAGS.csv), "licence": "as the input CSV"},
                id_column=FLAGS.id_column,
                overwrite=FLAGS.overwrite,
            )
        except TaskError as e:
            raise app.UsageError(str(e)) from e
        board = build_leaderboard(out, pool)
    print(json.dumps({"task": str(out), "leaderboard": board["scores"]}))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
