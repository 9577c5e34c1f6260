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


def test_task_json_values_that_would_escape_or_ungrade(tmp_path):
    """An id of "../../x" once put the sandbox's work dir outside its root; a NaN or
    infinite time limit loaded, then every script was UNGRADED; "abc" gave a raw error."""
    good = make_tiny_task(tmp_path / "good").root

    def load_with(**kw):
        d = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
        shutil.copytree(good, d)
        meta = json.loads((d / "task.json").read_text())
        meta.update(kw)
        (d / "task.json").write_text(json.dumps(meta))  # NaN and Infinity as JSON allows
        with pytest.raises(TaskError) as e:
            load_task(d)
        return str(e.value)

    for bad_id in ("../../x", "/tmp/x", "a/b", "", ".hidden", "١٢", "x" * 101, 7):
        assert "task id" in load_with(id=bad_id), bad_id
    for bad in (float("nan"), float("inf"), "abc", -1, 0, True, None):
        assert "time_limit_s must be" in load_with(time_limit_s=bad), bad
    for bad in (float("nan"), 1.5, "2048", -5, 0):
        assert "memory_mb must be" in load_with(memory_mb=bad), bad
    assert "id_column must be a column name" in load_with(id_column=3)
    assert load_task(good).id == "good"
    with pytest.raises(TaskError, match="task id"):
        write_task(
            tiny_classification_df(),
            tmp_path / "w",
            task_id="../w",
            target="label",
            metric="accuracy",
        )
    with pytest.raises(TaskError, match="time_limit_s"):
        write_task(
            tiny_classification_df(),
            tmp_path / "w",
            task_id="w",
            target="label",
            metric="accuracy",
            time_limit_s=float("nan"),
        )


def test_write_task_refuses_to_delete_what_is_not_a_task(tmp_path):
    df = tiny_classification_df()
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(TaskError, match="does not hold a task"):
        write_task(df, precious, task_id="t", target="label", metric="accuracy")
    assert (precious / "notes.txt").read_text() == "keep me"
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me too")
    with pytest.raises(TaskError, match="--overwrite"):
        write_task(df, a_file, task_id="t", target="label", metric="accuracy")
    assert a_file.read_text() == "keep me too"
    # A task is replaced; an empty directory is used; --overwrite replaces anything.
    task_dir = make_tiny_task(tmp_path / "task").root
    (task_dir / "stale.txt").write_text("old")
    write_task(df, task_dir, task_id="task", target="label", metric="accuracy")
    assert not (task_dir / "stale.txt").exists() and (task_dir / "task.json").is_file()
    (tmp_path / "empty").mkdir()
    write_task(df, tmp_path / "empty", task_id="empty", target="label", metric="accuracy")
    write_task(df, precious, task_id="t", target="label", metric="accuracy", overwrite=True)
    assert not (precious / "notes.txt").exists() and (precious / "task.json").is_file()


def test_existing_id_column(tmp_path):
    """--id_column: the CSV's own id is the task's id column (no extra `id` feature)."""
    df = tiny_classification_df().assign(customer=[f"c{i:03d}" for i in range(120)])
    task = load_task(
        write_task(
            df,
            tmp_path / "own",
            task_id="own",
            target="label",
            metric="accuracy",
            id_column="customer",
        )
    )
    train = pd.read_csv(task.public_dir / "train.csv")
    test = pd.read_csv(task.public_dir / "test.csv")
    labels = pd.read_csv(task.labels_path)
    assert task.id_column == "customer" and list(labels.columns) == ["customer", "label"]
    assert "id" not in train.columns and "id" not in test.columns
    assert sorted(train["customer"].tolist() + test["customer"].tolist()) == sorted(df["customer"])
    by_id = df.set_index("customer")["label"]
    assert (labels.set_index("customer")["label"] == by_id.loc[labels["customer"]]).all()
    for bad, needle in (("nope", "absent"), ("label", "is the target"), ("colour", "unique")):
        with pytest.raises(TaskError, match=needle):
            write_task(
                df,
                tmp_path / "bad",
                task_id="bad",
                target="label",
                metric="accuracy",
                id_column=bad,
            )


def test_make_task_cli_bad_csv_files(tmp_path, request):
    """Non-UTF-8, empty or header-only CSVs, and --out over a non-task directory: a one-line
    error naming the problem, no traceback."""
    root = str(request.config.rootpath)
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(b"name,label\n" + "caf\xe9,1\n".encode("latin-1") * 20)
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    header = tmp_path / "header.csv"
    header.write_text("a,label\n")
    good = tmp_path / "good.csv"
    tiny_classification_df().to_csv(good, index=False)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "keep.txt").write_text("x")
    cases = (
        (latin1, tmp_path / "o1", "is not UTF-8"),
        (empty, tmp_path / "o2", "is empty"),
        (header, tmp_path / "o3", "no rows"),
        (good, notes, "does not hold a task"),
        (good, tmp_path / "..bad", "task id"),
    )
    # The five commands side by side (each is an interpreter start and an import of pandas).
    make = [sys.executable, "-m", "wmrl.envs.autoresearch.make_task"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [
        subprocess.Popen(
            [*make, f"--csv={csv}", "--target=label", "--metric=accuracy", f"--out={out}"],
            cwd=root,
            **pipes,
        )
        for csv, out, _ in cases
    ]
    for p, (_, _, needle) in zip(procs, cases, strict=True):
        _, stderr = p.communicate(timeout=120)
        assert p.returncode != 0 and needle in stderr, (needle, stderr[-1500:])
        assert "Traceback" not in stderr, stderr[-1500:]
    assert (notes / "keep.txt").exists()
