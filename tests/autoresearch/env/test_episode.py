"""Multi-turn episode tasks: the validation split, opaque ids, one execution graded twice, and
no hidden label reaching the agent (real sandbox processes where anything executes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score

from tests.support.autoresearch_fixtures import GOOD_SCRIPT, make_tiny_task, tiny_classification_df
from wmrl.autoresearch.env.episode import (
    MIN_TRAIN_ROWS,
    episode_rows,
    make_episode_task,
    split_seed,
)
from wmrl.autoresearch.env.grader import Status, grade_submission
from wmrl.autoresearch.env.make_task import write_task
from wmrl.autoresearch.env.observation import observation_of, render_observation
from wmrl.autoresearch.env.pool import SandboxPool
from wmrl.autoresearch.env.task import TaskError, load_task

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

FEATURES = ["a", "b", "c"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_tiny_task(tmp_path_factory.mktemp("tasks") / "tiny", time_limit_s=10.0)


@pytest.fixture(scope="module")
def episode(source, tmp_path_factory):
    return make_episode_task(source, tmp_path_factory.mktemp("episodes"))


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(num_workers=1, startup_check=False) as p:
        yield p


def text_csv(path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def test_validation_split_is_fixed_by_task_id_stratified_and_disjoint(source, episode, tmp_path):
    train, test = (
        text_csv(source.public_dir / "train.csv"),
        text_csv(source.public_dir / "test.csv"),
    )
    rows = episode_rows(episode)
    val_ids = set(rows[rows.part == "validation"].source_id)
    ep_train = text_csv(episode.public_dir / "train.csv")
    # disjoint and complete: the validation rows left train.csv, every other row stayed
    assert val_ids.isdisjoint(ep_train.id)
    assert val_ids | set(ep_train.id) == set(train.id)
    assert set(rows[rows.part == "test"].source_id) == set(test.id)
    # 20% of each class (stratified), counted here from the source train.csv
    counts = train.label.value_counts()
    val_labels = train.set_index("id").loc[sorted(val_ids), "label"].value_counts()
    for cls, n in counts.items():
        assert val_labels[cls] == round(0.2 * n)
    # the same task id splits the same, wherever and whenever it is built
    again = make_episode_task(source, tmp_path / "elsewhere")
    again_rows = episode_rows(again)
    assert set(again_rows[again_rows.part == "validation"].source_id) == val_ids
    assert (again.public_dir / "test.csv").read_bytes() == (
        episode.public_dir / "test.csv"
    ).read_bytes()
    # another id, same data: another split
    other_dir = tmp_path / "tiny2"
    shutil.copytree(source.root, other_dir)
    meta = json.loads((other_dir / "task.json").read_text())
    (other_dir / "task.json").write_text(json.dumps({**meta, "id": "tiny2"}))
    other = make_episode_task(load_task(other_dir), tmp_path / "elsewhere")
    other_rows = episode_rows(other)
    assert set(other_rows[other_rows.part == "validation"].source_id) != val_ids
    assert split_seed("tiny") != split_seed("tiny2")


def test_test_csv_ids_are_opaque_and_rows_are_the_tasks_own(source, episode):
    test, train = (
        text_csv(source.public_dir / "test.csv"),
        text_csv(source.public_dir / "train.csv"),
    )
    mixed = text_csv(episode.public_dir / "test.csv")
    assert list(mixed.columns) == list(test.columns)
    assert "label" not in mixed.columns
    rows = episode_rows(episode).set_index("opaque_id")
    # every id replaced by a distinct 6-digit number, none of them a source id
    assert mixed.id.str.fullmatch(r"[1-9]\d{5}").all() and not mixed.id.duplicated().any()
    assert set(mixed.id).isdisjoint(set(test.id) | set(train.id))
    # test and validation rows are interleaved, not in two blocks
    parts = rows.loc[mixed.id, "part"].to_numpy()
    assert np.count_nonzero(parts[1:] != parts[:-1]) > 2
    # each row's features are the source row's text, byte for byte
    by_source = pd.concat([test.set_index("id"), train.set_index("id")[test.columns[1:]]])
    by_source = by_source[~by_source.index.duplicated()]
    src = rows.loc[mixed.id, "source_id"].to_numpy()
    feats = list(test.columns[1:])
    assert (mixed[feats].to_numpy() == by_source.loc[src, feats].to_numpy()).all()
    # the hidden labels are keyed by the opaque ids, test and validation apart
    labels, val = text_csv(episode.labels_path), text_csv(episode.validation_labels_path)
    assert set(labels.id) | set(val.id) == set(mixed.id) and not set(labels.id) & set(val.id)
    assert len(labels) == len(test)
    src_labels = text_csv(source.labels_path).set_index("id").label
    assert (labels.label.to_numpy() == src_labels.loc[rows.loc[labels.id, "source_id"]]).all()
    assert os.stat(episode.root / "private").st_mode & 0o777 == 0o700
    assert episode.id == source.id and episode.reference_scores == source.reference_scores
    ep_train = text_csv(episode.public_dir / "train.csv")
    assert f"- Rows: {len(ep_train)} train, 48 test" in episode.card
    for cls, n in ep_train.label.value_counts().items():  # not the task's own train counts
        assert f"- {cls}: {n} (" in episode.card


def test_built_once_and_rebuilt_when_the_source_changes(source, tmp_path):
    first = make_episode_task(source, tmp_path / "ep")
    stamp = (first.root / "task.json").stat().st_mtime_ns
    assert make_episode_task(source, tmp_path / "ep").root == first.root
    assert (first.root / "task.json").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "ep").iterdir()] == ["tiny"]  # no temp dirs left
    changed_dir = tmp_path / "src" / "tiny"
    shutil.copytree(source.root, changed_dir)
    (changed_dir / "leaderboard.json").write_text(json.dumps({"scores": [0.1, 0.2]}))
    rebuilt = make_episode_task(load_task(changed_dir), tmp_path / "ep")
    assert rebuilt.reference_scores == (0.1, 0.2)
    assert [p.name for p in (tmp_path / "ep").iterdir()] == ["tiny"]
    with pytest.raises(TaskError, match="already an episode task"):
        make_episode_task(rebuilt, tmp_path / "ep2")


def test_too_few_training_rows_is_an_error_naming_the_task(tmp_path):
    out = write_task(
        tiny_classification_df(n=60), tmp_path / "small", task_id="small", target="label",
        metric="accuracy",
    )  # fmt: skip
    small = load_task(out)
    assert len(text_csv(small.public_dir / "train.csv")) < MIN_TRAIN_ROWS
    with pytest.raises(TaskError, match=r"task small: train.csv has 45 rows.*at least 50"):
        make_episode_task(small, tmp_path / "ep")
    assert not (tmp_path / "ep" / "small").exists()


def logistic_predictions(task) -> pd.DataFrame:
    """What GOOD_SCRIPT predicts for every test.csv row of ``task``, computed here."""
    tr, te = pd.read_csv(task.public_dir / "train.csv"), pd.read_csv(task.public_dir / "test.csv")
    m = LogisticRegression().fit(tr[FEATURES], tr["label"])
    return pd.DataFrame({"id": te["id"].astype(str), "label": m.predict(te[FEATURES])})


def test_one_grade_gives_the_single_turn_test_reward_and_the_validation_metric(
    source, episode, tmp_path
):
    pred = logistic_predictions(episode)
    sub = tmp_path / "submission.csv"
    pred.to_csv(sub, index=False)
    grade = grade_submission(episode, sub)
    assert grade.status == Status.VALID
    labels, val = text_csv(episode.labels_path), text_csv(episode.validation_labels_path)
    by_id = pred.set_index("id").label
    assert grade.score == pytest.approx(accuracy_score(labels.label, by_id.loc[labels.id]))
    assert grade.validation == pytest.approx(accuracy_score(val.label, by_id.loc[val.id]))
    # the same predictions of the test rows, graded single-turn on the source task
    rows = episode_rows(episode).set_index("opaque_id")
    single = pd.DataFrame({"id": rows.loc[labels.id, "source_id"].to_numpy()})
    single["label"] = by_id.loc[labels.id].to_numpy()
    single.to_csv(tmp_path / "single.csv", index=False)
    ref = grade_submission(source, tmp_path / "single.csv")
    assert ref.validation is None
    assert (grade.score, grade.percentile, grade.reward) == (ref.score, ref.percentile, ref.reward)
    # predictions for the test rows only are not a submission for this test.csv
    pred[pred.id.isin(labels.id)].to_csv(tmp_path / "test_only.csv", index=False)
    assert grade_submission(episode, tmp_path / "test_only.csv").status == (
        Status.INVALID_SUBMISSION
    )


def test_an_execution_on_an_episode_task_reports_reward_and_validation(pool, episode):
    r = pool.run(episode, GOOD_SCRIPT)
    assert r.status == Status.VALID, r
    pred = logistic_predictions(episode).set_index("id").label
    labels, val = text_csv(episode.labels_path), text_csv(episode.validation_labels_path)
    assert r.score == pytest.approx(accuracy_score(labels.label, pred.loc[labels.id]))
    assert r.validation == pytest.approx(accuracy_score(val.label, pred.loc[val.id]))
    assert r.error_type == "none"
    obs = observation_of(r)
    assert obs.validation == pytest.approx(r.validation, abs=1e-4)
    assert render_observation(obs, episode.metric_name).startswith("status: VALID | error: none")
    broken = pool.run(episode, GOOD_SCRIPT.replace('tr["label"]', 'tr["Label"]'))
    assert (broken.status, broken.error_type, broken.validation) == (
        Status.RUNTIME_ERROR,
        "KeyError",
        None,
    )
    assert render_observation(observation_of(broken), "accuracy").startswith(
        "status: RUNTIME_ERROR | error: KeyError | runtime: "
    )


# An agent that reads everything it can and looks for a label of any test.csv row: in the
# files of DATA_DIR, its working directory, their parents, the temp dir and the task's own
# directory (whose path it guesses right), and in its environment. It also counts test.csv
# rows whose features appear in train.csv (a validation row left in train.csv).
SNOOP = """
import csv, os, sys

TASK_ROOT = {task_root!r}
data = os.environ["DATA_DIR"]
test_ids = set()
with open(os.path.join(data, "test.csv")) as f:
    rows = list(csv.reader(f))
test_ids = {{r[0] for r in rows[1:]}}
test_feats = {{tuple(r[1:]) for r in rows[1:]}}
with open(os.path.join(data, "train.csv")) as f:
    train = list(csv.reader(f))
print("test rows in train.csv:", sum(tuple(r[1:-1]) in test_feats for r in train[1:]))
print("env:", sorted(os.environ))
roots = [data, os.getcwd(), os.path.dirname(data), os.path.dirname(os.getcwd()),
         TASK_ROOT, os.path.join(TASK_ROOT, "private")]
if {walk_tmp!r}:  # not where /tmp is the host's (the unsandboxed control, rlimits)
    roots.append("/tmp")
# Not the Python installation the sandbox mounts read-only (with a checkout under /tmp its
# virtual environment is under /tmp too: tens of thousands of files, slower to read than the
# script's time limit, and none of them the task's).
python_dirs = {{os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}}
found, denied, seen = {{}}, set(), set()
for root in roots:
    for dirpath, dirs, files in os.walk(root, onerror=lambda e: denied.add(e.filename)):
        dirs[:] = [d for d in dirs
                   if os.path.realpath(os.path.join(dirpath, d)) not in python_dirs]
        for name in files:
            path = os.path.join(dirpath, name)
            if path in seen:
                continue
            seen.add(path)
            try:
                with open(path, newline="") as f:
                    table = list(csv.reader(f))
            except Exception as e:
                denied.add(path)
                continue
            for r in table:
                if len(r) >= 2 and r[0] in test_ids and r[-1] and r[-1] not in r[1:-1]:
                    if len(r) == 2:
                        found[r[0]] = r[1]
for name in ("test_labels.csv", "validation_labels.csv", "episode_rows.csv"):
    path = os.path.join(TASK_ROOT, "private", name)
    try:
        with open(path) as f:
            for line in f:
                i, _, v = line.strip().partition(",")
                if i in test_ids:
                    found.setdefault(i, v)
    except OSError as e:
        print("cannot read", name, type(e).__name__)
for k, v in os.environ.items():
    if any(i in v for i in list(test_ids)[:50]):
        print("env var mentions a test id:", k)
print("files read:", len(seen), "denied:", len(denied))
print("labelled test ids found:", len(found))
print("LEAK " + " ".join(f"{{k}}={{v}}" for k, v in sorted(found.items())))
"""


def hidden_sequences(episode) -> list[str]:
    """The hidden label columns in their files' order, as the snoop would print them."""
    out = []
    for path in (episode.labels_path, episode.validation_labels_path):
        t = text_csv(path)
        out.append(" ".join(f"{i}={v}" for i, v in zip(t.id, t.label, strict=True)))
    return out


def test_a_snooping_script_sees_no_test_or_validation_label(pool, episode):
    script = textwrap.dedent(SNOOP.format(task_root=str(episode.root), walk_tmp=True))
    assert_snoop_found_nothing(pool.run(episode, script), episode)


@pytest.mark.skipif(os.geteuid() != 0, reason="rlimits as non-root shares our uid (documented)")
def test_a_snooping_script_sees_no_label_in_the_rlimits_fallback(episode):
    script = textwrap.dedent(SNOOP.format(task_root=str(episode.root), walk_tmp=False))
    with SandboxPool(num_workers=1, isolation="rlimits", startup_check=False) as p:
        r = p.run(episode, script)
    assert "PermissionError" in r.stdout_tail
    assert_snoop_found_nothing(r, episode)


def assert_snoop_found_nothing(r, episode) -> None:
    out = r.stdout_tail
    assert "labelled test ids found:" in out, (r.status, r.stderr_tail[-2000:])  # it finished
    assert "labelled test ids found: 0" in out, out
    assert int(out.split("files read: ")[1].split()[0]) >= 3  # it did read the public files
    assert "test rows in train.csv: 0" in out, out
    assert "cannot read test_labels.csv" in out and "cannot read validation_labels.csv" in out
    leak_line = out.split("LEAK", 1)[1]
    labels, val = text_csv(episode.labels_path), text_csv(episode.validation_labels_path)
    for i in [*labels.id, *val.id]:
        assert f"{i}=" not in leak_line
    for seq in hidden_sequences(episode):
        assert seq[:200] not in out
    assert "env var mentions" not in out


def test_the_snoop_finds_the_labels_where_nothing_hides_them(episode, tmp_path):
    """The control: the same script, run unsandboxed with the task's private dir readable,
    finds every hidden label; so the sandboxed run's 0 is the sandbox's doing."""
    env = {"DATA_DIR": str(episode.public_dir)}
    script = textwrap.dedent(SNOOP.format(task_root=str(episode.root), walk_tmp=False))
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
        check=True, timeout=60,
    ).stdout  # fmt: skip
    assert "labelled test ids found: 48" in out, out
    for seq in hidden_sequences(episode):
        assert all(pair in out for pair in seq.split(" "))


def metric_task(root, metric: str):
    """A 240-row task for ``metric`` (regression target for rmse, binary for roc_auc)."""
    rng = np.random.default_rng(1)
    df = pd.DataFrame(rng.normal(size=(240, 3)), columns=FEATURES)
    if metric == "rmse":
        df["label"] = 3 * df.a - df.b + rng.normal(size=240)
    elif metric == "roc_auc":
        df["label"] = np.where(df.a + rng.normal(size=240) > 0, "pos", "neg")
    else:
        df["label"] = rng.choice(["x", "y", "z"], size=240, p=[0.6, 0.3, 0.1])
    out = write_task(df, root / metric, task_id=f"m-{metric}", target="label", metric=metric)
    # scores every metric here can give (an AUC or F1 above 1 is refused)
    (out / "leaderboard.json").write_text(json.dumps({"scores": [0.3, 0.6, 0.9, 0.95]}))
    return load_task(out)


@pytest.mark.parametrize("metric", ["rmse", "roc_auc", "f1_macro"])
def test_grading_other_metrics_matches_sklearn_and_single_turn(metric, tmp_path):
    from sklearn.metrics import f1_score, mean_squared_error, roc_auc_score

    source = metric_task(tmp_path, metric)
    episode = make_episode_task(source, tmp_path / "episodes")
    ids = text_csv(episode.public_dir / "test.csv").id
    rng = np.random.default_rng(2)
    if metric == "f1_macro":
        pred = rng.choice(["x", "y", "z"], size=len(ids))
    else:
        pred = rng.normal(size=len(ids)).round(6)
    sub = pd.DataFrame({"id": ids, "label": pred})
    sub.to_csv(tmp_path / "sub.csv", index=False)
    grade = grade_submission(episode, tmp_path / "sub.csv")
    assert grade.status == Status.VALID, grade
    by_id = sub.set_index("id").label

    def sk(labels):
        y, p = labels.label.to_numpy(), by_id.loc[labels.id].to_numpy()
        if metric == "rmse":
            return np.sqrt(mean_squared_error(y.astype(float), p.astype(float)))
        if metric == "roc_auc":
            return roc_auc_score(y.astype(int), p.astype(float))
        return f1_score(y, p, average="macro")

    labels, val = text_csv(episode.labels_path), text_csv(episode.validation_labels_path)
    assert grade.score == pytest.approx(sk(labels))
    assert grade.validation == pytest.approx(sk(val))
    if metric == "roc_auc":  # stratified: both classes are in the validation split
        assert set(val.label) == {"0", "1"}
    rows = episode_rows(episode).set_index("opaque_id")
    single = pd.DataFrame({"id": rows.loc[labels.id, "source_id"].to_numpy()})
    single["label"] = by_id.loc[labels.id].to_numpy()
    single.to_csv(tmp_path / "single.csv", index=False)
    ref = grade_submission(source, tmp_path / "single.csv")
    assert (grade.score, grade.percentile, grade.reward) == (ref.score, ref.percentile, ref.reward)


def test_validity_of_an_episode_submission_does_not_consult_the_test_labels(episode, tmp_path):
    """A class only the hidden test labels have: a plain task accepts a prediction of it (it
    is a true label), an episode task does not, so a VALID / INVALID status says nothing
    about the test labels."""
    planted = tmp_path / "planted"
    shutil.copytree(episode.root, planted)
    labels = text_csv(planted / "private" / "test_labels.csv")
    labels.loc[0, "label"] = "maybe"
    labels.to_csv(planted / "private" / "test_labels.csv", index=False)
    pred = logistic_predictions(episode)
    pred.loc[pred.id == labels.id[0], "label"] = "maybe"
    pred.to_csv(tmp_path / "sub.csv", index=False)
    grade = grade_submission(load_task(planted), tmp_path / "sub.csv")
    assert grade.status == Status.INVALID_SUBMISSION and "maybe" in grade.detail
    # the same files as a plain task (no validation split): the test labels make it known
    (planted / "private" / "validation_labels.csv").unlink()
    val = text_csv(episode.validation_labels_path)
    plain = load_task(planted)
    mixed_labels = pd.concat([labels, val])
    mixed_labels.to_csv(planted / "private" / "test_labels.csv", index=False)
    assert grade_submission(plain, tmp_path / "sub.csv").status == Status.VALID


def test_private_files_are_written_unreadable_to_the_sandbox(source, tmp_path, caplog):
    ep = make_episode_task(source, tmp_path / "ep")
    private = ep.root / "private"
    assert os.stat(private).st_mode & 0o777 == 0o700
    modes = {p.name: os.stat(p).st_mode & 0o777 for p in private.iterdir()}
    assert modes and set(modes.values()) == {0o600}, modes
    with caplog.at_level("WARNING"):
        load_task(ep.root)
    assert not [r for r in caplog.records if "private" in r.getMessage()]
