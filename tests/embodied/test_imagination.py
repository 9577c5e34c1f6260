"""The imagination-vs-simulator measurement (`wmrl.embodied.imagination`) and the WM's contact
gate, fast."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import embodied_push
from tests.support.embodied_helpers import stage_saved_without
from wmrl.config_errors import ConfigError
from wmrl.embodied import env as scene
from wmrl.embodied import imagination, rollout, stages
from wmrl.embodied import policy as pol
from wmrl.embodied import world_model as wmodel


def test_success_rule_matches_the_scene_rule():
    spec, rng = scene.EnvSpec(), np.random.default_rng(3)
    starts = [scene.sample_start(rng, scene.ALL_TASKS[i % 12], spec) for i in range(200)]
    finals, want = [], []
    for s in starts:
        blocks = s.blocks.copy()
        # half the episodes put the named block near its goal, some nudge another block
        if rng.random() < 0.5:
            blocks[s.task.block] = scene.goal_of(s, spec) + rng.normal(0, 0.02, 2)
        if rng.random() < 0.3:
            blocks[(s.task.block + 1) % 3] += rng.normal(0, 0.03, 2)
        finals.append(np.concatenate([s.pusher, blocks.ravel(), s.blocks.ravel()]))
        want.append(scene.success(s, blocks, spec))
    obs0 = np.stack([scene.make_obs(s) for s in starts])
    task = np.asarray([rollout.task_index(s.task) for s in starts])
    got = imagination.success_rule(obs0, np.stack(finals).astype(np.float32), task, spec)
    assert 40 < sum(want) < 160  # both outcomes are exercised
    np.testing.assert_array_equal(got, np.asarray(want))


def test_execute_actions_reproduces_the_simulator():
    spec = scene.EnvSpec()
    rng = np.random.default_rng(0)
    starts = rollout.sample_starts(rng, scene.ALL_TASKS, 3, spec)
    acts = rng.integers(0, spec.num_actions, (3, 6))
    got = imagination.execute_actions(rollout.EnvPool(spec), starts, acts)
    env = scene.PushEnv(spec)
    for i, s in enumerate(starts):
        want = [env.reset(s)] + [env.step(a) for a in acts[i]]
        np.testing.assert_allclose(got[i], np.stack(want))


# Slow (~12 s of CPU: it builds tiny stages): the fast suite keeps the success rule, the
# simulator replay and the gate by hand.
@pytest.mark.slow
def test_a_still_world_model_has_the_no_move_errors():
    """A WM whose dynamics predict no motion imagines the start state throughout: its block
    errors equal the real blocks' displacement (the no-move baseline), its pusher error the
    real pusher's displacement; chunk 0 of an imagined episode is the real start (no error,
    the same policy on both)."""
    c = embodied_push.get_config("tiny")
    c.env.episode_len = 8
    c.policy.chunk = 4
    graphdef, params = pol.init_policy(stages.policy_spec(c), 0)
    wm = wmodel.init_wm(stages.wm_spec(c), 1)
    wm["dyn"][-1] = jax.tree.map(jnp.zeros_like, wm["dyn"][-1])
    wm["pusher"] = jax.tree.map(jnp.zeros_like, wm["pusher"])  # the object dynamics' map
    spec = stages.env_spec(c)
    train, _ = stages.tasks_of(c)
    starts = rollout.sample_starts(np.random.default_rng(1), train, 2, spec, repeat=4)
    out = imagination.fidelity(c, wm, graphdef, params, starts, jax.random.PRNGKey(0), 4)
    rep, im = out["replay"], out["imagined"]
    assert rep["named_block_cm"] == pytest.approx(rep["named_block_no_move_cm"], abs=0.011)
    assert rep["other_blocks_cm"] == pytest.approx(rep["other_blocks_no_move_cm"], abs=0.011)
    assert rep["member_spread_blocks_cm"] == [0.0, 0.0]
    assert rep["rule_on_imagined_success"] == 0.0  # nothing moved in imagination
    assert im["pusher_cm"][0] == 0.0 and im["named_block_cm"][0] == 0.0
    assert im["kl_real_vs_imagined"][0] == pytest.approx(0.0, abs=1e-5)
    assert im["argmax_agreement"][0] == 1.0
    assert im["token_logp_on_imagined"][0] == pytest.approx(im["token_logp_on_real"][0])
    # the pusher moved in reality (random policy) but not in imagination
    assert im["pusher_cm"][1] > 0.5


def test_contact_gate_moves_only_touched_blocks():
    """`wm.contact_gate`: a block more than the gate's distance from the pusher and from the
    other blocks keeps its imagined position exactly; a touched one may move."""
    obs = np.zeros((1, 14), np.float32)
    obs[0, 0:2] = (0.0, 0.0)  # pusher
    obs[0, 2:8] = (0.05, 0.0, 0.2, 0.0, 0.2, 0.065)  # red 5 cm away; green, blue 6.5 cm apart
    obs[0, 8:14] = obs[0, 2:8]
    mask = np.asarray(wmodel.contact_mask(jnp.asarray(obs), 0.07))
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(
        np.asarray(wmodel.contact_mask(jnp.asarray(obs), 0.06)), [[1, 1, 0, 0, 0, 0]]
    )
    spec = wmodel.WMSpec(num_members=1, dynamics="mlp")
    member = jax.tree.map(lambda x: x[0], wmodel.init_wm(spec, 0))
    vel = jnp.asarray(scene.EnvSpec().velocities())
    a = jnp.asarray([3])
    free = np.asarray(wmodel.dyn_step(member, jnp.asarray(obs), a, vel))
    gated = np.asarray(wmodel.dyn_step(member, jnp.asarray(obs), a, vel, 0.06))
    assert np.abs(free[0, 4:8] - obs[0, 4:8]).min() > 0  # the ungated MLP moves every block
    np.testing.assert_array_equal(gated[0, 4:8], obs[0, 4:8])
    np.testing.assert_array_equal(gated[0, :4], free[0, :4])  # pusher and red as before


def test_a_stage_saved_before_the_contact_gate_loads_with_the_gate_off(tmp_path):
    c = embodied_push.get_config("tiny")
    c.wm.dynamics = "mlp"  # the gate's variant
    stage = stage_saved_without(tmp_path / "wm", c, "wm.contact_gate")
    assert stages.stage_done(stage, c)["x"] == 1
    c.wm.contact_gate = 0.07
    with pytest.raises(ConfigError, match=r"wm\.contact_gate"):
        stages.stage_done(stage, c)
    with pytest.raises(ConfigError, match=r"config\.wm\.contact_gate"):
        c.wm.contact_gate = -0.1
        stages.validate_embodied_config(c)


def test_trusted_tokens_stop_at_the_first_disagreement():
    from wmrl.embodied import rl

    c = embodied_push.get_config("tiny")
    c.rl.wm_trust_spread = 0.01
    st = rl.statics_from_config(c)  # chunk 4
    spread = np.asarray([[0.0, 0.004, 0.02, 0.001], [0.0, 0.0, 0.0, 0.0099], [0.0, 0.01, 0, 0]])
    want = np.asarray([[1] * 8 + [0] * 8, [1] * 16, [1] * 4 + [0] * 12], np.float32)
    np.testing.assert_array_equal(rl.trusted_tokens(spread, st), want)
    c.rl.wm_trust_spread = 0.0
    off = rl.trusted_tokens(spread, rl.statics_from_config(c))
    np.testing.assert_array_equal(off, np.ones((3, 16), np.float32))


def test_a_run_saved_before_the_new_fields_resumes_with_them_off():
    from wmrl.embodied import experiment

    c = embodied_push.get_config("tiny")
    saved = json.loads(c.to_json_best_effort())
    del saved["wm"]["contact_gate"], saved["rl"]["wm_trust_spread"]
    assert experiment.config_differences(saved, c) == []
    c.rl.wm_trust_spread = 0.01
    assert experiment.config_differences(saved, c) == ["rl.wm_trust_spread"]
