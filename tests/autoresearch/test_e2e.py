"""Every mode end to end for 2 RL steps on a 2-task suite: real sandbox, real models, real
checkpoints. Checks the artefacts, the execution counts each mode must have, that anchor
pairs carry the journalled real rewards, and that the WM's online data are real outcomes."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch.checkpoint import Checkpointer
from wmrl.autoresearch.env.grader import Status, static_outcome
from wmrl.autoresearch.experiment import run

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

STEP_KEYS = (
    "step", "wall_time_s", "generate_s", "execute_s", "wm_score_s", "train_s", "train_reward",
    "anchor_fraction", "calibrated", "bias_reduction", "anchor_weight", "wm_rank_corr",
    "rho", "wm_stream_corr", "wm_stream_collapsed_groups",
)  # fmt: skip
SUMMARY_KEYS = (
    "warmstart_heldout_reward", "final_heldout_reward", "wall_time_s", "time_to_target_s",
    "real_executions", "wm_calls",
)  # fmt: skip


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


MODES = ["real", "wm_only", "debias_only", "denoise_only", "wmrl", "static_anchors", "permuted_wm"]


# The ablation modes differ from `wmrl` only in switches of the correction (each tested in
# tests/core/test_correct.py and tests/autoresearch/test_correction.py): their end-to-end runs
# are slow.
ABLATIONS = ("wm_only", "debias_only", "denoise_only")


@pytest.mark.parametrize(
    "mode,lag",
    [pytest.param(m, 1, marks=[pytest.mark.slow] if m in ABLATIONS else []) for m in MODES]
    + [("wmrl", 0)],
    ids=[*MODES, "wmrl-lag0"],
)
def test_mode_end_to_end(mode, lag, rl_shared, tmp_path):
    data_dir, init_dir = rl_shared
    wd = tmp_path / mode
    summary = run(
        tiny_config(data_dir, init_dir, mode=mode, rl__anchor_lag=lag), wd, progress=False
    )
    # B = 2 groups of G = 2 per step, 2 steps; the non-real modes anchor 1 group per step.
    B, G, steps = 2, 2, 2
    anchors_per_step = B if mode == "real" else 1
    lagged = mode != "real" and lag == 1  # `real` is synchronous GRPO whatever anchor_lag says
    for key in SUMMARY_KEYS:
        assert key in summary
    assert summary["steps"] == steps
    assert summary["real_executions"] == steps * anchors_per_step * G
    assert summary["wm_calls"] == (0 if mode == "real" else steps * B * G)
    assert 0.0 <= summary["final_heldout_reward"] <= 1.0
    records = read_jsonl(wd / "metrics.jsonl")
    step_recs = [r for r in records if r["kind"] == "step"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in step_recs] == [1, 2]
    assert [r["step"] for r in evals] == [0, 2]  # warm start, then every eval_every=2
    for r in step_recs:
        assert set(STEP_KEYS) <= set(r)
        assert r["anchor_fraction"] == anchors_per_step / B
        assert r["rho"] == (1.0 if mode == "real" else 0.25)  # the tiny config's target
    # Which step's anchor outcomes each step trained on: its own, or (lagged) the previous
    # step's, none in the first step.
    expected_from = [None, 1] if lagged else [1, 2]
    assert [r["anchor_outcomes_from_step"] for r in step_recs] == expected_from
    if lagged:
        assert step_recs[0]["wm_rank_corr"] is None and step_recs[0]["anchor_status"] == {}
    assert all("heldout_reward" in r for r in evals)
    for r in evals:  # rewards lie in [0, 1]: a sample std (ddof 1) is at most 0.5 sqrt(n/(n-1))
        n = len(r["heldout_per_task"]) * 2 - r["heldout_ungraded"]  # rl.eval_samples = 2
        assert n > 1 and 0.0 <= r["heldout_reward_se_scripts"] <= 0.5 / np.sqrt(n - 1) + 1e-12
        # one held-out task: no spread between tasks to count, the scripts' SE stands in
        assert r["heldout_tasks"] == 1 and r["heldout_reward_se"] == r["heldout_reward_se_scripts"]
    # The journal holds every real execution once; pairs carry exactly its rewards. With the
    # lag, the last step's anchors are executed (and counted) but never trained on.
    journal = read_jsonl(wd / "anchors.jsonl")
    assert len(journal) == summary["real_executions"]
    assert len({(j["step"], j["row"]) for j in journal}) == len(journal)
    trained = [j for j in journal if not (lagged and j["step"] == steps - 1)]
    assert len(trained) == (steps - lagged) * anchors_per_step * G
    real = {(j["step"] + 1, j["row"]): j["reward"] for j in trained if j["reward"] is not None}
    pairs = read_jsonl(wd / "pairs.jsonl")
    assert {(p["step"], p["row"]) for p in pairs} == set(real)
    for p in pairs:
        assert p["r_env"] == pytest.approx(real[(p["step"], p["row"])])
        # rl.static_check = "names" (WM modes): an anchor is statically MALFORMED exactly when
        # the pool found it MALFORMED (its own pre-execution check); one flagged for reading
        # an undefined name came back RUNTIME_ERROR (or timed out first: the same reward).
        predicted = p["static_status"]
        assert p["static"] == (predicted is not None)
        if mode == "real":
            assert predicted is None
            continue
        assert (predicted == "MALFORMED") == (p["status"] == int(Status.MALFORMED))
        if predicted == "RUNTIME_ERROR":
            assert p["status"] in (int(Status.RUNTIME_ERROR), int(Status.TIMEOUT)), p
    if mode == "static_anchors":
        _check_the_control(pairs, step_recs, data_dir)
    for name in ("heldout_reward.png", "wm_calibration.png", "corrections.png"):
        assert (wd / "plots" / name).stat().st_size > 1000
    assert list((wd / "tb").glob("events.out.tfevents.*"))
    assert json.loads((wd / "summary.json").read_text())["mode"] == mode

    ckpt = Checkpointer(wd, keep=3)
    tree, meta = ckpt.read_raw()
    ckpt.close()
    assert meta["step"] == steps and meta["data_iterator"]["next_step"] == steps
    # The pending anchors in the checkpoint: the last step's (lagged), else none.
    assert int(tree["pending"]["step"]) == (steps - 1 if lagged else -1)
    replay = tree["replay"]
    n = int(replay["count"])
    if mode == "real":
        assert n == 0  # standard GRPO has no world model to train
    else:
        # The WM's online data are exactly the graded real outcomes it was given.
        graded = sorted(j["reward"] for j in trained if j["status"] != int(Status.UNGRADED))
        assert n == len(graded)
        np.testing.assert_allclose(sorted(np.asarray(replay["target"])[:n]), graded, atol=1e-6)


def _check_the_control(pairs, step_recs, data_dir):
    """`static_anchors`: every learned (not statically fixed) row of a step gets one shared
    reward; before any anchor outcome it is the mean reward of the executed training corpus's
    unflagged scripts (computed here from the data stage's own log)."""
    from wmrl.autoresearch.env.grader import static_outcome

    log = read_jsonl(data_dir / "trajectories" / "executions.jsonl")
    prior = np.mean([
        r["reward"] for r in log if r["split"] == "train" and r["reward"] is not None
        and static_outcome(r["script"].encode(), names=True) is None
    ])  # fmt: skip
    assert step_recs[0]["static_anchors_reward"] == pytest.approx(prior, abs=1e-5)
    for p in pairs:  # anchors trained on at step 2 were calibrated with step 2's value
        if not p["static"]:
            assert p["r_cal"] == pytest.approx(step_recs[1]["static_anchors_reward"], abs=1e-5)
    for r in step_recs:  # a constant stream has no order: no within-group correlation
        assert r["wm_stream_corr"] is None
        assert r["anchor_weight"] == 1.0


def test_permuted_wm_trains_on_wmrls_rewards_permuted_within_each_group(rl_shared, tmp_path):
    """One step of `wmrl` and of `permuted_wm` from the same stages and seed (3 groups of 3,
    one anchor group, synchronous anchors): the same scripts, anchors, static verdicts,
    calibrated scores, anchor weight, diagnostics and estimator state; the rewards GRPO trains
    on differ only by a permutation of each WM group's learned rows, exactly the one drawn
    from the step's key, and the step's draw is the same when the step is run again."""
    import jax

    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.experiment import prepare_stages
    from wmrl.autoresearch.trainer import Trainer
    from wmrl.core.correct import permutation_key, permute_within_groups

    data_dir, init_dir = rl_shared
    G, out = 3, {}
    for mode in ("wmrl", "permuted_wm"):
        config = tiny_config(
            data_dir, init_dir, mode=mode, rl__anchor_lag=0, rl__groups_per_step=3,
            rl__group_size=G,
        )  # fmt: skip
        s = prepare_stages(config, tmp_path / "stages", progress=False)
        pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
        (tmp_path / mode).mkdir()
        trainer = Trainer(config, s.prepared, s.policy, s.wm, pool, tmp_path / mode)
        try:
            st = trainer.initial_state(s.policy_params, s.wm_params)
            keys, clock = trainer.keys(st), trainer.clock()
            sampled = trainer.sample(st, keys.sample, clock)
            routed = trainer.route(st, sampled, keys.route, clock)
            x = trainer.act(st, sampled, routed, keys.act, clock)
            c = trainer.correct(st, routed, x, clock)
            again = trainer.correct(st, routed, x, clock)
        finally:
            trainer.journal.close()
            trainer.eval_journal.close()
            pool.close()
        np.testing.assert_array_equal(
            np.asarray(c.result.rewards), np.asarray(again.result.rewards)
        )
        out[mode] = (sampled, routed, x, c, st)
    (s_a, r_a, x_a, c_a, st), (s_b, r_b, x_b, c_b, _) = out["wmrl"], out["permuted_wm"]
    assert s_a.scripts == s_b.scripts
    np.testing.assert_array_equal(r_a.is_anchor, r_b.is_anchor)
    np.testing.assert_array_equal(x_a.r_env, x_b.r_env)
    np.testing.assert_array_equal(c_a.static, c_b.static)
    for name in ("calibrated", "valid"):
        np.testing.assert_array_equal(
            np.asarray(getattr(c_a.result, name)), np.asarray(getattr(c_b.result, name))
        )
    trees = [(c.result.correction, c.result.stats) for c in (c_a, c_b)]
    for u, v in zip(*map(jax.tree.leaves, trees), strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    want, got = np.asarray(c_a.result.rewards), np.asarray(c_b.result.rewards)
    anchor = np.repeat(r_a.is_anchor, G)
    fixed = c_a.static >= 0
    np.testing.assert_array_equal(got[anchor | fixed], want[anchor | fixed])
    for g in np.nonzero(~r_a.is_anchor)[0]:
        rows = [i for i in range(g * G, g * G + G) if not fixed[i]]
        assert sorted(got[rows]) == sorted(want[rows])
    key = jax.random.fold_in(jax.random.wrap_key_data(st.rng), st.step)
    draw = jax.random.wrap_key_data(permutation_key(key))
    drawn = np.asarray(permute_within_groups(jnp.asarray(want), jnp.asarray(~fixed), draw, G))
    np.testing.assert_array_equal(got[~anchor], drawn[~anchor])


def test_warmup_compiles_every_step_function(rl_shared, tmp_path):
    """After `Trainer.warmup` an RL step compiles nothing new, so `wall_time_s` is steady
    state; and warm-up leaves the run's state untouched (donated states were copies)."""
    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.experiment import prepare_stages
    from wmrl.autoresearch.trainer import Trainer
    from wmrl.models import sampler

    data_dir, init_dir = rl_shared
    config = tiny_config(data_dir, init_dir, mode="wmrl")
    s = prepare_stages(config, tmp_path, progress=False)
    pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
    trainer = Trainer(config, s.prepared, s.policy, s.wm, pool, tmp_path)
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        before = np.asarray(st.policy.params["embed_vd"]).copy()
        assert trainer.warmup(st) > 0
        after = np.asarray(st.policy.params["embed_vd"])
        np.testing.assert_array_equal(after, before)  # still readable: not donated away
        fns = {
            "policy_step": trainer._policy_step.jitted,
            "wm_step": trainer._wm_step.jitted,
            "ref_logprobs": trainer.logprobs.jitted,
            "wm_score": trainer.wm_score.jitted,
            "correct_rewards": trainer._correct,
            "prefill": sampler.prefill,
            "decode": sampler.decode,
        }
        sizes = {name: f._cache_size() for name, f in fns.items()}
        for _ in range(2):  # the second step trains on the first one's anchors (anchor_lag)
            st, metrics, _ = trainer.run_step(st)
            assert metrics["real_executions_step"] == 2  # the step really ran (1 anchor group)
        assert st.replay.count > 0  # ... and fed the WM's online update
        assert {name: f._cache_size() for name, f in fns.items()} == sizes
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()


def test_budget_used_up_while_draining_anchors_still_ends_with_an_evaluation(
    rl_shared, tmp_path, monkeypatch
):
    """Waiting for in-flight anchors before a checkpoint counts as training time; when that
    wait uses up `rl.max_wall_time_s` the run stops there, and its last evaluation must be of
    that final policy (a run once ended on an evaluation 5 steps old). The wait is made long
    by adding 1000 s to what the real drain measured."""
    import dataclasses

    from wmrl.autoresearch.trainer import Trainer

    real_drain = Trainer.drain

    def slow_drain(self, st):
        st, wait = real_drain(self, st)
        return dataclasses.replace(st, wall_time_s=st.wall_time_s + 1000.0), wait + 1000.0

    monkeypatch.setattr(Trainer, "drain", slow_drain)
    data_dir, init_dir = rl_shared
    config = tiny_config(
        data_dir, init_dir, mode="wmrl", rl__steps=3, rl__max_wall_time_s=500.0,
        rl__checkpoint_every=1, rl__eval_every=10,
    )  # fmt: skip
    summary = run(config, tmp_path / "wd", progress=False)
    assert summary["steps"] == 1 and summary["wall_time_s"] > 1000.0
    last = summary["heldout_curve"][-1]
    # Stamped when the policy existed, before the wait, which the run's clock still counts.
    record = [r for r in read_jsonl(tmp_path / "wd" / "metrics.jsonl") if r["kind"] == "eval"][-1]
    assert last["step"] == 1 and last["wall_time_s"] < 500.0 and record["anchor_drain_s"] > 1000.0
    assert last["wall_time_s"] == record["wall_time_s"]
    assert last["wall_time_s"] + record["anchor_drain_s"] == pytest.approx(summary["wall_time_s"])
    assert summary["final_heldout_reward"] == last["heldout_reward"]


def test_anchor_lag_trains_on_the_previous_steps_anchors(rl_shared, tmp_path):
    """With `rl.anchor_lag = 1` step 2's batch holds, in its anchor positions, step 1's anchor
    rows exactly as sampled (tokens, sampling log-probs) with advantages from their real
    rewards; step 1 masks those positions out. A trainer that lost the in-flight executions
    (a restart) executes the pending rows again."""
    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.experiment import prepare_stages
    from wmrl.autoresearch.trainer import Trainer

    data_dir, init_dir = rl_shared
    config = tiny_config(data_dir, init_dir, mode="wmrl", rl__anchor_lag=1)
    assert not config.rl.normalize_std and config.rl.baseline == "mean"  # Dr.GRPO, below
    s = prepare_stages(config, tmp_path, progress=False)
    pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
    trainer = Trainer(config, s.prepared, s.policy, s.wm, pool, tmp_path)
    batches = []
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        trainer.warmup(st)
        step_fn = trainer._policy_step

        def spy(state, batch):
            batches.append(batch)
            return step_fn(state, batch)

        trainer._policy_step = spy
        corrections = []
        correct_fn = trainer._correct

        def spy_correct(state, inputs):
            out = correct_fn(state, inputs)
            corrections.append((inputs, out))
            return out

        trainer._correct = spy_correct
        st1, m1, pairs1 = trainer.run_step(st)
        first = st1.pending
        assert first.step == 0 and pairs1 == [] and m1["anchor_outcomes_from_step"] is None
        np.testing.assert_array_equal(batches[0]["loss_mask"][first.rows], 0.0)
        assert batches[0]["loss_mask"].sum() > 0  # the WM groups do train
        st2, m2, pairs2 = trainer.run_step(st1)
        b, pos = batches[1], st2.pending.rows  # step 2 put step 1's anchors where its own are
        np.testing.assert_array_equal(b["tokens"][pos], first.tokens)
        np.testing.assert_array_equal(b["old_logp"][pos], first.old_logp)
        np.testing.assert_allclose(b["ref_logp"][pos], first.ref_logp * first.loss_mask)
        rec = {j["row"]: j for j in read_jsonl(tmp_path / "anchors.jsonl") if j["step"] == 0}
        assert sorted(rec) == sorted(first.rows.tolist())
        G = config.rl.group_size
        r = np.array([rec[int(i)]["reward"] or 0.0 for i in first.rows]).reshape(-1, G)
        ok = np.array([rec[int(i)]["status"] != int(Status.UNGRADED) for i in first.rows])
        ok = ok.reshape(-1, G)
        mean = (r * ok).sum(1, keepdims=True) / np.maximum(ok.sum(1, keepdims=True), 1)
        expected = np.where(ok & (ok.sum(1, keepdims=True) >= 2), r - mean, 0.0)
        expected *= m2["anchor_weight"]
        np.testing.assert_allclose(b["advantages"][pos], expected.reshape(-1), atol=1e-5)
        assert m2["anchor_outcomes_from_step"] == 1
        assert {(p["step"], p["row"]) for p in pairs2} == {
            (1, int(i)) for i in first.rows if rec[int(i)]["status"] != int(Status.UNGRADED)
        }
        by_row = dict(zip(first.rows.tolist(), first.r_wm.tolist(), strict=True))
        for p in pairs2:  # the WM score they were given when sampled
            assert p["r_wm"] == pytest.approx(by_row[p["row"]])

        # rl.static_check = "names": WM rows whose script (decoded here from the trained
        # tokens) does not compile get MALFORMED's reward 0, those that read an undefined name
        # RUNTIME_ERROR's 0.1, the others their WM score.
        P = config.data.max_prompt_len
        assert config.rl.static_check == "names"
        flagged = 0
        for batch, (inputs, out) in zip(batches, corrections, strict=True):
            wm_rows = ~np.repeat(np.asarray(inputs.anchor_groups), config.rl.group_size)
            scripts = trainer._decode(batch["tokens"][:, P:], batch["input_mask"][:, P:])
            verdict = [static_outcome(x.encode()) for x in scripts]
            expected = {None: np.nan, Status.MALFORMED: 0.0, Status.RUNTIME_ERROR: 0.1}
            exact = np.array([expected[v and v[0]] for v in verdict])
            known = ~np.isnan(exact)
            np.testing.assert_array_equal(np.asarray(inputs.static_mask)[wm_rows], known[wm_rows])
            rewards = np.asarray(out.rewards)
            np.testing.assert_allclose(rewards[wm_rows & known], exact[wm_rows & known], atol=1e-7)
            assert (rewards[wm_rows & ~known] != 0.0).all()  # WM scores (never exactly 0)
            flagged += int((wm_rows & known).sum())
        assert flagged > 0  # the fixture's policy writes some of both

        # A restart loses the in-flight futures: the pending rows are submitted again.
        trainer.anchors.forget()
        _, m3, _ = trainer.run_step(st2)
        assert m3["anchor_outcomes_from_step"] == 2
        again = [j for j in read_jsonl(tmp_path / "anchors.jsonl") if j["step"] == 1]
        assert sorted(j["row"] for j in again) == sorted(st2.pending.rows.tolist())
    finally:
        trainer.journal.close()
        pool.close()


class _RefusingPool:
    """A pool that must not be asked: the evaluation's outcomes are in the journal."""

    def submit(self, *args, **kwargs):
        raise AssertionError("a journalled held-out execution was executed again")


def test_heldout_evaluation_is_journalled_and_reused_on_resume(rl_shared, tmp_path):
    """The held-out executions are journalled (`heldout.jsonl`) as they complete; a trainer
    opened on the same workdir (a resumed run) evaluates the same policy at the same step
    from the journal, executing nothing, and reports the same figures."""
    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.experiment import prepare_stages
    from wmrl.autoresearch.trainer import Trainer

    data_dir, init_dir = rl_shared
    config = tiny_config(data_dir, init_dir, mode="wmrl")
    s = prepare_stages(config, tmp_path, progress=False)
    pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
    trainer = Trainer(config, s.prepared, s.policy, s.wm, pool, tmp_path)
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        first = trainer.evaluate(st)
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()
    journal = read_jsonl(tmp_path / "heldout.jsonl")
    n = len(s.prepared.heldout_tasks) * config.rl.eval_samples
    assert len(journal) == n and {j["step"] for j in journal} == {0}
    graded = [j["reward"] for j in journal if j["reward"] is not None]
    assert first["heldout_reward"] == pytest.approx(np.mean(graded))
    again = Trainer(config, s.prepared, s.policy, s.wm, _RefusingPool(), tmp_path)
    try:
        second = again.evaluate(st)
    finally:
        again.journal.close()
        again.eval_journal.close()
    for key in ("heldout_reward", "heldout_reward_se", "heldout_per_task", "heldout_ungraded"):
        assert second[key] == first[key]
    assert len(read_jsonl(tmp_path / "heldout.jsonl")) == n  # nothing appended
