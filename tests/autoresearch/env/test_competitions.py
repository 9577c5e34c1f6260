"""Benchmark competitions (MLE-bench, MLE-Dojo) as tasks: the import CLI, loading, the refusals,
grading by the competition's metric with the benchmark's own verdict, and the pool end to end.

The competitions are the synthetic ones of ``tests/support/competition_fixtures.py`` (a
regression, three label columns, string class labels, class-probability columns), prepared in
each benchmark's layout.
Expected scores, percentiles, medals and position scores are computed here by hand or with
scikit-learn, never by the code under test.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import accuracy_score, log_loss, mean_squared_error, roc_auc_score

from tests.support.competition_fixtures import (
    BOARDS,
    MLEBENCH,
    MLEDOJO,
    SOLUTIONS,
    answers_of,
    import_both,
    make_mlebench,
    make_mledojo,
    run_cli,
)
from wmrl.autoresearch.env.competitions import leaderboard, mlebench, mledojo
from wmrl.autoresearch.env.competitions.task_dir import write_competition_task
from wmrl.autoresearch.env.grader import Status, grade_submission
from wmrl.autoresearch.env.task import TaskError, load_suite, load_task

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("competitions")
    return root, import_both(root)


@pytest.fixture(scope="module")
def tasks(prepared):
    return {t.id: t for t in load_suite(prepared[1])}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- import and load ------------------------------------------------------------------------


def test_import_makes_tasks_with_public_data_only(prepared, tasks):
    root = prepared[0]
    assert sorted(tasks) == sorted(MLEBENCH + MLEDOJO)
    assert {t.split for t in tasks.values() if t.id in MLEBENCH} == {"train"}
    assert {t.split for t in tasks.values() if t.id in MLEDOJO} == {"heldout"}
    expected = {  # (type, metric, target, submission columns)
        "mb-house-price": ("regression", "rmse", "price", ["price"]),
        "mb-toxic-tags": ("classification", "mean_roc_auc", "toxic",
                          ["toxic", "obscene", "threat"]),
        "md-flower-kind": ("classification", "accuracy", "species", ["species"]),
        "md-leaf-probs": ("classification", "multiclass_logloss", "leaf",
                          ["acer", "betula", "quercus"]),
    }  # fmt: skip
    for name, t in tasks.items():
        kind, metric, target, columns = expected[name]
        assert (t.type, t.metric_name, t.target, t.competition["columns"]) == (
            kind, metric, target, columns,
        )  # fmt: skip
        assert t.reference_scores == ()  # the leaderboards stay on disk, under private/
        public = sorted(p.name for p in t.public_dir.iterdir())
        assert public == ["description.md", "sample_submission.csv", "test.csv", "train.csv"]
        test_cols = pd.read_csv(t.public_dir / "test.csv").columns
        assert not set(columns) & set(test_cols)
        assert mode(t.root / "private") == 0o700
        assert all(mode(p) == 0o600 for p in (t.root / "private").iterdir())
        card = t.card
        assert f"- Submission columns: `id`, {', '.join(f'`{c}`' for c in columns)}" in card
        assert "lower is better" in card if metric in ("rmse", "multiclass_logloss") else True
    # The benchmarks' own answers and downloads were made private by the import.
    for name in MLEBENCH:
        for sub in ("prepared/private", "raw"):
            assert mode(root / "mlebench-data" / name / sub) == 0o700, sub
    for name in MLEDOJO:
        for sub in ("data/private", "raw"):
            assert mode(root / "mledojo-data" / name / sub) == 0o700, sub
    # The suite index a trainer's suite.dir needs: both imports, one entry per task.
    index = json.loads((prepared[1] / "suite.json").read_text())
    assert [(e["id"], e["split"], e["benchmark"]) for e in index] == [
        ("mb-house-price", "train", "mlebench"), ("mb-toxic-tags", "train", "mlebench"),
        ("md-flower-kind", "heldout", "mledojo"), ("md-leaf-probs", "heldout", "mledojo"),
    ]  # fmt: skip
    # The answers kept are exactly the benchmark's (the sample submission's columns).
    kept = pd.read_csv(tasks["md-leaf-probs"].root / "private" / "answers.csv")
    pd.testing.assert_frame_equal(kept, answers_of("md-leaf-probs"))


def test_the_cli_stops_on_the_first_refusal_or_lists_them_with_keep_going(tmp_path):
    comps, data = make_mlebench(tmp_path)
    (comps / "mb-toxic-tags" / "config.yaml").unlink()
    out = run_cli("--benchmark=mlebench", f"--competitions_dir={comps}", f"--data_dir={data}",
                  f"--out={tmp_path / 'suite'}")  # fmt: skip
    assert out.returncode != 0
    assert "mb-toxic-tags" in out.stderr and "no MLE-bench config" in out.stderr, out.stderr
    out = run_cli("--benchmark=mlebench", f"--competitions_dir={comps}", f"--data_dir={data}",
                  f"--out={tmp_path / 'suite'}", "--keep_going")  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert list(report["imported"]) == ["mb-house-price"]
    assert "config.yaml" in report["refused"]["mb-toxic-tags"]
    out = run_cli("--benchmark=mledojo", f"--data_dir={data}", f"--out={tmp_path / 'x'}")
    assert out.returncode != 0 and "no mledojo competition is prepared" in out.stderr, out.stderr


# -- refusals -------------------------------------------------------------------------------


def _mb(root):
    comps, data = make_mlebench(root)
    return comps, data, lambda name="mb-house-price": mlebench.read_mlebench(comps, data, name)


def _md(root, metric="accuracy", name="md-flower-kind"):
    comps, data = make_mledojo(root)
    return comps, data, lambda m=metric, n=name: mledojo.read_mledojo(data, n, m, comps)


def _lfs_pointer(comps, data, read):
    (comps / "mb-house-price" / "leaderboard.csv").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n"
    )
    return read()


def _drop_answer_row(comps, data, read):
    path = data / "mb-house-price" / "prepared" / "private" / "test.csv"
    pd.read_csv(path)[1:].to_csv(path, index=False)
    return read()


def _unknown_metric(comps, data, read):
    path = comps / "mb-house-price" / "config.yaml"
    path.write_text(path.read_text().replace("root-mean-squared-error", "weighted-gini-xyz"))
    return read()


def _not_prepared(comps, data, read):
    shutil.rmtree(data / "mb-house-price" / "prepared")
    return read()


def _not_tabular(comps, data, read):
    (data / "mb-house-price" / "prepared" / "public" / "train.csv").unlink()
    return read()


def _board_order(comps, data, read):
    path = data / "md-flower-kind" / "data" / "private" / "private_leaderboard.csv"
    board = pd.read_csv(path)
    board["score"] = board["score"].to_numpy()[::-1]
    board.to_csv(path, index=False)
    return read()


def _no_boards(comps, data, read):
    for f in (data / "md-flower-kind" / "data" / "private").glob("*_leaderboard.csv"):
        f.unlink()
    return read()


REFUSALS = [
    (_mb, lambda c, d, r: (c / "mb-house-price" / "config.yaml").unlink() or r(),
     "no MLE-bench config"),
    (_mb, _not_prepared, "mlebench prepare -c mb-house-price"),
    (_mb, _lfs_pointer, "Git LFS pointer"),
    (_mb, _drop_answer_row, "are not test.csv's"),
    (_mb, _unknown_metric, "unknown metric 'weighted-gini-xyz'"),
    (_mb, _not_tabular, "no public train.csv"),
    (lambda r: _md(r, metric=None), lambda c, d, r: r(), "names its metric only in code"),
    (lambda r: _md(r, metric="log-loss"), lambda c, d, r: r(), "higher_is_better=True"),
    (_md, _board_order, "ordered as if lower scores were better"),
    (_md, _no_boards, "no leaderboard"),
]  # fmt: skip


@pytest.mark.parametrize("setup,breaks,says", REFUSALS, ids=[r[2][:30] for r in REFUSALS])
def test_a_broken_competition_is_refused_naming_the_problem(tmp_path, setup, breaks, says):
    comps, data, read = setup(tmp_path)
    out = tmp_path / "suite" / "task"
    with pytest.raises(TaskError) as e:
        write_competition_task(breaks(comps, data, read), out)
    assert says in str(e.value), str(e.value)
    assert "competition md-flower-kind" in str(e.value) or "mb-house-price" in str(e.value)
    assert not out.exists()


def test_a_task_dir_whose_answers_changed_is_refused_at_load(prepared, tmp_path):
    task_dir = tmp_path / "copy"
    shutil.copytree(prepared[1] / "mb-house-price", task_dir)
    answers = task_dir / "private" / "answers.csv"
    pd.read_csv(answers).drop(columns=["price"]).to_csv(answers, index=False)
    with pytest.raises(TaskError, match="lack the submission's columns"):
        load_task(task_dir)


def test_a_malformed_competition_block_is_refused_naming_the_field(prepared, tmp_path):
    task_dir = tmp_path / "copy"
    shutil.copytree(prepared[1] / "md-flower-kind", task_dir)
    meta = json.loads((task_dir / "task.json").read_text())
    cases = [
        ({**meta["competition"], "benchmark": "kaggle"}, "competition.benchmark 'kaggle'"),
        ({**meta["competition"], "answers": "../answers.csv"}, "must be a file name in private/"),
        ({**meta["competition"], "leaderboards": {"final": "x.csv"}},
         "competition.leaderboards must map some of ('private', 'public')"),
        ({k: v for k, v in meta["competition"].items() if k != "columns"}, "lacks ['columns']"),
    ]  # fmt: skip
    for block, says in cases:
        (task_dir / "task.json").write_text(json.dumps({**meta, "competition": block}))
        with pytest.raises(TaskError) as e:
            load_task(task_dir)
        assert says in str(e.value), str(e.value)


# -- grading --------------------------------------------------------------------------------


def mid_rank(score, board, higher):
    """The reward ladder's percentile, by hand: beaten entries plus half the ties."""
    board = np.asarray(board)
    worse = np.sum(board < score) if higher else np.sum(board > score)
    return (worse + 0.5 * np.sum(board == score)) / len(board)


def submission(name: str) -> tuple[pd.DataFrame, float]:
    """A submission with a known score, and that score computed by scikit-learn."""
    ans = answers_of(name)
    sub = ans.copy()
    if name == "mb-house-price":  # every prediction off by 1.23: RMSE 1.23
        sub["price"] = ans["price"] + np.where(np.arange(len(ans)) % 2, 1.23, -1.23)
        return sub, float(np.sqrt(mean_squared_error(ans["price"], sub["price"])))
    if name == "mb-toxic-tags":  # two columns ranked perfectly, one constant: AUC 1, 1, 0.5
        sub["threat"] = 0.5
        aucs = [roc_auc_score(ans[c], sub[c]) for c in ("toxic", "obscene", "threat")]
        return sub, float(np.mean(aucs))
    if name == "md-flower-kind":  # the first 8 of 40 labels wrong: accuracy 0.8
        wrong = {"setosa": "virginica", "versicolor": "setosa", "virginica": "versicolor"}
        sub.loc[:7, "species"] = sub.loc[:7, "species"].map(wrong)
        return sub, accuracy_score(ans["species"], sub["species"])
    probs = np.where(ans[["acer", "betula", "quercus"]] == 1, 0.7, 0.15)  # log loss -ln 0.7
    sub[["acer", "betula", "quercus"]] = probs
    truth = ans[["acer", "betula", "quercus"]].to_numpy().argmax(axis=1)
    return sub, float(log_loss(truth, probs, labels=[0, 1, 2]))


HAND = {  # the benchmark's verdict on `submission(name)`, worked out from BOARDS by hand
    # 50 teams: gold at position 5 (0.9), silver 10 (1.4), bronze 20 (2.4); median 2.95.
    "mb-house-price": (1.23, {"medal": "silver", "any_medal": True, "above_median": True}),
    # 50 teams: gold 0.95, silver 0.90, bronze 0.80; median 0.745.
    "mb-toxic-tags": (0.83333, {"medal": "bronze", "any_medal": True, "above_median": True}),
    # private: 4 better of 10 -> position 5, (10-5+1)/10; public: 2 better of 5 -> 3, 3/5.
    "md-flower-kind": (0.8, {"position_score": (0.6 + 0.6) / 2}),
    # private: 3 better of 8 -> position 4, 5/8; public: 1 better of 4 -> 2, 3/4.
    "md-leaf-probs": (-np.log(0.7), {"position_score": (5 / 8 + 3 / 4) / 2}),
}


@pytest.mark.parametrize("name", [*MLEBENCH, *MLEDOJO])
def test_grading_uses_the_metric_and_records_the_benchmark_verdict(tasks, tmp_path, name):
    task = tasks[name]
    sub, expected = submission(name)
    hand_score, verdict = HAND[name]
    assert expected == pytest.approx(hand_score, abs=1e-5)  # the hand numbers are right
    path = tmp_path / "sub.csv"
    sub.sample(frac=1.0, random_state=1).to_csv(path, index=False)  # rows in any order
    g = grade_submission(task, path)
    assert g.status == Status.VALID, g
    assert g.score == pytest.approx(expected, rel=1e-9)
    board = BOARDS[name]["leaderboard" if name in MLEBENCH else "private"]
    higher = name in ("mb-toxic-tags", "md-flower-kind")
    assert g.percentile == pytest.approx(mid_rank(expected, board, higher))
    assert g.reward == pytest.approx(0.5 + 0.5 * g.percentile)
    for key, value in verdict.items():
        assert g.benchmark[key] == pytest.approx(value), (key, g.benchmark)
    assert g.benchmark["benchmark"] == ("mlebench" if name in MLEBENCH else "mledojo")


def _bad(name, change):
    sub = answers_of(name)
    return change(sub)


INVALID = [
    ("md-leaf-probs", lambda s: s.drop(columns=["betula"]), "lacks column"),
    ("md-leaf-probs", lambda s: s.assign(extra=1), "the sample submission lacks"),
    ("md-leaf-probs", lambda s: s.assign(acer=1.5), "probabilities in [0, 1]"),
    ("md-leaf-probs", lambda s: s.assign(acer=0, betula=0, quercus=0), "all 0"),
    ("md-leaf-probs", lambda s: s[1:], "rows"),
    ("mb-house-price", lambda s: pd.concat([s[:-1], s[:1]]), "duplicate ids"),
    ("mb-house-price", lambda s: s.assign(price="cheap"), "finite numbers"),
    ("mb-house-price", lambda s: s.assign(id=s["id"] + 1), "ids do not match"),
    ("md-flower-kind", lambda s: s.assign(species=""), "empty cells"),
]  # fmt: skip


@pytest.mark.parametrize("name,change,says", INVALID, ids=[f"{n}-{s}" for n, _, s in INVALID])
def test_invalid_submissions_get_the_invalid_rung(tasks, tmp_path, name, change, says):
    path = tmp_path / "sub.csv"
    change(answers_of(name)).to_csv(path, index=False)
    g = grade_submission(tasks[name], path)
    assert (g.status, g.reward, g.score) == (Status.INVALID_SUBMISSION, 0.2, None), g
    # the verdict documented for a submission that is not VALID: no medal, position score 0
    assert g.benchmark == (
        {"benchmark": "mlebench", "score": None, "medal": None, "any_medal": False,
         "above_median": False, "position_score": 0.0}
        if name in MLEBENCH
        else {"benchmark": "mledojo", "score": None, "position_score": 0.0, "positions": {}}
    ), g.benchmark  # fmt: skip
    assert says in g.detail, g.detail


def test_medal_positions_follow_the_leaderboard_size():
    """Kaggle's progression rules as MLE-bench applies them, one row of the table each."""
    assert leaderboard.medal_positions(50) == (5, 10, 20)
    assert leaderboard.medal_positions(7) == (1, 1, 2)
    assert leaderboard.medal_positions(150) == (10, 30, 60)
    assert leaderboard.medal_positions(500) == (11, 50, 100)
    assert leaderboard.medal_positions(2500) == (15, 125, 250)


def test_a_score_is_rounded_to_five_decimals_before_it_meets_a_threshold():
    board = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0])  # gold at position 1
    out = leaderboard.mlebench_outcome(0.8999999, board, higher_is_better=True)
    assert out["medal"] == "gold" and out["score"] == 0.9
    assert leaderboard.mlebench_outcome(None, board, True)["any_medal"] is False


# -- the pool, end to end -------------------------------------------------------------------


def test_honest_solutions_are_graded_through_the_real_pool(tasks, tmp_path):
    """Each competition's honest solution runs in the real sandbox (its sample submission
    readable there), is VALID, and the pool's result carries the benchmark's verdict on the
    same score the grader gives the same predictions outside the sandbox."""
    from wmrl.autoresearch.env.pool import SandboxPool

    with SandboxPool(num_workers=2) as pool:
        results = {n: pool.submit(tasks[n], SOLUTIONS[n]) for n in tasks}
        results = {n: f.result() for n, f in results.items()}
    for name, r in results.items():
        assert r.status == Status.VALID, (name, r.detail, r.stderr_tail[-800:])
        assert r.benchmark is not None and r.benchmark["score"] is not None
        mine = tmp_path / f"{name}.csv"  # the same solution, run here without a sandbox
        env = {**os.environ, "DATA_DIR": str(tasks[name].public_dir), "SUBMISSION_PATH": str(mine)}
        subprocess.run([sys.executable, "-c", SOLUTIONS[name]], env=env, check=True)
        assert r.score == pytest.approx(grade_submission(tasks[name], mine).score, rel=1e-9)
    assert results["md-leaf-probs"].benchmark["position_score"] > 0
    assert results["mb-house-price"].benchmark["medal"] in ("gold", "silver", "bronze", None)


def test_multi_turn_episodes_refuse_a_competition_task(tasks, tmp_path):
    from wmrl.autoresearch.env.episode import make_episode_task

    with pytest.raises(TaskError, match="imported mledojo competition"):
        make_episode_task(tasks["md-flower-kind"], tmp_path / "episodes")


def test_class_probabilities_are_rescaled_to_sum_to_one(tasks, tmp_path):
    """Kaggle's rule: each row divided by its sum before the log loss. Halving every
    probability of `submission`'s rows leaves the score as it was."""
    sub, expected = submission("md-leaf-probs")
    sub[["acer", "betula", "quercus"]] /= 2
    sub.to_csv(tmp_path / "half.csv", index=False)
    g = grade_submission(tasks["md-leaf-probs"], tmp_path / "half.csv")
    assert g.status == Status.VALID and g.score == pytest.approx(expected, rel=1e-9)


def test_the_metrics_agree_with_scikit_learn():
    from sklearn import metrics as sk

    from wmrl.autoresearch.env.competitions.metrics import get_competition_metric as get

    rng = np.random.default_rng(3)
    n = 60
    labels = rng.choice(["a", "b", "c"], size=n).astype(object)
    guess = np.where(rng.random(n) < 0.6, labels, rng.choice(["a", "b", "c"], size=n))
    binary = rng.integers(0, 2, size=(n, 2)).astype(float)
    scores = np.clip(binary * 0.4 + rng.random((n, 2)) * 0.6, 0.01, 0.99)
    y, p = rng.normal(size=(n, 3)) + 3, rng.normal(size=(n, 3)) + 3
    col = lambda a: a.reshape(-1, 1)
    one_hot = np.eye(3)[rng.integers(0, 3, size=n)]
    probs = rng.random((n, 3)) + 0.05
    cases = [
        ("accuracy", col(labels), col(guess), sk.accuracy_score(labels, guess)),
        ("f1_macro", col(labels), col(guess), sk.f1_score(labels, guess, average="macro")),
        ("f1_micro", col(labels), col(guess), sk.f1_score(labels, guess, average="micro")),
        ("f1_weighted", col(labels), col(guess),
         sk.f1_score(labels, guess, average="weighted")),
        ("f1", col(binary[:, 0].astype(int).astype(str).astype(object)),
         col((scores[:, 0] > 0.5).astype(int).astype(str).astype(object)),
         sk.f1_score(binary[:, 0], scores[:, 0] > 0.5)),
        ("qwk", col(rng.integers(0, 5, n)), col(rng.integers(0, 5, n)), None),
        ("roc_auc", binary[:, :1], scores[:, :1], sk.roc_auc_score(binary[:, 0], scores[:, 0])),
        ("mean_roc_auc", binary, scores, np.mean([sk.roc_auc_score(binary[:, j], scores[:, j])
                                                  for j in range(2)])),
        ("logloss", binary[:, :1], scores[:, :1], sk.log_loss(binary[:, 0], scores[:, 0])),
        ("multiclass_logloss", one_hot, probs,
         sk.log_loss(one_hot.argmax(1), probs / probs.sum(1, keepdims=True))),
        ("rmse", y[:, :1], p[:, :1], np.sqrt(sk.mean_squared_error(y[:, 0], p[:, 0]))),
        ("mse", y[:, :1], p[:, :1], sk.mean_squared_error(y[:, 0], p[:, 0])),
        ("mae", y[:, :1], p[:, :1], sk.mean_absolute_error(y[:, 0], p[:, 0])),
        ("r2", y[:, :1], p[:, :1], sk.r2_score(y[:, 0], p[:, 0])),
        ("rmsle", y[:, :1], p[:, :1], np.sqrt(sk.mean_squared_log_error(y[:, 0], p[:, 0]))),
        ("mean_rmsle", y, p, np.mean([np.sqrt(sk.mean_squared_log_error(y[:, j], p[:, j]))
                                      for j in range(3)])),
        ("mcrmse", y, p, np.mean([np.sqrt(sk.mean_squared_error(y[:, j], p[:, j]))
                                  for j in range(3)])),
    ]  # fmt: skip
    for name, t, q, expected in cases:
        if name == "qwk":
            expected = sk.cohen_kappa_score(t[:, 0], q[:, 0], weights="quadratic")
        assert get(name).fn(t, q) == pytest.approx(expected, rel=1e-9, abs=1e-12), name
    # MAP@3 by hand: row 1 hits at rank 2 (1/2), row 2 at ranks 1 and 3 of two true (1 + 2/3)/2
    truth = np.empty((2, 1), dtype=object)
    truth[:, 0] = [("x",), ("y", "z")]
    guess3 = np.empty((2, 1), dtype=object)
    guess3[:, 0] = [("w", "x", "v"), ("y", "w", "z")]
    assert get("map@3").fn(truth, guess3) == pytest.approx((0.5 + (1 + 2 / 3) / 2) / 2)
