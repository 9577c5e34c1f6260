"""What a prepared competition is, whichever benchmark prepared it, and the checks it must pass.

``CompetitionSource`` is a benchmark's prepared competition located on disk (``mlebench`` and
``mledojo`` read their own layouts into it); ``inspect_files`` checks the files a task is
made of and says what they hold (``Layout``), raising ``CompetitionError`` (a ``TaskError``)
that names the competition and the first problem. The same checks run when a competition is
imported and whenever its task directory is loaded.

What a competition must be to become a task (the sandbox runs one Python script on CPU with
numpy, pandas and scikit-learn):

* tabular: ``train.csv`` and ``test.csv`` in its public data, the id column (the sample
  submission's first column) in test.csv (train.csv may lack it: MLE-Dojo's
  amazon-employee-access-challenge adds an id to its test rows only);
* at most ``MAX_PREDICTION_COLUMNS`` prediction columns (the grader sizes its header caps
  from the task's columns, ``grading.header_caps``; beyond this a submission's header alone
  is more than grading should parse);
* a sample submission whose other columns are the predictions, every one of them in the
  answers file, with the same ids as ``test.csv``;
* answers the metric can score (``metrics.parse_column`` and the metric's ``check_true``);
* at least one leaderboard, ordered as its metric says (best first).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import stat
from pathlib import Path

import pandas as pd

from wmrl.autoresearch.env.competitions import leaderboard
from wmrl.autoresearch.env.competitions.metrics import CompetitionMetric, ValuesError
from wmrl.autoresearch.env.competitions.metrics import parse_columns as parse_value_columns
from wmrl.autoresearch.env.ids import MAX_CELL_CHARS, canonical_id
from wmrl.autoresearch.env.task import TaskError, colliding_ids, describe_collision

# The most prediction columns a competition may have (a sample submission's columns less its
# id). Real ones have at most a few hundred class columns; the grader's header caps grow with
# the task's columns up to this (``grading.header_caps``).
MAX_PREDICTION_COLUMNS = 10_000


class CompetitionError(TaskError):
    """A prepared competition, or its task directory, that cannot be a task."""


@dataclasses.dataclass(frozen=True)
class CompetitionSource:
    """A benchmark's prepared competition on disk.

    ``public_dir``: what the agent may see (copied into the task's ``public/``, less
    ``skip_public``); ``answers``, ``leaderboards`` (name -> file): what it may not;
    ``private_paths``: everything else the benchmark keeps of the competition (its private
    directory, its raw download, MLE-bench's Kaggle zip: ``download_paths``), which the
    import makes unreadable to other users (``protect_private_paths``). ``metric_words``: what the
    competition calls its metric; ``declared_higher_is_better``: the direction its own code
    declares, where that can be read without running it (None otherwise)."""

    benchmark: str
    competition_id: str
    public_dir: Path
    answers: Path
    sample_submission: Path
    description: str
    leaderboards: dict[str, Path]
    metric: CompetitionMetric
    metric_words: str
    private_paths: tuple[Path, ...]
    skip_public: tuple[str, ...] = ()
    declared_higher_is_better: bool | None = None


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a competition's files hold: the id column, the prediction columns (in the sample
    submission's order), the train.csv column the agent learns from, and the test ids."""

    id_column: str
    columns: list[str]
    target: str
    test_rows: int


def read_header(path: Path, what: str, name: str) -> list[str]:
    """A CSV file's column names (parsed as CSV), or a CompetitionError naming it."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            names = next(csv.reader(f), [])
    except FileNotFoundError as e:
        raise CompetitionError(f"competition {name}: {what} {path} does not exist") from e
    except (UnicodeDecodeError, csv.Error) as e:
        raise CompetitionError(f"competition {name}: {what} {path} is not CSV text ({e})") from e
    if not names:
        raise CompetitionError(f"competition {name}: {what} {path} is empty")
    if len(set(names)) != len(names):
        raise CompetitionError(f"competition {name}: {what} {path} repeats a column name")
    return names


def submission_columns(sample: Path, name: str) -> tuple[str, list[str]]:
    """The id column and prediction columns of a sample submission."""
    header = read_header(sample, "sample submission", name)
    if len(header) < 2:
        raise CompetitionError(
            f"competition {name}: sample submission {sample} has {header}: it needs an id "
            "column and at least one prediction column"
        )
    return header[0], header[1:]


def _target(name: str, columns: list[str], train: list[str], test: list[str], id_col: str):
    """The train.csv column the agent learns from: the first prediction column when train.csv
    has it (a regression, a label, several targets), else train.csv's one column that
    test.csv lacks (class probabilities predicted for a label column)."""
    if columns[0] in train:
        return columns[0]
    only_in_train = [c for c in train if c not in test and c != id_col]
    if len(only_in_train) == 1:
        return only_in_train[0]
    raise CompetitionError(
        f"competition {name}: cannot tell which train.csv column holds the target: prediction "
        f"column {columns[0]!r} is not in train.csv, and train.csv has "
        f"{len(only_in_train)} columns test.csv lacks ({only_in_train[:5]})"
    )


def inspect_files(
    name: str,
    public_dir: Path,
    answers: Path,
    id_column: str,
    columns: list[str],
    metric: CompetitionMetric,
    boards: dict[str, Path],
    declared_higher_is_better: bool | None = None,
) -> Layout:
    """Check a competition's files (module docstring) and say what they hold."""
    for file in ("train.csv", "test.csv"):
        if not (public_dir / file).is_file():
            has = sorted(p.name for p in public_dir.iterdir())[:8] if public_dir.is_dir() else []
            raise CompetitionError(
                f"competition {name}: no public {file} (public data: {has}); only tabular "
                "competitions with train.csv and test.csv can be tasks"
            )
    if len(columns) > MAX_PREDICTION_COLUMNS:
        raise CompetitionError(
            f"competition {name}: its sample submission has {len(columns):,} prediction "
            f"columns, more than the {MAX_PREDICTION_COLUMNS:,} a submission is graded with"
        )
    train = read_header(public_dir / "train.csv", "train.csv", name)
    test = read_header(public_dir / "test.csv", "test.csv", name)
    if id_column not in test:
        raise CompetitionError(
            f"competition {name}: id column {id_column!r} (the sample submission's first) "
            "is not in test.csv"
        )
    _check_metric(name, metric, columns, declared_higher_is_better)
    target = _target(name, columns, train, test, id_column)
    test_rows = _check_answers(name, public_dir / "test.csv", answers, id_column, columns, metric)
    _check_boards(name, boards, metric)
    return Layout(id_column, list(columns), target, test_rows)


def _check_metric(name, metric, columns, declared_higher_is_better) -> None:
    if metric.columns == "one" and len(columns) != 1:
        raise CompetitionError(
            f"competition {name}: metric {metric.name} scores one prediction column, the "
            f"sample submission has {len(columns)} ({columns[:5]}); name a metric over "
            "several columns (mean_roc_auc, mean_rmsle, mcrmse, multiclass_logloss)"
        )
    if metric.columns == "rows" and len(columns) < 2:
        raise CompetitionError(
            f"competition {name}: metric {metric.name} scores rows of class probabilities, "
            f"the sample submission has one prediction column ({columns})"
        )
    declared = declared_higher_is_better
    if declared is not None and declared != metric.higher_is_better:
        raise CompetitionError(
            f"competition {name}: its metric code declares higher_is_better={declared}, but "
            f"{metric.name} is {'higher' if metric.higher_is_better else 'lower'} is better: "
            "name the metric it uses"
        )


def _read_text(path: Path, columns: list[str]) -> pd.DataFrame:
    return pd.read_csv(path, usecols=columns, dtype=str, keep_default_na=False)[columns]


def _check_answers(name, test_csv, answers, id_column, columns, metric) -> int:
    """The answers: every prediction column present, ids unique and those of test.csv, cells
    the metric can read and score. Returns the number of test rows."""
    header = read_header(answers, "answers", name)
    missing = [c for c in [id_column, *columns] if c not in header]
    if missing:
        raise CompetitionError(
            f"competition {name}: answers {answers} lack the submission's columns {missing[:5]} "
            f"(has {header[:8]})"
        )
    frame = _read_text(answers, [id_column, *columns])
    if frame.empty:
        raise CompetitionError(f"competition {name}: answers {answers} have no rows")
    longest = int(max(frame[c].str.len().max() for c in frame.columns))
    if longest > MAX_CELL_CHARS:
        raise CompetitionError(
            f"competition {name}: an answer cell has {longest:,} characters (at most "
            f"{MAX_CELL_CHARS:,}): it could not be graded"
        )
    collision = colliding_ids(frame[id_column])
    if collision is not None:
        raise CompetitionError(
            f"competition {name}: answers' id column {id_column!r}: "
            f"{describe_collision(collision)}; no submission could be graded VALID"
        )
    test_ids = _read_text(test_csv, [id_column])[id_column]
    if {canonical_id(i) for i in test_ids} != {canonical_id(i) for i in frame[id_column]}:
        raise CompetitionError(
            f"competition {name}: the answers' ids ({len(frame)}) are not test.csv's "
            f"({len(test_ids)})"
        )
    try:
        truth = parse_value_columns(frame, columns, metric.reads)
    except ValuesError as e:
        raise CompetitionError(f"competition {name}: answers {answers}: {e}") from e
    problem = metric.check_true(truth) if metric.check_true else None
    if problem:
        raise CompetitionError(f"competition {name}: answers {answers}: {problem}")
    return len(frame)


def _check_boards(name: str, boards: dict[str, Path], metric: CompetitionMetric) -> None:
    if not boards:
        raise CompetitionError(f"competition {name}: no leaderboard")
    for board, path in boards.items():
        try:
            scores = leaderboard.read_board(path)
        except (OSError, ValueError) as e:
            raise CompetitionError(f"competition {name}: {board} leaderboard: {e}") from e
        lower = leaderboard.ordered_lower_is_better(scores)
        if lower is not None and lower == metric.higher_is_better:
            order = "lower" if lower else "higher"
            raise CompetitionError(
                f"competition {name}: its {board} leaderboard {path} is ordered as if {order} "
                f"scores were better (first {scores[0]:g}, last {scores[-1]:g}), but "
                f"{metric.name} is {'higher' if metric.higher_is_better else 'lower'} is better"
            )


def download_paths(competition_dir: Path, public_dir: Path) -> tuple[Path, ...]:
    """Everything a benchmark keeps of a competition (``<DATA>/<id>``) but its public data:
    the entries of ``competition_dir`` and of each directory on the way down to
    ``public_dir``, less that way itself. For MLE-bench: ``prepared/private``, the raw
    download ``raw`` and the Kaggle zip ``<id>.zip``; for MLE-Dojo: ``data/private`` and
    ``raw``. All of it must be as private as the answers: both benchmarks cut their test set
    out of the original training data, so the raw train.csv and the zip hold every answer."""
    public = public_dir.absolute()
    out, directory = [], competition_dir.absolute()
    if directory not in public.parents:
        raise ValueError(f"{public_dir} is not inside {competition_dir}")
    while directory != public:
        step = public.relative_to(directory).parts[0]
        out += [e for e in sorted(directory.iterdir()) if e.name != step]
        directory = directory / step
    return tuple(out)


def protect_private_paths(source: CompetitionSource, warn) -> None:
    """Make everything of the benchmark's outside its public data unreadable to other users
    (directories 0700, files without group and other bits), saying so through ``warn``: a
    script at the rlimits isolation level runs as another uid and could otherwise read the
    original answers where the benchmark prepared them. A symbolic link (its target might be
    anywhere), or a readable entry that belongs to another user, is refused, naming it."""
    name = source.competition_id
    for path in source.private_paths:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            raise CompetitionError(
                f"competition {name}: {path} is a symbolic link beside the public data; it "
                "may lead to the answers and cannot be made private here: replace it with "
                "what it points to, or remove it"
            )
        mode = stat.S_IMODE(st.st_mode)
        if not mode & 0o077:
            continue
        if st.st_uid != os.geteuid():
            raise CompetitionError(
                f"competition {name}: {path} (mode {mode:04o}, uid {st.st_uid}) may hold the "
                "answers and other users may read it, so a sandboxed script could: make it "
                "private (chmod go-rwx)"
            )
        new = 0o700 if stat.S_ISDIR(st.st_mode) else mode & ~0o077
        os.chmod(path, new)
        warn(
            f"competition {name}: {path} had mode {mode:04o} (readable by other users, the "
            f"sandbox's among them); made it {new:04o}"
        )


def value_kind(column: pd.Series) -> str:
    return "numeric" if pd.api.types.is_numeric_dtype(column) else "categorical"
