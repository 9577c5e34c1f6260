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
    scripts as one): repaired to 0700 / 0600, with a warning, when they are ours; a
    TaskError naming the path and its mode when they are not. Modes are read through
    symlinks: what counts is whether the sandbox uid could open the labels."""
    private = root / "private"
    for path in [private, *sorted(p for p in private.iterdir() if p.is_file())]:
        st = path.stat()
        mode = stat.S_IMODE(st.st_mode)
        if not mode & 0o077:  # nothing for group or others
            continue
        new = 0o700 if path.is_dir() else 0o600
        if st.st_uid != os.geteuid():
            raise TaskError(
                f"task {root.name}: {path} has mode {mode:04o}, so a sandboxed script could read "
                f"the hidden labels, and it belongs to uid {st.st_uid}, not us: make it "
                f"{new:04o} (chmod go-rwx)"
            )
        try:
            os.chmod(path, new)
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
    except json.JSONDecodeError as e:
        raise TaskError(f"task {root.name}: task.json is not valid JSON ({e})") from e
    missing = [k for k in REQUIRED_FIELDS if k not in meta]
    if missing:
        raise TaskError(f"task {root.name}: task.json lacks fields {missing}")
    if meta["type"] not in TASK_TYPES:
        raise TaskError(f"task {root.name}: type {meta['type']!r} not in {TASK_TYPES}")
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
        scores = tuple(float(s) for s in board["scores"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise TaskError(f"task {root.name}: leaderboard.json needs a 'scores' list ({e})") from e
    try:
        task_id = check_id(meta["id"])
        time_limit_s = check_time_limit(meta["time_limit_s"])
        memory_mb = check_memory_mb(meta["memory_mb"])
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
        provenance=dict(meta.get("provenance", {})),
        split=str(meta.get("split", "train")),
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
