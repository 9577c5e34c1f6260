"""Import prepared benchmark competitions as task directories (a suite the trainer can use).

    python -m wmrl.autoresearch.env.competitions --benchmark=mlebench \\
        --competitions_dir=mle-bench/mlebench/competitions --data_dir=DATA \\
        [--ids=a,b | --ids_file=mle-bench/experiments/splits/low.txt] --out=SUITE \\
        [--split=heldout] [--time_limit=600] [--memory_mb=4096] [--metric=NAME] \\
        [--metrics=FILE.json] [--keep_going] [--overwrite]
    python -m wmrl.autoresearch.env.competitions --benchmark=mledojo --data_dir=DATA \\
        [--competitions_dir=MLE-Dojo/mledojo/competitions] --metrics=FILE.json --out=SUITE ...

Each competition becomes ``SUITE/<id>`` (``task_dir.write_competition_task``) and an entry of
``SUITE/suite.json`` (the index a trainer's ``suite.dir`` needs); where the suite already
holds the same competition imported from the other benchmark, it becomes
``SUITE/<id>-<benchmark>`` instead (``suite_task_id``), so both stay. Nothing is
downloaded: the data are what the benchmark's own tools prepared. ``--metrics`` is a JSON
object mapping competition ids to metric names (needed for MLE-Dojo; for MLE-bench it
overrides config.yaml). Without ``--keep_going`` the first competition that cannot be a task
stops the import with one line naming it and the problem; with it, every one is tried and
the refused are listed. Prints one JSON object: ``imported`` (competition id -> the task
directory written) and ``refused`` (competition id -> why).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program, so modules import side-effect free."""
    flags.DEFINE_enum("benchmark", None, ["mlebench", "mledojo"], "the competitions' format")
    flags.DEFINE_string("data_dir", None, "where the benchmark's tools prepared the data")
    flags.DEFINE_string(
        "competitions_dir", None,
        "the benchmark checkout's competitions directory (mlebench/competitions: required; "
        "mledojo/competitions: optional, its metric.py is read for the metric's direction)",
    )  # fmt: skip
    flags.DEFINE_list("ids", None, "competition ids (default: every prepared one)")
    flags.DEFINE_string("ids_file", None, "a file of competition ids, one per line")
    flags.DEFINE_string("out", None, "the suite directory to write the tasks in")
    flags.DEFINE_enum("split", "train", ["train", "heldout"], "the tasks' split")
    flags.DEFINE_float("time_limit", 600.0, "wall-clock seconds per execution")
    flags.DEFINE_integer("memory_mb", 4096, "memory budget per execution")
    flags.DEFINE_string("metric", None, "the metric of the (one) competition imported")
    flags.DEFINE_string("metrics", None, "JSON file: competition id -> metric name")
    flags.DEFINE_bool("keep_going", False, "list the competitions refused instead of stopping")
    flags.DEFINE_bool("overwrite", False, "replace what is at SUITE/<id> even if not a task")


def competition_ids(data_dir: Path, ids, ids_file: str | None, benchmark: str) -> list[str]:
    from wmrl.autoresearch.env.competitions import mlebench, mledojo

    if ids_file:
        return [line.strip() for line in Path(ids_file).read_text().splitlines() if line.strip()]
    if ids:
        return list(ids)
    return (mlebench if benchmark == "mlebench" else mledojo).prepared_ids(data_dir)


def read_source(benchmark: str, name: str, metric: str | None):
    from wmrl.autoresearch.env.competitions import mlebench, mledojo

    if benchmark == "mlebench":
        return mlebench.read_mlebench(FLAGS.competitions_dir, FLAGS.data_dir, name, metric)
    return mledojo.read_mledojo(FLAGS.data_dir, name, metric, FLAGS.competitions_dir)


def metric_names() -> dict[str, str]:
    if not FLAGS.metrics:
        return {}
    try:
        names = json.loads(Path(FLAGS.metrics).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise app.UsageError(f"--metrics {FLAGS.metrics}: {e}") from e
    if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
        raise app.UsageError(f"--metrics {FLAGS.metrics}: must map competition ids to names")
    return names


def main(argv) -> None:
    del argv
    from wmrl.autoresearch.env.competitions.task_dir import write_competition_task
    from wmrl.autoresearch.env.task import TaskError

    for name in ("benchmark", "data_dir", "out"):
        if not getattr(FLAGS, name):
            raise app.UsageError(f"--{name} is required")
    if FLAGS.benchmark == "mlebench" and not FLAGS.competitions_dir:
        raise app.UsageError("--competitions_dir (the mle-bench checkout's "
                             "mlebench/competitions) is required for mlebench")  # fmt: skip
    if not Path(FLAGS.data_dir).is_dir():
        sys.exit(f"competitions: --data_dir {FLAGS.data_dir} is not a directory")
    ids = competition_ids(Path(FLAGS.data_dir), FLAGS.ids, FLAGS.ids_file, FLAGS.benchmark)
    if not ids:
        layout = "<id>/prepared/public" if FLAGS.benchmark == "mlebench" else "<id>/data/public"
        sys.exit(
            f"competitions: no {FLAGS.benchmark} competition is prepared under "
            f"{FLAGS.data_dir} (no {layout}): prepare them with the benchmark's own tools "
            "(docs/competitions.md)"
        )
    if FLAGS.metric and len(ids) != 1:
        raise app.UsageError(f"--metric names one competition's metric, {len(ids)} were given")
    names = metric_names()
    imported, refused = {}, {}
    for name in ids:
        metric = FLAGS.metric or names.get(name)
        try:
            source = read_source(FLAGS.benchmark, name, metric)
            task_id = suite_task_id(Path(FLAGS.out), FLAGS.benchmark, name)
            out = write_competition_task(
                source, Path(FLAGS.out) / task_id, split=FLAGS.split, overwrite=FLAGS.overwrite,
                time_limit_s=FLAGS.time_limit, memory_mb=FLAGS.memory_mb, task_id=task_id,
            )  # fmt: skip
        except (TaskError, OSError) as e:
            if not FLAGS.keep_going:
                sys.exit(f"competitions: {e}")
            refused[name] = str(e)
            continue
        imported[name] = str(out)
    if imported:
        update_suite_index(Path(FLAGS.out), [Path(p).name for p in imported.values()])
    print(json.dumps({"imported": imported, "refused": refused}, indent=2))


def _imported_as(task_dir: Path) -> tuple[str, str] | None:
    """(benchmark, competition id) of an imported competition's task directory, read from its
    task.json; None when it is not one (or is unreadable: the import's own checks say why)."""
    try:
        block = json.loads((task_dir / "task.json").read_text())["competition"]
        return str(block["benchmark"]), str(block["competition_id"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def suite_task_id(suite: Path, benchmark: str, competition_id: str) -> str:
    """The task id (and directory name) a competition gets in ``suite``: its own id, unless
    the suite holds that id as the same competition imported from another benchmark; then
    ``<id>-<benchmark>``. Importing a competition again finds the task it wrote before.
    Both benchmarks hold many of the same competitions (nomad2018, spaceship-titanic, ...):
    without this the second import would replace the first's task."""
    from wmrl.autoresearch.env.task import TaskError, check_id

    plain, qualified = competition_id, f"{competition_id}-{benchmark}"
    if _imported_as(suite / qualified) == (benchmark, competition_id):
        return qualified
    held = _imported_as(suite / plain)
    if held is None or held == (benchmark, competition_id):
        return plain
    try:
        return check_id(qualified)
    except TaskError as e:
        raise TaskError(
            f"competition {competition_id}: {suite / plain} holds {held[1]} from {held[0]}, "
            f"and the {benchmark} one cannot be named {qualified!r} beside it ({e})"
        ) from e


def update_suite_index(suite: Path, ids: list[str]) -> None:
    """Add the imported tasks to ``SUITE/suite.json``, the index a trainer's ``suite.dir``
    must have (``wmrl.autoresearch.config``): one entry per task (id, split, metric,
    benchmark, competition id), earlier entries of other ids kept, so several imports build
    one suite; an entry whose task directory is gone is dropped."""
    from wmrl.autoresearch.env.task import load_task

    path = suite / "suite.json"
    index = json.loads(path.read_text()) if path.is_file() else []
    entries = {e["id"]: e for e in index if (suite / e["id"] / "task.json").is_file()}
    for name in ids:
        task = load_task(suite / name)
        entries[name] = {"id": task.id, "split": task.split, "metric": task.metric_name,
                         "benchmark": task.competition["benchmark"],
                         "competition_id": task.competition["competition_id"]}  # fmt: skip
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps([entries[k] for k in sorted(entries)], indent=2))
    tmp.replace(path)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
