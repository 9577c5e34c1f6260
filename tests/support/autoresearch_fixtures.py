"""Tiny tasks for the Mini AutoResearch tests, built on the fly (no baselines run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from wmrl.autoresearch.env.make_task import write_task
from wmrl.autoresearch.env.task import load_task


def tiny_classification_df(n: int = 120, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] > 0, "yes", "no")
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["colour"] = rng.choice(["red", "green"], size=n)
    df["label"] = y
    return df


def make_tiny_task(root: Path, scores=(0.5, 0.7, 0.9), time_limit_s: float = 3.0, **kw):
    """A 120-row binary task with a fixed, hand-written leaderboard."""
    out = write_task(
        tiny_classification_df(),
        root,
        task_id=root.name,
        target="label",
        metric=kw.pop("metric", "accuracy"),
        time_limit_s=time_limit_s,
        memory_mb=kw.pop("memory_mb", 512),
        **kw,
    )
    (out / "leaderboard.json").write_text(json.dumps({"scores": list(scores)}))
    return load_task(out)


GOOD_SCRIPT = """
import os
import pandas as pd
from sklearn.linear_model import LogisticRegression
d = os.environ["DATA_DIR"]
tr = pd.read_csv(os.path.join(d, "train.csv"))
te = pd.read_csv(os.path.join(d, "test.csv"))
cols = ["a", "b", "c"]
m = LogisticRegression().fit(tr[cols], tr["label"])
pd.DataFrame({"id": te["id"], "label": m.predict(te[cols])}).to_csv(
    os.environ["SUBMISSION_PATH"], index=False)
"""


def good_script_score(task) -> float:
    """The accuracy GOOD_SCRIPT must get, computed here without any sandbox."""
    from sklearn.linear_model import LogisticRegression

    tr = pd.read_csv(task.public_dir / "train.csv")
    te = pd.read_csv(task.public_dir / "test.csv")
    labels = pd.read_csv(task.labels_path)
    m = LogisticRegression().fit(tr[["a", "b", "c"]], tr["label"])
    pred = pd.Series(m.predict(te[["a", "b", "c"]]), index=te["id"])
    return float((pred.loc[labels["id"]].to_numpy() == labels["label"].to_numpy()).mean())
