"""Reading an MLE-bench competition as its own tools prepared it.

MLE-bench keeps two trees (prepared with ``mlebench prepare -c ID --data-dir=DATA``, or
``--lite`` for MLE-bench-Lite):

    <competitions_dir>/<id>/config.yaml         (the mle-bench checkout's
                                                 mlebench/competitions): dataset.answers and
                                                 dataset.sample_submission, paths relative to
                                                 DATA; grader.name, the metric in words;
                                                 grader.grade_fn, never imported here
    <competitions_dir>/<id>/leaderboard.csv     Kaggle's final leaderboard, best first, with
                                                 a ``score`` column (stored with Git LFS: a
                                                 clone without ``git lfs pull`` has pointers)
    <competitions_dir>/<id>/description.md
    <DATA>/<id>/prepared/public/                train.csv, test.csv, sample submission,
                                                 description.md, other files
    <DATA>/<id>/prepared/private/               the answers (and a gold submission)

The metric is ``grader.name`` through ``metrics.metric_for_name``, unless the caller names
one (``metric``): MLE-bench's grade functions are code, and none is run here.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from wmrl.autoresearch.env.competitions.metrics import metric_for_name
from wmrl.autoresearch.env.competitions.source import (
    CompetitionError,
    CompetitionSource,
    download_paths,
)

LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


def _config(comp_dir: Path, name: str) -> dict:
    path = comp_dir / "config.yaml"
    if not path.is_file():
        raise CompetitionError(f"competition {name}: no MLE-bench config {path}")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise CompetitionError(f"competition {name}: {path} is not valid YAML ({e})") from e
    for keys in (("dataset", "answers"), ("dataset", "sample_submission"), ("grader", "name")):
        node = config
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, str) or not node:
            raise CompetitionError(f"competition {name}: {path} lacks {'.'.join(keys)}")
    return config


def _data_path(data_dir: Path, rel: str, name: str, what: str) -> Path:
    """A config path (relative to the data dir) that stays inside the competition's own
    prepared directory."""
    root = (data_dir / name / "prepared").resolve()
    path = (data_dir / rel).resolve()
    if Path(rel).is_absolute() or root not in path.parents:
        raise CompetitionError(f"competition {name}: config {what} {rel!r} is not inside {root}")
    if not path.is_file():
        raise CompetitionError(
            f"competition {name}: {what} {path} does not exist: prepare the competition with "
            f"`mlebench prepare -c {name} --data-dir={data_dir}`"
        )
    return path


def _leaderboard(comp_dir: Path, name: str) -> Path:
    path = comp_dir / "leaderboard.csv"
    if not path.is_file():
        raise CompetitionError(f"competition {name}: no leaderboard {path}")
    with open(path, "rb") as f:
        if f.read(len(LFS_POINTER)) == LFS_POINTER:
            raise CompetitionError(
                f"competition {name}: {path} is a Git LFS pointer, not the leaderboard: run "
                "`git lfs fetch --all && git lfs pull` in the mle-bench checkout"
            )
    return path


def read_mlebench(
    competitions_dir: str | Path, data_dir: str | Path, competition_id: str,
    metric: str | None = None,
) -> CompetitionSource:  # fmt: skip
    """The prepared MLE-bench competition ``competition_id`` (module docstring); ``metric``
    names its metric instead of config.yaml's ``grader.name``. CompetitionError naming what
    is missing or malformed."""
    name = competition_id
    comp_dir = Path(competitions_dir) / name
    data_dir = Path(data_dir)
    config = _config(comp_dir, name)
    prepared = data_dir / name / "prepared"
    public, private = prepared / "public", prepared / "private"
    for directory in (public, private):
        if not directory.is_dir():
            raise CompetitionError(
                f"competition {name}: {directory} does not exist: prepare the competition with "
                f"`mlebench prepare -c {name} --data-dir={data_dir}`"
            )
    answers = _data_path(data_dir, config["dataset"]["answers"], name, "dataset.answers")
    sample = _data_path(
        data_dir, config["dataset"]["sample_submission"], name, "dataset.sample_submission"
    )
    words = metric or config["grader"]["name"]
    try:
        resolved = metric_for_name(words)
    except ValueError as e:
        raise CompetitionError(f"competition {name}: {e}") from e
    description = public / "description.md"
    if not description.is_file():
        description = comp_dir / "description.md"
    if not description.is_file():
        raise CompetitionError(f"competition {name}: no description.md in {public} or {comp_dir}")
    return CompetitionSource(
        benchmark="mlebench",
        competition_id=name,
        public_dir=public,
        answers=answers,
        sample_submission=sample,
        description=description.read_text(),
        leaderboards={"leaderboard": _leaderboard(comp_dir, name)},
        metric=resolved,
        metric_words=words,
        private_paths=download_paths(data_dir / name, public),
        skip_public=("description.md",),
    )


def prepared_ids(data_dir: str | Path) -> list[str]:
    """The competitions prepared under an MLE-bench data dir (those with prepared/public)."""
    return sorted(p.name for p in Path(data_dir).iterdir() if (p / "prepared" / "public").is_dir())
