"""The world model's `object` dynamics (`wm.dynamics`, the default): the swept-path contact
gate, the learned pusher map, the square's symmetries its training uses (checked against the
simulator), and that pretraining learns them."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import embodied_push
from tests.support.embodied_helpers import stage_saved_without
from wmrl.config_errors import ConfigError
from wmrl.embodied import env as scene
from wmrl.embodied import stages
from wmrl.embodied import world_model as wmodel

SPEC = scene.EnvSpec()
VEL = SPEC.velocities()


def _member(spec: wmodel.WMSpec, seed: int = 0):
    return jax.tree.map(lambda x: x[0], wmodel.init_wm(spec, seed))


def test_segment_distance_by_hand():
    a, b = jnp.asarray([[0.0, 0.0]] * 4), jnp.asarray([[2.0, 0.0]] * 3 + [[0.0, 0.0]])
    p = jnp.asarray([[1.0, 1.0], [3.0, 0.0], [-1.0, -1.0], [3.0, 4.0]])
    got = np.asarray(wmodel.segment_distance(p, a, b))
    np.testing.assert_allclose(got, [1.0, 1.0, np.sqrt(2.0), 5.0], rtol=1e-6)  # last: a point


def test_square_symmetries_map_the_action_grid_onto_itself():
    mats, maps = wmodel.square_symmetries(VEL)
    assert mats.shape == (8, 2, 2) and maps.shape == (8, 25)
    np.testing.assert_allclose(
        np.einsum("gij,gkj->gik", mats, mats), np.broadcast_to(np.eye(2), (8, 2, 2))
    )
    assert len({m.tobytes() for m in mats}) == 8  # all different
    for g in range(8):  # each a permutation of the tokens, velocities mapped exactly
        assert sorted(maps[g]) == list(range(25))
        np.testing.assert_allclose(VEL[maps[g]], VEL @ mats[g].T, atol=1e-7)
    np.testing.assert_array_equal(maps[0], np.arange(25))  # the identity first
    # token = iy * 5 + ix over the axis (-0.2, -0.1, 0, 0.1, 0.2): +x at full speed is 14,
    # +y at full speed 22; mats[2] turns by 90 degrees; mats[1] mirrors y.
    assert maps[2][14] == 22 and maps[1][19] == 9  # (0.2, 0.1) -> (0.2, -0.1)


def test_the_simulator_is_symmetric_under_them():
    """The training windows' transformation is a real symmetry of the scene: a pushing episode
    started from a transformed state with the mapped action tokens is the transformed episode
    (MuJoCo, three actions from the pusher touching a block). Contact can amplify rounding
    (a pusher hitting a cube's corner), so the check is on the median over placements; a
    wrong action map or point transform is off by centimetres almost everywhere."""
    mats, maps = wmodel.square_symmetries(VEL)
    env = scene.PushEnv(SPEC)
    rng = np.random.default_rng(0)
    gaps, moved = [], []
    for i in range(24):
        s = scene.sample_start(rng, scene.ALL_TASKS[i % 12], SPEC)
        angle = rng.uniform(0, 2 * np.pi)
        touch = 0.045 * np.asarray([np.cos(angle), np.sin(angle)])
        s = scene.StartState(s.task, (s.blocks[s.task.block] - touch).astype(np.float32), s.blocks)
        acts = rng.integers(0, 25, 3)
        real = np.stack([env.reset(s)] + [env.step(a) for a in acts])
        moved.append(np.linalg.norm(real[-1, 2:8] - real[0, 2:8]))
        for g in range(1, 8):
            m = mats[g]
            s2 = scene.StartState(s.task, m @ s.pusher, (s.blocks @ m.T).astype(np.float32))
            mirrored = np.stack([env.reset(s2)] + [env.step(maps[g][a]) for a in acts])
            want = wmodel.transform_points(real, np.broadcast_to(m, (4, 2, 2)))
            gaps.append(np.abs(mirrored - want).max())
    assert sum(d > 0.005 for d in moved) >= 8  # blocks were pushed (centimetres)
    gaps = np.asarray(gaps).reshape(24, 7)
    assert (np.median(gaps, axis=0) < 1e-5).all()  # each of the 7 symmetries


def test_object_dynamics_move_only_blocks_the_pusher_can_reach():
    member = _member(wmodel.WMSpec(num_members=1, hidden=16))
    member["pusher"]["w"] = jnp.eye(2) * 0.1
    member["pusher"]["b"] = jnp.asarray([0.001, -0.002])
    obs = np.zeros((3, 14), np.float32)
    # row 0: red 6 cm ahead of a pusher moving +x 2 cm (touched), green 6.8 cm from the swept
    # path but 5.5 cm from red (moved along), blue far away
    obs[0, 2:8] = (0.06, 0.0, 0.06, 0.055, -0.2, 0.2)
    # row 1: the pusher moves away from every block (none touched)
    obs[1, 2:8] = (0.06, 0.0, 0.06, 0.055, -0.2, 0.2)
    # row 2: green touched, red moved along through green (the other neighbour's branch)
    obs[2, 2:8] = (0.06, 0.055, 0.06, 0.0, -0.2, 0.2)
    obs[:, 8:14] = obs[:, 2:8]
    right, left = 14, 10  # (+0.2, 0), (-0.2, 0)
    acts = jnp.asarray([right, left, right])
    nxt = np.asarray(wmodel.dyn_step(member, jnp.asarray(obs), acts, jnp.asarray(VEL)))
    np.testing.assert_allclose(nxt[0, 0:2], [0.021, -0.002], atol=1e-7)  # v @ W + b
    np.testing.assert_allclose(nxt[1, 0:2], [-0.019, -0.002], atol=1e-7)
    assert np.abs(nxt[0, 2:6] - obs[0, 2:6]).min() > 0  # red and green may move
    np.testing.assert_array_equal(nxt[0, 6:8], obs[0, 6:8])  # blue exactly still
    np.testing.assert_array_equal(nxt[1, 2:8], obs[1, 2:8])  # nothing touched in row 1
    assert np.abs(nxt[2, 2:6] - obs[2, 2:6]).min() > 0
    np.testing.assert_array_equal(nxt[2, 6:8], obs[2, 6:8])
    np.testing.assert_array_equal(nxt[:, 8:14], obs[:, 8:14])  # start positions are constant
    assert wmodel.dynamics_kind(member) == "object"
    mlp = _member(wmodel.WMSpec(num_members=1, hidden=16, dynamics="mlp"))
    assert wmodel.dynamics_kind(mlp) == "mlp" and "pusher" not in mlp


def _real_windows(n_eps: int, seed: int):
    """Expert episodes with a third of the actions random (contact and free moves)."""
    rng = np.random.default_rng(seed)
    env = scene.PushEnv(SPEC)
    obs = np.zeros((n_eps, 41, 14), np.float32)
    acts = np.zeros((n_eps, 40), np.int32)
    for i in range(n_eps):
        s = scene.sample_start(rng, scene.ALL_TASKS[i % 12], SPEC)
        obs[i, 0] = env.reset(s)
        for t in range(40):
            a = scene.expert_action(obs[i, t], s.task, SPEC)
            acts[i, t] = rng.integers(0, 25) if rng.random() < 0.3 else a
            obs[i, t + 1] = env.step(acts[i, t])
    task = np.zeros(n_eps, np.int32)
    return wmodel.episode_data(obs, acts, task, np.zeros(n_eps), SPEC.push_distance)


def test_make_batch_shows_each_window_under_one_symmetry():
    data = _real_windows(6, 0)
    sym = wmodel.square_symmetries(VEL)
    plain = wmodel.make_batch(np.random.default_rng(1), data, 2, 64, 3, 2)
    seen = wmodel.make_batch(np.random.default_rng(1), data, 2, 64, 3, 2, symmetries=sym)
    for k in ("ep_obs0", "ep_actions", "ep_success"):  # the other draws are unchanged
        np.testing.assert_array_equal(plain[k], seen[k])
    mats, maps = sym
    used = set()
    for m in range(2):
        for i in range(64):
            hits = [
                g
                for g in range(8)
                if np.allclose(
                    wmodel.transform_points(plain["obs"][m, i], mats[g]), seen["obs"][m, i]
                )
                and (maps[g][plain["action"][m, i]] == seen["action"][m, i]).all()
                and np.allclose(
                    wmodel.transform_points(plain["next_obs"][m, i], mats[g][None]),
                    seen["next_obs"][m, i],
                )
            ]
            assert hits
            used.update(hits)
    assert len(used) == 8
    # physics, independently: the pusher still moves by (about) the mapped action's velocity
    move = seen["next_obs"][..., 0, :2] - seen["obs"][..., :2]
    np.testing.assert_allclose(move, VEL[seen["action"][..., 0]] * SPEC.action_dt, atol=3e-3)


def test_pretraining_learns_the_object_dynamics():
    """250 steps on 40 real episodes: the pusher map reaches the action's duration
    (displacement = velocity x 0.1 s; the servo's lag takes ~2.5% off one step) and the
    one-step error of the blocks on fresh transitions that move a block falls well below
    predicting that nothing moves (0.58 of it when written; an untrained model is at 1)."""
    data = _real_windows(40, 1)
    spec = wmodel.WMSpec(num_members=2, hidden=32, head_hidden=8, head_inputs="final")
    params = wmodel.init_wm(spec, 0)
    tx = optax.adam(3e-3)
    opt = tx.init(params)
    step = wmodel.make_train_step(tx, jnp.asarray(VEL), SPEC.push_distance)
    rng, sym = np.random.default_rng(0), wmodel.square_symmetries(VEL)
    for _ in range(250):
        params, opt, _ = step(params, opt, wmodel.make_batch(rng, data, 2, 128, 2, 2, 0, sym))
    np.testing.assert_allclose(
        np.asarray(params["pusher"]["w"]), np.broadcast_to(np.eye(2) * 0.1, (2, 2, 2)), atol=0.006
    )
    test = _real_windows(20, 2)
    o, a, o2 = (
        x.reshape(-1, *x.shape[2:])
        for x in (test["obs"][:, :-1], test["actions"], test["obs"][:, 1:])
    )
    moved = np.linalg.norm((o2 - o)[:, 2:8].reshape(-1, 3, 2), axis=-1).max(-1) > 0.002
    assert moved.sum() > 100
    member = jax.tree.map(lambda x: x[0], params)
    pred = np.asarray(
        wmodel.dyn_step(member, jnp.asarray(o[moved]), jnp.asarray(a[moved]), jnp.asarray(VEL))
    )
    err = np.abs(pred - o2[moved])[:, 2:8].mean()
    still = np.abs(o[moved] - o2[moved])[:, 2:8].mean()
    assert err < 0.75 * still, (err, still)


def test_dynamics_config_errors_name_the_field(tmp_path):
    c = embodied_push.get_config("tiny")
    assert c.wm.dynamics == "object"
    c.wm.dynamics = "physics"
    with pytest.raises(ConfigError, match=r"config\.wm\.dynamics"):
        stages.validate_embodied_config(c)
    c.wm.dynamics = "object"
    c.wm.contact_gate = 0.07
    with pytest.raises(ConfigError, match=r"config\.wm\.contact_gate.*'mlp' only"):
        stages.validate_embodied_config(c)
    c.wm.dynamics = "mlp"
    stages.validate_embodied_config(c)


def test_stages_and_runs_saved_before_the_field_are_mlp(tmp_path):
    import json

    from wmrl.embodied import experiment

    c = embodied_push.get_config("tiny")
    stage = stage_saved_without(tmp_path / "wm", c, "wm.dynamics")
    with pytest.raises(ConfigError, match=r"wm\.dynamics"):
        stages.stage_done(stage, c)  # an old stage is the mlp one, not this config's object
    c.wm.dynamics = "mlp"
    assert stages.stage_done(stage, c)["x"] == 1
    run = json.loads(c.to_json_best_effort())
    del run["wm"]["dynamics"]
    assert experiment.config_differences(run, c) == []
    c.wm.dynamics = "object"
    assert experiment.config_differences(run, c) == ["wm.dynamics"]
