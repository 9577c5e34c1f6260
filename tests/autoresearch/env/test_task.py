"""Task building and validation errors that name the problem."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tests.support.autoresearch_fixtures import make_tiny_task, tiny_classification_df
from wmrl.autoresearch.env.make_task import MAX_CARD_COLUMNS, make_task, task_info, write_task
from wmrl.autoresearch.env.task import (
    MAX_MEMORY_MB,
    MAX_TIME_LIMIT_S,
    TaskError,
    load_suite,
    load_task,
)


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


@pytest.mark.real
def test_run_cli_prints_one_json(tmp_path, request):
    from tests.support.autoresearch_fixtures import GOOD_SCRIPT, good_script_score

    root = str(request.config.rootpath)
    task = make_tiny_task(tmp_path / "t")
    script = tmp_path / "s.py"
    script.write_text(GOOD_SCRIPT)
    p = _cli(["wmrl.autoresearch.env.run", f"--task={task.root}", f"--script={script}"], root)
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
            "wmrl.autoresearch.env.run",
            f"--task={task.root}",
            f"--script={tmp_path / 'missing.py'}",
        ],
        root,
    )
    assert p.returncode != 0 and "does not exist" in p.stderr
    p = _cli(["wmrl.autoresearch.env.run", f"--task={tmp_path}", f"--script={script}"], root)
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


@pytest.mark.real
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
    make = [sys.executable, "-m", "wmrl.autoresearch.env.make_task"]
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


@pytest.mark.real
def test_make_task_cli_refuses_tasks_that_cannot_be_graded(tmp_path, request):
    """Limits past their bounds, a one-class target, and a task on which every baseline times
    out: exit non-zero with one line naming the problem (the flag, for a flag), and nothing
    left under the output's parent."""
    good = tmp_path / "good.csv"
    tiny_classification_df().to_csv(good, index=False)
    one_class = tmp_path / "one.csv"
    tiny_classification_df().assign(label="yes").to_csv(one_class, index=False)
    cases = (
        (good, "--time_limit=1e10", "--time_limit: time_limit_s must be positive and at most"),
        (good, "--memory_mb=10000000000000", "--memory_mb: memory_mb must be a positive whole"),
        (one_class, "--test_fraction=0.25", "classification target 'label' has one class"),
        (good, "--time_limit=0.001", "no baseline was graded VALID (dummy: TIMEOUT"),
    )
    make = [sys.executable, "-m", "wmrl.autoresearch.env.make_task", "--workers=1"]
    procs = [
        subprocess.Popen(
            [
                *make,
                f"--csv={csv}",
                "--target=label",
                "--metric=accuracy",
                flag,
                f"--out={tmp_path / 'tasks' / f't{i}'}",
            ],
            cwd=str(request.config.rootpath),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, (csv, flag, _) in enumerate(cases)
    ]
    for p, (_, _, needle) in zip(procs, cases, strict=True):
        _, stderr = p.communicate(timeout=180)
        assert p.returncode != 0 and needle in stderr, (needle, stderr[-1500:])
        assert "Traceback" not in stderr, stderr[-1500:]
    assert not (tmp_path / "tasks").exists()


# -- limits that validate but make every run UNGRADED ----------------------------------------


def test_limits_have_upper_bounds_in_write_task_and_load_task(tmp_path):
    """A 1e10 s time limit overflowed the pool's wait, 10^13 MB overflowed RLIMIT_AS: both
    once built and loaded, then every execution was UNGRADED."""
    df = tiny_classification_df()
    for kw, field in (
        ({"time_limit_s": 1e10}, "time_limit_s"),
        ({"time_limit_s": MAX_TIME_LIMIT_S + 1}, "time_limit_s"),
        ({"memory_mb": 10**13}, "memory_mb"),
        ({"memory_mb": MAX_MEMORY_MB + 1}, "memory_mb"),
    ):
        with pytest.raises(TaskError, match=f"^{field} must be .* at most"):
            write_task(df, tmp_path / "w", task_id="w", target="label", metric="accuracy", **kw)
        assert not (tmp_path / "w").exists()
    good = make_tiny_task(tmp_path / "good").root
    for key, value in (("time_limit_s", 1e10), ("memory_mb", 10**13)):
        d = tmp_path / f"bad-{key}"
        shutil.copytree(good, d)
        meta = json.loads((d / "task.json").read_text())
        (d / "task.json").write_text(json.dumps({**meta, key: value}))
        with pytest.raises(TaskError, match=f"task bad-{key}: {key} must be .* at most"):
            load_task(d)


@pytest.mark.real
def test_the_largest_limits_still_grade(tmp_path):
    """The bounds are inside what the sandbox can express: a task at both maxima runs and is
    graded, where the values above them are UNGRADED (run here for real, on a Task made
    without load_task)."""
    from tests.support.autoresearch_fixtures import GOOD_SCRIPT, good_script_score
    from wmrl.autoresearch.env.grader import Status
    from wmrl.autoresearch.env.pool import SandboxPool

    task = make_tiny_task(tmp_path / "max", time_limit_s=MAX_TIME_LIMIT_S, memory_mb=MAX_MEMORY_MB)
    assert (task.time_limit_s, task.memory_mb) == (86_400.0, 2**20)
    with SandboxPool(num_workers=1) as pool:
        r = pool.run(task, GOOD_SCRIPT)
        assert r.status == Status.VALID and r.score == pytest.approx(good_script_score(task))
        for over in ({"time_limit_s": 1e10}, {"memory_mb": 10**13}):
            assert pool.run(dataclasses.replace(task, **over), GOOD_SCRIPT).status == (
                Status.UNGRADED
            ), over


# -- ids that collide only after canonicalisation ---------------------------------------------


def test_ids_equal_to_the_grader_are_refused(tmp_path):
    """ "7" and "007" are one id to the grader: with both among the test ids no submission
    could be VALID. make_task refuses the id column, load_task a hand-made labels file."""
    df = tiny_classification_df().assign(key=[f"k{i}" for i in range(120)])
    df.loc[3, "key"], df.loc[50, "key"] = "7", "007"
    with pytest.raises(TaskError) as e:
        write_task(
            df, tmp_path / "w", task_id="w", target="label", metric="accuracy", id_column="key"
        )
    assert "ids '7' and '007' are the same id to the grader" in str(e.value)
    assert not (tmp_path / "w").exists()
    task = make_tiny_task(tmp_path / "t")
    labels = task.labels_path.read_text().splitlines()
    first, second = labels[1].split(",")[0], labels[2].split(",")[0]
    labels[2] = labels[2].replace(second, f" {first}.0", 1)  # one id, spelled differently
    task.labels_path.write_text("\n".join(labels) + "\n")
    with pytest.raises(TaskError) as e:
        load_task(task.root)
    assert f"ids '{first}' and ' {first}.0' are the same id to the grader" in str(e.value)


def test_ids_past_two_to_the_53_stay_distinct(tmp_path):
    """Exact integers: 2**53 and 2**53 + 1 are distinct ids (a float round trip merged them)."""
    big = 2**53
    df = tiny_classification_df().assign(key=[str(big + i) for i in range(120)])
    task = load_task(
        write_task(
            df, tmp_path / "big", task_id="big", target="label", metric="accuracy", id_column="key"
        )
    )
    ids = pd.read_csv(task.labels_path, dtype=str)["key"]
    assert len(set(ids)) == 30 and all(int(i) >= big for i in ids)


# -- degenerate targets -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "metric, values, needle",
    [
        ("accuracy", ["yes"] * 120, "classification target 'label' has one class ('yes'"),
        ("f1_macro", ["yes"] * 120, "has one class"),
        ("rmse", [3.5] * 120, "regression target 'label' has one value ('3.5'"),
        ("rmse", [float("inf"), *range(119)], "has non-finite values (inf)"),
        ("mae", [-float("inf"), *range(119)], "has non-finite values (-inf)"),
        ("rmse", [1e308, *range(119)], "values up to 1e+308, above 1e+150"),
        ("r2", [-1e200, *range(119)], "values up to 1e+200"),
        ("accuracy", ["a", "b"] + ["c"] * 118, "the test rows of target 'label' hold one class"),
    ],
)
def test_degenerate_targets_are_refused_by_name(tmp_path, metric, values, needle):
    """A one-class target put every valid file at the top of the leaderboard; inf or 1e308
    targets left it empty (no score is finite). Both were accepted."""
    df = tiny_classification_df().assign(label=values)
    with pytest.raises(TaskError) as e:
        write_task(df, tmp_path / "w", task_id="w", target="label", metric=metric)
    assert needle in str(e.value)
    assert not (tmp_path / "w").exists()


@pytest.mark.real
def test_no_valid_baseline_leaves_nothing_behind(tmp_path):
    """The general guard: a task on which no baseline is graded VALID (here every one times
    out) is refused, with each baseline's status; nothing is left at --out (nor the
    parents made for it), and a task already there is kept as it was."""
    from wmrl.autoresearch.env.pool import SandboxPool

    df = tiny_classification_df()
    kw = {"task_id": "slow", "target": "label", "metric": "accuracy", "time_limit_s": 0.001}
    old = make_tiny_task(tmp_path / "kept" / "slow").root
    before = {p.relative_to(old): p.read_bytes() for p in old.rglob("*") if p.is_file()}
    with SandboxPool(num_workers=2) as pool:
        for out in (tmp_path / "new" / "deeper" / "slow", old):
            with pytest.raises(TaskError) as e:
                make_task(df, out, pool, **kw)
            assert "no baseline was graded VALID (dummy: TIMEOUT," in str(e.value)
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["slow"]  # no .partial
    assert {p.relative_to(old): p.read_bytes() for p in old.rglob("*") if p.is_file()} == before


# -- headers parsed as CSV; nothing half-built ------------------------------------------------


@pytest.mark.real
def test_a_target_name_with_a_comma(tmp_path):
    """ "my,label" is quoted in the CSV header; splitting the header on commas reported it
    absent (with a traceback) and left a half-built task directory. Built for real, with
    the baselines' leaderboard."""
    from wmrl.autoresearch.env.pool import SandboxPool

    df = tiny_classification_df().rename(columns={"label": "my,label", "a": 'say "a"'})
    with SandboxPool(num_workers=2) as pool:
        out, board = make_task(
            df, tmp_path / "comma", pool, task_id="comma", target="my,label", metric="accuracy"
        )
    task = load_task(out)
    assert task.target == "my,label" and len(board["scores"]) >= 5
    assert pd.read_csv(task.labels_path).columns.tolist() == ["id", "my,label"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comma"]


def test_headers_are_read_as_csv(tmp_path):
    task = make_tiny_task(tmp_path / "t")
    train = task.public_dir / "train.csv"
    text = train.read_text().splitlines()
    text[0] = text[0].replace("colour", '"col,our"')
    train.write_text("\n".join(text) + "\n")
    assert load_task(task.root).target == "label"
    text[0] = text[0].replace("label", " label")  # not the target's name: refused, exactly
    train.write_text("\n".join(text) + "\n")
    with pytest.raises(TaskError, match=r"target 'label' absent from train\.csv"):
        load_task(task.root)


def test_a_failed_write_leaves_no_partial_directory(tmp_path, monkeypatch):
    """Interrupted while writing (here: the card fails): neither --out nor a staging
    directory remains, and a task already at --out is kept."""
    import wmrl.autoresearch.env.make_task as mt

    old = make_tiny_task(tmp_path / "t").root
    card = (old / "public/description.md").read_text()

    def broken(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(mt, "describe", broken)
    for out in (tmp_path / "fresh", old):
        with pytest.raises(KeyboardInterrupt):
            write_task(
                tiny_classification_df(), out, task_id=out.name, target="label", metric="accuracy"
            )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]
    assert (old / "public/description.md").read_text() == card
    assert load_task(old).reference_scores == (0.5, 0.7, 0.9)


def test_load_suite_skips_hidden_directories(tmp_path):
    a = make_tiny_task(tmp_path / "a").root
    shutil.copytree(a, tmp_path / ".a.partial-x")  # what an interrupted make_task leaves
    assert [t.id for t in load_suite(tmp_path)] == ["a"]


# -- the card's column table ------------------------------------------------------------------


def test_the_card_lists_at_most_max_card_columns(tmp_path):
    """A card listed every column: 5,000 columns, 5,000 table rows. Now the first
    MAX_CARD_COLUMNS are listed and one line says what was cut."""
    rng = np.random.default_rng(0)
    n = 120
    df = pd.DataFrame(rng.normal(size=(n, 240)), columns=[f"f{i:03d}" for i in range(240)])
    for j in range(10):
        df[f"c{j}"] = rng.choice(["u", "v"], size=n)
    df.iloc[:7, 150] = np.nan  # 7 missing cells among the unlisted columns (f150)
    df.iloc[:3, 20] = np.nan  # 3 among the listed ones (f020)
    df["label"] = tiny_classification_df()["label"]
    task = load_task(
        write_task(df, tmp_path / "wide", task_id="wide", target="label", metric="accuracy")
    )
    rows = [line for line in task.card.splitlines() if re.match(r"\| (f\d{3}|c\d) \|", line)]
    assert MAX_CARD_COLUMNS == 100 and len(rows) == 100
    assert rows[0].startswith("| f000 |") and rows[-1].startswith("| f099 |")
    assert "| f020 | numeric | 3 |" in task.card
    assert (
        "... and 150 more columns (not listed): numeric 140, categorical 10; "
        "7 missing values among them"
    ) in task.card
    assert "feature columns: 250" in task.card
    narrow = make_tiny_task(tmp_path / "narrow")
    assert "more columns" not in narrow.card
