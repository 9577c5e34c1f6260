"""The task directory format (public: users add their own tasks).

    <task>/task.json              id, type, metric, target, id_column, time_limit_s,
                                  memory_mb, provenance {source, licence, notes}
    <task>/public/train.csv       features + target
    <task>/public/test.csv        features only
    <task>/public/description.md  the card the agent sees
    <task>/private/test_labels.csv  id_column + target; never visible to the agent
    <task>/leaderboard.json       {"metric": ..., "scores": [...], "entries": [...]}
    <task>/private/validation_labels.csv  only in a multi-turn episode task
                                  (``episode.make_episode_task``): id_column + target of the
                                  validation rows mixed into test.csv

``load_task`` checks all of this and raises ``TaskError`` naming the first
problem, so a broken user task fails at load time, not inside the pool. One problem it
repairs instead, saying so in a warning: a ``private/`` that other users may read (a task
copied by git or by hand is usually 0755) is made 0700 and its files 0600 when they are
ours; ``private/`` that is not ours and readable is refused. Whatever the isolation level,
labels a sandboxed script could open are never graded against.

An imported benchmark competition (MLE-bench, MLE-Dojo: ``competitions``, docs/competitions.md)
is a task directory of its own kind: its task.json has a ``competition`` block, its
``private/`` holds the answers and the leaderboards (there is no leaderboard.json), and
``load_task`` hands it to ``competitions.task_dir.load_competition_task``, which checks it
and repairs ``private/`` the same way.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from wmrl.autoresearch.env.competitions.metrics import get_competition_metric
from wmrl.autoresearch.env.ids import canonical_id
from wmrl.autoresearch.env.metrics import Metric, get_metric

TASK_TYPES = ("classification", "regression")
SPLITS = ("train", "heldout")
# What task.json's provenance holds as text (the builders add other fields, kept as they are).
PROVENANCE_TEXTS = ("source", "licence", "notes")
# The scores each metric can give (a reference score outside them is no submission's: it
# would move every percentile).
SCORE_RANGES = {
    "accuracy": (0.0, 1.0),
    "f1_macro": (0.0, 1.0),
    "roc_auc": (0.0, 1.0),
    "rmse": (0.0, math.inf),
    "mae": (0.0, math.inf),
    "r2": (-math.inf, 1.0),
}
REQUIRED_FIELDS = ("id", "type", "metric", "target", "id_column", "time_limit_s", "memory_mb")

# Upper bounds of a task's limits. An execution holds a sandbox slot, and a trainer step
# waits for its slowest execution: past a day a task is not one for this environment. The
# bounds also keep the limits inside what the machinery can express; above them they no
# longer fit (a 1e10 s wait overflows the pool's wait, 10^13 MB overflows RLIMIT_AS in
# bytes) and every execution would be UNGRADED.
MAX_TIME_LIMIT_S = 86_400.0
MAX_MEMORY_MB = 2**20  # 1 TiB for a script on one core; RLIMIT_AS in bytes fits 64 bits

logger = logging.getLogger(__name__)


class TaskError(ValueError):
    """A task directory that does not follow the format."""


# Ids name directories (the sandbox's work dirs among them): ASCII letters, digits, ".", "_"
# and "-", starting with a letter or digit, so "../../x" or "/tmp/x" cannot be one.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", re.ASCII)


def check_id(task_id) -> str:
    """The id, if it is a valid task id; TaskError naming the rule otherwise."""
    if not isinstance(task_id, str) or not ID_PATTERN.fullmatch(task_id):
        raise TaskError(
            f"task id {task_id!r} is not valid: use 1-100 ASCII letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    return task_id


def check_time_limit(value) -> float:
    """Seconds in (0, MAX_TIME_LIMIT_S] (NaN, Infinity or 1e10 would make every run
    UNGRADED)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TaskError(f"time_limit_s must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or not 0 < value <= MAX_TIME_LIMIT_S:
        raise TaskError(
            f"time_limit_s must be positive and at most {MAX_TIME_LIMIT_S:g} s (a day), "
            f"got {value!r}"
        )
    return float(value)


def check_memory_mb(value) -> int:
    """A whole number of MB in [1, MAX_MEMORY_MB]."""
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    if not ok or not math.isfinite(value) or value != int(value) or not 0 < value <= MAX_MEMORY_MB:
        raise TaskError(
            f"memory_mb must be a positive whole number of MB, at most {MAX_MEMORY_MB} "
            f"(1 TiB), got {value!r}"
        )
    return int(value)


def check_split(value) -> str:
    """The split, "train" or "heldout" (a held-out task is never trained on)."""
    if not isinstance(value, str) or value not in SPLITS:
        raise TaskError(f"split must be one of {SPLITS}, got {value!r}")
    return value


def check_provenance(value) -> dict:
    """A JSON object whose `PROVENANCE_TEXTS` fields, where present, are text."""
    if not isinstance(value, dict):
        raise TaskError(
            f'provenance must be a JSON object such as {{"source": ..., "licence": ...}}, '
            f"got {type(value).__name__} {_short(value)}"
        )
    for name in PROVENANCE_TEXTS:
        if name in value and not isinstance(value[name], str):
            raise TaskError(f"provenance.{name} must be text, got {_short(value[name])}")
    return dict(value)


def check_reference_scores(board, metric: Metric) -> tuple[float, ...]:
    """leaderboard.json's scores: a JSON object with a `scores` list of finite numbers the
    metric can give (`SCORE_RANGES`), and, if it names one, the task's metric. A NaN
    reference counts as better than every submission (no percentile could reach 1), an
    infinite one as worse or better than all of them."""
    if not isinstance(board, dict):
        raise TaskError(
            f"leaderboard.json must be a JSON object with a 'scores' list, got "
            f"{type(board).__name__}"
        )
    if "metric" in board and board["metric"] != metric.name:
        raise TaskError(
            f"leaderboard.json: metric {_short(board['metric'])} is not the task's metric "
            f"{metric.name}"
        )
    scores = board.get("scores")
    if not isinstance(scores, list):
        raise TaskError(f"leaderboard.json needs a 'scores' list, got {_short(scores)}")
    low, high = SCORE_RANGES.get(metric.name, (-math.inf, math.inf))
    for i, score in enumerate(scores):
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise TaskError(f"leaderboard.json: scores[{i}] is {_short(score)}, not a number")
        if not math.isfinite(score):
            raise TaskError(
                f"leaderboard.json: scores[{i}] is {score}; reference scores must be finite"
            )
        if not low <= score <= high:
            bound = (
                f"between {low:g} and {high:g}" if math.isfinite(low) and math.isfinite(high)
                else f"at least {low:g}" if math.isfinite(low) else f"at most {high:g}"
            )  # fmt: skip
            raise TaskError(
                f"leaderboard.json: scores[{i}] is {score!r}; {metric.name} scores lie {bound}"
            )
    return tuple(float(s) for s in scores)


def _short(value) -> str:
    """A value's repr for an error line, shortened to its first 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}... ({len(text)} characters)"


def colliding_ids(ids: Iterable[str]) -> tuple[str, str] | None:
    """Two ids the grader takes for one (the same ``ids.canonical_id``: "7" and "007",
    or the same string twice), or None. With such ids in the test set no submission could
    be VALID: its rows would count as duplicates."""

    seen: dict[str, str] = {}
    for raw in ids:
        try:
            key = canonical_id(raw)
        except ValueError as e:  # too long to be graded
            raise TaskError(f"id {raw[:40]!r}... cannot be graded: {e}") from e
        if key in seen:
            return seen[key], raw
        seen[key] = raw
    return None


def describe_collision(pair: tuple[str, str]) -> str:
    a, b = pair
    if a == b:
        return f"id {a!r} appears twice"
    return f"ids {a!r} and {b!r} are the same id to the grader"


@dataclasses.dataclass(frozen=True)
class Task:
    """A loaded, validated task. Paths are absolute; data stay on disk."""

    root: Path
    id: str
    type: str
    metric_name: str
    target: str
    id_column: str
    time_limit_s: float
    memory_mb: int
    provenance: dict
    split: str
    reference_scores: tuple[float, ...]
    # An imported benchmark competition's block of task.json (``competitions.task_dir``):
    # graded by its own metric and leaderboards, not by test_labels.csv and leaderboard.json.
    competition: dict | None = None

    @property
    def metric(self) -> Metric:
        if self.competition is not None:
            return get_competition_metric(self.metric_name)
        return get_metric(self.metric_name)

    @property
    def public_dir(self) -> Path:
        return self.root / "public"

    @property
    def labels_path(self) -> Path:
        return self.root / "private" / "test_labels.csv"

    @property
    def validation_labels_path(self) -> Path:
        """An episode task's validation labels (``episode.make_episode_task``), keyed by the
        opaque ids of test.csv; never visible to the agent."""
        return self.root / "private" / "validation_labels.csv"

    @property
    def has_validation_split(self) -> bool:
        """An episode task: its test.csv also holds validation rows, graded for the
        observation only (``grader.grade_submission``)."""
        return self.validation_labels_path.is_file()

    @property
    def card(self) -> str:
        return (self.public_dir / "description.md").read_text()


def _read_header(path: Path) -> list[str]:
    """The column names, parsed as CSV (a name such as "my,label" is quoted in the file)."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            names = next(csv.reader(f), [])
    except UnicodeDecodeError as e:
        raise TaskError(f"{path} is not UTF-8 text ({e})") from e
    except csv.Error as e:
        raise TaskError(f"{path} has a header that is not readable CSV ({e})") from e
    if not names:
        raise TaskError(f"{path} is empty")
    return names


def _first_column(path: Path) -> list[str]:
    """The first column's cells as text, as the grader reads them (blank lines skipped)."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = csv.reader(f)
        next(rows, None)
        return [row[0] for row in rows if row]


def make_private(root: Path) -> None:
    """``private/`` and every file in it unreadable to other uids (the rlimits sandbox runs
    scripts as one), and nothing of it reachable from ``public/``.

    - Modes: repaired to 0700 / 0600, with a warning, when they are ours; a TaskError naming
      the path and its mode when they are not.
    - Links: a symbolic link in ``private/`` (or ``private/`` itself one) is refused, never
      followed: its target lies outside the task, and nothing outside the task directory is
      ever changed. A file of ``public/`` that shares its inode with one of ``private/`` (a
      hard link) is refused: the sandbox would read the labels under the public name.
    """
    private = root / "private"
    if private.is_symlink():
        raise TaskError(f"task {root.name}: {private} is a symbolic link; it must be a directory")
    hidden: dict[tuple[int, int], Path] = {}
    paths = [private, *sorted(private.iterdir())]
    for path in paths:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            raise TaskError(
                f"task {root.name}: {path} is a symbolic link (to {os.readlink(path)!r}); "
                "private/ must hold regular files only"
            )
        if path is not private and not stat.S_ISREG(st.st_mode):
            continue
        hidden[(st.st_dev, st.st_ino)] = path
        mode = stat.S_IMODE(st.st_mode)
        if not mode & 0o077:  # nothing for group or others
            continue
        new = 0o700 if path is private else 0o600
        if st.st_uid != os.geteuid():
            raise TaskError(
                f"task {root.name}: {path} has mode {mode:04o}, so a sandboxed script could read "
                f"the hidden labels, and it belongs to uid {st.st_uid}, not us: make it "
                f"{new:04o} (chmod go-rwx)"
            )
        try:
            os.chmod(path, new, follow_symlinks=False)
        except OSError as e:
            raise TaskError(
                f"task {root.name}: {path} has mode {mode:04o}, so a sandboxed script could read "
                f"the hidden labels, and it cannot be changed ({e})"
            ) from e
        logger.warning(
            "task %s: %s had mode %04o (readable by other users, the sandbox's among them); "
            "made it %04o",
            root.name,
            path,
            mode,
            new,
        )
    for path in sorted((root / "public").rglob("*")):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) in hidden:
            raise TaskError(
                f"task {root.name}: {path} is a hard link to "
                f"{hidden[(st.st_dev, st.st_ino)]}: the sandbox would read the hidden labels"
            )


def load_task(root: str | os.PathLike) -> Task:
    """Load and validate a task directory; raise TaskError naming what is wrong."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise TaskError(f"task directory {root} does not exist")
    from wmrl.autoresearch.env.competitions import task_dir  # it builds on this module

    if task_dir.is_competition_task(root):
        return task_dir.load_competition_task(root)
    for rel in (
        "task.json",
        "public/train.csv",
        "public/test.csv",
        "public/description.md",
        "private/test_labels.csv",
        "leaderboard.json",
    ):
        if not (root / rel).is_file():
            raise TaskError(f"task {root.name}: missing file {rel}")
    try:
        meta = json.loads((root / "task.json").read_text())
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deeply
        raise TaskError(f"task {root.name}: task.json is not valid JSON ({e})") from e
    if not isinstance(meta, dict):
        raise TaskError(
            f"task {root.name}: task.json must be a JSON object of fields, got "
            f"{type(meta).__name__}"
        )
    missing = [k for k in REQUIRED_FIELDS if k not in meta]
    if missing:
        raise TaskError(f"task {root.name}: task.json lacks fields {missing}")
    if meta["type"] not in TASK_TYPES:
        raise TaskError(f"task {root.name}: type {_short(meta['type'])} not in {TASK_TYPES}")
    if not isinstance(meta["metric"], str):
        raise TaskError(
            f"task {root.name}: metric must be a metric's name, got {_short(meta['metric'])}"
        )
    try:
        metric = get_metric(meta["metric"])
    except ValueError as e:
        raise TaskError(f"task {root.name}: {e}") from e
    if metric.task_type != meta["type"]:
        raise TaskError(
            f"task {root.name}: metric {metric.name} is for {metric.task_type}, "
            f"task type is {meta['type']}"
        )
    target, id_col = meta["target"], meta["id_column"]
    for field in ("target", "id_column"):
        if not isinstance(meta[field], str) or not meta[field]:
            raise TaskError(f"task {root.name}: {field} must be a column name, got {meta[field]!r}")
    train_cols = _read_header(root / "public/train.csv")
    test_cols = _read_header(root / "public/test.csv")
    label_cols = _read_header(root / "private/test_labels.csv")
    if target not in train_cols:
        raise TaskError(f"task {root.name}: target {target!r} absent from train.csv")
    if target in test_cols:
        raise TaskError(f"task {root.name}: target {target!r} leaks into test.csv")
    for name, cols in (("train.csv", train_cols), ("test.csv", test_cols)):
        if id_col not in cols:
            raise TaskError(f"task {root.name}: id column {id_col!r} absent from {name}")
    if label_cols[:2] != [id_col, target]:
        raise TaskError(
            f"task {root.name}: private/test_labels.csv must have columns "
            f"[{id_col}, {target}], has {label_cols}"
        )
    graded_ids = _first_column(root / "private/test_labels.csv")
    if (root / "private/validation_labels.csv").is_file():
        val_cols = _read_header(root / "private/validation_labels.csv")
        if val_cols[:2] != [id_col, target]:
            raise TaskError(
                f"task {root.name}: private/validation_labels.csv must have columns "
                f"[{id_col}, {target}], has {val_cols}"
            )
        graded_ids += _first_column(root / "private/validation_labels.csv")
    collision = colliding_ids(graded_ids)
    if collision is not None:
        raise TaskError(
            f"task {root.name}: id column {id_col!r} of the hidden labels: "
            f"{describe_collision(collision)}; no submission could be graded VALID"
        )
    try:
        board = json.loads((root / "leaderboard.json").read_text())
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deeply
        raise TaskError(f"task {root.name}: leaderboard.json is not valid JSON ({e})") from e
    try:
        scores = check_reference_scores(board, metric)
        task_id = check_id(meta["id"])
        time_limit_s = check_time_limit(meta["time_limit_s"])
        memory_mb = check_memory_mb(meta["memory_mb"])
        split = check_split(meta.get("split", "train"))
        provenance = check_provenance(meta.get("provenance", {}))
    except TaskError as e:
        raise TaskError(f"task {root.name}: {e}") from e
    make_private(root)
    return Task(
        root=root,
        id=task_id,
        type=meta["type"],
        metric_name=metric.name,
        target=target,
        id_column=id_col,
        time_limit_s=time_limit_s,
        memory_mb=memory_mb,
        provenance=provenance,
        split=split,
        reference_scores=scores,
    )


def load_suite(root: str | os.PathLike, split: str | None = None) -> list[Task]:
    """Load every task directory under ``root`` (optionally one split), sorted by id.
    Hidden directories are skipped: no task id starts with a dot, and ``make_task`` builds a
    task in one (``.<name>.partial-*``) before renaming it into place."""
    tasks = [
        load_task(p)
        for p in sorted(Path(root).iterdir())
        if not p.name.startswith(".") and (p / "task.json").is_file()
    ]
    if split is not None:
        tasks = [t for t in tasks if t.split == split]
    return tasks
