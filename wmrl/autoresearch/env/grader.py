"""Submission validation and the paper's reward ladder.

Statuses are an ``IntEnum`` so the world model can predict them as a class:

    MALFORMED           0    not decodable as UTF-8, empty, over MAX_SCRIPT_BYTES, or
                                  does not compile (a syntax error, or too deeply nested)
    RUNTIME_ERROR       1    0.1  non-zero exit, killed by a signal, memory error
    TIMEOUT             2    0.1  wall-clock or CPU-seconds limit
    NO_SUBMISSION       3    0.2  ran cleanly but wrote no submission file
    INVALID_SUBMISSION  4    0.2  wrote one, but rows / ids / values are wrong, a cell is
                                  over MAX_CELL_CHARS, or it cannot be graded within the
                                  grading CPU budget (``pool``)
    VALID               5    0.5 + 0.5 * percentile on the task's leaderboard
    UNGRADED            6    NaN  the sandbox or the grader itself broke
                                  (infrastructure): masked out of the loss, never 0

Validation happens before scoring: the file must parse as CSV, hold the id
column and the target column, one row per test id (no missing, extra or
duplicate ids), and values of the right kind (finite numbers for regression
and AUC, known class labels for accuracy/F1). Ids and class labels are compared
by ``canonical_id``.

The pool grades in the execution's supervisor process under a CPU-time budget, never in
the trainer's interpreter (``forkserver._grade``); everything here is also bounded on its
own (header size, columns, rows, ``MAX_CELL_CHARS``, linear-time patterns).
"""

from __future__ import annotations

import ast
import builtins
import csv
import dataclasses
import enum
import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd

from wmrl.autoresearch.env.ids import MAX_CELL_CHARS, canonical_id
from wmrl.autoresearch.env.metrics import percentile as leaderboard_percentile
from wmrl.autoresearch.env.task import Task


class Status(enum.IntEnum):
    MALFORMED = 0
    RUNTIME_ERROR = 1
    TIMEOUT = 2
    NO_SUBMISSION = 3
    INVALID_SUBMISSION = 4
    VALID = 5
    UNGRADED = 6


_LADDER = {
    Status.MALFORMED: 0.0,
    Status.RUNTIME_ERROR: 0.1,
    Status.TIMEOUT: 0.1,
    Status.NO_SUBMISSION: 0.2,
    Status.INVALID_SUBMISSION: 0.2,
    Status.UNGRADED: math.nan,
}


def reward(status: Status, pct: float | None = None) -> float:
    """Reward for a status; VALID needs the leaderboard percentile in [0, 1]."""
    if status == Status.VALID:
        if pct is None or not 0.0 <= pct <= 1.0:
            raise ValueError(f"VALID needs a percentile in [0, 1], got {pct}")
        return 0.5 + 0.5 * pct
    return _LADDER[Status(status)]


# The largest script the pool accepts. A policy writes at most a few thousand tokens
# (~15 KB) and a hand-written solution a few KB, so this is ~17 times anything real; it
# bounds what is copied into the sandbox's work dir (its tmpfs must hold the script with
# room to spare, see ``pool``) and the compile check below, which runs in the trainer's
# process (CPython compiles the worst-shaped scripts at roughly 2 s per MB).
MAX_SCRIPT_BYTES = 256 * 1024


def check_script(source: bytes) -> str | None:
    """Return why a script is malformed (None if it compiles). Never executes it.

    The size is checked first, so an oversized script costs nothing to refuse. A script
    the compiler gives up on (RecursionError or MemoryError on deep nesting such as
    ``1+1+...+1``) is malformed like a syntax error: the same interpreter in the sandbox
    would fail before its first line."""
    if len(source) > MAX_SCRIPT_BYTES:
        return f"script is {len(source):,} bytes, over the {MAX_SCRIPT_BYTES:,}-byte limit"
    if not source.strip():
        return "empty script"
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"script is not valid UTF-8: {e}"
    try:
        compile(text, "script.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    except (RecursionError, MemoryError) as e:
        return f"does not compile: {type(e).__name__}: {e} (nested too deeply)"
    return None


# Names a module can read without binding them (beyond `builtins`).
_MODULE_NAMES = frozenset(dir(builtins)) | {"__file__", "__builtins__", "__cached__"}


def undefined_names(text: str) -> list[str] | None:
    """The names a script reads but never binds anywhere (not an assignment, import, `def`,
    `class`, argument, loop / `with` / `except` / comprehension / `match` target or `global`)
    and that are not builtins: reading one raises NameError. None when the script does not
    parse or star-imports (then nobody can tell statically). Never executes it.

    Deliberately conservative: a name bound anywhere counts as bound everywhere (so a use
    before the assignment, or in another function's scope, is not reported), which makes a
    report a near-certain runtime error for straight-line scripts; the exception is a read
    that the script never reaches (dead code, a function never called, `except NameError`).
    """
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound.update(node.names)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return sorted(read - bound - _MODULE_NAMES)


def static_outcome(source: bytes, names: bool = True) -> tuple[Status, str] | None:
    """The status a script will get that is known without executing it, and why; None when
    only execution can tell. MALFORMED: the pool's own pre-execution check (`check_script`)
    fails, exact. RUNTIME_ERROR (`names`): it reads a name it never defines
    (`undefined_names`), e.g. an estimator it forgot to import; a reached read raises
    NameError and a non-zero exit is RUNTIME_ERROR whatever else the script did (a time-out
    before it has the same reward)."""
    why = check_script(source)
    if why is not None:
        return Status.MALFORMED, why
    if names:
        missing = undefined_names(source.decode("utf-8"))
        if missing:
            return Status.RUNTIME_ERROR, "undefined name(s): " + ", ".join(missing)
    return None


@dataclasses.dataclass(frozen=True)
class Grade:
    status: Status
    score: float | None
    percentile: float | None
    reward: float
    detail: str
    validation: float | None = None  # the raw metric on an episode task's validation rows
    # An imported competition's verdict in its benchmark's terms (MLE-bench's medal, MLE-Dojo's
    # position score: ``competitions.leaderboard.benchmark_outcome``); None for other tasks.
    benchmark: dict | None = None

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "status": int(self.status)}

    @classmethod
    def from_json(cls, fields: dict) -> Grade:
        return cls(**{**fields, "status": Status(fields["status"])})


def task_to_json(task: Task) -> dict:
    """A task's fields as JSON values: what the supervisor that grades gets (``pool``)."""
    fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    return {**fields, "root": str(task.root), "reference_scores": list(task.reference_scores)}


def task_from_json(fields: dict) -> Task:
    return Task(
        **{
            **fields,
            "root": Path(fields["root"]),
            "reference_scores": tuple(fields["reference_scores"]),
        }
    )


# How many characters of a submitted value a detail message echoes (``shorten``).
DETAIL_VALUE_CHARS = 60


def shorten(value: str, limit: int = DETAIL_VALUE_CHARS) -> str:
    """How a detail message echoes a value it did not write (a submitted cell, a column
    name, a parser's message): its repr, and past ``limit`` characters only the repr of its
    start, an ellipsis and its length, so a detail stays short whatever a submission holds:
    ``'12345'…(1,048,577 chars)``."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}…({len(value):,} chars)"


def _invalid(detail: str) -> Grade:
    return Grade(Status.INVALID_SUBMISSION, None, None, reward(Status.INVALID_SUBMISSION), detail)


# A submission needs two columns; its header is checked before anything is parsed, so that
# grading stays cheap whatever the file: a 100,000-column header once took 14 s and 526 MB,
# a 16 MB one 280 s and 8.2 GB.
MAX_HEADER_BYTES = 64 * 1024
MAX_COLUMNS = 1000


def submission_header(
    path: Path, max_columns: int = MAX_COLUMNS, max_bytes: int = MAX_HEADER_BYTES
) -> list[str] | Grade:
    """A submission's column names, read from at most ``max_bytes``; or why it is invalid
    (too long, not UTF-8, empty, not CSV, more than ``max_columns`` columns). A task that
    needs more columns passes its own caps (``competitions.grading.header_caps``)."""
    with open(path, "rb") as f:
        head = f.readline(max_bytes + 1)
    if len(head) > max_bytes:
        return _invalid(f"submission header is longer than {max_bytes} bytes")
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError:
        return _invalid("submission header is not UTF-8")
    if not text.strip():
        return _invalid("submission is empty or starts with an empty line")
    try:
        names = [c.strip() for c in next(csv.reader([text.rstrip("\r\n")]), [])]
    except csv.Error as e:
        return _invalid(f"submission header is not readable CSV: {shorten(str(e), 200)}")
    if len(names) > max_columns:
        return _invalid(f"submission header has {len(names)} columns (at most {max_columns})")
    return names


def _read_submission(task: Task, path: Path, n_rows: int) -> pd.DataFrame | Grade:
    """The id and target columns of at most ``n_rows + 1`` rows, or the reason it is invalid.

    Bounded work: the header is read (at most MAX_HEADER_BYTES) and checked first; pandas
    then parses only the two needed columns and stops after one row more than the test set;
    no cell over MAX_CELL_CHARS reaches the per-cell parsing.
    """
    names = submission_header(path)
    if isinstance(names, Grade):
        return names
    for col in (task.id_column, task.target):
        count = names.count(col)
        if count == 0:
            has = ", ".join(shorten(n) for n in names[:10])
            return _invalid(f"submission lacks column {col!r} (has [{has}])")
        if count > 1:
            return _invalid(f"column {col!r} appears {count} times in the submission header")
    wanted = sorted({names.index(task.id_column), names.index(task.target)})
    try:
        sub = pd.read_csv(path, usecols=wanted, dtype=str, keep_default_na=False, nrows=n_rows + 1)
    except Exception as e:  # any parse failure is the agent's fault
        return _invalid(
            f"submission is not a readable CSV: {type(e).__name__}: {shorten(str(e), 200)}"
        )
    sub.columns = [str(c).strip() for c in sub.columns]
    if sorted(sub.columns) != sorted([task.id_column, task.target]):
        read = ", ".join(shorten(c) for c in sub.columns)
        return _invalid(f"submission header could not be parsed (read [{read}])")
    for col in (task.id_column, task.target):
        longest = int(sub[col].str.len().max()) if len(sub) else 0
        if longest > MAX_CELL_CHARS:
            return _invalid(
                f"a cell of column {col!r} has {longest:,} characters (at most {MAX_CELL_CHARS:,})"
            )
    return sub


def grade_submission(task: Task, submission_path: str | Path) -> Grade:
    """Validate a submission file against the task's hidden labels and score it.

    On an episode task (``task.has_validation_split``, built by
    ``episode.make_episode_task``) test.csv holds the test rows and the validation rows under
    opaque ids: the submission must cover all of them (it is one row per test.csv row, as
    always), the status, score, percentile and reward come from the test rows alone, exactly
    as a single-turn grade of those predictions, and ``Grade.validation`` is the raw metric on
    the validation rows (None where it is undefined, e.g. a one-class AUC). A predicted class
    is known if it appears in train.csv or the validation labels: the test labels are not
    consulted for validity, so nothing about them can reach the agent's observation."""
    path = Path(submission_path)
    if not path.is_file():
        return Grade(Status.NO_SUBMISSION, None, None, reward(Status.NO_SUBMISSION), "no file",
                     benchmark=no_score_verdict(task))  # fmt: skip
    if task.competition is not None:  # an imported benchmark competition: its own metric
        from wmrl.autoresearch.env.competitions.grading import grade_competition  # builds on us

        return grade_competition(task, path)
    labels = _read_str_csv(task.labels_path, None)
    n_test = len(labels)
    validation = None
    if task.has_validation_split:
        validation = _read_str_csv(task.validation_labels_path, None)
        labels = pd.concat([labels, validation], ignore_index=True)  # test rows first
    sub = _read_submission(task, path, len(labels))
    if isinstance(sub, Grade):
        return sub
    if len(sub) > len(labels):
        return _invalid(f"submission has more than {len(labels)} rows (the test set's)")
    if len(sub) != len(labels):
        return _invalid(f"submission has {len(sub)} rows, test set has {len(labels)}")
    sub_ids = _canonical(sub[task.id_column])
    if sub_ids.duplicated().any():
        return _invalid("duplicate ids in submission")
    true_ids = _canonical(labels[task.id_column])
    if set(sub_ids) != set(true_ids):
        return _invalid("submission ids do not match the test ids")
    pred = sub.set_index(sub_ids)[task.target].reindex(true_ids).to_numpy()
    metric = task.metric
    if task.type == "regression" or metric.needs_scores:
        values = pd.to_numeric(pd.Series(pred), errors="coerce").to_numpy(dtype=float)
        if not np.all(np.isfinite(values)):
            return _invalid("predictions must be finite numbers (found NaN, inf or text)")
        y_pred = values
    else:
        y_pred = _canonical(pd.Series(pred)).to_numpy(dtype=object)
        if any(v == "" for v in y_pred):
            return _invalid("empty predictions")
    if task.type == "regression":
        y_true = labels[task.target].astype(float).to_numpy()
    elif metric.needs_scores:
        y_true = _canonical(labels[task.target]).astype(int).to_numpy()
    else:
        y_true = _canonical(labels[task.target]).to_numpy(dtype=object)
        known = set(y_true[n_test:]) if validation is not None else set(y_true)
        unknown = set(y_pred) - known
        if unknown:  # train.csv is read only when the labels do not settle it
            unknown -= _train_classes(task)
        if unknown:
            shown = ", ".join(shorten(v) for v in sorted(unknown)[:5])
            return _invalid(f"predictions contain unknown class labels [{shown}]")
    score = metric.fn(y_true[:n_test], y_pred[:n_test])
    if not math.isfinite(score):
        return _invalid(f"score is not finite ({score})")
    pct = leaderboard_percentile(score, list(task.reference_scores), metric.higher_is_better)
    val_score = None
    if validation is not None:
        try:
            val_score = float(metric.fn(y_true[n_test:], y_pred[n_test:]))
        except ValueError:  # e.g. roc_auc on a validation split with one class
            val_score = None
        if val_score is not None and not math.isfinite(val_score):
            val_score = None
    return Grade(Status.VALID, score, pct, reward(Status.VALID, pct), "ok", val_score)


def no_score_verdict(task: Task) -> dict | None:
    """An imported competition's verdict on a submission that is not VALID (no medal,
    position score 0: ``competitions.leaderboard.no_score_outcome``); None for other tasks."""
    if task.competition is None:
        return None
    from wmrl.autoresearch.env.competitions.leaderboard import no_score_outcome

    return no_score_outcome(task.competition["benchmark"])


def _canonical(cells: pd.Series) -> pd.Series:
    """``canonical_id`` of every cell, computed once per distinct cell (labels repeat)."""
    values = cells.to_numpy(dtype=object)  # iterating pandas' arrow strings is slow
    forms = {cell: canonical_id(cell) for cell in set(values)}
    return pd.Series([forms[cell] for cell in values], index=cells.index, dtype=object)


def _train_classes(task: Task) -> set[str]:
    col = _read_str_csv(task.public_dir / "train.csv", task.target)[task.target]
    return {canonical_id(v) for v in col.unique()}


def _read_str_csv(path: Path, column: str | None) -> pd.DataFrame:
    """Task files read as strings, cached by (path, mtime): the pool grades every
    execution of a task against the same labels."""
    st = path.stat()
    return _cached_csv(str(path), st.st_mtime_ns, st.st_size, column).copy()


@functools.lru_cache(maxsize=64)
def _cached_csv(path: str, mtime_ns: int, size: int, column: str | None) -> pd.DataFrame:
    del mtime_ns, size  # cache key only
    usecols = None if column is None else [column]
    return pd.read_csv(path, usecols=usecols, dtype=str, keep_default_na=False)
