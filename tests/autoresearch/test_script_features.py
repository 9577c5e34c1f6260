"""The script-feature scorer: features read off authored scripts with known mistakes, and the
ridge fit against a direct normal-equations solution (hand numbers and references)."""

import math
import random
import re
import time

import numpy as np
import pytest

from wmrl.autoresearch import script_features as sf
from wmrl.autoresearch.env import author
from wmrl.autoresearch.env.grader import MAX_SCRIPT_BYTES

INFO = author.TaskInfo("classification", "roc_auc", "label", "row_id", has_missing=True,
                       has_categorical=True, n_rows=500)  # fmt: skip
FACTS = sf.CardFacts("classification", "roc_auc", "label", "row_id", True, True, 500, 6, 20.0)


def feats(mistake=None, model="forest", params=None, impute=True, encode="onehot"):
    params = params or {"trees": 100, "depth": 6}
    spec = author.ScriptSpec(model, params, impute=impute, encode=encode, mistake=mistake)
    return sf.feature_dict(author.render(INFO, spec), FACTS)


def test_feature_names_match_the_vector():
    v = sf.features(author.render(INFO, author.ScriptSpec("knn", {"k": 15})), FACTS)
    assert v.shape == (len(sf.FEATURE_NAMES),) and 40 <= len(sf.FEATURE_NAMES) <= 64
    assert v[sf.FEATURE_NAMES.index("family_knn")] == 1.0
    assert v[sf.FEATURE_NAMES.index("log_neighbors")] == pytest.approx(math.log1p(15))


def test_card_facts_features():
    f = feats()
    assert f["card_classification"] == 1.0 and f["card_metric_roc_auc"] == 1.0
    assert f["card_metric_accuracy"] == 0.0
    assert f["card_log_rows"] == pytest.approx(math.log1p(500))
    assert f["card_log_features"] == pytest.approx(math.log1p(6))
    assert f["card_log_limit_s"] == pytest.approx(math.log(20.0))


def test_a_correct_script():
    f = feats()
    for name in ("compiles", "reads_train", "reads_test", "names_target", "names_id",
                 "writes_submission", "submission_has_id", "imputer", "onehot",
                 "predict_proba", "family_forest"):  # fmt: skip
        assert f[name] == 1.0, name
    for name in ("target_near_miss", "missing_unhandled", "categorical_unencoded",
                 "auc_without_proba", "undefined_names", "depth_unlimited"):  # fmt: skip
        assert f[name] == 0.0, name
    assert f["log_trees"] == pytest.approx(math.log1p(100))
    # log(100 trees * 501 * 7 / 20 s)
    want = math.log(100) + math.log1p(500) + math.log1p(6) - math.log(20.0)
    assert f["log_ensemble_work_per_s"] == pytest.approx(want)


def test_each_mistake_shows_in_its_feature():
    assert feats("wrong_column")["target_near_miss"] == 1.0
    assert feats("wrong_column")["names_target"] == 0.0
    assert feats("no_write")["writes_submission"] == 0.0
    wrong_format = feats("wrong_format")
    assert wrong_format["writes_submission"] == 1.0
    assert wrong_format["submission_has_id"] == 0.0
    assert feats("no_imputation", impute=False)["missing_unhandled"] == 1.0
    assert feats(model="hgb", params={"lr": 0.1, "iters": 100}, impute=False)[
        "missing_unhandled"] == 0.0  # fmt: skip
    assert feats("no_encoding", encode="none")["categorical_unencoded"] == 1.0
    assert feats(encode="drop")["categorical_unencoded"] == 0.0
    assert feats("syntax_slip")["compiles"] == 0.0
    slow = feats("too_slow", params={"trees": 3000, "depth": None})
    assert slow["log_trees"] == pytest.approx(math.log1p(3000))
    assert slow["depth_unlimited"] == 1.0
    nb = feats(model="naive_bayes", params={})
    assert nb["family_naive_bayes"] == 1.0 and nb["sparse_to_dense_only"] == 0.0  # dense
    assert sf.feature_dict("import sklearn\nx = undefined_thing\n", FACTS)["undefined_names"] == 1


def test_model_family_is_the_last_estimator_called():
    script = "a = Ridge(alpha=1.0)\nb = RandomForestRegressor(n_estimators=5)\n"
    assert sf.model_family(script) == "forest"
    assert sf.model_family("print(1)\n") is None
    assert sf.feature_dict("print(1)\n", FACTS)["family_unknown"] == 1.0


def rows_from(X, y):
    """Rows whose features are arbitrary: the scorer only sees them through `features`."""
    return [sf.Row(f"x = {i}\n", FACTS, float(t)) for i, t in enumerate(y)], X


def test_ridge_matches_the_normal_equations(monkeypatch):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = 0.5 + X @ np.array([0.2, -0.1, 0.0]) + 0.05 * rng.normal(size=40)
    rows, _ = rows_from(X, y)
    table = {r.script: x for r, x in zip(rows, X, strict=True)}
    monkeypatch.setattr(sf, "feature_matrix", lambda rs: np.stack([table[r.script] for r in rs]))
    scorer = sf.FeatureScorer(penalties=(2.0,)).fit(rows)
    mu, sd = X.mean(0), X.std(0)
    Z = (X - mu) / sd
    w = np.linalg.solve(Z.T @ Z + 2.0 * np.eye(3), Z.T @ (y - y.mean()))
    mean, var = scorer.predict(rows)
    np.testing.assert_allclose(mean, Z @ w + y.mean(), atol=1e-10)
    # The variance: residual variance x (1 + leverage); larger far from the data.
    far = sf.Row("far", FACTS)
    table["far"] = mu + 10 * sd
    _, v_far = scorer.predict([far])
    assert v_far[0] > var.max()
    resid = y - mean
    dof = 40 - np.trace(Z @ np.linalg.solve(Z.T @ Z + 2.0 * np.eye(3), Z.T)) - 1
    inv = np.linalg.inv(Z.T @ Z + 2.0 * np.eye(3))
    lever = np.einsum("ij,jk,ik->i", Z, inv, Z) + 1 / 40
    np.testing.assert_allclose(var, resid @ resid / dof * (1 + lever), rtol=1e-8)


def test_leave_one_out_picks_the_small_penalty_on_clean_data(monkeypatch):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 2))
    y = X[:, 0]  # noiseless: any shrinkage only hurts
    rows, _ = rows_from(X, y)
    table = {r.script: x for r, x in zip(rows, X, strict=True)}
    monkeypatch.setattr(sf, "feature_matrix", lambda rs: np.stack([table[r.script] for r in rs]))
    assert sf.FeatureScorer(penalties=(0.01, 100.0)).fit(rows).penalty == 0.01
    y_noise = rng.normal(size=60)  # pure noise: the strong penalty predicts best
    rows = [sf.Row(r.script, FACTS, float(t)) for r, t in zip(rows, y_noise, strict=True)]
    assert sf.FeatureScorer(penalties=(0.01, 1000.0)).fit(rows).penalty == 1000.0


def test_the_scorer_learns_the_mistakes_from_authored_scripts():
    """Fitted on authored scripts labelled by whether they would fail, it ranks a held-out
    correct script above held-out broken ones."""
    rows = []
    for seed in range(30):
        for mistake, r in ((None, 0.8), ("no_write", 0.2), ("wrong_column", 0.1)):
            spec = author.ScriptSpec("forest", {"trees": 100, "depth": 6}, mistake=mistake,
                                     seed=seed, scale=seed % 2 == 0)  # fmt: skip
            rows.append(sf.Row(author.render(INFO, spec), FACTS, r))
    scorer = sf.FeatureScorer().fit(rows)
    test = [sf.Row(author.render(INFO, author.ScriptSpec("linear", {"C": 1.0}, mistake=m)),
                   FACTS) for m in (None, "no_write", "wrong_column")]  # fmt: skip
    mean, var = scorer.predict(test)
    assert mean[0] > mean[1] and mean[0] > mean[2]
    assert np.all(var > 0)
    assert scorer.coefficients()["writes_submission"] > 0


def test_unfitted_and_bad_input():
    mean, var = sf.FeatureScorer().predict([sf.Row("x = 1\n", FACTS)])
    assert mean.tolist() == [0.5] and var.tolist() == [0.25]
    with pytest.raises(ValueError, match="at least 2 rows with a reward"):
        sf.FeatureScorer().fit([sf.Row("x = 1\n", FACTS, 0.5), sf.Row("y\n", FACTS)])


def test_feature_vectors_give_the_same_fit():
    rows = [sf.Row(author.render(INFO, author.ScriptSpec(m, p, mistake=k)), FACTS, r)
            for m, p, k, r in [("linear", {"C": 1.0}, None, 0.7), ("knn", {"k": 5}, None, 0.6),
                               ("tree", {"depth": 3}, "no_write", 0.2),
                               ("forest", {"trees": 50, "depth": 4}, None, 0.9)]]  # fmt: skip
    a = sf.FeatureScorer().fit(rows).predict(rows)
    X = np.stack([sf.features(r.script, r.facts) for r in rows])
    b = sf.FeatureScorer().fit_features(X, [r.reward for r in rows]).predict_features(X)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


# Scripts shaped to make each pattern over script text work hardest: many starts that each
# fail late (an opening with no close, a name with no value, a quote with no partner).
WORST_SHAPES = {
    "unclosed_frames": "DataFrame({",
    "unclosed_frames_spaced": "DataFrame(  { x ",
    "unpaired_quotes": "'" + "a" * 80 + '"',
    "keywords_without_values": "n_estimators =" + " " * 30 + "\n",
    "tuples_without_cat": "(" + " " * 20,
    "estimators_never_called": "RandomForestClassifier" + " " * 20,
    "none_depths": "max_depth = Non",
}


def largest_accepted(unit: str) -> str:
    script = (unit * (MAX_SCRIPT_BYTES // len(unit) + 1))[:MAX_SCRIPT_BYTES]
    assert len(script.encode("utf-8")) == MAX_SCRIPT_BYTES  # the pool's cap, not over it
    return script


@pytest.mark.parametrize("unit", WORST_SHAPES.values(), ids=list(WORST_SHAPES))
def test_the_largest_accepted_script_is_featurised_in_linear_time(unit):
    r"""Every pattern is linear in the script: the worst shapes at the pool's size cap cost
    well under a second of this process's CPU (a `DataFrame\(\s*\{([^}]*)\}` search took
    20 s on unclosed frames, quadratic: each opening rescanned the rest of the text)."""
    script = largest_accepted(unit)
    t0 = time.process_time()
    sf.features(script, FACTS)
    assert time.process_time() - t0 < 1.0


def test_the_submission_frame_is_the_last_dict_a_regex_would_find():
    """The linear search finds what `re.findall` of the old pattern found last, on random
    texts made of the pieces that matter (openings, braces, spaces, other text)."""
    old = re.compile(r"DataFrame\(\s*\{([^}]*)\}")
    pieces = ["DataFrame(", "DataFrame({", "{", "}", " ", "\n", "x", "ID", "(", "Frame("]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 14)))
        found = old.findall(text)
        assert sf._submission_frame(text) == (found[-1] if found else None), text
    assert sf._submission_frame('pd.DataFrame( {"ID": ids, "y": p}).to_csv(') == (
        '"ID": ids, "y": p'
    )


def test_a_script_over_the_cap_is_read_only_up_to_it():
    """No WM reads more than the pool's size cap: a longer script (MALFORMED without being
    compiled) has the features of its first MAX_SCRIPT_BYTES characters, except that it
    does not compile and its length is its own, and costs no more to featurise."""
    head = author.render(INFO, author.ScriptSpec("forest", {"trees": 100, "depth": 6}))
    script = head + "#" * (64 * MAX_SCRIPT_BYTES)  # 16 MiB
    prefix = script[:MAX_SCRIPT_BYTES]
    t0 = time.process_time()
    long_f = sf.feature_dict(script, FACTS)
    assert time.process_time() - t0 < 1.0
    prefix_f = sf.feature_dict(prefix, FACTS)
    assert prefix_f["compiles"] == 1.0 and long_f["compiles"] == 0.0
    assert long_f["undefined_names"] == 0.0
    assert long_f["log_chars"] == pytest.approx(math.log1p(len(head) + 64 * MAX_SCRIPT_BYTES))
    assert (
        long_f["log_lines"] == prefix_f["log_lines"] == pytest.approx(math.log1p(head.count("\n")))
    )
    same = {k for k in long_f if k not in ("compiles", "log_chars")}
    assert {k: long_f[k] for k in same} == {k: prefix_f[k] for k in same}
    assert prefix_f["family_forest"] == 1.0 and prefix_f["writes_submission"] == 1.0
