"""make_task CLI with a real leaderboard, the built-in suite's shape, and its version."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.support.autoresearch_fixtures import tiny_classification_df
from wmrl.autoresearch.env import suite
from wmrl.autoresearch.env.suite import build_suite, suite_tasks, task_frame
from wmrl.autoresearch.env.task import load_suite, load_task

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs


def test_suite_definition_covers_the_required_variety():
    tasks = suite_tasks()
    assert len({t.id for t in tasks}) == len(tasks)
    train = [t for t in tasks if t.split == "train"]
    held = [t for t in tasks if t.split == "heldout"]
    assert len(train) >= 24 and len(held) >= 8
    kinds = {"missing": 0, "categorical": 0, "regression": 0, "classification": 0, "tight": 0}
    for t in tasks:
        df = task_frame(t, 0)
        assert t.target in df.columns, t.id
        assert t.provenance.get("source") and t.provenance.get("licence")
        feats = df.drop(columns=[t.target])
        kinds["missing"] += bool(feats.isna().any().any())
        kinds["categorical"] += any(not pd.api.types.is_numeric_dtype(d) for d in feats.dtypes)
        kinds["regression" if t.metric in ("rmse", "mae", "r2") else "classification"] += 1
        kinds["tight"] += t.time_limit_s < 30 and len(df) >= 40_000
    assert all(v >= 2 for v in kinds.values()), kinds


def test_build_suite_subset(tmp_path):
    build_suite(tmp_path, only=["iris-species", "heldout-penguins-sex"], workers=2)
    tasks = load_suite(tmp_path)
    assert [t.id for t in tasks] == ["heldout-penguins-sex", "iris-species"]
    assert [t.split for t in tasks] == ["heldout", "train"]
    for t in tasks:
        assert len(t.reference_scores) == 7  # every baseline ran and was valid
        assert "licence" in t.provenance
    auc = tasks[0]
    assert auc.metric_name == "roc_auc" and min(auc.reference_scores) == pytest.approx(0.5)


def test_make_task_cli_builds_leaderboard(tmp_path, request):
    csv = tmp_path / "data.csv"
    tiny_classification_df(n=200).to_csv(csv, index=False)
    out = tmp_path / "task"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "wmrl.autoresearch.env.make_task",
            f"--csv={csv}",
            "--target=label",
            "--metric=accuracy",
            f"--out={out}",
            "--test_fraction=0.3",
            "--time_limit=20",
            "--workers=2",
        ],
        capture_output=True,
        text=True,
        cwd=request.config.rootpath,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    task = load_task(out)
    board = json.loads((out / "leaderboard.json").read_text())
    assert next(e["name"] for e in board["entries"]) == "dummy"
    labels = pd.read_csv(task.labels_path)
    assert len(labels) == 60
    train = pd.read_csv(task.public_dir / "train.csv")
    majority = train["label"].value_counts().idxmax()
    dummy = board["entries"][0]
    assert dummy["status"] == "VALID"
    assert dummy["score"] == pytest.approx((labels["label"] == majority).mean())
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "wmrl.autoresearch.env.make_task",
            f"--csv={csv}",
            "--target=label",
            "--metric=logloss",
            f"--out={tmp_path / 'bad'}",
        ],
        capture_output=True,
        text=True,
        cwd=request.config.rootpath,
        timeout=120,
    )
    assert p.returncode != 0 and "unknown metric 'logloss'" in p.stderr


def test_a_tasks_rows_do_not_depend_on_the_other_tasks_built(tmp_path):
    """Seeds come from the suite seed and the task id: a subset builds the same files."""
    alone = build_suite(tmp_path / "a", only=["moons"], leaderboards=False)[0]
    among = build_suite(tmp_path / "b", only=["iris-species", "moons"], leaderboards=False)[1]
    for name in ("public/train.csv", "public/test.csv", "private/test_labels.csv"):
        assert (alone / name).read_bytes() == (among / name).read_bytes(), name


def test_built_tasks_record_the_builder_version(tmp_path):
    build_suite(tmp_path, only=["cars-mpg", "moons"], leaderboards=False)
    index = json.loads((tmp_path / "suite.json").read_text())
    assert [e["suite_version"] for e in index] == [suite.SUITE_VERSION] * 2
    for t in load_suite(tmp_path):
        assert t.provenance["suite_version"] == suite.SUITE_VERSION
        assert ("re-derived" in t.provenance["notes"]) == (t.id == "cars-mpg")
    train = pd.read_csv(tmp_path / "cars-mpg/public/train.csv")
    assert "Name" not in train.columns  # a car's name would give its row away
    assert suite.stale_tasks(tmp_path) == []


def test_a_suite_from_an_older_builder_is_refused(tmp_path):
    """A data_dir whose suite an older builder wrote (no version in its index) is refused
    with the field named, before anything is executed on it."""
    from tests.support.rl_fixtures import tiny_config
    from wmrl.autoresearch.data import prepare_data
    from wmrl.config_errors import ConfigError

    config = tiny_config(tmp_path / "data", tmp_path / "init")
    suite_dir = tmp_path / "data" / "suite"
    build_suite(suite_dir, only=list(config.suite.tasks), leaderboards=False)
    index = json.loads((suite_dir / "suite.json").read_text())
    for entry in index:
        del entry["suite_version"]
    (suite_dir / "suite.json").write_text(json.dumps(index))
    assert suite.stale_tasks(suite_dir) == sorted(config.suite.tasks)
    with pytest.raises(ConfigError, match=r"config\.data_dir.*older suite builder"):
        prepare_data(config, tmp_path / "data", progress=False)
    assert not (tmp_path / "data" / "trajectories").exists()


def test_stages_made_on_an_older_builders_tasks_are_not_reused(tmp_path):
    """A stage saved before the suite recorded its version names the field it lacks."""
    from tests.support.rl_fixtures import tiny_config
    from wmrl.autoresearch import stages
    from wmrl.config_errors import ConfigError

    config = tiny_config(tmp_path / "data", tmp_path / "init")
    saved = stages._fingerprint(config, "warmstart")
    assert saved["suite_version"] == suite.SUITE_VERSION
    del saved["suite_version"]
    stage = tmp_path / "init" / "warmstart"
    stage.mkdir(parents=True)
    (stage / "done.json").write_text(json.dumps({"config": saved}))
    with pytest.raises(ConfigError, match="suite_version"):
        stages.stages_done(config, tmp_path / "init")
