"""make_task CLI with a real leaderboard, and the built-in suite's shape."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from autoresearch_fixtures import tiny_classification_df

from wmrl.envs.autoresearch.suite import build_suite, suite_tasks
from wmrl.envs.autoresearch.task import load_suite, load_task


def test_suite_definition_covers_the_required_variety():
    tasks = suite_tasks()
    assert len({t.id for t in tasks}) == len(tasks)
    train = [t for t in tasks if t.split == "train"]
    held = [t for t in tasks if t.split == "heldout"]
    assert len(train) >= 24 and len(held) >= 8
    kinds = {"missing": 0, "categorical": 0, "regression": 0, "classification": 0, "tight": 0}
    for i, t in enumerate(tasks):
        df = t.load(np.random.default_rng([0, i]))
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
            "wmrl.envs.autoresearch.make_task",
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
            "wmrl.envs.autoresearch.make_task",
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
