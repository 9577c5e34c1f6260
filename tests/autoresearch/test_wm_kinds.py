"""What the WM is and what every run reports of it: the WM's P(timeout) travels with the anchor
pairs (through the lag's pending rows), summary.json carries the anchor figures of
`wmrl.autoresearch.anchor_metrics` (whole run and per quarter), and `wm.kind = "features"`
runs the script-feature ridge as the WM: fitted on the corpus, refitted on the replay of real
outcomes (checked against a ridge fitted here on the decoded anchor scripts and the
journal's rewards), its variance read by uncertainty routing, a pure function of the replay
(a new scorer on a restored replay predicts the same)."""

import json

import jax
import numpy as np
import pytest

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch import anchor_metrics
from wmrl.autoresearch import script_features as sf
from wmrl.autoresearch.env.grader import Status
from wmrl.config_errors import ConfigError


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _trainer(config, tmp_path):
    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.experiment import make_trainer, prepare_stages

    s = prepare_stages(config, tmp_path, progress=False)
    pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
    return s, pool, make_trainer(config, s, pool, tmp_path)


@pytest.mark.real  # the sandbox and the tiny pipeline's stages
def test_pairs_carry_the_wms_p_timeout_through_the_lag(rl_shared, tmp_path):
    """Step 1's anchors are scored when sampled and trained on (and written as pairs) at step
    2: each pair's `p_timeout` is the pretrained WM's P(timeout) of that row's tokens under
    its task's capped limit, computed here again from the pending rows."""
    from wmrl.autoresearch import data as rldata
    from wmrl.models.train_steps import make_wm_score_fn

    data_dir, init_dir = rl_shared
    config = tiny_config(data_dir, init_dir, mode="wmrl", rl__anchor_lag=1)
    assert config.wm.runtime_coef > 0  # the runtime head that gives P(timeout)
    s, pool, trainer = _trainer(config, tmp_path)
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        st1, _, pairs1 = trainer.run_step(st)
        first = st1.pending.live()
        assert pairs1 == [] and np.isfinite(first.p_timeout).all()
        _, _, pairs2 = trainer.run_step(st1)
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()
    tasks = trainer._tasks_for_rows(0, first.rows)
    limits = np.array([rldata.time_limit(t, config.suite.time_limit_s) for t in tasks])
    score = make_wm_score_fn(s.wm.graphdef, s.wm.shardings, s.wm.mesh, fuse=trainer.tc.fuse)
    want = np.asarray(score(s.wm_params, first.tokens, first.input_mask, limits)["p_timeout"])
    by_row = dict(zip(first.rows.tolist(), want.tolist(), strict=True))
    assert pairs2 and all(0.0 <= p["p_timeout"] <= 1.0 for p in pairs2)
    for p in pairs2:
        assert p["p_timeout"] == pytest.approx(by_row[p["row"]], abs=1e-5)


@pytest.mark.real  # the sandbox and the tiny pipeline's stages
def test_summary_carries_the_anchor_figures(rl_shared, tmp_path):
    """summary.json's `anchor_figures` are `anchor_report` of the run's own pairs.jsonl (whole
    run and four quarters); the pairs carry P(timeout), so its calibration is measured."""
    from wmrl.autoresearch.experiment import run

    data_dir, init_dir = rl_shared
    wd = tmp_path / "wmrl"
    config = tiny_config(data_dir, init_dir, mode="wmrl", rl__steps=3, rl__anchor_lag=0)
    summary = run(config, wd, progress=False)
    pairs = read_jsonl(wd / "pairs.jsonl")
    assert pairs and all("p_timeout" in p for p in pairs)
    figures = summary["anchor_figures"]
    assert figures == json.loads(json.dumps(anchor_metrics.anchor_report(pairs, 3)))
    assert len(figures["quarters"]) == 4 and figures["all"]["pairs"] == len(pairs)
    learned = sum(map(anchor_metrics.is_learned, pairs))
    calibration = figures["all"]["timeout_calibration"]
    # Measured over the rows the static check does not decide (none: nothing to calibrate).
    assert (calibration["rows"] if learned else calibration) == (learned or None)
    assert json.loads((wd / "summary.json").read_text())["anchor_figures"] == figures
    assert summary["wm_kind"] == "neural"


def _base_rows(config, prepared):
    """The feature WM's fit rows before RL, built here from the data stage: the training
    tasks' executed corpus, facts under each task's own limit."""
    facts = {t.id: sf.card_facts(t, 0.0) for t in prepared.train_tasks}
    recs = [r for r in prepared.executions if r["split"] == "train" and r["task_id"] in facts
            and r["reward"] is not None]  # fmt: skip
    X = np.stack([sf.features(r["script"], facts[r["task_id"]]) for r in recs])
    return X, np.array([r["reward"] for r in recs])


@pytest.mark.real  # the sandbox and the tiny pipeline's stages
def test_feature_wm_scores_refits_on_the_replay_and_routes_by_its_variance(rl_shared, tmp_path):
    """`wm.kind = "features"`, uncertainty routing, the lag: step 1's rows are scored by the
    ridge fitted on the corpus; after step 2 trained on step 1's anchors the scorer is the
    ridge on the corpus plus those anchors (their decoded scripts, the journal's rewards);
    a new scorer fitted to the same replay (a resumed run's) predicts the same; the neural
    WM is neither trained nor pretrained."""
    data_dir, init_dir = rl_shared
    config = tiny_config(
        data_dir, init_dir, mode="wmrl", wm__kind="features", routing="uncertainty",
        rl__anchor_lag=1,
    )  # fmt: skip
    s, pool, trainer = _trainer(config, tmp_path)
    fwm = trainer.feature_wm
    assert s.wm_report["kind"] == "features" and "within_task_spearman" in s.wm_report["heldout"]
    X, y = _base_rows(config, s.prepared)
    cap = config.suite.time_limit_s
    P = config.data.max_prompt_len
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        wm_before = [np.asarray(v).copy() for v in jax.tree.leaves(st.wm.params)]
        trainer.warmup(st)
        st1, m1, _ = trainer.run_step(st)
        first = st1.pending.live()
        scripts = trainer._decode(first.tokens[:, P:], first.input_mask[:, P:])
        tasks = trainer._tasks_for_rows(0, first.rows)
        pairs = zip(scripts, tasks, strict=True)
        Z = np.stack([sf.features(x, sf.card_facts(t, cap)) for x, t in pairs])
        base = sf.FeatureScorer().fit_features(X, y)
        np.testing.assert_allclose(first.r_wm, base.predict_features(Z)[0], rtol=1e-5, atol=1e-6)
        assert m1["anchor_groups_uncertainty"] >= 0 and np.isnan(first.p_timeout).all()
        st2, _, pairs2 = trainer.run_step(st1)
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()
    assert pairs2 and all("p_timeout" not in p for p in pairs2)
    rec = {j["row"]: j for j in read_jsonl(tmp_path / "anchors.jsonl") if j["step"] == 0}
    graded = [i for i, r in enumerate(first.rows) if rec[int(r)]["status"] != int(Status.UNGRADED)]
    assert int(st2.replay.count) == len(graded) > 0
    rewards = [rec[int(first.rows[i])]["reward"] or 0.0 for i in graded]
    online = sf.FeatureScorer().fit_features(np.concatenate([X, Z[graded]]), np.r_[y, rewards])
    probe = np.concatenate([Z, X[:5]])
    fwm.fit_to(st2.replay)
    np.testing.assert_allclose(fwm.scorer.predict_features(probe)[0],
                               online.predict_features(probe)[0], rtol=1e-5, atol=1e-6)  # fmt: skip
    from wmrl.autoresearch.feature_wm import FeatureWM

    restarted = FeatureWM(config, s.prepared)
    restarted.fit_to(st2.replay)
    got, want = restarted.predict(scripts, tasks), fwm.predict(scripts, tasks)
    np.testing.assert_array_equal(got["score"], want["score"])
    np.testing.assert_array_equal(got["predictive_var"], want["predictive_var"])
    assert (want["predictive_var"] > 0).all()
    for got, want in zip(jax.tree.leaves(st2.wm.params), wm_before, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)  # never trained


def test_wm_kind_is_checked():
    from tests.support.rl_fixtures import load_config, set_fields
    from wmrl.autoresearch.config import validate_autoresearch_config
    from wmrl.autoresearch.presets import TINY_MULTITURN_SETTING
    from wmrl.autoresearch.stages import active_stages

    c = load_config()
    assert c.wm.kind == "neural" and "wm_pretrain" in active_stages(c)
    c.wm.kind = "features"
    validate_autoresearch_config(c)
    assert "wm_pretrain" not in active_stages(c)
    c.wm.kind = "boosted"
    with pytest.raises(ConfigError, match=r"wm\.kind"):
        validate_autoresearch_config(c)
    m = set_fields(load_config(), TINY_MULTITURN_SETTING, "", "", {"wm__kind": "features"})
    with pytest.raises(ConfigError, match=r"wm\.kind.*env\.turns=2"):
        validate_autoresearch_config(m)


@pytest.mark.real  # the sandbox and the tiny pipeline's stages
def test_feature_wm_run_resumes_as_the_uninterrupted_run(rl_shared, tmp_path):
    """A `wm.kind = "features"` run stopped after step 2 and resumed to step 3 scores its
    rows as the uninterrupted 3-step run does (the scorer is refitted from the restored
    replay): the same WM scores in every anchor pair and the same per-step rewards."""
    from wmrl.autoresearch.experiment import run

    data_dir, init_dir = rl_shared
    config = lambda steps: tiny_config(
        data_dir, init_dir, mode="wmrl", wm__kind="features", rl__steps=steps,
        rl__checkpoint_every=1,
    )  # fmt: skip
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(config(3), straight, progress=False)
    run(config(2), resumed, progress=False)
    summary = run(config(3), resumed, progress=False)
    assert summary["steps"] == 3 and summary["wm_kind"] == "features"
    key = lambda p: (p["step"], p["row"])
    pairs = {w: sorted(read_jsonl(w / "pairs.jsonl"), key=key) for w in (straight, resumed)}
    assert pairs[straight] and [key(p) for p in pairs[straight]] == [key(p) for p in pairs[resumed]]
    for a, b in zip(pairs[straight], pairs[resumed], strict=True):
        assert a["r_wm"] == pytest.approx(b["r_wm"], abs=1e-6)
    steps = {w: [r for r in read_jsonl(w / "metrics.jsonl") if r["kind"] == "step"]
             for w in (straight, resumed)}  # fmt: skip
    assert [r["step"] for r in steps[resumed]] == [1, 2, 3]
    assert [r["train_reward"] for r in steps[straight]] == pytest.approx(
        [r["train_reward"] for r in steps[resumed]], abs=1e-6
    )
