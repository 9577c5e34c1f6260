"""Task building and validation errors that name the problem."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
from autoresearch_fixtures import make_tiny_task, tiny_classification_df

from wmrl.envs.autoresearch.make_task import task_info, write_task
from wmrl.envs.autoresearch.task import TaskError, load_task


def test_write_task_layout_and_card(tmp_path):
    task = make_tiny_task(tmp_path / "t")
    train = pd.read_csv(task.public_dir / "train.csv")
    test = pd.read_csv(task.public_dir / "test.csv")
    labels = pd.read_csv(task.labels_path)
    assert len(train) + len(test) == 120 and len(test) == 30
    assert "label" not in test.columns
    assert list(labels.columns) == ["id", "label"]
    assert set(labels["id"]) == set(test["id"])
    assert not set(train["id"]) & set(test["id"])
    # stratified: the class ratio in train and test differs by at most one row's worth
    full = tiny_classification_df()["label"].value_counts(normalize=True)
    assert abs(labels["label"].value_counts(normalize=True)["yes"] - full["yes"]) < 0.05
    assert (task.root / "private").stat().st_mode & 0o077 == 0
    card = task.card
    for needle in (
        "accuracy (higher is better)",
        "colour | categorical (2 values)",
        "label",
        "SUBMISSION_PATH",
        "3 s wall-clock",
    ):
        assert needle in card
    info = task_info(task)
    assert info.has_categorical and not info.has_missing and info.task_type == "classification"


def test_load_errors_name_the_problem(tmp_path):
    good = make_tiny_task(tmp_path / "good").root

    def broken(name, edit):
        d = tmp_path / name
        shutil.copytree(good, d)
        edit(d)
        with pytest.raises(TaskError) as e:
            load_task(d)
        return str(e.value)

    assert "missing file private/test_labels.csv" in broken(
        "a", lambda d: (d / "private/test_labels.csv").unlink()
    )
    assert "missing file public/train.csv" in broken(
        "b", lambda d: (d / "public/train.csv").unlink()
    )

    def set_meta(**kw):
        def edit(d):
            meta = json.loads((d / "task.json").read_text())
            meta.update(kw)
            (d / "task.json").write_text(json.dumps(meta))

        return edit

    assert "target 'nope' absent from train.csv" in broken("c", set_meta(target="nope"))
    assert "unknown metric 'auc2'" in broken("d", set_meta(metric="auc2"))
    assert "metric rmse is for regression" in broken("e", set_meta(metric="rmse"))
    assert "leaderboard.json" in broken("f", lambda d: (d / "leaderboard.json").write_text("{}"))
    with pytest.raises(TaskError, match="does not exist"):
        load_task(tmp_path / "missing")


def test_write_task_rejects_bad_input(tmp_path):
    df = tiny_classification_df()
    with pytest.raises(TaskError, match="unknown metric"):
        write_task(df, tmp_path / "x", task_id="x", target="label", metric="logloss")
    with pytest.raises(TaskError, match="absent from the CSV"):
        write_task(df, tmp_path / "x", task_id="x", target="nope", metric="accuracy")
    df3 = df.assign(label=["a", "b", "c"] * 40)
    with pytest.raises(TaskError, match="binary"):
        write_task(df3, tmp_path / "x", task_id="x", target="label", metric="roc_auc")
    with pytest.raises(TaskError, match="not numeric"):
        write_task(df, tmp_path / "x", task_id="x", target="label", metric="rmse")


def _cli(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_run_cli_prints_one_json(tmp_path, request):
    from autoresearch_fixtures import GOOD_SCRIPT, good_script_score

    root = str(request.config.rootpath)
    task = make_tiny_task(tmp_path / "t")
    script = tmp_path / "s.py"
    script.write_text(GOOD_SCRIPT)
    p = _cli(["wmrl.envs.autoresearch.run", f"--task={task.root}", f"--script={script}"], root)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for key in (
        "status",
        "reward",
        "score",
        "percentile",
        "runtime_s",
        "stdout_tail",
        "stderr_tail",
        "isolation",
    ):
        assert key in out
    assert out["status"] == "VALID"
    assert out["score"] == pytest.approx(good_script_score(task))
    p = _cli(
        [
            "wmrl.envs.autoresearch.run",
            f"--task={task.root}",
            f"--script={tmp_path / 'missing.py'}",
        ],
        root,
    )
    assert p.returncode != 0 and "does not exist" in p.stderr
    p = _cli(["wmrl.envs.autoresearch.run", f"--task={tmp_path}", f"--script={script}"], root)
    assert p.returncode != 0 and "missing file task.json" in p.stderr
