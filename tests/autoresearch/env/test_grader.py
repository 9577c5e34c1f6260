"""Metrics and the reward ladder against hand-computed numbers; submission checks."""

from __future__ import annotations

import decimal
import itertools
import json
import math
import re
import time

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm

from tests.support.autoresearch_fixtures import make_tiny_task
from wmrl.autoresearch.env import grader, ids, metrics
from wmrl.autoresearch.env.grader import (
    Status,
    check_script,
    grade_submission,
    reward,
    static_outcome,
    undefined_names,
)
from wmrl.autoresearch.env.ids import canonical_id
from wmrl.autoresearch.env.task import load_task


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
    from wmrl.autoresearch.env.make_task import write_task

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
    from tests.support.autoresearch_fixtures import tiny_classification_df
    from wmrl.autoresearch.env.make_task import write_task

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
from wmrl.autoresearch.env.grader import grade_submission
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
    code = BOUNDED.format(
        tests=str(Path(__file__).resolve().parents[2] / "support"),
        root=str(tmp_path),
        honest=str(honest),
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (status, detail, seconds, rss_growth_mb) in out.items():
        assert status == "INVALID_SUBMISSION", (name, detail)
        assert "header" in detail, (name, detail)
        assert seconds < 2.0, (name, seconds)
        assert rss_growth_mb < 100, (name, rss_growth_mb)


# -- ids, labels and cells: linear-time parsing, exact canonical forms, bounded details -------

# The number pattern as it was: ``\d+\.?\d*`` splits a run of digits between two loops in
# every possible way, so a failing match is quadratic in the run's length.
OLD_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def _matches(pattern: re.Pattern, text: str) -> bool:
    return pattern.fullmatch(text) is not None


def test_number_pattern_matches_exactly_what_the_old_one_did():
    alphabet = "01.+-eEx"
    short = ["".join(p) for n in range(7) for p in itertools.product(alphabet, repeat=n)]
    rng = np.random.default_rng(0)
    pool = list("0123456789" * 4 + ".+-eE x١_")
    longer = ["".join(rng.choice(pool, size=rng.integers(7, 40))) for _ in range(20_000)]
    numbers = [
        f"{s}{i}{p}{f}{e}"
        for s in ("", "+", "-")
        for i in ("", "0", "12")
        for p in ("", ".")
        for f in ("", "5", "050")
        for e in ("", "e3", "E-07", "e+", "e")
    ]
    attacks = ["1" * 2000 + "a", "1" * 2000 + ".", "1" * 1000 + "." + "1" * 1000 + "e", "." * 9]
    texts = short + longer + numbers + attacks
    assert sum(_matches(OLD_NUMBER, t) for t in texts) > 1000  # both outcomes well covered
    mismatched = [t for t in texts if _matches(OLD_NUMBER, t) != _matches(ids.NUMBER, t)]
    assert mismatched == []


def test_number_pattern_is_linear_on_the_attack_strings():
    """A megabyte of digits and a letter: the old pattern took hours (30,000 digits: 30 s)."""
    for text in ("1" * 2**20 + "a", "1" * 2**19 + "." + "1" * 2**19 + "a", "9" * 2**20 + "e+a"):
        t0 = time.perf_counter()
        assert ids.NUMBER.fullmatch(text) is None
        assert time.perf_counter() - t0 < 0.5


def test_canonical_id_hand_cases():
    big = 2**53
    assert canonical_id(str(big)) != canonical_id(str(big + 1))  # float() merges these two
    assert canonical_id(str(big + 1)) == "9007199254740993"
    assert canonical_id(f"{big + 1}.0") == "9007199254740993"
    for spelling in ("7", "007", "+7", " 7\t", "7.", "7.0", "7.00", "0.7e1", "70E-1", "+0007e0"):
        assert canonical_id(spelling) == "7", spelling
    assert canonical_id("-007") == "-7"
    for spelling in ("0", "-0", "+0.0", "0e5", ".0", "000"):
        assert canonical_id(spelling) == "0", spelling
    for spelling in ("0.5", "0.50", ".5", "5e-1", "50E-2", "+000.5000"):
        assert canonical_id(spelling) == "0.5", spelling
    assert canonical_id("1e3") == "1000" and canonical_id("1.5E+2") == "150"
    assert canonical_id("12.345") == "12.345" and canonical_id("-0.00120") == "-0.0012"
    assert canonical_id("1.0000000000000001") == "1.0000000000000001"  # float() says 1.0
    # Beyond MAX_CELL_CHARS digits in plain form: mantissa and exponent.
    assert canonical_id("1e5000") == "1e5000" == canonical_id("10e4999")
    assert canonical_id("-2.50e-4000") == "-2.5e-4000"
    assert canonical_id("1e999") == "1" + "0" * 999  # 1000 digits: still plain
    assert canonical_id("1e1000") == "1e1000"
    # Not ASCII decimal numbers: themselves, stripped.
    for text in ("cat", "١٢", "1_0", "inf", "nan", "0x1F", "1e", "1.2.3", "--1", "7 7"):
        assert canonical_id(f" {text} ") == text, text
    assert canonical_id("a" * grader.MAX_CELL_CHARS) == "a" * grader.MAX_CELL_CHARS
    with pytest.raises(ValueError, match="1,001 characters"):
        canonical_id("1" * (grader.MAX_CELL_CHARS + 1))


def _exact_form(text: str) -> str:
    """The canonical form by the decimal module's exact arithmetic (plain notation)."""
    value = decimal.Decimal(text)
    if value == 0:
        return "0"
    return format(value.normalize(decimal.Context(prec=5000)), "f")


def test_canonical_id_is_the_exact_value_of_every_number_spelling():
    """Random spellings (signs, leading and trailing zeros, points, exponents) against the
    decimal module's exact value: equal values give equal forms, distinct ones distinct."""
    rng = np.random.default_rng(1)

    def digits(n: int) -> str:
        return "".join(rng.choice(list("0123456789"), size=n))

    for _ in range(20_000):
        whole, frac = digits(rng.integers(0, 25)), digits(rng.integers(0, 25))
        point = "." if frac or rng.random() < 0.3 else ""
        whole = whole if whole or frac else "0"
        exp = "" if rng.random() < 0.5 else f"e{rng.choice(['', '+', '-'])}{rng.integers(0, 60)}"
        text = f"{rng.choice(['', '+', '-'])}{whole}{point}{frac}{exp}"
        assert canonical_id(text) == _exact_form(text), text


def test_shorten_echoes_long_values_with_an_ellipsis_and_their_length():
    assert grader.shorten("cat") == "'cat'"
    assert grader.shorten("x" * 60) == repr("x" * 60)
    assert grader.shorten("1" * 100, limit=5) == "'11111'…(100 chars)"
    assert grader.shorten("é" * 2_000_000) == repr("é" * 60) + "…(2,000,000 chars)"


def test_overlong_cells_are_invalid_quickly(task, tmp_path):
    """An id cell of 30,000 digits and a letter (30 s of the old pattern) or of a megabyte
    (hours): INVALID_SUBMISSION from the cell cap, before any number parsing."""
    labels = pd.read_csv(task.labels_path, dtype=str)
    for column, cell in (
        ("id", "1" * 30_000 + "a"),
        ("id", "1" * 2**20 + "a"),
        ("label", "y" * 2**20),
    ):
        sub = labels.copy()
        sub.loc[0, column] = cell
        t0 = time.perf_counter()
        g = grade_submission(task, _write(tmp_path, sub))
        assert time.perf_counter() - t0 < 2.0
        assert g.status == Status.INVALID_SUBMISSION
        assert g.detail == (
            f"a cell of column {column!r} has {len(cell):,} characters (at most 1,000)"
        )
    sub = labels.copy()
    sub.loc[0, "id"] = "0" * 990 + sub.loc[0, "id"]  # at the cap: read, and the same id
    assert grade_submission(task, _write(tmp_path, sub)).status == Status.VALID


def test_details_never_echo_a_long_value_whole(task, tmp_path):
    """Unknown labels of 1,000 characters (the cell cap), a 60,000-character column name
    in a header without the id column: the detail names them, cut short."""
    labels = pd.read_csv(task.labels_path, dtype=str)
    sub = labels.assign(label=[f"{i:03d}" + "z" * 997 for i in range(len(labels))])
    g = grade_submission(task, _write(tmp_path, sub))
    assert g.status == Status.INVALID_SUBMISSION and "unknown class labels" in g.detail
    assert g.detail.count("…(1,000 chars)") == 5 and len(g.detail) < 500, g.detail
    path = tmp_path / "wide_name.csv"
    path.write_text("n" * 60_000 + ",label\n1,yes\n")
    g = grade_submission(task, path)
    assert "lacks column 'id'" in g.detail and "…(60,000 chars)" in g.detail
    assert len(g.detail) < 300, len(g.detail)


def test_check_script_refuses_oversized_and_uncompilable_scripts_without_raising(monkeypatch):
    cap = grader.MAX_SCRIPT_BYTES
    padded = b"print(1)\n#"
    at_cap = padded + b"x" * (cap - len(padded))
    assert len(at_cap) == cap and check_script(at_cap) is None
    with monkeypatch.context() as m:  # refused by its size alone: never decoded nor compiled
        m.setattr(grader, "compile", lambda *a, **k: pytest.fail("compiled"), raising=False)
        why = check_script(at_cap + b"x")
        assert why == f"script is {cap + 1:,} bytes, over the {cap:,}-byte limit"
        assert check_script(b"#" * 270 * 2**20).startswith("script is 283,115,520 bytes")
    # The compiler gives up on these (RecursionError, MemoryError): malformed, not a crash.
    for source in (b"x = " + b"1+" * 100_000 + b"1\n", b"x = " + b"-" * 200_000 + b"1\n"):
        why = check_script(source)
        assert why is not None and why.startswith("does not compile:"), why
        assert static_outcome(source) == (Status.MALFORMED, why)
