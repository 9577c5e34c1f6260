"""Build a task directory from any CSV: split, card, hidden labels, leaderboard.

    python -m wmrl.autoresearch.env.make_task --csv=FILE --target=COL --metric=M \\
        --out=DIR [--test_fraction=0.25] [--time_limit=60] [--memory_mb=2048] \\
        [--id_column=COL] [--overwrite] [--executor=local|ray] \\
        [--ray_address=auto|local|ray://host:port]

The leaderboard is computed by running the fixed baseline pool
(``author.baseline_specs``) through the sandbox, so a task's percentiles are
relative to honest, executed solutions.

Everything that can be checked on the CSV is checked before anything is written. The task
is then written into a hidden directory next to ``--out`` (``.<name>.partial-*``), its
leaderboard computed there, and only then renamed into place: a failure (bad input, no
baseline graded VALID, an interrupt) leaves ``--out`` as it was.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from absl import app, flags

from wmrl.autoresearch.env import author
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.metrics import get_metric
from wmrl.autoresearch.env.task import (
    Task,
    TaskError,
    check_id,
    check_memory_mb,
    check_time_limit,
    colliding_ids,
    describe_collision,
    load_task,
)

# The card lists at most this many feature columns, one table row each; the rest are
# summarised in one line by kind. Past a hundred a table is not read column by column, and
# the card is text the agent reads (and the corpus's tokenizer trains on).
MAX_CARD_COLUMNS = 100

# A regression target's largest magnitude: the metrics square differences of targets and
# predictions and sum them over rows, which overflows to inf (no score, so no submission
# could be VALID) long before 1e308. (2e150)**2 summed over 10 million rows is 4e307.
MAX_ABS_REGRESSION_TARGET = 1e150


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
    features = [c for c in train.columns if c not in (target, id_col)]
    for col in features[:MAX_CARD_COLUMNS]:
        kind = _kind(train[col])
        if kind == "categorical":
            kind += f" ({train[col].nunique()} values)"
        missing = int(train[col].isna().sum() + test[col].isna().sum())
        lines.append(f"| {col} | {kind} | {missing} |")
    if len(features) > MAX_CARD_COLUMNS:
        lines += ["", _unlisted_columns(train, test, features[MAX_CARD_COLUMNS:])]
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


def _kind(column: pd.Series) -> str:
    return "numeric" if pd.api.types.is_numeric_dtype(column) else "categorical"


def _unlisted_columns(train: pd.DataFrame, test: pd.DataFrame, cut: list) -> str:
    """The card's line for the columns past MAX_CARD_COLUMNS: how many, of which kind, and
    how many missing values they hold."""
    kinds = collections.Counter(_kind(train[c]) for c in cut)
    missing = int(train[cut].isna().sum().sum() + test[cut].isna().sum().sum())
    return (
        f"... and {len(cut):,} more columns (not listed): numeric {kinds['numeric']:,}, "
        f"categorical {kinds['categorical']:,}; {missing:,} missing values among them"
    )


@dataclasses.dataclass(frozen=True)
class PreparedTask:
    """A task checked and split in memory, nothing written yet (``prepare_task``)."""

    train: pd.DataFrame
    test: pd.DataFrame
    meta: dict
    class_counts: dict | None


def prepare_task(
    df: pd.DataFrame,
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
) -> PreparedTask:
    """Check the input and split it; raise TaskError naming the first problem. Writes
    nothing (``write_task`` and ``make_task`` write what this returns)."""
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
        _check_id_column(df, id_column, target)
    _check_target(df[target], target, m)
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
        test_idx = rng.permutation(len(df))[: round(test_fraction * len(df))]
    is_test = np.zeros(len(df), bool)
    is_test[test_idx] = True
    train, test = df[~is_test], df[is_test]
    if len(train) < 10 or len(test) < 5:
        raise TaskError(f"too few rows to split: {len(train)} train / {len(test)} test")
    if m.task_type == "classification":
        if test[target].nunique() < 2:
            raise TaskError(
                f"the test rows of target {target!r} hold one class: a constant prediction "
                "would score the top; give at least two classes two rows or more each"
            )
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
    return PreparedTask(train, test, meta, class_counts)


def _check_id_column(df: pd.DataFrame, id_column: str, target: str) -> None:
    """An id column of the CSV: present, not the target, no missing values, and unique as
    the grader compares ids (its canonical forms: "7" and "007" are one id)."""
    if id_column not in df.columns:
        raise TaskError(f"id column {id_column!r} absent from the CSV")
    if id_column == target:
        raise TaskError(f"id column {id_column!r} is the target")
    if df[id_column].isna().any():
        raise TaskError(f"id column {id_column!r} must be unique with no missing values")
    collision = colliding_ids(df[id_column].astype(str))
    if collision is not None:
        raise TaskError(
            f"id column {id_column!r} must be unique with no missing values: "
            f"{describe_collision(collision)}"
        )


def _check_target(y: pd.Series, target: str, m) -> None:
    """Refuse a target no leaderboard can rank: one class or one value (a constant
    prediction scores the top), non-numeric, non-finite or too large for the regression
    metrics (no score at all)."""
    values = y.unique()
    if len(values) == 0:
        raise TaskError(f"target {target!r} is missing in every row")
    if len(values) == 1:
        what = "class" if m.task_type == "classification" else "value"
        raise TaskError(
            f"{m.task_type} target {target!r} has one {what} ('{values[0]}' in every row with "
            "a target): a constant prediction would score the top of the leaderboard"
        )
    if m.task_type != "regression":
        return
    if not pd.api.types.is_numeric_dtype(y):
        raise TaskError(f"regression target {target!r} is not numeric")
    v = y.to_numpy(dtype=float)
    if not np.isfinite(v).all():
        bad = v[~np.isfinite(v)][0]
        raise TaskError(
            f"regression target {target!r} has non-finite values ({bad}): no metric can be "
            "computed on them"
        )
    if np.abs(v).max() > MAX_ABS_REGRESSION_TARGET:
        raise TaskError(
            f"regression target {target!r} has values up to {np.abs(v).max():g}, above "
            f"{MAX_ABS_REGRESSION_TARGET:g}: squared errors would overflow to inf, so no "
            "submission could be scored (rescale the target)"
        )


def _write_files(prepared: PreparedTask, dest: Path) -> None:
    """The task's files in ``dest`` (an empty directory), leaderboard empty."""
    train, test, meta = prepared.train, prepared.test, prepared.meta
    target, id_col = meta["target"], meta["id_column"]
    (dest / "public").mkdir()
    (dest / "private").mkdir(mode=0o700)
    os.chmod(dest / "private", 0o700)  # unreadable to the sandbox's unprivileged uid
    train.to_csv(dest / "public/train.csv", index=False)
    test.drop(columns=[target]).to_csv(dest / "public/test.csv", index=False)
    test[[id_col, target]].to_csv(dest / "private/test_labels.csv", index=False)
    os.chmod(dest / "private/test_labels.csv", 0o600)
    (dest / "public/description.md").write_text(describe(train, test, meta, prepared.class_counts))
    (dest / "leaderboard.json").write_text(json.dumps({"metric": meta["metric"], "scores": []}))
    (dest / "task.json").write_text(json.dumps(meta, indent=2))


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
    """Write the task files (leaderboard empty); raise TaskError on bad input, having
    written nothing.

    ``id_column``: a column of the CSV that already identifies its rows (unique, no
    missing values), used as the task's id column instead of a new ``id`` (or ``row_id``).
    ``out`` may already hold a task (it is replaced) or be an empty directory; anything
    else is refused unless ``overwrite``. The files are written next to ``out`` and renamed
    into place once written and loaded back (``load_task``).
    """
    prepared = prepare_task(
        df, task_id=task_id, target=target, metric=metric, test_fraction=test_fraction,
        time_limit_s=time_limit_s, memory_mb=memory_mb, provenance=provenance,
        summary=summary, split=split, seed=seed, id_column=id_column,
    )  # fmt: skip
    out = Path(out)
    with staged_task_dir(out, overwrite) as staging:
        _write_files(prepared, staging)
        load_task(staging)
    return out


def make_task(
    df: pd.DataFrame, out: str | os.PathLike, pool, *, overwrite: bool = False, **settings
) -> tuple[Path, dict]:
    """``write_task`` (``settings``: its keyword arguments) with the leaderboard computed
    (``build_leaderboard`` on ``pool``) before the task is renamed into place: a task on
    which no baseline is graded VALID is refused and ``out`` is left as it was. Returns the
    task directory and its leaderboard."""
    prepared = prepare_task(df, **settings)
    out = Path(out)
    with staged_task_dir(out, overwrite) as staging:
        _write_files(prepared, staging)
        board = build_leaderboard(staging, pool)
    return out, board


@contextlib.contextmanager
def staged_task_dir(out: Path, overwrite: bool):
    """A fresh hidden directory next to ``out`` to build a task in. When the block ends
    normally it replaces ``out`` (``_check_replaceable`` says what may be replaced); on any
    exception it is removed, with the parent directories made for it, and ``out`` is left
    as it was."""
    _check_replaceable(out, overwrite)
    made = _first_missing(out.parent)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
        os.chmod(staging, 0o755)  # public/ readable by the sandbox (private/ stays 0700)
    except OSError as e:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise TaskError(f"cannot write a task at {out}: {e}") from e
    try:
        yield staging
        _put_in_place(staging, out, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise


def _first_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its ancestors that does not exist yet (None if
    ``path`` exists): what ``mkdir(parents=True)`` will create."""
    path = path.absolute()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def _check_replaceable(out: Path, overwrite: bool) -> None:
    """Refuse, before anything is written, to replace what is not a task (or an empty
    directory) unless told to (``--overwrite``)."""
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


def _put_in_place(staging: Path, out: Path, overwrite: bool) -> None:
    """Rename the built task to ``out``, replacing what is there (a task, an empty directory,
    anything with ``--overwrite``). A directory there is moved aside first and deleted only
    once the new task is in place."""
    _check_replaceable(out, overwrite)  # again: it may have changed while the task was built
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        out.unlink()
    if not out.exists():
        os.rename(staging, out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rename(out, aside / out.name)
    try:
        os.rename(staging, out)
    except OSError:
        os.rename(aside / out.name, out)
        os.rmdir(aside)
        raise
    shutil.rmtree(aside, ignore_errors=True)


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
    from wmrl.autoresearch.env.pool import SandboxPool

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
    if not scores:
        raise TaskError(_no_valid_baseline(specs, results))
    board = {"metric": task.metric_name, "scores": scores, "entries": entries}
    (Path(task_dir) / "leaderboard.json").write_text(json.dumps(board, indent=2))
    return board


def _no_valid_baseline(specs, results) -> str:
    """One line: no baseline was graded VALID, each one's status, and the first reason."""
    statuses = ", ".join(f"{s.model}: {r.status.name}" for s, r in zip(specs, results, strict=True))
    why = next((r.detail or r.stderr_tail for r in results if r.detail or r.stderr_tail), "")
    line = f"no baseline was graded VALID ({statuses}), so the task cannot rank a submission"
    why = " ".join(why.split())[-300:]
    return f"{line}; the first reason: {why}" if why else line


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
    for flag, check in (("time_limit", check_time_limit), ("memory_mb", check_memory_mb)):
        try:
            check(getattr(FLAGS, flag))
        except TaskError as e:
            sys.exit(f"make_task: --{flag}: {e}")
    from wmrl.autoresearch.env.executor import make_executor

    settings = dict(
        task_id=FLAGS.id or Path(FLAGS.out).resolve().name,
        target=FLAGS.target,
        metric=FLAGS.metric,
        test_fraction=FLAGS.test_fraction,
        time_limit_s=FLAGS.time_limit,
        memory_mb=FLAGS.memory_mb,
        provenance={"source": os.path.basename(FLAGS.csv), "licence": "as the input CSV"},
        id_column=FLAGS.id_column,
    )
    try:
        df = read_csv(FLAGS.csv)
        prepare_task(df, **settings)  # every check on the input before the pool starts
        with make_executor(executor=FLAGS.executor, workers=FLAGS.workers,
                           ray_address=FLAGS.ray_address) as pool:  # fmt: skip
            out, board = make_task(df, FLAGS.out, pool, overwrite=FLAGS.overwrite, **settings)
    except TaskError as e:
        sys.exit(f"make_task: {e}")
    print(json.dumps({"task": str(out), "leaderboard": board["scores"]}))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
