"""Branched imagination (`wm.branch_chunks`): the success-to-go head's training windows, the
branch imagined from a real state, the WM rows a branched RL step trains on, and bad input."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import embodied_push
from wmrl.config_errors import ConfigError
from wmrl.embodied import config as econfig
from wmrl.embodied import env as scene
from wmrl.embodied import experiment, imagination, rl, rollout, stages
from wmrl.embodied import policy as pol
from wmrl.embodied import wm_training as wmtrain
from wmrl.embodied import world_model as wmodel


def test_value_windows_by_hand():
    E, T, h = 3, 10, 4
    obs = np.zeros((E, T + 1, 14), np.float32)
    obs[..., 0] = np.arange(E)[:, None] * 100 + np.arange(T + 1)  # (episode, time) readable
    data = {
        "obs": obs,
        "actions": (np.arange(E)[:, None] * 7 + np.arange(T)) % 25,
        "task": np.asarray([4, 5, 6]),
        "success": np.asarray([1.0, 0.0, 1.0], np.float32),
        "progress": np.zeros(E, np.float32),
    }
    b = wmtrain.make_batch(np.random.default_rng(0), data, 2, 5, 50, 1, value_horizon=h)
    assert b["v_obs"].shape == (2, 50, 14) and b["v_actions"].shape == (2, 50, h)
    e, t = (b["v_obs"][..., 0] // 100).astype(int), (b["v_obs"][..., 0] % 100).astype(int)
    assert t.max() <= T - h and len(np.unique(t)) > 3  # every window fits in its episode
    for m in range(2):
        for i in range(50):
            np.testing.assert_array_equal(
                b["v_actions"][m, i], data["actions"][e[m, i], t[m, i] : t[m, i] + h]
            )
    np.testing.assert_allclose(b["v_left"], (T - t - h) / T)
    np.testing.assert_array_equal(b["v_success"], data["success"][e])
    np.testing.assert_array_equal(b["v_task"], data["task"][e])
    assert "v_obs" not in wmtrain.make_batch(np.random.default_rng(0), data, 2, 5, 50, 1)


def _still(wm):
    """The WM with its dynamics' last layer (and the object dynamics' pusher map) zeroed:
    nothing moves in imagination."""
    wm = jax.tree.map(lambda x: x, wm)
    wm["dyn"][-1] = jax.tree.map(jnp.zeros_like, wm["dyn"][-1])
    if "pusher" in wm:
        wm["pusher"] = jax.tree.map(jnp.zeros_like, wm["pusher"])
    return wm


def test_a_branch_starts_at_the_real_state_and_is_scored_with_the_time_left():
    spec = wmodel.WMSpec(num_members=3, hidden=16, head_hidden=8, value_head=True)
    wm = _still(wmodel.init_wm(spec, 0))
    assert "value" not in wmodel.init_wm(wmodel.WMSpec(num_members=1), 0)  # off: no head
    c = embodied_push.get_config("tiny")
    graphdef, params = pol.init_policy(stages.policy_spec(c), 0)
    rng = np.random.default_rng(1)
    starts = [scene.sample_start(rng, scene.ALL_TASKS[i], scene.EnvSpec()) for i in range(4)]
    obs = np.stack([scene.make_obs(s) for s in starts])
    obs[:, 0:2] += 0.01  # a mid-episode state: the pusher has moved
    words = np.stack([scene.encode_instruction(s.task) for s in starts])
    task = np.asarray([rollout.task_index(s.task) for s in starts], np.int32)
    t0 = np.asarray([0, 4, 8, 24], np.float32)
    vel = jnp.asarray(scene.EnvSpec().velocities())
    branch = jax.jit(
        lambda wm, params, *a: wmodel.imagine_branch(
            wm,
            graphdef,
            params,
            *a,
            num_chunks=2,
            chunk=4,
            episode_len=40,
            velocities=vel,
            push_distance=0.1,
        )
    )
    im = branch(
        wm,
        params,
        jnp.asarray(words),
        jnp.asarray(task),
        jnp.asarray(obs),
        jnp.asarray(t0),
        jax.random.PRNGKey(0),
    )
    assert im["actions"].shape == (4, 8) and im["obs"].shape == (4, 2, 14)
    np.testing.assert_allclose(np.asarray(im["obs"]), np.repeat(obs[:, None], 2, 1), atol=1e-6)
    left = np.asarray([32, 28, 24, 8], np.float32) / 40  # (40 - t0 - 8) / 40, by hand
    for m in range(3):
        member = jax.tree.map(lambda x, m=m: x[m], wm)
        feats = wmodel.value_features(jnp.asarray(obs), jnp.asarray(task), 0.1, jnp.asarray(left))
        mu, lv, _ = wmodel.value(member, feats)
        np.testing.assert_allclose(np.asarray(im["means"][m]), np.asarray(mu), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(im["log_vars"][m]), np.asarray(lv), rtol=1e-5)
    # an anchor's pair: its own actions replayed from the same state, the same score
    rep_mu, _ = wmodel.replay_value(
        wm,
        jnp.asarray(obs),
        im["actions"],
        jnp.asarray(t0),
        jnp.asarray(task),
        episode_len=40,
        velocities=vel,
        push_distance=0.1,
    )
    np.testing.assert_allclose(np.asarray(rep_mu), np.asarray(im["means"]), rtol=1e-5)
    assert len(np.unique(np.asarray(im["means"][0]).round(6))) == 4  # the time left matters


def test_branch_chunks_bad_input_names_the_field(tmp_path):
    for bad in (-1, 11):
        c = embodied_push.get_config()
        c.wm.branch_chunks = bad
        with pytest.raises(ConfigError, match=r"config\.wm\.branch_chunks.*\[0, 10\]"):
            econfig.validate_embodied_config(c)
    c = embodied_push.get_config("tiny")
    stage = tmp_path / "wm"
    stage.mkdir()
    stages.finish_stage(stage, c, {"x": 1})
    saved = json.loads((stage / "done.json").read_text())
    del saved["config"]["wm.branch_chunks"]  # a stage saved before the field existed
    (stage / "done.json").write_text(json.dumps(saved))
    assert stages.stage_done(stage, c)["x"] == 1
    c.wm.branch_chunks = 1
    with pytest.raises(ConfigError, match=r"wm\.branch_chunks"):
        stages.stage_done(stage, c)
    run = json.loads(embodied_push.get_config("tiny").to_json_best_effort())
    del run["wm"]["branch_chunks"]
    assert econfig.HISTORY.differences(run, embodied_push.get_config("tiny")) == []


@pytest.fixture(scope="module")
def branched_run(tmp_path_factory):
    """A one-step tiny `wmrl` run with 1-chunk branches; every policy batch and every
    simulator step taken while the WM groups are built are recorded."""
    root = tmp_path_factory.mktemp("branch")
    c = embodied_push.get_config("tiny")
    c.init_dir, c.rl.steps, c.wm.branch_chunks = str(root / "init"), 1, 1
    batches, env_steps = [], {"n": 0, "in_branch": 0}
    make_update, branched = rl.make_policy_update, rl.Trainer.branched_groups
    step = scene.PushEnv.step
    inside = {"on": False}

    def count_step(self, a):
        env_steps["n"] += 1
        env_steps["in_branch"] += inside["on"]
        return step(self, a)

    def record(*a, **k):
        update = make_update(*a, **k)

        def wrapped(params, opt, ref, batch):
            batches.append(jax.tree.map(np.asarray, batch))
            return update(params, opt, ref, batch)

        return wrapped

    def spy(self, *a, **k):
        inside["on"] = True
        try:
            return branched(self, *a, **k)
        finally:
            inside["on"] = False

    mp = pytest.MonkeyPatch()
    mp.setattr(rl, "make_policy_update", record)
    mp.setattr(rl.Trainer, "branched_groups", spy)
    mp.setattr(scene.PushEnv, "step", count_step)
    try:
        summary = experiment.run(c, root / "run")
    finally:
        mp.undo()
    return c, summary, batches, env_steps


# The branched run is `slow` (an off-by-default option; ~35 s with its fixture); the fast suite
# keeps the branch's start state and score by hand above.
@pytest.mark.slow
def test_a_branched_step_trains_the_branch_tokens_on_a_real_prefix(branched_run):
    c, summary, batches, env_steps = branched_run
    G, H, T = c.rl.group_size, c.policy.chunk, c.env.episode_len
    assert summary["real_executions"] == 2 * G and summary["wm_episodes"] == 2 * G
    assert env_steps["n"] > 0 and env_steps["in_branch"] == 0  # branches never step MuJoCo
    (b,) = batches
    anchors, branch = slice(0, 2 * G), slice(2 * G, 4 * G)
    np.testing.assert_array_equal(b["mask"][anchors], 1.0)
    for g in range(2):  # a WM group: G branches from one state of one anchor episode
        rows = b["mask"][branch][g * G : (g + 1) * G]
        tok = np.nonzero(rows[0])[0]
        assert len(tok) == H and tok[0] % H == 0 and np.all(np.diff(tok) == 1)
        assert np.all(rows == rows[0])
        acts = b["actions"][branch][g * G : (g + 1) * G]
        src = [
            i
            for i in range(2 * G)
            if np.array_equal(b["actions"][i, : tok[0]], acts[0, : tok[0]])
            and np.array_equal(b["words"][i], b["words"][2 * G + g * G])
        ]
        assert src, "the prefix is an anchor episode's real actions"
        # the branch rows' prefix (and suffix) are the same source episode's, untrained
        for r in range(1, G):
            np.testing.assert_array_equal(acts[r, : tok[0]], acts[0, : tok[0]])
            np.testing.assert_array_equal(acts[r, tok[-1] + 1 :], acts[0, tok[-1] + 1 :])
        assert tok[-1] < T


@pytest.mark.slow
def test_the_branch_probe_executes_what_the_trainer_imagines(branched_run):
    c = branched_run[0]
    init = Path(c.init_dir)
    spec = stages.env_spec(c)
    pool = rollout.EnvPool(spec)
    demos, _ = stages.demos_stage(c, init / "demos", pool)
    graphdef, bc, _ = stages.bc_stage(c, init / "bc", demos)
    wm, _, _ = stages.wm_stage(c, init / "wm", pool, demos, graphdef, bc)
    train, _ = stages.tasks_of(c)
    starts = rollout.sample_starts(np.random.default_rng(0), train, 4, spec, repeat=4)
    out = imagination.fidelity(c, wm, graphdef, bc, starts, jax.random.PRNGKey(0), 4)
    br = out["branch"]
    assert br["branch_chunks"] == 1
    assert br["prefix_replay_error_cm"] < 1e-3  # the branches start where the episode was
    assert 0.0 <= br["real_success_of_branches"] <= 1.0
    assert 0.0 <= br["value_on_imagined_mean"] <= 1.0
    for k in ("within_group_auc_imagined", "within_group_auc_real_state"):
        assert np.isnan(br[k]) or 0.0 <= br[k] <= 1.0
