"""`wm.kind = "verdict"` in the trainer: the config's checks, and the tiny single-turn run with
the warm-started policy's frozen backbone as the WM (its scores in the step's rows and anchor
pairs, routing by its variance, the compile gate, unchanged by RL's updates)."""

import json

import jax
import numpy as np
import pytest

from tests.support.rl_fixtures import load_config, set_fields, tiny_config
from wmrl.autoresearch import verdict as v
from wmrl.autoresearch.config import validate_autoresearch_config
from wmrl.config_errors import ConfigError


def test_the_verdict_wm_config_is_checked():
    from wmrl.autoresearch.presets import TINY_MULTITURN_SETTING
    from wmrl.autoresearch.stages import active_stages
    from wmrl.core.correct import MODE_SPECS

    c = load_config()
    c.wm.kind = "verdict"
    for mode in MODE_SPECS:  # every mode takes it (`real` builds it and never calls it)
        c.mode = mode
        validate_autoresearch_config(c)
    c.mode = "wmrl"
    assert "wm_pretrain" not in active_stages(c)  # no neural pretraining
    c.wm.verdict_train = "finetune"
    validate_autoresearch_config(c)
    c.wm.verdict_train = "online"
    with pytest.raises(ConfigError, match=r"wm\.verdict_train"):
        validate_autoresearch_config(c)
    c.wm.verdict_train = "frozen"
    c.wm.verdict_finetune_steps = -1
    with pytest.raises(ConfigError, match=r"wm\.verdict_finetune_steps"):
        validate_autoresearch_config(c)
    c.wm.verdict_finetune_steps = 0
    c.wm.verdict_score = "argmax"
    with pytest.raises(ConfigError, match=r"wm\.verdict_score"):
        validate_autoresearch_config(c)
    c.wm.verdict_score = "sampled"
    c.wm.verdict_prompt_len = 8
    with pytest.raises(ConfigError, match=r"wm\.verdict_prompt_len"):
        validate_autoresearch_config(c)
    m = set_fields(load_config(), TINY_MULTITURN_SETTING, "", "", {"wm__kind": "verdict"})
    with pytest.raises(ConfigError, match=r"wm\.kind.*single-turn.*env\.turns=2"):
        validate_autoresearch_config(m)


def _trainer(config, tmp_path):
    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.experiment import make_trainer, prepare_stages

    s = prepare_stages(config, tmp_path, progress=False)
    pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
    return s, pool, make_trainer(config, s, pool, tmp_path)


VERDICT = {"wm__kind": "verdict", "wm__verdict_prompt_len": 2560,
           "wm__verdict_script_chars": 3000}  # fmt: skip


@pytest.mark.real  # the sandbox and the tiny pipeline's stages
def test_the_frozen_verdict_wm_scores_the_rows_and_routes_by_its_variance(rl_shared, tmp_path):
    """Two steps with the lag and uncertainty routing: the verdict LM is the warm-started
    policy's parameters; step 1's pending rows carry the verdict's expected reward of their
    scripts (0 for a script that does not compile); step 2 trains on them with the anchors'
    pairs; after RL's updates the verdict LM and its scores of those scripts are unchanged."""
    data_dir, init_dir = rl_shared
    config = tiny_config(data_dir, init_dir, mode="wmrl", routing="uncertainty",
                         rl__anchor_lag=1, **VERDICT)  # fmt: skip
    s, pool, trainer = _trainer(config, tmp_path)
    vwm = trainer.feature_wm
    assert s.wm_report["kind"] == "verdict" and s.wm_report["score"] == "expected"
    held = s.wm_report["heldout"]
    assert held["n"] > 0 and 0.0 <= held["status_accuracy"] <= 1.0
    for got, want in zip(jax.tree.leaves(vwm.params), jax.tree.leaves(s.policy_params),
                         strict=True):  # fmt: skip
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    P = config.data.max_prompt_len
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        st1, m1, _ = trainer.run_step(st)
        first = st1.pending.live()
        scripts = trainer._decode(first.tokens[:, P:], first.input_mask[:, P:])
        tasks = trainer._tasks_for_rows(0, first.rows)
        before = vwm.predict(scripts, tasks)
        st2, _, pairs2 = trainer.run_step(st1)
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()
    np.testing.assert_allclose(first.r_wm, before["score"], rtol=1e-5, atol=1e-6)
    probs = before["outcome_probs"].astype(np.float64)
    rewards = np.array([v.outcome_reward(a, b) for a, b in v.OUTCOMES])
    gate = np.array([v.compiles(x) for x in scripts])
    np.testing.assert_allclose(before["score"], np.where(gate, probs @ rewards, 0.0), atol=1e-5)
    var = np.where(gate, probs @ rewards**2 - (probs @ rewards) ** 2, 0.0)
    np.testing.assert_allclose(before["predictive_var"], var, atol=1e-5)
    assert m1["anchor_groups_uncertainty"] >= 0
    assert pairs2 and {p["row"] for p in pairs2} <= set(first.rows.tolist())
    by_row = dict(zip(first.rows.tolist(), before["score"].tolist(), strict=True))
    for p in pairs2:
        assert p["r_wm"] == pytest.approx(by_row[p["row"]], abs=1e-6)
    pairs = zip(jax.tree.leaves(st2.policy.params), jax.tree.leaves(s.policy_params), strict=True)
    moved = any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
    assert moved  # RL trained the policy ...
    after = vwm.predict(scripts, tasks)  # ... and the frozen verdict LM did not move
    np.testing.assert_array_equal(after["score"], before["score"])


@pytest.mark.real  # the sandbox and the tiny pipeline's stages
def test_a_sampled_verdict_run_writes_its_summary(rl_shared, tmp_path):
    """`wm.verdict_score = "sampled"` through `run`: every WM score is one of the outcome
    rewards (the top prediction's, or 0 by the compile gate), and the summary names the WM."""
    from wmrl.autoresearch.experiment import run

    data_dir, init_dir = rl_shared
    config = tiny_config(data_dir, init_dir, mode="wmrl", rl__steps=2, rl__anchor_lag=0,
                         wm__verdict_score="sampled", wm__verdict_reason_tokens=4,
                         wm__verdict_feedback_tokens=4, **VERDICT)  # fmt: skip
    summary = run(config, tmp_path / "run", progress=False)
    assert summary["wm_kind"] == "verdict"
    pairs = [json.loads(x) for x in (tmp_path / "run" / "pairs.jsonl").read_text().splitlines()]
    assert pairs
    ladder = {round(v.outcome_reward(a, b), 6) for a, b in v.OUTCOMES}
    assert all(round(p["r_wm"], 6) in ladder for p in pairs)


@pytest.mark.real  # the sandbox and the tiny pipeline's stages
def test_the_fine_tuned_verdict_wm_learns_before_rl_and_online(rl_shared, tmp_path):
    """`wm.verdict_train = "finetune"`: 3 SFT steps before RL on the corpus's verdicts move
    the LM off the warm start, and RL's WM state is that LM (the step scores with it); step 2
    trains it online on step 1's anchors (one SFT step on their verdicts), and step 3 scores
    with the result."""
    data_dir, init_dir = rl_shared
    config = tiny_config(data_dir, init_dir, mode="wmrl", rl__anchor_lag=1,
                         wm__verdict_train="finetune", wm__verdict_finetune_steps=3,
                         **VERDICT)  # fmt: skip
    s, pool, trainer = _trainer(config, tmp_path)
    vwm = trainer.feature_wm
    ft = s.wm_report["finetune"]
    assert s.wm_report["train"] == "finetune" and ft["steps"] == 3 and ft["rows"] > 0
    assert np.isfinite(ft["nll_first"]) and np.isfinite(ft["nll_last"])
    leaves = lambda tree: [np.asarray(x) for x in jax.tree.leaves(tree)]
    tuned = leaves(s.wm_params)
    assert any(not np.array_equal(a, b) for a, b in zip(tuned, leaves(s.policy_params),
                                                        strict=True))  # fmt: skip
    P = config.data.max_prompt_len
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        for a, b in zip(leaves(st.wm.params), tuned, strict=True):
            np.testing.assert_array_equal(a, b)  # RL's WM state is the fine-tuned LM
        st1, _, _ = trainer.run_step(st)
        first = st1.pending.live()
        scripts = trainer._decode(first.tokens[:, P:], first.input_mask[:, P:])
        tasks = trainer._tasks_for_rows(0, first.rows)
        np.testing.assert_allclose(first.r_wm, vwm.predict(scripts, tasks)["score"], atol=1e-6)
        st2, _, pairs2 = trainer.run_step(st1)
        online = leaves(st2.wm.params)
        assert pairs2 and int(st2.replay.count) > 0
        assert any(not np.array_equal(a, b) for a, b in zip(online, tuned, strict=True))
        st3, _, _ = trainer.run_step(st2)
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()
    vwm.use(st3.wm.params)
    third = st3.pending.live()
    s3 = trainer._decode(third.tokens[:, P:], third.input_mask[:, P:])
    t3 = trainer._tasks_for_rows(2, third.rows)
    assert len(s3) == len(t3) > 0
    # Step 3 scored with step 2's online LM: its scores of those rows again.
    vwm.use(jax.tree.unflatten(jax.tree.structure(st2.wm.params), online))
    np.testing.assert_allclose(third.r_wm, vwm.predict(s3, t3)["score"], atol=1e-6)


@pytest.mark.slow  # three runs and a probe, ~4 min on the 2-core machine
@pytest.mark.real  # the sandbox and the tiny pipeline's stages
def test_a_fine_tuned_verdict_run_resumes_as_the_uninterrupted_run(rl_shared, tmp_path):
    """`wm.verdict_train = "finetune"` stopped after step 2 and resumed to step 3 (the
    fine-tuning before RL repeated, the online-trained LM restored from the checkpoint)
    scores its anchors as the uninterrupted 3-step run does, and ends with the same LM, one
    that online training moved off the fine-tuned start."""
    from wmrl.autoresearch.checkpoint import Checkpointer
    from wmrl.autoresearch.experiment import run

    data_dir, init_dir = rl_shared
    config = lambda steps: tiny_config(
        data_dir, init_dir, mode="wmrl", rl__steps=steps, rl__checkpoint_every=1,
        wm__verdict_train="finetune", wm__verdict_finetune_steps=2, **VERDICT,
    )  # fmt: skip
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(config(3), straight, progress=False)
    run(config(2), resumed, progress=False)
    summary = run(config(3), resumed, progress=False)
    assert summary["steps"] == 3 and summary["wm_kind"] == "verdict"
    read = lambda w: sorted(
        (json.loads(x) for x in (w / "pairs.jsonl").read_text().splitlines()),
        key=lambda p: (p["step"], p["row"]),
    )  # fmt: skip
    a, b = read(straight), read(resumed)
    assert a and [(p["step"], p["row"]) for p in a] == [(p["step"], p["row"]) for p in b]
    for x, y in zip(a, b, strict=True):
        assert x["r_wm"] == pytest.approx(y["r_wm"], abs=1e-5)
    (tmp_path / "probe").mkdir()
    s, pool, trainer = _trainer(config(3), tmp_path / "probe")
    try:
        template = trainer.initial_state(s.policy_params, s.wm_params)
        start = [np.asarray(x) for x in jax.tree.leaves(template.wm.params)]
        ends = []
        for w in (straight, resumed):
            ckpt = Checkpointer(w, 3)
            ends.append(
                [np.asarray(x) for x in jax.tree.leaves(ckpt.restore_latest(template).wm.params)]
            )
            ckpt.close()
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()
    for x, y in zip(*ends, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    assert any(not np.array_equal(x, y) for x, y in zip(ends[0], start, strict=True))
