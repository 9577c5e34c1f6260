"""Imported competitions graded as their benchmarks grade them, on fixtures in each benchmark's
real layout (``tests/support/competition_fixtures.py``): boolean labels, AUC ranges, a
train.csv without an id column, one suite from both benchmarks, the no-score verdict of an
invalid submission, metric errors that are the submission's, quadratic weighted kappa in
linear memory, and a competition with more class columns than the default header cap.

Expected values come from scikit-learn called as the benchmark calls it (pandas-read frames,
sorted by id) or from hand numbers, never from the code under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import accuracy_score, cohen_kappa_score, f1_score, roc_auc_score

from tests.support.competition_fixtures import (
    answers_of,
    make_mlebench,
    make_mledojo,
    metrics_file,
    run_cli,
)
from wmrl.autoresearch.env.competitions import mlebench, mledojo
from wmrl.autoresearch.env.competitions.metrics import (
    get_competition_metric,
    parse_column,
    quadratic_weighted_kappa,
)
from wmrl.autoresearch.env.competitions.task_dir import write_competition_task
from wmrl.autoresearch.env.grader import MAX_COLUMNS, Status, grade_submission
from wmrl.autoresearch.env.task import TaskError, load_suite, load_task

REPO = Path(__file__).resolve().parents[3]
# The verdict documented for a submission that is not VALID: no medal, position score 0.
NO_SCORE = {
    "mlebench": {"benchmark": "mlebench", "score": None, "medal": None, "any_medal": False,
                 "above_median": False, "position_score": 0.0},
    "mledojo": {"benchmark": "mledojo", "score": None, "position_score": 0.0, "positions": {}},
}  # fmt: skip


def mb_task(root: Path, name: str):
    comps, data = make_mlebench(root, names=(name,))
    return load_task(write_competition_task(mlebench.read_mlebench(comps, data, name),
                                            root / "suite" / name))  # fmt: skip


def md_task(root: Path, name: str):
    from tests.support.competition_fixtures import METRIC_WORDS

    comps, data = make_mledojo(root, names=(name,))
    source = mledojo.read_mledojo(data, name, METRIC_WORDS[name], comps)
    return load_task(write_competition_task(source, root / "suite" / name))


def grade_frame(task, frame: pd.DataFrame, tmp_path: Path, text: str | None = None):
    path = tmp_path / "submission.csv"
    if text is not None:
        path.write_text(text)
    else:
        frame.to_csv(path, index=False)
    return grade_submission(task, path), path


def as_mlebench_scores_accuracy(sub_path: Path, answers: pd.DataFrame, id_col: str, col: str):
    """MLE-bench's accuracy grade: both files read by pandas with its defaults, sorted by id,
    then scikit-learn's accuracy_score."""
    sub = pd.read_csv(sub_path).sort_values(id_col)
    ans = answers.sort_values(id_col)
    return accuracy_score(ans[col].to_numpy(), sub[col].to_numpy())


# -- booleans -------------------------------------------------------------------------------


SPELLINGS = {  # how a script may write the True / False answers, each read as pandas reads it
    "int": lambda b: b.astype(int).astype(str),
    "float": lambda b: b.astype(float).astype(str),
    "lower": lambda b: b.map({True: "true", False: "false"}),
    "upper": lambda b: b.map({True: "TRUE", False: "FALSE"}),
    "python": lambda b: b.astype(str),
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_boolean_answers_written_as_one_and_zero_score_as_mlebench_scores_them(tmp_path, spelling):
    """spaceship-titanic's answers are True/False; a submission of 1/0 (what ``.astype(int)``
    writes) is accuracy 1.0 and gold in MLE-bench (scikit-learn compares True == 1)."""
    task = mb_task(tmp_path, "mb-spaceship")
    answers = pd.read_csv(task.root / "private" / "answers.csv")
    assert answers["Transported"].dtype == bool  # pandas reads the answers as booleans
    sub = answers.copy()
    sub["Transported"] = SPELLINGS[spelling](answers["Transported"])
    sub.loc[:3, "Transported"] = SPELLINGS[spelling](~answers["Transported"][:4])  # 4 wrong
    g, path = grade_frame(task, sub, tmp_path)
    expected = as_mlebench_scores_accuracy(path, answers, "PassengerId", "Transported")
    assert expected == pytest.approx(1 - 4 / 40)  # the hand number
    assert g.status == Status.VALID, g
    assert g.score == pytest.approx(expected)
    # 50 teams, best 0.82: 0.9 is above the gold threshold (position 5, 0.796)
    assert g.benchmark["medal"] == "gold" and g.percentile == 1.0


def test_binary_f1_takes_true_for_the_positive_class_as_scikit_learn_does():
    truth = np.array(["True", "False", "True", "True", "False"], dtype=object)
    guess = np.array(["1", "1", "0", "1", "0"], dtype=object)
    f1 = get_competition_metric("f1").fn
    y_true = parse_column(truth, "labels", "y").reshape(-1, 1)
    y_pred = parse_column(guess, "labels", "y").reshape(-1, 1)
    expected = f1_score(np.array([True, False, True, True, False]), np.array([1, 1, 0, 1, 0]))
    assert expected == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))  # tp 2, fp 1, fn 1
    assert f1(y_true, y_pred) == pytest.approx(expected)


# -- AUC ranges -----------------------------------------------------------------------------


def test_mlebench_auc_refuses_predictions_outside_zero_one(tmp_path):
    """MLE-bench's prepare_for_auroc_metric refuses predictions outside [0, 1]; a perfect
    ranking rescaled to [-1, 2] is INVALID, the same ranking in [0, 1] VALID and gold."""
    task = mb_task(tmp_path, "mb-click-auc")
    answers = answers_of("mb-click-auc")
    rank = answers["clicked"] + np.linspace(0, 0.5, len(answers))  # ranks every 1 above 0
    rank = (rank - rank.min()) / (rank.max() - rank.min())
    inside = answers.assign(clicked=rank)
    g, _ = grade_frame(task, inside, tmp_path)
    assert g.status == Status.VALID and g.score == pytest.approx(
        roc_auc_score(answers["clicked"], inside["clicked"])
    )  # fmt: skip
    assert g.score == 1.0 and g.benchmark["medal"] == "gold"
    outside = answers.assign(clicked=-1 + 3 * rank)
    assert outside["clicked"].min() == -1 and outside["clicked"].max() == 2
    g, _ = grade_frame(task, outside, tmp_path)
    assert (g.status, g.benchmark) == (Status.INVALID_SUBMISSION, NO_SCORE["mlebench"]), g
    assert "[0, 1]" in g.detail, g.detail


def test_mledojo_auc_ranks_any_finite_scores_as_its_metric_does(tmp_path):
    """MLE-Dojo's amazon-employee-access metric.py calls roc_auc_score on the raw column: a
    ranking in [-1, 2] is scored (1.0 here), as there."""
    task = md_task(tmp_path, "md-access")
    answers = answers_of("md-access")
    scores = -1 + 3 * (answers["ACTION"] + np.linspace(0, 0.5, len(answers))) / 1.5
    sub = answers.assign(ACTION=scores)
    g, _ = grade_frame(task, sub, tmp_path)
    assert g.status == Status.VALID, g
    assert g.score == pytest.approx(roc_auc_score(answers["ACTION"], scores)) and g.score == 1.0


# -- a train.csv without an id column ---------------------------------------------------------


def test_a_train_csv_without_an_id_column_imports(tmp_path):
    """amazon-employee-access-challenge as MLE-Dojo prepares it: train.csv has no id (its
    prepare.py adds one to the test rows only); test.csv and the sample submission carry it."""
    comps, data = make_mledojo(tmp_path, names=("md-access",))
    train = pd.read_csv(data / "md-access" / "data" / "public" / "train.csv")
    assert "id" not in train.columns and "ACTION" in train.columns
    out = run_cli("--benchmark=mledojo", f"--data_dir={data}", f"--competitions_dir={comps}",
                  f"--metrics={metrics_file(tmp_path, ('md-access',))}",
                  f"--out={tmp_path / 'suite'}")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert list(json.loads(out.stdout)["imported"]) == ["md-access"]
    task = load_task(tmp_path / "suite" / "md-access")
    assert (task.target, task.id_column, task.metric_name) == ("ACTION", "id", "roc_auc")
    assert "- Rows: 80 train, 40 test; feature columns: 3" in task.card
    g, _ = grade_frame(task, answers_of("md-access"), tmp_path)
    assert g.status == Status.VALID and g.score == 1.0


# -- one suite from both benchmarks -----------------------------------------------------------


def test_two_benchmarks_competitions_with_one_id_coexist_in_one_suite(tmp_path):
    """nomad2018 is in both benchmarks: importing MLE-Dojo's, then MLE-bench's, into one
    --out keeps both, under distinct task ids, and suite.json lists both; importing either
    again replaces its own task only."""
    md_comps, md_data = make_mledojo(tmp_path, names=("conductors",))
    mb_comps, mb_data = make_mlebench(tmp_path, names=("conductors",))
    suite = tmp_path / "suite"
    dojo = ("--benchmark=mledojo", f"--data_dir={md_data}", f"--competitions_dir={md_comps}",
            f"--metrics={metrics_file(tmp_path, ('conductors',))}", f"--out={suite}",
            "--split=heldout")  # fmt: skip
    bench = ("--benchmark=mlebench", f"--data_dir={mb_data}", f"--competitions_dir={mb_comps}",
             f"--out={suite}")  # fmt: skip
    for args in (dojo, bench, dojo, bench):
        out = run_cli(*args)
        assert out.returncode == 0, out.stderr
    tasks = load_suite(suite)
    by_benchmark = {t.competition["benchmark"]: t for t in tasks}
    assert len(tasks) == 2 and sorted(by_benchmark) == ["mlebench", "mledojo"]
    assert {t.competition["competition_id"] for t in tasks} == {"conductors"}
    assert by_benchmark["mledojo"].split == "heldout" and by_benchmark["mlebench"].split == "train"
    assert by_benchmark["mlebench"].id != by_benchmark["mledojo"].id
    index = json.loads((suite / "suite.json").read_text())
    assert sorted((e["id"], e["benchmark"], e["split"]) for e in index) == sorted(
        (t.id, t.competition["benchmark"], t.split) for t in tasks
    )
    for t in tasks:
        assert t.root.name == t.id
        g, _ = grade_frame(t, answers_of("conductors"), tmp_path)
        assert g.status == Status.VALID and g.score == 0.0
        assert g.benchmark["benchmark"] == t.competition["benchmark"]
    # What the import said: each run names the task directory it wrote.
    said = json.loads(run_cli(*bench).stdout)["imported"]
    assert said == {"conductors": str(by_benchmark["mlebench"].root)}


def test_a_second_benchmark_id_too_long_to_qualify_is_refused_naming_both(tmp_path):
    from wmrl.autoresearch.env.competitions.__main__ import suite_task_id

    long = "c" * 95  # task ids have at most 100 characters: "-mlebench" does not fit
    (tmp_path / long).mkdir()
    block = {"benchmark": "mledojo", "competition_id": long}
    (tmp_path / long / "task.json").write_text(json.dumps({"competition": block}))
    assert suite_task_id(tmp_path, "mledojo", long) == long
    with pytest.raises(TaskError) as e:
        suite_task_id(tmp_path, "mlebench", long)
    assert "from mledojo" in str(e.value) and "the mlebench one" in str(e.value), str(e.value)


# -- the verdict of a submission that is not VALID -----------------------------------------


def test_an_invalid_or_missing_submission_records_the_no_score_verdict(tmp_path):
    task = mb_task(tmp_path, "mb-spaceship")
    g, _ = grade_frame(task, answers_of("mb-spaceship").assign(extra=1), tmp_path)
    assert (g.status, g.benchmark) == (Status.INVALID_SUBMISSION, NO_SCORE["mlebench"]), g
    g = grade_submission(task, tmp_path / "nothing.csv")
    assert (g.status, g.benchmark) == (Status.NO_SUBMISSION, NO_SCORE["mlebench"]), g
    dojo = md_task(tmp_path / "dojo", "md-access")
    g, _ = grade_frame(dojo, answers_of("md-access")[1:], tmp_path)
    assert (g.status, g.benchmark) == (Status.INVALID_SUBMISSION, NO_SCORE["mledojo"]), g


# -- errors a submission causes in a metric ---------------------------------------------------


def test_a_kappa_grade_beyond_int64_is_invalid_not_a_grader_failure(tmp_path):
    task = mb_task(tmp_path, "mb-essay-kappa")
    sub = answers_of("mb-essay-kappa").astype({"score": object})
    for huge in (str(2**63), str(-(2**63) - 1), "1" + "0" * 400):
        sub.loc[0, "score"] = huge
        g, _ = grade_frame(task, sub, tmp_path)
        assert g.status == Status.INVALID_SUBMISSION, g
        assert "64-bit" in g.detail and g.benchmark == NO_SCORE["mlebench"], g.detail
    sub.loc[0, "score"] = str(2**62)  # in range: a grade no answer has, scored
    g, _ = grade_frame(task, sub, tmp_path)
    truth = answers_of("mb-essay-kappa")["score"].to_numpy()
    expected = cohen_kappa_score(truth, sub["score"].astype(np.int64).to_numpy(),
                                 weights="quadratic")  # fmt: skip
    assert g.status == Status.VALID and g.score == pytest.approx(expected)


def test_any_error_the_metric_raises_on_a_submission_is_invalid(tmp_path, monkeypatch):
    """Whatever the metric raises on a submission's values (here a ZeroDivisionError and an
    OverflowError planted in it) is that submission's INVALID, naming the error."""
    from wmrl.autoresearch.env.competitions import grading

    task = mb_task(tmp_path, "mb-essay-kappa")
    for error in (ZeroDivisionError("float division by zero"), OverflowError("too big")):

        def broken(*_args, error=error):
            raise error

        monkeypatch.setattr(grading, "score", broken)
        g, _ = grade_frame(task, answers_of("mb-essay-kappa"), tmp_path)
        assert g.status == Status.INVALID_SUBMISSION, g
        assert type(error).__name__ in g.detail and str(error) in g.detail, g.detail


@pytest.mark.real
def test_through_the_real_pool_a_kappa_overflow_is_invalid_and_graded_once(tmp_path):
    """The script runs in the real sandbox and writes one grade above int64: the pool's
    record is INVALID_SUBMISSION with the no-score verdict, graded once, not UNGRADED. A
    submission the pool itself refuses (over its size cap) carries that verdict too."""
    from wmrl.autoresearch.env.pool import SandboxPool

    task = mb_task(tmp_path, "mb-essay-kappa")
    script = textwrap.dedent("""
        import os, pandas as pd
        te = pd.read_csv(os.path.join(os.environ["DATA_DIR"], "test.csv"))
        scores = ["3"] * len(te)
        scores[0] = str(2 ** 64)
        pd.DataFrame({"id": te["id"], "score": scores}).to_csv(
            os.environ["SUBMISSION_PATH"], index=False)
    """)
    too_large = textwrap.dedent("""
        import os
        with open(os.environ["SUBMISSION_PATH"], "w") as f:
            f.write("id,score\\n" + "1,1\\n" * 400_000)
    """)
    with SandboxPool(num_workers=1, submission_mb=1) as pool:
        r = pool.run(task, script)
        big = pool.run(task, too_large)  # INVALID by the pool itself: over submission_mb
    assert r.status == Status.INVALID_SUBMISSION, (r.status, r.detail, r.stderr_tail[-500:])
    assert "64-bit" in r.detail and r.benchmark == NO_SCORE["mlebench"], r.detail
    assert r.attempts == 1
    assert big.status == Status.INVALID_SUBMISSION and "larger than 1 MB" in big.detail, big
    assert big.benchmark == NO_SCORE["mlebench"]


# -- quadratic weighted kappa in linear memory -------------------------------------------------


def test_quadratic_weighted_kappa_agrees_with_scikit_learn():
    rng = np.random.default_rng(5)
    for n, k in ((40, 6), (500, 300), (2000, 1500)):
        t = rng.integers(0, k, n)
        p = np.clip(t + rng.integers(-3, 4, n), 0, k - 1) if k < 100 else rng.integers(0, k, n)
        expected = cohen_kappa_score(t, p, weights="quadratic")
        assert quadratic_weighted_kappa(t, p) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # by hand: grades 1, 2, 3 against 1, 3, 3 -> positions (0,1,2) vs (0,2,2); observed
    # sum of squared position gaps 1; expected 3 * (var t + var p + (mean gap)^2)
    # = 3 * (2/3 + 8/9 + 1/9) = 5; kappa = 1 - 1/5
    assert quadratic_weighted_kappa(np.array([1, 2, 3]), np.array([1, 3, 3])) == pytest.approx(0.8)


MEMORY_PROBE = """
import resource, sys, time, tracemalloc
import numpy as np
from wmrl.autoresearch.env.competitions.metrics import quadratic_weighted_kappa
k = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]) * 2**20,) * 2)
rng = np.random.default_rng(0)
t = rng.permutation(k)  # every grade distinct, k rows
p = rng.permutation(k)
tracemalloc.start()
start = time.process_time()
value = quadratic_weighted_kappa(t, p)
cpu = time.process_time() - start
print(value, tracemalloc.get_traced_memory()[1], cpu)
"""


@pytest.mark.parametrize("k", [4000, 50_000])
def test_quadratic_weighted_kappa_memory_is_linear_in_the_distinct_grades(k):
    """50,000 distinct grades: a dense k x k matrix would be 20 GB. Run in a child capped at
    1.5 GB of address space (dense matrices hit MemoryError there); its peak traced memory
    must stay within 64 bytes per row plus 1 MB."""
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(k), "1536"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    value, peak, _cpu = out.stdout.split()
    assert -1.0 <= float(value) <= 1.0
    assert int(peak) <= 64 * k + 2**20, f"peak {int(peak):,} bytes for {k:,} grades"


# -- a competition with more class columns than the default header cap ----------------------


def many_classes(root: Path, n_classes: int) -> tuple[Path, Path]:
    """An MLE-Dojo competition (its layout) with one probability column per class."""
    comps, data = root / "MLE-Dojo" / "competitions", root / "mledojo-data"
    name = "md-many-classes"
    public, private = data / name / "data" / "public", data / name / "data" / "private"
    public.mkdir(parents=True)
    private.mkdir(parents=True)
    (comps / name / "utils").mkdir(parents=True)
    (comps / name / "utils" / "metric.py").write_text(
        "from mledojo.metrics.base import CompetitionMetrics\n\n\n"
        "class M(CompetitionMetrics):\n    def __init__(self, higher_is_better: bool = False):\n"
        "        super().__init__(higher_is_better)\n"
    )
    rng = np.random.default_rng(0)
    classes = [f"c{i:05d}" for i in range(n_classes)]
    train_y = rng.integers(0, n_classes, 60)
    pd.DataFrame(
        {"id": range(60), "f0": rng.normal(size=60), "label": np.array(classes)[train_y]}
    ).to_csv(public / "train.csv", index=False)
    test_ids = np.arange(100, 120)
    pd.DataFrame({"id": test_ids, "f0": rng.normal(size=20)}).to_csv(public / "test.csv",
                                                                        index=False)  # fmt: skip
    one_hot = np.zeros((20, n_classes), dtype=np.int8)
    one_hot[np.arange(20), rng.integers(0, n_classes, 20)] = 1
    answers = pd.concat([pd.DataFrame({"id": test_ids}), pd.DataFrame(one_hot, columns=classes)],
                        axis=1)  # fmt: skip
    answers.to_csv(private / "test_answer.csv", index=False)
    sample = answers.copy()
    sample[classes] = 1.0 / n_classes
    sample.to_csv(public / "sample_submission.csv", index=False)
    (public / "description.txt").write_text("many classes\n")
    for board, scores in (("private", [0.5, 1.0, 2.0]), ("public", [0.6, 1.2])):
        pd.DataFrame({"rank": range(1, len(scores) + 1), "score": scores}).to_csv(
            private / f"{board}_leaderboard.csv", index=False
        )
    return comps, data


def test_a_competition_with_more_class_columns_than_the_default_cap_grades_its_answers(tmp_path):
    n = MAX_COLUMNS + 100  # 1,100 class columns
    comps, data = many_classes(tmp_path, n)
    source = mledojo.read_mledojo(data, "md-many-classes", "multi-class-log-loss", comps)
    task = load_task(write_competition_task(source, tmp_path / "suite" / "md-many-classes"))
    answers = pd.read_csv(data / "md-many-classes" / "data" / "private" / "test_answer.csv")
    g, _ = grade_frame(task, answers, tmp_path)
    assert g.status == Status.VALID, g.detail
    assert g.score == pytest.approx(-np.log(1 - 1e-15), abs=1e-12)  # one-hot, clipped
    assert g.benchmark["positions"]["private"]["position"] == 1
    extra = pd.concat([answers, pd.DataFrame({"extra": np.zeros(len(answers), int)})], axis=1)
    g, _ = grade_frame(task, extra, tmp_path)  # one column too many
    assert g.status == Status.INVALID_SUBMISSION and "column" in g.detail, g.detail


def test_a_competition_beyond_the_column_ceiling_is_refused_naming_the_count(tmp_path):
    from wmrl.autoresearch.env.competitions.source import MAX_PREDICTION_COLUMNS

    n = MAX_PREDICTION_COLUMNS + 1
    comps, data = many_classes(tmp_path, n)
    source = mledojo.read_mledojo(data, "md-many-classes", "multi-class-log-loss", comps)
    with pytest.raises(TaskError) as e:
        write_competition_task(source, tmp_path / "suite" / "md-many-classes")
    assert f"{n:,} prediction columns" in str(e.value), str(e.value)
    assert "md-many-classes" in str(e.value)
