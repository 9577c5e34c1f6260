"""Episode tasks for multi-turn Mini AutoResearch: one execution gives feedback and reward.

For K > 1 turns an episode runs on a task directory built from the task's public files, so
that the agent's feedback (a validation score) and the reward (the hidden test labels) come
from the same execution of the same script, and no test label ever reaches the agent:

    <root>/<task id>/task.json          the task's, plus an "episode" block (format, rows,
                                        seed, fingerprint of the source task's files)
    <root>/<task id>/leaderboard.json   the task's (the reward is graded as single-turn)
    <root>/<task id>/public/train.csv   train.csv less the validation rows
    <root>/<task id>/public/test.csv    the test rows and the validation rows (features
                                        only), shuffled, under fresh opaque ids
    <root>/<task id>/public/description.md  the card, its row and class counts updated
    <root>/<task id>/private/           0700, never visible to the agent:
        test_labels.csv                 id + target of the test rows (opaque ids)
        validation_labels.csv           id + target of the validation rows (opaque ids)
        episode_rows.csv                opaque id, part (test | validation), source id: the
                                        audit trail back to the task's own rows

The validation split is fixed per task: seeded by the task id alone (``split_seed``), it
takes ``VALIDATION_FRACTION`` of train.csv's rows, at most ``VALIDATION_CAP`` rows, drawn per
class for classification (stratified, so both classes of a roc_auc task are in it), at
random for regression. A task needs ``MIN_TRAIN_ROWS`` training rows and a split of at least
``MIN_VALIDATION_ROWS`` rows, else ``TaskError`` naming the task.

The id column's values are replaced for every row of test.csv (test and validation rows
alike) by distinct random 6-digit integers in a shuffled order, so a script cannot tell the
validation rows from the test rows by id, position or format (rows are copied as the text of
the task's own CSVs). The script's contract is unchanged: it reads train.csv and test.csv and
writes one row per test.csv row. ``grader.grade_submission`` grades the test rows for the
reward exactly as a single-turn submission and scores the validation rows for the
observation.

Built once per task under ``root`` (a directory the data stage owns) and reused while the
source task's files are unchanged; a build is written to a temporary directory and renamed
into place, so an interrupted or concurrent build never leaves a half-written task.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from wmrl.autoresearch.env.grader import canonical_id
from wmrl.autoresearch.env.task import Task, TaskError, load_task

EPISODE_FORMAT = 1  # bump when the layout or the split rule changes: cached builds are rebuilt
VALIDATION_FRACTION = 0.2
VALIDATION_CAP = 1000
MIN_TRAIN_ROWS = 50
MIN_VALIDATION_ROWS = 10
_SOURCE_FILES = (
    "task.json",
    "leaderboard.json",
    "public/train.csv",
    "public/test.csv",
    "public/description.md",
    "private/test_labels.csv",
)


def split_seed(task_id: str) -> int:
    """The validation split's seed: the task id alone, so every run splits a task the same."""
    return zlib.crc32(f"wmrl-validation-split:{task_id}".encode())


def source_fingerprint(task: Task) -> str:
    """SHA-256 over the episode format and the task files an episode is built from."""
    h = hashlib.sha256(f"episode-format-{EPISODE_FORMAT}\0".encode())
    for rel in _SOURCE_FILES:
        h.update(rel.encode() + b"\0")
        h.update((task.root / rel).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _read_text_csv(path: Path) -> pd.DataFrame:
    """Every cell as its text in the file, so copied rows keep their exact spelling."""
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def validation_rows(task: Task, train: pd.DataFrame | None = None) -> np.ndarray:
    """Positions (sorted) in ``task``'s train.csv of its validation rows; TaskError naming the
    task when it has too few rows for a split."""
    if train is None:
        train = _read_text_csv(task.public_dir / "train.csv")
    n = len(train)
    if n < MIN_TRAIN_ROWS:
        raise TaskError(
            f"task {task.id}: train.csv has {n} rows; a validation split for multi-turn "
            f"episodes needs at least {MIN_TRAIN_ROWS}"
        )
    fraction = min(VALIDATION_FRACTION, VALIDATION_CAP / n)
    rng = np.random.default_rng(split_seed(task.id))
    if task.type == "classification":
        labels = train[task.target].str.strip()
        groups = [np.flatnonzero(labels.to_numpy() == c) for c in sorted(labels.unique())]
    else:
        groups = [np.arange(n)]
    picked = [rng.permutation(g)[: round(fraction * len(g))] for g in groups]
    rows = np.sort(np.concatenate(picked)).astype(np.int64)
    if len(rows) < MIN_VALIDATION_ROWS:
        raise TaskError(
            f"task {task.id}: its validation split would hold {len(rows)} rows (< "
            f"{MIN_VALIDATION_ROWS}); train.csv has {n}"
        )
    return rows


def _update_card(card: str, train: pd.DataFrame, n_test: int, target: str) -> str:
    """The card with the episode's counts: its "- Rows: N train, M test" line and, where it
    has one, its "## Class balance (train)" list (left stale, the difference from the task's
    own card would give away the validation split's class counts)."""
    card = re.sub(
        r"^- Rows: \d+ train, \d+ test",
        f"- Rows: {len(train)} train, {n_test} test",
        card,
        count=1,
        flags=re.MULTILINE,
    )
    head, sep, rest = card.partition("## Class balance (train)\n\n")
    if not sep:
        return card
    old = rest.split("\n\n", 1)
    counts = train[target].value_counts()
    total = int(counts.sum())
    lines = [f"- {k}: {int(v)} ({int(v) / total:.1%})" for k, v in counts.items()]
    return head + sep + "\n".join(lines) + ("\n\n" + old[1] if len(old) > 1 else "\n")


def _write(task: Task, out: Path, fingerprint: str) -> None:
    """Write the episode task's files into the empty directory ``out``."""
    train = _read_text_csv(task.public_dir / "train.csv")
    test = _read_text_csv(task.public_dir / "test.csv")
    labels = _read_text_csv(task.labels_path)
    id_col, target = task.id_column, task.target
    missing = [c for c in test.columns if c not in train.columns]
    if missing:
        raise TaskError(f"task {task.id}: test.csv columns {missing} are absent from train.csv")
    label_ids = labels[id_col].map(canonical_id)
    test_ids = test[id_col].map(canonical_id)
    if len(labels) != len(test) or label_ids.duplicated().any() or set(label_ids) != set(test_ids):
        raise TaskError(f"task {task.id}: private/test_labels.csv ids do not match test.csv")
    rows = validation_rows(task, train)
    is_val = np.zeros(len(train), bool)
    is_val[rows] = True
    val = train[is_val]
    # Features of test rows and validation rows, in test.csv's column order, then shuffled.
    test_target = labels.set_index(label_ids)[target].reindex(test_ids).to_numpy()
    mixed = pd.concat([test, val[test.columns]], ignore_index=True)
    mixed_target = np.concatenate([test_target, val[target].to_numpy()])
    part = np.array(["test"] * len(test) + ["validation"] * len(val))
    source_id = mixed[id_col].to_numpy().copy()
    rng = np.random.default_rng(split_seed(task.id) + 1)
    order = rng.permutation(len(mixed))
    opaque = (rng.choice(900_000, size=len(mixed), replace=False) + 100_000).astype(str)
    mixed, mixed_target = mixed.iloc[order].reset_index(drop=True), mixed_target[order]
    part, source_id = part[order], source_id[order]
    mixed[id_col] = opaque
    (out / "public").mkdir()
    (out / "private").mkdir()
    os.chmod(out / "private", 0o700)  # unreadable to the sandbox's unprivileged uid
    train[~is_val].to_csv(out / "public/train.csv", index=False)
    mixed.to_csv(out / "public/test.csv", index=False)
    card = _update_card(task.card, train[~is_val], len(mixed), target)
    (out / "public/description.md").write_text(card)
    keyed = pd.DataFrame({id_col: opaque, target: mixed_target, "_part": part})
    keyed = keyed.sort_values(id_col, kind="stable")
    for name, which in (("test_labels.csv", "test"), ("validation_labels.csv", "validation")):
        keyed[keyed["_part"] == which][[id_col, target]].to_csv(out / "private" / name, index=False)
    audit = pd.DataFrame({"opaque_id": opaque, "part": part, "source_id": source_id})
    audit.sort_values("opaque_id").to_csv(out / "private/episode_rows.csv", index=False)
    for path in (out / "private").iterdir():
        os.chmod(path, 0o600)  # as `load_task` requires of private files
    shutil.copyfile(task.root / "leaderboard.json", out / "leaderboard.json")
    meta = json.loads((task.root / "task.json").read_text())
    meta["rows"] = {"train": int((~is_val).sum()), "test": len(test), "validation": len(val)}
    meta["episode"] = {
        "format": EPISODE_FORMAT,
        "validation_fraction": VALIDATION_FRACTION,
        "validation_cap": VALIDATION_CAP,
        "seed": split_seed(task.id),
        "fingerprint": fingerprint,
    }
    (out / "task.json").write_text(json.dumps(meta, indent=2))


def _cached_fingerprint(path: Path) -> str | None:
    try:
        return json.loads((path / "task.json").read_text())["episode"]["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def make_episode_task(task: Task, root: str | os.PathLike) -> Task:
    """The episode task of ``task`` under ``root/<task id>``: built once (atomically) and
    reused while the source task's files and ``EPISODE_FORMAT`` are unchanged. The returned
    Task has ``task``'s id, metric and limits; TaskError naming the task when it has too few
    training rows for a validation split."""
    if task.has_validation_split:
        raise TaskError(f"task {task.id} is already an episode task ({task.root})")
    if task.competition is not None:
        raise TaskError(
            f"task {task.id} is an imported {task.competition['benchmark']} competition: "
            "multi-turn episodes (env.turns > 1) are built on the built-in task format only "
            "(docs/competitions.md)"
        )
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / task.id
    fingerprint = source_fingerprint(task)
    if _cached_fingerprint(final) == fingerprint:
        return load_task(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{task.id}.build-", dir=root))
    try:
        _write(task, tmp, fingerprint)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, final)
        except OSError:  # a build is there: a concurrent one (reuse it) or a stale one
            if _cached_fingerprint(final) != fingerprint:
                old = Path(tempfile.mkdtemp(prefix=f".{task.id}.old-", dir=root))
                os.rename(final, old / "task")
                os.rename(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return load_task(final)


def episode_rows(task: Task) -> pd.DataFrame:
    """An episode task's private audit table: opaque_id, part (test | validation), source_id
    (all text). For tests and audits; never passed to anything the agent sees."""
    with contextlib.suppress(FileNotFoundError):
        return _read_text_csv(task.root / "private" / "episode_rows.csv")
    raise TaskError(f"task {task.id} is not an episode task (no private/episode_rows.csv)")
