"""Grading a submission to an imported competition (``grader.grade_submission`` hands it here).

The reward ladder is the one every task has; what differs is what a VALID submission is and
how it is scored:

* its header names exactly the sample submission's columns, in any order: the id column and
  every prediction column (a missing or an extra column is INVALID, as MLE-Dojo rules);
* one row per answer row, ids matched as ``ids.canonical_id`` compares them (no missing,
  extra or duplicate id);
* every prediction cell readable as the metric reads it in the competition's benchmark
  (``metrics.parse_column``, ``metrics.benchmark_reads``) and passing its check (class
  probabilities summing to 1, log arguments above -1);

then the score is the metric on the answers (``metrics.score``), the percentile its mid-rank
on the reference leaderboard, and ``Grade.benchmark`` the benchmark's own verdict
(``leaderboard.benchmark_outcome``: MLE-bench's medal, MLE-Dojo's position score). A
submission that is not VALID gets the verdict of no score (``leaderboard.no_score_outcome``:
no medal, position score 0). Whatever the metric raises on the submission's values
(an overflow, a division by zero, a value error) is INVALID, naming the error: it is the
submission's doing, never the grader's failure. The answers and leaderboards are read
outside that, so a task whose own files broke still fails as the infrastructure.

Bounded work whatever the file holds, as in ``grader``: the header is read first (at most
``MAX_HEADER_BYTES``, ``MAX_COLUMNS``, or what the task's own columns need where that is
more: ``header_caps``), pandas parses only the needed columns and at most one row beyond the
answers, and no cell over ``MAX_CELL_CHARS`` reaches the per-cell parsing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from wmrl.autoresearch.env.competitions import leaderboard
from wmrl.autoresearch.env.competitions.metrics import (
    ValuesError,
    benchmark_reads,
    parse_columns,
    score,
)
from wmrl.autoresearch.env.grader import (
    MAX_COLUMNS,
    MAX_HEADER_BYTES,
    Grade,
    Status,
    reward,
    shorten,
    submission_header,
)
from wmrl.autoresearch.env.ids import MAX_CELL_CHARS, canonical_id
from wmrl.autoresearch.env.metrics import percentile
from wmrl.autoresearch.env.task import Task


def _invalid(detail: str) -> Grade:
    return Grade(Status.INVALID_SUBMISSION, None, None, reward(Status.INVALID_SUBMISSION), detail)


def _metric_failed(error: Exception) -> Grade:
    return _invalid(
        f"the metric failed on the predictions: {type(error).__name__}: {shorten(str(error), 200)}"
    )


def header_caps(wanted: list[str]) -> tuple[int, int]:
    """The most columns and header bytes a submission with the ``wanted`` columns may have:
    the grader's defaults, or what those columns need where that is more (a competition with
    1,100 class columns), so that the answers themselves are always within them. Bytes: each
    name as UTF-8, quoted, with a separator and a space, four times over."""
    need = sum(len(c.encode("utf-8")) + 4 for c in wanted)
    return max(MAX_COLUMNS, len(wanted)), max(MAX_HEADER_BYTES, 4 * need)


def read_submission(path: Path, wanted: list[str], n_rows: int) -> pd.DataFrame | Grade:
    """The submission's ``wanted`` columns (the id column and the predictions) as text, at
    most ``n_rows + 1`` rows; or why it is INVALID."""
    max_columns, max_bytes = header_caps(wanted)
    names = submission_header(path, max_columns=max_columns, max_bytes=max_bytes)
    if isinstance(names, Grade):
        return names
    missing = [c for c in wanted if c not in names]
    if missing:
        shown = ", ".join(shorten(c) for c in missing[:5])
        return _invalid(f"submission lacks column(s) [{shown}] of the sample submission")
    extra = [c for c in names if c not in wanted]
    if extra:
        shown = ", ".join(shorten(c) for c in extra[:5])
        return _invalid(f"submission has column(s) the sample submission lacks: [{shown}]")
    repeated = next((c for c in wanted if names.count(c) > 1), None)
    if repeated is not None:
        return _invalid(f"column {repeated!r} appears {names.count(repeated)} times")
    try:
        sub = pd.read_csv(path, dtype=str, keep_default_na=False, nrows=n_rows + 1)
    except Exception as e:  # any parse failure is the submitter's
        return _invalid(
            f"submission is not a readable CSV: {type(e).__name__}: {shorten(str(e), 200)}"
        )
    sub.columns = [str(c).strip() for c in sub.columns]
    if sorted(sub.columns) != sorted(wanted):
        return _invalid("submission header could not be parsed")
    for col in wanted:
        longest = int(sub[col].str.len().max()) if len(sub) else 0
        if longest > MAX_CELL_CHARS:
            return _invalid(
                f"a cell of column {col!r} has {longest:,} characters (at most {MAX_CELL_CHARS:,})"
            )
    return sub


def _canonical(cells: pd.Series) -> list[str]:
    values = cells.to_numpy(dtype=object)
    forms = {cell: canonical_id(cell) for cell in set(values)}
    return [forms[cell] for cell in values]


def grade_competition(task: Task, path: Path) -> Grade:
    """Validate a submission to a competition task and score it (module docstring)."""
    grade = _grade(task, path)
    if grade.status == Status.VALID:
        return grade
    return dataclasses.replace(
        grade, benchmark=leaderboard.no_score_outcome(task.competition["benchmark"])
    )


def _grade(task: Task, path: Path) -> Grade:
    spec = task.competition
    metric = task.metric
    id_col, columns = spec["id_column"], list(spec["columns"])
    answers = pd.read_csv(task.root / "private" / spec["answers"], dtype=str,
                          keep_default_na=False)[[id_col, *columns]]  # fmt: skip
    sub = read_submission(path, [id_col, *columns], len(answers))
    if isinstance(sub, Grade):
        return sub
    if len(sub) != len(answers):
        more = "more than " if len(sub) > len(answers) else ""
        return _invalid(f"submission has {more}{len(sub)} rows, the test set {len(answers)}")
    sub_ids, true_ids = _canonical(sub[id_col]), _canonical(answers[id_col])
    if len(set(sub_ids)) != len(sub_ids):
        return _invalid("duplicate ids in submission")
    if set(sub_ids) != set(true_ids):
        return _invalid("submission ids do not match the test ids")
    aligned = sub.set_axis(sub_ids, axis=0).loc[true_ids]
    y_true = parse_columns(answers, columns, metric.reads)  # checked when imported
    try:
        y_pred = parse_columns(aligned, columns, benchmark_reads(metric, spec["benchmark"]))
    except ValuesError as e:
        return _invalid(f"predictions: {e}")
    except Exception as e:  # whatever reading these values raises is the submission's
        return _metric_failed(e)
    try:
        value = score(metric, y_true, y_pred)
    except ValuesError as e:
        return _invalid(str(e))
    except Exception as e:  # whatever the metric raises on these values is the submission's
        return _metric_failed(e)
    boards = leaderboard.boards_of(task)
    pct = percentile(value, list(leaderboard.reference_scores(task, boards)),
                     metric.higher_is_better)  # fmt: skip
    outcome = leaderboard.benchmark_outcome(task, value, boards)
    return Grade(Status.VALID, value, pct, reward(Status.VALID, pct), "ok", benchmark=outcome)
