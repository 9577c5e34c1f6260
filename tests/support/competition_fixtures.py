"""Small synthetic competitions in the two benchmarks' prepared layouts, built on the fly.

MLE-bench (``mlebench prepare``): a checkout's ``competitions/<id>/`` (config.yaml,
description.md, leaderboard.csv) and a data dir's ``<id>/prepared/{public,private}`` plus
the download ``<id>/raw``. MLE-Dojo (``prepare/mle.py``): ``<id>/data/public`` (with
description.txt), ``<id>/data/private`` (test_answer.csv, public_ and private_leaderboard.csv)
and ``<id>/raw``, and the checkout's ``competitions/<id>/utils/metric.py``.

Four competitions cover what the grader must handle:

    mb-house-price   MLE-bench, regression, RMSE (lower is better), one prediction column
    mb-toxic-tags    MLE-bench, three 0/1 label columns, column-wise ROC AUC
    md-flower-kind   MLE-Dojo, multiclass with string labels, accuracy
    md-leaf-probs    MLE-Dojo, class-probability columns, multi-class log loss (lower is
                     better), rows scored whole

Others, built only by the tests that name them, reproduce what real competitions do:

    mb-spaceship     MLE-bench, accuracy on True/False answers (spaceship-titanic's), id
                     column PassengerId
    mb-click-auc     MLE-bench, ROC AUC on one 0/1 column (its grade.py range-checks)
    mb-essay-kappa   MLE-bench, quadratic weighted kappa on grades 1-6
    md-access        MLE-Dojo, ROC AUC, a train.csv without an id column (as
                     amazon-employee-access-challenge's prepare.py writes it)
    conductors       both benchmarks under the same id (nomad2018's two columns, mean
                     column-wise RMSLE, lower is better)

An MLE-bench data dir also keeps the Kaggle download ``<id>/<id>.zip`` (``mlebench prepare``
leaves it there), which holds the original train.csv and so every answer.

Every leaderboard is hand-made (``BOARDS``), so a test can compute ranks, medals and
position scores by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

N_TRAIN, N_TEST = 80, 40
SPECIES = ("setosa", "versicolor", "virginica")

# Best first, as the benchmarks store them. MLE-bench: 50 teams (gold at position 5, silver
# 10, bronze 20); MLE-Dojo: a private and a public board.
BOARDS = {
    "mb-house-price": {"leaderboard": [round(0.5 + 0.1 * i, 5) for i in range(50)]},
    "mb-toxic-tags": {"leaderboard": [round(0.99 - 0.01 * i, 5) for i in range(50)]},
    "md-flower-kind": {
        "private": [1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3],
        "public": [1.0, 0.9, 0.8, 0.6, 0.4],
    },
    "md-leaf-probs": {
        "private": [0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.1, 1.5],
        "public": [0.2, 0.4, 0.8, 1.6],
    },
    "mb-spaceship": {"leaderboard": [round(0.82 - 0.006 * i, 5) for i in range(50)]},
    "mb-click-auc": {"leaderboard": [round(0.95 - 0.008 * i, 5) for i in range(50)]},
    "mb-essay-kappa": {"leaderboard": [round(0.85 - 0.01 * i, 5) for i in range(50)]},
    "md-access": {
        "private": [0.92, 0.9, 0.88, 0.85, 0.8, 0.75, 0.7, 0.6],
        "public": [0.91, 0.87, 0.8, 0.7],
    },
    "conductors": {
        "leaderboard": [round(0.05 + 0.005 * i, 5) for i in range(50)],
        "private": [0.05, 0.06, 0.08, 0.1, 0.2, 0.3],
        "public": [0.055, 0.07, 0.12, 0.25],
    },
}
METRIC_WORDS = {  # what each competition calls its metric (MLE-Dojo: the import's --metrics)
    "mb-house-price": "root-mean-squared-error",
    "mb-toxic-tags": "mean-column-wise-roc-auc",
    "md-flower-kind": "accuracy",
    "md-leaf-probs": "multi-class-log-loss",
    "mb-spaceship": "accuracy",
    "mb-click-auc": "auc-roc",
    "mb-essay-kappa": "quadratic-weighted-kappa",
    "md-access": "roc-auc",
    "conductors": "mean-column-wise-rmsle",
}
ID_COLUMNS = {"mb-spaceship": "PassengerId"}  # default "id"
LOWER_IS_BETTER = ("mb-house-price", "md-leaf-probs", "conductors")
MLEBENCH = ("mb-house-price", "mb-toxic-tags")
MLEDOJO = ("md-flower-kind", "md-leaf-probs")


def id_column(name: str) -> str:
    return ID_COLUMNS.get(name, "id")


def _frames(name: str, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(train, test features, answers) of a competition; answers has the sample submission's
    columns."""
    rng = np.random.default_rng(seed)
    n = N_TRAIN + N_TEST
    X = rng.normal(size=(n, 3))
    ids = np.arange(1000, 1000 + n)
    if name == "mb-spaceship":  # spaceship-titanic's ids: group and member, "0013_01"
        ids = np.array([f"{i:04d}_{1 + i % 3:02d}" for i in range(n)])
    key = id_column(name)
    feats = pd.DataFrame({key: ids, "f0": X[:, 0], "f1": X[:, 1], "f2": X[:, 2]})
    if name == "mb-house-price":
        y = pd.DataFrame({"price": 3.0 * X[:, 0] - X[:, 1] + rng.normal(scale=0.5, size=n)})
    elif name == "mb-toxic-tags":
        y = pd.DataFrame({
            "toxic": (X[:, 0] > 0).astype(int),
            "obscene": (X[:, 1] > 0.3).astype(int),
            "threat": (X[:, 0] + X[:, 2] > 0.5).astype(int),
        })  # fmt: skip
    elif name == "md-flower-kind":
        kind = np.digitize(X[:, 0] + 0.3 * X[:, 1], [-0.5, 0.5])
        y = pd.DataFrame({"species": np.array(SPECIES)[kind]})
    elif name == "mb-spaceship":  # pandas writes a bool column as True / False
        y = pd.DataFrame({"Transported": X[:, 0] + 0.5 * X[:, 1] > 0})
    elif name == "mb-click-auc":
        y = pd.DataFrame({"clicked": (X[:, 0] - X[:, 2] > 0.2).astype(int)})
    elif name == "md-access":
        y = pd.DataFrame({"ACTION": (X[:, 1] > -0.8).astype(int)})
    elif name == "mb-essay-kappa":
        y = pd.DataFrame({"score": np.digitize(X[:, 0], [-1.2, -0.5, 0.0, 0.5, 1.2]) + 1})
    elif name == "conductors":
        y = pd.DataFrame({
            "formation_energy_ev_natom": np.abs(0.2 + 0.05 * X[:, 0]),
            "bandgap_energy_ev": np.abs(2.0 + 0.8 * X[:, 1]),
        })  # fmt: skip
    else:  # md-leaf-probs: the label in train.csv, one probability column per class
        kind = np.digitize(X[:, 0] - 0.5 * X[:, 2], [-0.4, 0.4])
        y = pd.DataFrame({"leaf": np.array(["acer", "betula", "quercus"])[kind]})
    train = pd.concat([feats, y], axis=1)[:N_TRAIN]
    if name == "md-access":  # MLE-Dojo's prepare.py: the id is added to test rows only
        train = train.drop(columns=[key])
    test = feats[N_TRAIN:].reset_index(drop=True)
    truth = y[N_TRAIN:].reset_index(drop=True)
    if name == "md-leaf-probs":
        answers = pd.DataFrame({"id": test["id"]})
        for c in ("acer", "betula", "quercus"):
            answers[c] = (truth["leaf"] == c).astype(int)
    else:
        answers = pd.concat([test[[key]], truth], axis=1)
    return train, test, answers


def sample_submission(answers: pd.DataFrame) -> pd.DataFrame:
    sample = answers.copy()
    for c in sample.columns[1:]:
        sample[c] = answers[c].iloc[0]
    return sample


def make_mlebench(root: Path, names=MLEBENCH) -> tuple[Path, Path]:
    """An MLE-bench checkout's competitions dir and a prepared data dir under ``root``."""
    comps, data = root / "mle-bench" / "competitions", root / "mlebench-data"
    for name in names:
        train, test, answers = _frames(name)
        cdir = comps / name
        cdir.mkdir(parents=True)
        (cdir / "config.yaml").write_text(
            textwrap.dedent(f"""\
            id: {name}
            name: {name}
            competition_type: simple
            awards_medals: true
            description: mlebench/competitions/{name}/description.md
            dataset:
              answers: {name}/prepared/private/test.csv
              sample_submission: {name}/prepared/public/sample_submission.csv
            grader:
              name: {METRIC_WORDS[name]}
              grade_fn: mlebench.competitions.{name}.grade:grade
            preparer: mlebench.competitions.{name}.prepare:prepare
            """)
        )
        (cdir / "description.md").write_text(f"# {name}\n\nPredict the columns of the sample.\n")
        board = BOARDS[name]["leaderboard"]
        pd.DataFrame({"teamName": [f"team{i}" for i in range(len(board))], "score": board}).to_csv(
            cdir / "leaderboard.csv", index=False
        )
        public, private = data / name / "prepared" / "public", data / name / "prepared" / "private"
        public.mkdir(parents=True)
        private.mkdir(parents=True)
        train.to_csv(public / "train.csv", index=False)
        test.to_csv(public / "test.csv", index=False)
        sample_submission(answers).to_csv(public / "sample_submission.csv", index=False)
        (public / "description.md").write_text(f"# {name}\n\nPredict the columns of the sample.\n")
        answers.to_csv(private / "test.csv", index=False)
        _raw(data / name, train, test, answers)
        with zipfile.ZipFile(data / name / f"{name}.zip", "w") as z:  # the Kaggle download
            z.write(data / name / "raw" / "train.csv", "train.csv")
    return comps, data


DOJO_METRIC = '''
from mledojo.metrics.base import CompetitionMetrics


class {cls}(CompetitionMetrics):
    """{doc}"""

    def __init__(self, value: str = "x", higher_is_better: bool = {higher}):
        super().__init__(higher_is_better)
'''


def make_mledojo(root: Path, names=MLEDOJO) -> tuple[Path, Path]:
    """An MLE-Dojo checkout's competitions dir and a prepared data dir under ``root``."""
    comps, data = root / "MLE-Dojo" / "competitions", root / "mledojo-data"
    for name in names:
        train, test, answers = _frames(name)
        utils = comps / name / "utils"
        utils.mkdir(parents=True)
        higher = "False" if name in LOWER_IS_BETTER else "True"
        (utils / "metric.py").write_text(
            DOJO_METRIC.format(cls="Metrics", doc=METRIC_WORDS[name], higher=higher)
        )
        public, private = data / name / "data" / "public", data / name / "data" / "private"
        public.mkdir(parents=True)
        private.mkdir(parents=True)
        train.to_csv(public / "train.csv", index=False)
        test.to_csv(public / "test.csv", index=False)
        sample_submission(answers).to_csv(public / "sample_submission.csv", index=False)
        (public / "description.txt").write_text(f"{name}: predict what the sample asks.\n")
        answers.to_csv(private / "test_answer.csv", index=False)
        for board in ("private", "public"):
            scores = BOARDS[name][board]
            pd.DataFrame({"rank": range(1, len(scores) + 1), "score": scores}).to_csv(
                private / f"{board}_leaderboard.csv", index=False
            )
        _raw(data / name, train, test, answers)
    return comps, data


def _raw(comp_dir: Path, train, test, answers) -> None:
    """The benchmark's download: the original training data, the test rows' answers in it."""
    raw = comp_dir / "raw"
    raw.mkdir()
    key = answers.columns[0]
    rows = test.merge(answers, on=key)
    if key not in train.columns:
        rows = rows.drop(columns=[key])
    full = pd.concat([train, rows], ignore_index=True)
    full.to_csv(raw / "train.csv", index=False)


def open_to_all(root: Path) -> None:
    """The modes a download under umask 022 has: every directory 0755, every file 0644 (the
    import must make the answers' directories private)."""
    for dirpath, _dirs, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)


def metrics_file(root: Path, names=MLEDOJO) -> Path:
    """The JSON the import's --metrics takes for the MLE-Dojo competitions ``names``."""
    path = root / "dojo_metrics.json"
    path.write_text(json.dumps({n: METRIC_WORDS[n] for n in names}))
    return path


def answers_of(name: str) -> pd.DataFrame:
    return _frames(name)[2]


# Honest solutions, one per competition: each writes the sample submission's columns.
SOLUTIONS = {
    "mb-house-price": """
import os, pandas as pd
from sklearn.linear_model import LinearRegression
d = os.environ["DATA_DIR"]
tr, te = pd.read_csv(os.path.join(d, "train.csv")), pd.read_csv(os.path.join(d, "test.csv"))
f = ["f0", "f1", "f2"]
p = LinearRegression().fit(tr[f], tr["price"]).predict(te[f])
pd.DataFrame({"id": te["id"], "price": p}).to_csv(os.environ["SUBMISSION_PATH"], index=False)
""",
    "mb-toxic-tags": """
import os, pandas as pd
from sklearn.linear_model import LogisticRegression
d = os.environ["DATA_DIR"]
tr, te = pd.read_csv(os.path.join(d, "train.csv")), pd.read_csv(os.path.join(d, "test.csv"))
sample = pd.read_csv(os.path.join(d, "sample_submission.csv"))
f = ["f0", "f1", "f2"]
out = pd.DataFrame({"id": te["id"]})
for c in sample.columns[1:]:
    out[c] = LogisticRegression().fit(tr[f], tr[c]).predict_proba(te[f])[:, 1]
out.to_csv(os.environ["SUBMISSION_PATH"], index=False)
""",
    "md-flower-kind": """
import os, pandas as pd
from sklearn.linear_model import LogisticRegression
d = os.environ["DATA_DIR"]
tr, te = pd.read_csv(os.path.join(d, "train.csv")), pd.read_csv(os.path.join(d, "test.csv"))
f = ["f0", "f1", "f2"]
p = LogisticRegression().fit(tr[f], tr["species"]).predict(te[f])
pd.DataFrame({"id": te["id"], "species": p}).to_csv(os.environ["SUBMISSION_PATH"], index=False)
""",
    "md-leaf-probs": """
import os, pandas as pd
from sklearn.linear_model import LogisticRegression
d = os.environ["DATA_DIR"]
tr, te = pd.read_csv(os.path.join(d, "train.csv")), pd.read_csv(os.path.join(d, "test.csv"))
f = ["f0", "f1", "f2"]
m = LogisticRegression().fit(tr[f], tr["leaf"])
out = pd.DataFrame(m.predict_proba(te[f]), columns=m.classes_)
out.insert(0, "id", te["id"])
out.to_csv(os.environ["SUBMISSION_PATH"], index=False)
""",
}


REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wmrl.autoresearch.env.competitions", *args],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def import_both(root: Path) -> Path:
    """Both layouts prepared under ``root`` (modes as a umask-022 download has them) and
    imported through the CLI: MLE-bench as training tasks, MLE-Dojo as held-out ones."""
    mb_comps, mb_data = make_mlebench(root)
    md_comps, md_data = make_mledojo(root)
    open_to_all(root)
    suite = root / "suite"
    out = run_cli("--benchmark=mlebench", f"--competitions_dir={mb_comps}",
                  f"--data_dir={mb_data}", f"--out={suite}", "--time_limit=20")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert sorted(json.loads(out.stdout)["imported"]) == sorted(MLEBENCH)
    out = run_cli("--benchmark=mledojo", f"--competitions_dir={md_comps}", f"--data_dir={md_data}",
                  f"--metrics={metrics_file(root)}", f"--out={suite}", "--split=heldout",
                  "--time_limit=20")  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert sorted(report["imported"]) == sorted(MLEDOJO) and report["refused"] == {}
    return suite
