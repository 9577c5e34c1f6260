"""Reading an MLE-Dojo competition as its own tools prepared it.

MLE-Dojo's ``prepare/mle.py --competitions ID --data-dir DATA`` writes

    <DATA>/<id>/data/public/     description.txt (copied from the competition's info/),
                                 sample_submission.csv, the competition's data files
    <DATA>/<id>/data/private/    test_answer.csv (the sample submission's columns, with the
                                 answers), private_leaderboard.csv and/or
                                 public_leaderboard.csv (columns rank, score; best first)

and scores with ``mledojo/competitions/<id>/utils/metric.py``: a ``CompetitionMetrics``
subclass whose ``__init__`` declares ``higher_is_better`` and whose ``evaluate`` computes
the score. That is code, so it is never run here, and MLE-Dojo names the metric nowhere
else: the caller names it (``metric``, words ``metrics.metric_for_name`` knows). Given the
MLE-Dojo checkout's ``mledojo/competitions`` (``competitions_dir``), the file is read as text
(``ast``) for the direction its ``__init__`` declares, which must agree with the named
metric, and its class docstring, quoted when the metric is not named.
"""

from __future__ import annotations

import ast
from pathlib import Path

from wmrl.autoresearch.env.competitions.metrics import metric_for_name
from wmrl.autoresearch.env.competitions.source import (
    CompetitionError,
    CompetitionSource,
    download_paths,
)

BOARD_FILES = {"private": "private_leaderboard.csv", "public": "public_leaderboard.csv"}


def read_metric_declaration(path: str | Path) -> tuple[bool | None, str]:
    """From an MLE-Dojo metric.py, without running it: the default of ``higher_is_better`` in
    the ``__init__`` of its ``CompetitionMetrics`` subclass (None when it has no literal
    default) and the first line of that class's docstring ("" when none)."""
    tree = ast.parse(Path(path).read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
        if "CompetitionMetrics" not in bases:
            continue
        doc = (ast.get_docstring(node) or "").strip().splitlines()
        return _declared_direction(node), doc[0] if doc else ""
    return None, ""


def _declared_direction(cls: ast.ClassDef) -> bool | None:
    for item in cls.body:
        if not isinstance(item, ast.FunctionDef) or item.name != "__init__":
            continue
        args = item.args
        positional = args.posonlyargs + args.args
        defaults = dict(zip([a.arg for a in positional[-len(args.defaults):]], args.defaults,
                            strict=True)) if args.defaults else {}  # fmt: skip
        defaults |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d}
        node = defaults.get("higher_is_better")
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
    return None


def read_mledojo(
    data_dir: str | Path, competition_id: str, metric: str | None,
    competitions_dir: str | Path | None = None,
) -> CompetitionSource:  # fmt: skip
    """The prepared MLE-Dojo competition ``competition_id`` (module docstring), graded by the
    metric named ``metric``. CompetitionError naming what is missing or malformed."""
    name = competition_id
    data_dir = Path(data_dir)
    public, private = data_dir / name / "data" / "public", data_dir / name / "data" / "private"
    for directory in (public, private):
        if not directory.is_dir():
            raise CompetitionError(
                f"competition {name}: {directory} does not exist: prepare the competition with "
                f"MLE-Dojo's `python prepare/mle.py --competitions {name} --data-dir {data_dir}`"
            )
    for path in (public / "sample_submission.csv", public / "description.txt",
                 private / "test_answer.csv"):  # fmt: skip
        if not path.is_file():
            raise CompetitionError(f"competition {name}: {path} does not exist")
    boards = {b: private / f for b, f in BOARD_FILES.items() if (private / f).is_file()}
    if not boards:
        raise CompetitionError(
            f"competition {name}: no leaderboard in {private} ({' or '.join(BOARD_FILES.values())})"
        )
    declared, summary = None, ""
    metric_py = Path(competitions_dir) / name / "utils" / "metric.py" if competitions_dir else None
    if metric_py is not None:
        if not metric_py.is_file():
            raise CompetitionError(f"competition {name}: no metric code {metric_py}")
        try:
            declared, summary = read_metric_declaration(metric_py)
        except (SyntaxError, ValueError, UnicodeDecodeError) as e:
            raise CompetitionError(f"competition {name}: {metric_py} does not parse ({e})") from e
    if not metric:
        says = f"; its metric.py says {summary!r}" if summary else ""
        says += f" (higher_is_better={declared})" if declared is not None else ""
        raise CompetitionError(
            f"competition {name}: MLE-Dojo names its metric only in code, which is never run "
            f"here: name it (--metric, or --metrics=FILE mapping ids to metrics){says}"
        )
    try:
        resolved = metric_for_name(metric)
    except ValueError as e:
        raise CompetitionError(f"competition {name}: {e}") from e
    return CompetitionSource(
        benchmark="mledojo",
        competition_id=name,
        public_dir=public,
        answers=private / "test_answer.csv",
        sample_submission=public / "sample_submission.csv",
        description=(public / "description.txt").read_text(),
        leaderboards=boards,
        metric=resolved,
        metric_words=metric,
        private_paths=download_paths(data_dir / name, public),
        skip_public=("description.txt",),
        declared_higher_is_better=declared,
    )


def prepared_ids(data_dir: str | Path) -> list[str]:
    """The competitions prepared under an MLE-Dojo data dir (those with data/public)."""
    return sorted(p.name for p in Path(data_dir).iterdir() if (p / "data" / "public").is_dir())
