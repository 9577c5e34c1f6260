"""Metrics and the reward ladder against hand-computed numbers; submission checks."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from autoresearch_fixtures import make_tiny_task
from sklearn import metrics as skm

from wmrl.envs.autoresearch import metrics
from wmrl.envs.autoresearch.grader import (
    Status,
    check_script,
    grade_submission,
    reward,
    static_outcome,
    undefined_names,
)
from wmrl.envs.autoresearch.task import load_task


def test_metrics_hand_numbers():
    assert metrics.accuracy(np.array([1, 0, 1, 1]), np.array([1, 1, 1, 0])) == 0.5
    # class a: tp=1 fp=1 fn=0 -> 2/3; class b: tp=1 fp=0 fn=1 -> 2/3; class c: tp=0 fp=0 fn=0
    # (absent) -> mean 2/3
    assert metrics.f1_macro(np.array(["a", "b", "b"]), np.array(["a", "a", "b"])) == pytest.approx(
        2 / 3
    )
    # positives {0.8, 0.4}, negatives {0.6, 0.2}: pairs won 3 of 4 -> 0.75
    assert metrics.roc_auc(np.array([1, 1, 0, 0]), np.array([0.8, 0.4, 0.6, 0.2])) == 0.75
    # a tie between a positive and a negative counts half: 0.5
    assert metrics.roc_auc(np.array([1, 0]), np.array([0.3, 0.3])) == 0.5
    assert metrics.rmse(np.array([1.0, 2.0]), np.array([2.0, 4.0])) == pytest.approx(math.sqrt(2.5))
    assert metrics.mae(np.array([1.0, 2.0]), np.array([2.0, 4.0])) == 1.5
    # y mean 2, ss_tot = 2, ss_res = 0.5 -> 0.75
    assert metrics.r2(np.array([1.0, 2.0, 3.0]), np.array([1.5, 2.0, 2.5])) == 0.75


def test_metrics_agree_with_sklearn_on_random_data():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 200)
    p = rng.integers(0, 3, 200)
    assert metrics.f1_macro(y, p) == pytest.approx(skm.f1_score(y, p, average="macro"))
    yb = rng.integers(0, 2, 300)
    s = np.round(rng.random(300), 1)  # many ties
    assert metrics.roc_auc(yb, s) == pytest.approx(skm.roc_auc_score(yb, s))
    a, b = rng.normal(size=50), rng.normal(size=50)
    assert metrics.r2(a, b) == pytest.approx(skm.r2_score(a, b))
    assert metrics.rmse(a, b) == pytest.approx(math.sqrt(skm.mean_squared_error(a, b)))


def test_percentile_respects_direction_and_ties():
    refs = [0.5, 0.7, 0.9]
    assert metrics.percentile(0.95, refs, True) == 1.0
    assert metrics.percentile(0.1, refs, True) == 0.0
    assert metrics.percentile(0.7, refs, True) == pytest.approx(1.5 / 3)
    assert metrics.percentile(0.8, refs, True) == pytest.approx(2 / 3)
    # lower is better (rmse): 0.6 beats 0.7 and 0.9
    assert metrics.percentile(0.6, refs, False) == pytest.approx(2 / 3)
    assert metrics.percentile(0.3, [], True) == 0.5


def test_reward_ladder():
    assert reward(Status.MALFORMED) == 0.0
    assert reward(Status.RUNTIME_ERROR) == 0.1
    assert reward(Status.TIMEOUT) == 0.1
    assert reward(Status.NO_SUBMISSION) == 0.2
    assert reward(Status.INVALID_SUBMISSION) == 0.2
    assert reward(Status.VALID, 0.0) == 0.5
    assert reward(Status.VALID, 0.5) == 0.75
    assert reward(Status.VALID, 1.0) == 1.0
    assert math.isnan(reward(Status.UNGRADED))
    with pytest.raises(ValueError):
        reward(Status.VALID, None)
    assert [int(s) for s in Status] == list(range(7))


def test_check_script():
    assert check_script(b"print(1)\n") is None
    assert "UTF-8" in check_script(b"\xff\xfe")
    assert "SyntaxError" in check_script(b"def f(:\n")
    assert check_script(b"   \n") == "empty script"
    assert "null bytes" in check_script(b"x = 1\x00\n")


BOUND_EVERY_WAY = """
import os, numpy as np
import sklearn.ensemble as ens
from sklearn.svm import SVC as Classifier
x = [v for v in range(3)] + list({k for k in (1, 2)})
for i, (a, b) in enumerate([(1, 2)]):
    pass
with open(os.devnull) as fh:
    pass
try:
    pass
except ValueError as err:
    print(err)
def fit(data, *args, scale=1.0, **kw):
    global seen
    seen = data
    return lambda q: q + scale
class Model:
    pass
if (n := len(x)) > 1:
    print(n, i, a, b, fh, fit, Model, ens, Classifier, np, __file__, __name__, len, print)
match x:
    case [first, *rest]:
        print(first, rest)
    case {"k": v, **others}:
        print(v, others)
"""


def test_undefined_names_hand_cases():
    # A forgotten import: the commonest runtime error of a small policy.
    src = "from sklearn.svm import SVC\nm = DecisionTreeClassifier(max_depth=3)\nprint(m, SVC)\n"
    assert undefined_names(src) == ["DecisionTreeClassifier"]
    assert undefined_names(BOUND_EVERY_WAY) == []
    # Every name read but bound nowhere, sorted, once each; attributes are not names.
    assert undefined_names("y = np.zeros(3)\nprint(np.pi, z, z.shape, y)\n") == ["np", "z"]
    # Conservative: bound anywhere counts as bound (a use before the assignment is not
    # reported), and a star import or a script that does not parse cannot be judged.
    assert undefined_names("print(late)\nlate = 1\n") == []
    assert undefined_names("from numpy import *\nprint(zeros)\n") is None
    assert undefined_names("def f(:\n") is None


def test_static_outcome():
    assert static_outcome(b"import os\nprint(os.sep)\n") is None
    status, why = static_outcome(b"def f(:\n")
    assert status == Status.MALFORMED and "SyntaxError" in why
    status, why = static_outcome(b"m = Ridge()\nm.fit(X, y)\n")
    assert status == Status.RUNTIME_ERROR and why == "undefined name(s): Ridge, X, y"
    assert static_outcome(b"m = Ridge()\n", names=False) is None  # rl.static_check="compile"
    assert static_outcome(b"   ", names=False)[0] == Status.MALFORMED


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_tiny_task(tmp_path_factory.mktemp("g") / "tiny")


def _write(tmp_path, df: pd.DataFrame, name="sub.csv"):
    path = tmp_path / name
    df.to_csv(path, index=False)
    return path


def test_grade_valid_submission_by_hand(task, tmp_path):
    labels = pd.read_csv(task.labels_path)
    sub = labels.copy()
    flip = sub.index[:4]  # four wrong answers out of 30
    sub.loc[flip, "label"] = sub.loc[flip, "label"].map({"yes": "no", "no": "yes"})
    sub = sub.iloc[::-1]  # row order must not matter
    g = grade_submission(task, _write(tmp_path, sub))
    assert len(labels) == 30
    assert g.status == Status.VALID
    assert g.score == pytest.approx(26 / 30)
    assert g.percentile == pytest.approx(2 / 3)  # beats 0.5 and 0.7, loses to 0.9
    assert g.reward == pytest.approx(0.5 + 0.5 * g.percentile)


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d.drop(columns=["label"]), "lacks column"),
        (lambda d: d.rename(columns={"id": "ID"}), "lacks column"),
        (lambda d: d.iloc[:-1], "rows"),
        (lambda d: d.assign(id=d["id"].iloc[0]), "duplicate"),
        (lambda d: d.assign(id=d["id"] + 10_000), "ids do not match"),
        (lambda d: d.assign(label="maybe"), "unknown class"),
        (lambda d: d.assign(label=""), "empty"),
    ],
)
def test_grade_invalid_submissions(task, tmp_path, mutate, needle):
    labels = pd.read_csv(task.labels_path)
    g = grade_submission(task, _write(tmp_path, mutate(labels)))
    assert g.status == Status.INVALID_SUBMISSION
    assert needle in g.detail
    assert g.reward == 0.2


def test_grade_missing_and_unparseable(task, tmp_path):
    assert grade_submission(task, tmp_path / "nope.csv").status == Status.NO_SUBMISSION
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"\x00\x01\x02")
    assert grade_submission(task, bad).status == Status.INVALID_SUBMISSION


def test_float_ids_and_regression_nan(tmp_path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"x": rng.normal(size=60)})
    df["y"] = 2 * df["x"] + 1
    from wmrl.envs.autoresearch.make_task import write_task

    out = write_task(df, tmp_path / "reg", task_id="reg", target="y", metric="rmse")
    task = load_task(out)
    labels = pd.read_csv(task.labels_path)
    sub = labels.assign(id=labels["id"].astype(float), y=labels["y"] + 1.0)
    g = grade_submission(task, _write(tmp_path, sub))
    assert g.status == Status.VALID and g.score == pytest.approx(1.0)
    assert g.percentile == 0.5  # empty leaderboard
    sub.loc[sub.index[0], "y"] = np.nan
    assert grade_submission(task, _write(tmp_path, sub)).status == Status.INVALID_SUBMISSION


def test_auc_submission_scores_probabilities(tmp_path):
    from autoresearch_fixtures import tiny_classification_df

    from wmrl.envs.autoresearch.make_task import write_task

    out = write_task(
        tiny_classification_df(), tmp_path / "auc", task_id="auc", target="label", metric="roc_auc"
    )
    task = load_task(out)
    (out / "leaderboard.json").write_text(json.dumps({"scores": [0.6]}))
    task = load_task(out)
    labels = pd.read_csv(task.labels_path)
    assert set(labels["label"]) == {0, 1}  # "no" < "yes": yes is class 1
    g = grade_submission(task, _write(tmp_path, labels.assign(label=labels["label"] * 0.9)))
    assert g.status == Status.VALID and g.score == 1.0 and g.percentile == 1.0


def test_duplicated_required_column_is_named(task, tmp_path):
    labels = pd.read_csv(task.labels_path)
    path = tmp_path / "dup.csv"
    rows = "".join(f"{i},{y},{y}\n" for i, y in zip(labels["id"], labels["label"], strict=True))
    path.write_text("id,label,label\n" + rows)
    g = grade_submission(task, path)
    assert g.status == Status.INVALID_SUBMISSION
    assert "'label' appears 2 times" in g.detail


def test_non_ascii_digits_are_not_ids(task, tmp_path):
    """float() reads "١٢" (Arabic-Indic digits) and "1_2" as 12: such strings must not
    stand for the test set's ids."""
    labels = pd.read_csv(task.labels_path)
    arabic = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
    for spell in (lambda i: str(i).translate(arabic), lambda i: "_".join(str(i))):
        sub = labels.assign(id=labels["id"].map(spell))
        assert (sub["id"] != labels["id"].astype(str)).any()
        g = grade_submission(task, _write(tmp_path, sub))
        assert g.status == Status.INVALID_SUBMISSION and "ids do not match" in g.detail, g
    g = grade_submission(task, _write(tmp_path, labels.assign(id=labels["id"].map(" {}.0".format))))
    assert g.status == Status.VALID and g.score == 1.0  # ASCII spellings of the same number


BOUNDED = """
import json, resource, sys, time
sys.path.insert(0, {tests!r})
from autoresearch_fixtures import make_tiny_task
from pathlib import Path
from wmrl.envs.autoresearch.grader import grade_submission
task = make_tiny_task(Path({root!r}) / "tiny")
grade_submission(task, {honest!r})  # warm: labels cached, pandas paths loaded
out = {{}}
for name in ("wide", "long"):
    rss0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    g = grade_submission(task, Path({root!r}) / (name + ".csv"))
    out[name] = [g.status.name, g.detail, time.monotonic() - t0,
                 (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024]
print(json.dumps(out))
"""


def test_grading_is_bounded_whatever_the_header(task, tmp_path):
    """A 0.7 MB submission whose header has 100,000 columns (once 14 s and 526 MB of the
    trainer) and a 16 MB header line (280 s, 8.2 GB): INVALID_SUBMISSION, fast, small."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    labels = pd.read_csv(task.labels_path)
    rows = "".join(f"{i},{y}\n" for i, y in zip(labels["id"], labels["label"], strict=True))
    (tmp_path / "wide.csv").write_text(
        ",".join(f"c{i}" for i in range(100_000)) + ",id,label\n" + rows
    )
    (tmp_path / "long.csv").write_text("id,label," + "x" * (16 * 2**20) + "\n" + rows)
    honest = _write(tmp_path, labels)
    code = BOUNDED.format(tests=str(Path(__file__).parent), root=str(tmp_path), honest=str(honest))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (status, detail, seconds, rss_growth_mb) in out.items():
        assert status == "INVALID_SUBMISSION", (name, detail)
        assert "header" in detail, (name, detail)
        assert seconds < 2.0, (name, seconds)
        assert rss_growth_mb < 100, (name, rss_growth_mb)
