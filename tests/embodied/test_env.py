"""The MuJoCo pushing scene, its expert and its bad-input errors (fast)."""

import jax
import numpy as np
import pytest

from configs import embodied_push
from wmrl.config_errors import ConfigError
from wmrl.embodied import env as scene
from wmrl.embodied import policy as pol
from wmrl.embodied import stages

SPEC = scene.EnvSpec()


def test_expert_succeeds_on_most_episodes():
    """The waypoint controller in the real physics (measured 88.8% over 240 episodes)."""
    env, rng = scene.PushEnv(SPEC), np.random.default_rng(0)
    wins = []
    for i in range(24):
        task = scene.ALL_TASKS[i % 12]
        obs = env.reset(scene.sample_start(rng, task, SPEC))
        for _ in range(SPEC.episode_len):
            obs = env.step(scene.expert_action(obs, task, SPEC))
        wins.append(env.succeeded())
    assert np.mean(wins) >= 0.7


def test_idle_episode_fails_and_pusher_moves_at_commanded_speed():
    env = scene.PushEnv(SPEC)
    start = scene.StartState(
        scene.Task("red", "left"),
        np.array([0.2, 0.2], np.float32),
        np.array([[-0.1, 0.0], [0.0, 0.0], [0.1, 0.0]], np.float32),
    )
    env.reset(start)
    stop = int(SPEC.quantise(np.zeros(2)))
    right = int(SPEC.quantise(np.array([SPEC.max_speed, 0.0])))
    for _ in range(3):
        env.step(stop)
    assert not env.succeeded()  # nothing moved: the red block is 10 cm from its goal
    obs = env.step(right)
    # one action of 0.1 s at 0.2 m/s: 2 cm (the velocity servo lags a few ms)
    assert obs[0] - 0.2 == pytest.approx(SPEC.max_speed * SPEC.action_dt, abs=2e-3)


def test_success_rule_by_hand():
    start = scene.StartState(
        scene.Task("green", "forward"),
        np.zeros(2, np.float32),
        np.array([[-0.1, 0.0], [0.0, 0.0], [0.1, 0.0]], np.float32),
    )
    at_goal = start.blocks.copy()
    at_goal[1] = (0.0, 0.08)  # 2 cm short of the goal (0, 0.10): within 3 cm
    assert scene.success(start, at_goal, SPEC)
    far = at_goal.copy()
    far[1] = (0.0, 0.065)  # 3.5 cm short
    assert not scene.success(start, far, SPEC)
    bumped = at_goal.copy()
    bumped[0] = (-0.135, 0.0)  # another block moved 3.5 cm
    assert not scene.success(start, bumped, SPEC)


def test_canonical_frame_maps_push_direction_to_plus_x():
    rots, perms = pol.frame_tables(SPEC.num_actions)
    vel = SPEC.velocities()
    push_x = int(SPEC.quantise(np.array([SPEC.max_speed, 0.0])))
    for i, name in enumerate(scene.DIRECTIONS):
        d = np.asarray(scene.DIRECTION_VECTORS[name])
        np.testing.assert_allclose(rots[i] @ d, [1.0, 0.0])
        canon = np.zeros(SPEC.num_actions)
        canon[push_x] = 1.0
        world = canon[perms[i]]  # canonical logits -> world logits
        np.testing.assert_allclose(vel[world.argmax()], SPEC.max_speed * d)


def test_bad_input_names_the_field():
    c = embodied_push.get_config()
    c.tasks.heldout = ("push the red block sideways",)
    with pytest.raises(ConfigError, match=r"config\.tasks\.heldout\[0\].*sideways"):
        stages.validate_embodied_config(c)
    c = embodied_push.get_config()
    c.tasks.heldout = ("push the red block left", "shove the red block left")
    with pytest.raises(ConfigError, match=r"config\.tasks\.heldout\[1\].*unknown.*shove"):
        stages.validate_embodied_config(c)
    c = embodied_push.get_config()
    c.tasks.train = ("push the yellow block left",)
    with pytest.raises(ConfigError, match=r"config\.tasks\.train\[0\].*colour 'yellow'.*scene"):
        stages.validate_embodied_config(c)
    c = embodied_push.get_config()
    c.policy.chunk = 48
    with pytest.raises(ConfigError, match=r"config\.policy\.chunk.*longer than the episode"):
        stages.validate_embodied_config(c)
    c = embodied_push.get_config()
    c.mode = "fastest"
    with pytest.raises(ConfigError, match=r"config\.mode: must be one of .*'fastest'"):
        stages.validate_embodied_config(c)
    c.mode = "constant_wm"  # the control's old name: refused, naming the new one
    with pytest.raises(
        ConfigError, match=r"config\.mode: 'constant_wm' is now called 'static_anchors'"
    ):
        stages.validate_embodied_config(c)
    c = embodied_push.get_config()
    c.env.colours = ("red", "yellow", "blue")
    with pytest.raises(ConfigError, match=r"config\.env\.colours"):
        stages.validate_embodied_config(c)
    c = embodied_push.get_config()
    c.correction.debias = "keyed"
    with pytest.raises(ConfigError, match=r"config\.correction\.debias.*monotone"):
        stages.validate_embodied_config(c)
    c = embodied_push.get_config()
    c.wm.head_inputs = "images"
    with pytest.raises(ConfigError, match=r"config\.wm\.head_inputs.*images"):
        stages.validate_embodied_config(c)
    c = embodied_push.get_config()
    c.wm.replay_size = 0
    with pytest.raises(ConfigError, match=r"config\.wm\.replay_size.*integer >= 1.*got 0"):
        stages.validate_embodied_config(c)
    c = embodied_push.get_config()
    c.wm.online_steps = -1
    with pytest.raises(ConfigError, match=r"config\.wm\.online_steps.*integer >= 0"):
        stages.validate_embodied_config(c)


def test_default_heldout_evaluation_has_a_standard_error_of_at_most_0_03():
    """The bar an evaluation must meet: the binomial SE sqrt(p (1 - p) / n) at worst (p = 0.5)."""
    n = embodied_push.get_config().rl.eval_episodes
    assert np.sqrt(0.25 / n) <= 0.03


def test_path_features_by_hand():
    """The WM head's pusher-path features on a straight path (by hand, in the named block's
    frame: origin the green block's start, x along "forward" = +y, y across = -x)."""
    import jax.numpy as jnp

    from wmrl.embodied import world_model as wmodel

    obs0 = np.zeros((1, 14), np.float32)
    obs0[0, :2] = (0.0, -0.1)
    starts = np.array([[0.1, 0.0], [0.0, 0.0], [-0.1, 0.05]], np.float32)
    obs0[0, 2:8] = obs0[0, 8:14] = starts.ravel()
    t = np.arange(8)
    path = np.stack([np.full(8, 0.01), -0.1 + 0.025 * (t + 1)], -1)[None].astype(np.float32)
    task = scene.ALL_TASKS.index(scene.parse_instruction("push the green block forward"))
    f = np.asarray(wmodel.path_features(jnp.asarray(obs0), jnp.asarray(path), jnp.asarray([task])))
    # along after steps 2, 4, 6, 8; across (-x) there; max along; max |across|; clearance to
    # red (closest at y = 0: 0.09) and to blue (closest at y = 0.05: 0.11), sorted; x10 scale
    want = [-0.05, 0.0, 0.05, 0.1, -0.01, -0.01, -0.01, -0.01, 0.1, 0.01, 0.09, 0.11]
    np.testing.assert_allclose(f[0], 10 * np.asarray(want), atol=1e-5)


def test_head_inputs_variants_round_trip_and_score():
    """Each `wm.head_inputs` variant builds a head of its width, is read back from the params
    and scores replayed episodes (success probabilities [M, N] in (0, 1))."""
    import jax.numpy as jnp

    from wmrl.embodied import world_model as wmodel

    obs0 = jnp.asarray(
        scene.make_obs(scene.sample_start(np.random.default_rng(0), scene.ALL_TASKS[5], SPEC))
    )[None]
    actions = jnp.zeros((1, 8), jnp.int32)
    vel = jnp.asarray(SPEC.velocities())
    for kind, width in wmodel.HEAD_WIDTHS.items():
        params = wmodel.init_wm(
            wmodel.WMSpec(num_members=2, hidden=8, head_hidden=8, head_inputs=kind), 0
        )
        member = jax.tree.map(lambda x: x[0], params)
        assert wmodel.head_kind(member) == kind and member["head"][0]["w"].shape[0] == width
        finals, paths = wmodel.replay(params, obs0, actions, vel)
        assert paths.shape == (2, 1, 8, 2)
        mu, _ = wmodel.score_finals(params, obs0, finals, jnp.asarray([5]), 0.1, paths)
        assert mu.shape == (2, 1) and bool(((mu > 0) & (mu < 1)).all())
