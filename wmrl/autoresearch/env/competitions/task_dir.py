"""An imported competition's task directory: written from a ``CompetitionSource``, loaded as a
``Task`` by ``task.load_task``.

    <task>/task.json          the task's fields (``metric`` is a competition metric's registry
                              name, ``target`` the train.csv column learnt from) and a
                              ``competition`` block: benchmark, competition_id, metric_words,
                              id_column, columns (the predictions, in the sample submission's
                              order), answers and leaderboards (file names in private/)
    <task>/public/            the competition's public files as its benchmark prepared them (a
                              hard link where the file system allows and the file is readable
                              by all, a copy otherwise) less its own description file;
                              description.md is the card, the description inside it
    <task>/private/ (0700)    answers.csv (the answers' id and prediction columns) and the
                              leaderboard(s), files 0600

There is no leaderboard.json and ``Task.reference_scores`` is empty: the leaderboards stay in
private/ (``leaderboard`` says why). Import refuses a public file that is a symbolic link or
the answers' or a leaderboard's own inode (either could put them in the sandbox's view).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from pathlib import Path

import pandas as pd

from wmrl.autoresearch.env.competitions import leaderboard
from wmrl.autoresearch.env.competitions.metrics import (
    CompetitionMetric,
    benchmark_reads,
    get_competition_metric,
)
from wmrl.autoresearch.env.competitions.source import (
    CompetitionError,
    CompetitionSource,
    inspect_files,
    protect_private_paths,
    submission_columns,
    value_kind,
)
from wmrl.autoresearch.env.task import (
    REQUIRED_FIELDS,
    Task,
    TaskError,
    check_id,
    check_memory_mb,
    check_time_limit,
    load_task,
    make_private,
)

logger = logging.getLogger(__name__)

ANSWERS = "answers.csv"
BENCHMARK_NAMES = {"mlebench": "MLE-bench", "mledojo": "MLE-Dojo"}
BLOCK_FIELDS = ("benchmark", "competition_id", "metric_words", "id_column", "columns", "answers",
                "leaderboards")  # fmt: skip
CARD_COLUMNS = 100  # the card's column table lists at most this many train.csv columns
CARD_SUBMISSION_COLUMNS = 20  # and its facts name at most this many submission columns


def write_competition_task(
    source: CompetitionSource,
    out: str | os.PathLike,
    *,
    split: str = "train",
    time_limit_s: float = 600.0,
    memory_mb: int = 4096,
    overwrite: bool = False,
    task_id: str | None = None,
) -> Path:
    """Check ``source`` (``source.inspect_files``), make the benchmark's answers unreadable to
    other users (``source.protect_private_paths``), and write its task directory at ``out``
    (built in a hidden directory next to it and renamed into place once ``load_task`` accepts
    it; on any error ``out`` is left as it was). The task's id is ``task_id``, by default the
    competition's (a suite holding the same competition from both benchmarks needs two:
    ``suite_task_id``). Raises CompetitionError / TaskError naming the problem."""
    from wmrl.autoresearch.env.make_task import staged_task_dir

    name = source.competition_id
    task_id = name if task_id is None else task_id
    try:
        check_id(name)
        check_id(task_id)
        time_limit_s, memory_mb = check_time_limit(time_limit_s), check_memory_mb(memory_mb)
    except TaskError as e:
        raise CompetitionError(f"competition {name}: {e}") from e
    if split not in ("train", "heldout"):
        raise CompetitionError(f"competition {name}: split must be train or heldout, not {split!r}")
    id_column, columns = submission_columns(source.sample_submission, name)
    layout = inspect_files(
        name, source.public_dir, source.answers, id_column, columns, source.metric,
        source.leaderboards, source.declared_higher_is_better,
    )  # fmt: skip
    _check_public_tree(source)
    protect_private_paths(source, logger.warning)
    meta = {
        "id": task_id,
        "type": source.metric.task_type,
        "metric": source.metric.name,
        "target": layout.target,
        "id_column": id_column,
        "time_limit_s": time_limit_s,
        "memory_mb": memory_mb,
        "split": split,
        "provenance": {
            "source": f"{BENCHMARK_NAMES[source.benchmark]} competition {name}",
            "licence": "the competition's rules (its Kaggle page)",
            "notes": f"imported from the benchmark's prepared data; metric {source.metric_words!r}",
        },
        "competition": {
            "benchmark": source.benchmark,
            "competition_id": name,
            "metric_words": source.metric_words,
            "id_column": id_column,
            "columns": columns,
            "answers": ANSWERS,
            "leaderboards": {board: path.name for board, path in source.leaderboards.items()},
        },
    }
    out = Path(out)
    with staged_task_dir(out, overwrite) as staging:
        _copy_public(source, staging / "public")
        private = staging / "private"
        private.mkdir(mode=0o700)
        os.chmod(private, 0o700)
        answers = pd.read_csv(source.answers, usecols=[id_column, *columns], dtype=str,
                              keep_default_na=False)[[id_column, *columns]]  # fmt: skip
        answers.to_csv(private / ANSWERS, index=False)
        for path in source.leaderboards.values():
            shutil.copyfile(path, private / path.name)
        for file in private.iterdir():
            os.chmod(file, 0o600)
        card = competition_card(source, meta, layout.test_rows, staging / "public")
        (staging / "public" / "description.md").write_text(card)
        (staging / "task.json").write_text(json.dumps(meta, indent=2))
        load_task(staging)
    return out


def _check_public_tree(source: CompetitionSource) -> None:
    """No symbolic link in the public data, and no public file that is the answers' or a
    leaderboard's own inode (a hard link): either would put them in the sandbox's view."""
    hidden = {
        (p.stat().st_dev, p.stat().st_ino) for p in [source.answers, *source.leaderboards.values()]
    }
    for path in [source.public_dir, *sorted(source.public_dir.rglob("*"))]:
        if path.is_symlink():
            raise CompetitionError(
                f"competition {source.competition_id}: public {path} is a symbolic link; "
                "refused (it could point at the answers)"
            )
        st = path.stat()
        if (st.st_dev, st.st_ino) in hidden:
            raise CompetitionError(
                f"competition {source.competition_id}: public {path} is the answers or a "
                "leaderboard (the same file)"
            )


def _link_or_copy(src: str, dst: str) -> str:
    """A hard link when the file is readable by every user (the sandbox's uid must read it)
    and the file system allows; otherwise a copy readable by all."""
    if stat.S_IMODE(os.stat(src).st_mode) & 0o004:
        try:
            os.link(src, dst)
            return dst
        except OSError:
            pass
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o644)
    return dst


def _copy_public(source: CompetitionSource, dest: Path) -> None:
    dest.mkdir()
    os.chmod(dest, 0o755)
    skip = {*source.skip_public, "description.md"}
    for entry in sorted(source.public_dir.iterdir()):
        if entry.name in skip:
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(entry), str(dest / entry.name))


def _prediction_text(metric: CompetitionMetric, columns: list[str], reads: str) -> str:
    """What one submission row holds, in words, by how the benchmark reads the metric's
    predictions (``reads``: ``metrics.benchmark_reads``)."""
    if metric.columns == "rows":
        return "the probability of each class (one column per class), each row summing to 1"
    k = metric.name.split("@")[1] if "@" in metric.name else ""
    per = {
        "labels": "the predicted label",
        "label_lists": f"up to {k} predicted labels separated by spaces, best first",
        "integers": "the predicted grade, a whole number",
        "probabilities": "the probability of 1",
        "numbers": (
            "a score, higher for a row more likely to be 1"
            if metric.task_type == "classification"
            else "the predicted value"
        ),
    }[reads]
    return per + (" in each prediction column" if len(columns) > 1 else "")


def competition_card(source: CompetitionSource, meta: dict, test_rows: int, public: Path) -> str:
    """The card: the task's facts (the ``- `` lines the policy's prompt is made of), train.csv's
    columns, the submission format, then the competition's own description."""
    metric, block = source.metric, meta["competition"]
    columns, id_column = block["columns"], block["id_column"]
    direction = "higher is better" if metric.higher_is_better else "lower is better"
    train = pd.read_csv(public / "train.csv")
    features = [c for c in train.columns if c not in (meta["target"], id_column, *columns)]
    shown = ", ".join(f"`{c}`" for c in [id_column, *columns][: CARD_SUBMISSION_COLUMNS + 1])
    more = len(columns) + 1 - (CARD_SUBMISSION_COLUMNS + 1)
    shown += f" and {more} more" if more > 0 else ""
    lines = [
        f"# Competition {source.competition_id} ({BENCHMARK_NAMES[source.benchmark]})",
        "",
        f"- Type: {meta['type']}",
        f"- Metric: {metric.name} ({direction})",
        f"- Target column: `{meta['target']}`; id column: `{id_column}`",
        f"- Submission columns: {shown}",
        f"- Rows: {len(train)} train, {test_rows} test; feature columns: {len(features)}",
        f"- Limits: {meta['time_limit_s']:g} s wall-clock, {meta['memory_mb']} MB memory, "
        "one CPU core, no network",
        "",
        "## Columns",
        "",
        "| column | kind | missing |",
        "|---|---|---|",
    ]
    lines += [
        f"| {c} | {value_kind(train[c])} | {int(train[c].isna().sum())} |"
        for c in features[:CARD_COLUMNS]
    ]
    if len(features) > CARD_COLUMNS:
        lines += ["", f"... and {len(features) - CARD_COLUMNS:,} more columns (not listed)"]
    lines += [
        "",
        "## Submission",
        "",
        "Read `train.csv`, `test.csv` and the competition's other files from",
        '`os.environ["DATA_DIR"]`; write a CSV to `os.environ["SUBMISSION_PATH"]` with exactly',
        "the columns above (any order): one row per test row,",
        f"{_prediction_text(metric, columns, benchmark_reads(metric, source.benchmark))}. "
        "numpy, pandas and scikit-learn",
        "are installed.",
        "",
        f"## The competition's description ({BENCHMARK_NAMES[source.benchmark]})",
        "",
        source.description.strip(),
        "",
    ]
    return "\n".join(lines)


def is_competition_task(root: Path) -> bool:
    """Whether ``root``'s task.json holds a ``competition`` block (an unreadable task.json is
    left to ``load_task``'s own refusal)."""
    try:
        meta = json.loads((root / "task.json").read_text())
    except (OSError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    return isinstance(meta, dict) and "competition" in meta


def _block(meta: dict, name: str) -> dict:
    """task.json's competition block, checked field by field."""
    block = meta["competition"]
    if not isinstance(block, dict):
        raise CompetitionError(f"task {name}: task.json's competition block is not an object")
    missing = [f for f in BLOCK_FIELDS if f not in block]
    if missing:
        raise CompetitionError(f"task {name}: task.json's competition block lacks {missing}")
    if block["benchmark"] not in leaderboard.BENCHMARKS:
        raise CompetitionError(
            f"task {name}: competition.benchmark {block['benchmark']!r} is not one of "
            f"{leaderboard.BENCHMARKS}"
        )
    cols = block["columns"]
    if not isinstance(cols, list) or not cols or not all(isinstance(c, str) for c in cols):
        raise CompetitionError(f"task {name}: competition.columns must be a list of column names")
    boards = block["leaderboards"]
    allowed = leaderboard.BOARD_NAMES[block["benchmark"]]
    if not isinstance(boards, dict) or not boards or not set(boards) <= set(allowed):
        raise CompetitionError(
            f"task {name}: competition.leaderboards must map some of {allowed} to file names"
        )
    for file in [block["answers"], *boards.values()]:
        if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
            raise CompetitionError(
                f"task {name}: {file!r} must be a file name in private/ (no directories)"
            )
    return block


def load_competition_task(root: Path) -> Task:
    """Load and check an imported competition's task directory (module docstring); a
    TaskError naming the problem otherwise. ``private/`` is made unreadable to other users as
    ``task.make_private`` does for every task."""
    name = root.name
    try:
        meta = json.loads((root / "task.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CompetitionError(f"task {name}: task.json is not valid JSON ({e})") from e
    missing = [k for k in REQUIRED_FIELDS if k not in meta]
    if missing:
        raise CompetitionError(f"task {name}: task.json lacks fields {missing}")
    block = _block(meta, name)
    try:
        metric = get_competition_metric(meta["metric"])
    except ValueError as e:
        raise CompetitionError(f"task {name}: {e}") from e
    if meta["type"] != metric.task_type or meta["id_column"] != block["id_column"]:
        raise CompetitionError(
            f"task {name}: type {meta['type']!r} / id_column {meta['id_column']!r} do not match "
            f"the metric's type {metric.task_type!r} / the competition's id column"
        )
    for rel in ("public/description.md",):
        if not (root / rel).is_file():
            raise CompetitionError(f"task {name}: missing file {rel}")
    private = root / "private"
    boards = {board: private / file for board, file in block["leaderboards"].items()}
    layout = inspect_files(
        name, root / "public", private / block["answers"], block["id_column"], block["columns"],
        metric, boards,
    )  # fmt: skip
    if layout.target != meta["target"]:
        raise CompetitionError(
            f"task {name}: target {meta['target']!r} is not the column the files say "
            f"({layout.target!r})"
        )
    try:
        task_id = check_id(meta["id"])
        time_limit_s = check_time_limit(meta["time_limit_s"])
        memory_mb = check_memory_mb(meta["memory_mb"])
    except TaskError as e:
        raise CompetitionError(f"task {name}: {e}") from e
    make_private(root)
    return Task(
        root=root,
        id=task_id,
        type=metric.task_type,
        metric_name=metric.name,
        target=layout.target,
        id_column=block["id_column"],
        time_limit_s=time_limit_s,
        memory_mb=memory_mb,
        provenance=dict(meta.get("provenance", {})),
        split=str(meta.get("split", "train")),
        reference_scores=(),
        competition=block,
    )
