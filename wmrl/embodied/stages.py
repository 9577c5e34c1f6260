"""Config validation and the stages before RL, each saved once and reused:

    demos/  expert demonstrations (real episodes of the waypoint controller)
    bc/     the behaviour-cloned chunk policy
    wm/     the world model, pretrained on the demos and real rollouts of the BC policy

A stage writes its arrays first and `done.json` (its report and the config fields it depends
on) last, so an interrupted pipeline redoes at most the stage it was in; a stage made with
other settings is refused, naming the fields.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from wmrl.config_errors import ConfigError
from wmrl.core.correct import SAMPLE_FUSIONS
from wmrl.embodied import checkpoint as ckpt
from wmrl.embodied import env as scene
from wmrl.embodied import policy as pol
from wmrl.embodied import render, rollout
from wmrl.embodied import rl as erl
from wmrl.embodied import world_model as wmodel

MODES = tuple(erl.MODE_SPECS)

STAGE_FIELDS = {
    "demos": ("seed", "env", "tasks", "demos"),
    "bc": ("seed", "env", "tasks", "demos", "policy", "obs", "image"),
    "wm": (
        "seed",
        "env",
        "tasks",
        "demos",
        "policy",
        "obs",
        "image",
        "wm.num_members",
        "wm.dynamics",
        "wm.hidden",
        "wm.head_hidden",
        "wm.head_inputs",
        "wm.contact_gate",
        "wm.branch_chunks",
        "wm.policy_rollouts",
        "wm.pretrain_steps",
        "wm.batch_transitions",
        "wm.unroll",
        "wm.batch_episodes",
        "wm.learning_rate",
    ),
}


# Fields added after stages were saved: a stage without one was made with this value.
STAGE_FIELD_DEFAULTS = {
    "wm.contact_gate": 0.0,
    "wm.branch_chunks": 0,
    "wm.dynamics": "mlp",
    "obs": "state",
}
OBSERVATIONS = ("state", "image")


def validate_embodied_config(config) -> None:
    """Bad input -> ConfigError naming the field."""
    if config.mode in erl.LEGACY_MODE_NAMES:
        raise ConfigError(
            "config.mode",
            f"{config.mode!r} is now called {erl.LEGACY_MODE_NAMES[config.mode]!r} (the control's "
            "one name in every experiment)",
        )
    if config.mode not in MODES:
        raise ConfigError("config.mode", f"must be one of {list(MODES)}, got {config.mode!r}")
    if config.obs not in OBSERVATIONS:
        raise ConfigError("config.obs", f"must be one of {list(OBSERVATIONS)}, got {config.obs!r}")
    if config.obs == "image":
        image_spec(config)
    colours = tuple(config.env.colours)
    bad = [c for c in colours if c not in scene.COLOURS]
    if bad or len(set(colours)) != 3 or len(colours) != 3:
        raise ConfigError(
            "config.env.colours",
            f"the scene has three blocks from {list(scene.COLOURS)}, got {colours}",
        )
    T, H = config.env.episode_len, config.policy.chunk
    if H < 1:
        raise ConfigError("config.policy.chunk", f"must be >= 1, got {H}")
    if H > T:
        raise ConfigError(
            "config.policy.chunk",
            f"an action chunk of {H} is longer than the episode ({T} actions, "
            "config.env.episode_len)",
        )
    if T % H:
        raise ConfigError("config.policy.chunk", f"must divide env.episode_len={T}, got {H}")
    tasks_of(config)
    rl = config.rl
    for name in (
        "steps",
        "groups_per_step",
        "group_size",
        "eval_episodes",
        "eval_every",
        "checkpoint_every",
        "ppo_epochs",
    ):
        if rl[name] < 1:
            raise ConfigError(f"config.rl.{name}", f"must be >= 1, got {rl[name]}")
    if not 0.0 <= config.correction.rho <= 1.0:
        raise ConfigError(
            "config.correction.rho", f"must be in [0, 1], got {config.correction.rho}"
        )
    if config.correction.debias != "monotone":
        # Keyed offsets by task would cancel inside a group (all G rollouts share the task).
        raise ConfigError(
            "config.correction.debias",
            f"only 'monotone' applies here (a group shares one task), got "
            f"{config.correction.debias!r}",
        )
    if config.correction.sample_fusion not in SAMPLE_FUSIONS:
        raise ConfigError(
            "config.correction.sample_fusion",
            f"must be one of {list(SAMPLE_FUSIONS)}, got {config.correction.sample_fusion!r}",
        )
    if config.wm.head_inputs not in wmodel.HEAD_WIDTHS:
        raise ConfigError(
            "config.wm.head_inputs",
            f"must be one of {list(wmodel.HEAD_WIDTHS)}, got {config.wm.head_inputs!r}",
        )
    if config.wm.dynamics not in wmodel.DYNAMICS:
        raise ConfigError(
            "config.wm.dynamics",
            f"must be one of {list(wmodel.DYNAMICS)}, got {config.wm.dynamics!r}",
        )
    if not 0.0 <= config.wm.contact_gate < 1.0:
        raise ConfigError(
            "config.wm.contact_gate",
            f"a distance in m in [0, 1) (0 = off), got {config.wm.contact_gate}",
        )
    if config.wm.contact_gate > 0 and config.wm.dynamics != "mlp":
        raise ConfigError(
            "config.wm.contact_gate",
            f"applies to wm.dynamics='mlp' only (the {config.wm.dynamics!r} dynamics gate every "
            "block by the pusher's swept path); set it to 0",
        )
    for name, low in (("replay_size", 1), ("online_steps", 0)):
        v = config.wm[name]
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ConfigError(f"config.wm.{name}", f"an integer >= {low}, got {v!r}")
    bc = config.wm.branch_chunks
    if not isinstance(bc, int) or not 0 <= bc <= T // H:
        raise ConfigError(
            "config.wm.branch_chunks",
            f"chunks per imagined branch, an integer in [0, {T // H}] (the episode's chunks; "
            f"0 = whole imagined episodes), got {bc!r}",
        )
    if config.rl.wm_trust_spread < 0:
        raise ConfigError(
            "config.rl.wm_trust_spread",
            f"a distance in m >= 0 (0 = off), got {config.rl.wm_trust_spread}",
        )
    if config.env.real_episode_cost_s < 0:
        raise ConfigError("config.env.real_episode_cost_s", "must be >= 0")


def tasks_of(config) -> tuple[list[scene.Task], list[scene.Task]]:
    """(train tasks, held-out tasks), parsed; the fields are named in errors."""
    colours = tuple(config.env.colours)
    held = [
        scene.parse_instruction(t, f"config.tasks.heldout[{i}]", colours)
        for i, t in enumerate(config.tasks.heldout)
    ]
    if config.tasks.train:
        train = [
            scene.parse_instruction(t, f"config.tasks.train[{i}]", colours)
            for i, t in enumerate(config.tasks.train)
        ]
    else:
        train = [t for t in scene.ALL_TASKS if t not in held]
    if not train or not held:
        raise ConfigError("config.tasks", "needs at least one training and one held-out task")
    overlap = [t.text for t in train if t in held]
    if overlap:
        raise ConfigError("config.tasks.train", f"held-out instructions in training: {overlap}")
    return train, held


def env_spec(config) -> scene.EnvSpec:
    return scene.env_spec_from_config(config.env)


def policy_spec(config) -> pol.PolicySpec:
    p = config.policy
    return pol.PolicySpec(
        num_actions=config.env.action_bins**2,
        chunk=p.chunk,
        d_model=p.d_model,
        num_layers=p.num_layers,
        num_heads=p.num_heads,
        mlp_dim=p.mlp_dim,
        canonical_frame=p.canonical_frame,
        obs=config.obs,
        image=image_spec(config) if config.obs == "image" else render.ImageSpec(),
    )


def image_spec(config) -> render.ImageSpec:
    """`config.image` (read with obs = "image"); bad values name the field."""
    im = config.image
    for name in ("pixels", "patch"):
        if not isinstance(im[name], int) or im[name] < 1:
            raise ConfigError(f"config.image.{name}", f"must be an integer >= 1, got {im[name]!r}")
    if im.pixels % im.patch:
        raise ConfigError(
            "config.image.patch", f"must divide config.image.pixels={im.pixels}, got {im.patch}"
        )
    if not im.extent > 0:  # also refuses NaN
        raise ConfigError("config.image.extent", f"must be > 0 (m), got {im.extent}")
    if not isinstance(im.film, bool):
        raise ConfigError("config.image.film", f"must be True or False, got {im.film!r}")
    if not 0.0 <= im.bc_shift < im.extent:
        raise ConfigError(
            "config.image.bc_shift", f"must be in [0, image.extent) (m), got {im.bc_shift}"
        )
    return render.ImageSpec(
        pixels=im.pixels,
        patch=im.patch,
        extent=float(im.extent),
        film=im.film,
        bc_shift=float(im.bc_shift),
    )


def wm_spec(config) -> wmodel.WMSpec:
    w = config.wm
    return wmodel.WMSpec(
        num_members=w.num_members,
        hidden=w.hidden,
        head_hidden=w.head_hidden,
        num_actions=config.env.action_bins**2,
        push_distance=config.env.push_distance,
        head_inputs=w.head_inputs,
        contact_gate=w.contact_gate,
        value_head=w.branch_chunks > 0,
        dynamics=w.dynamics,
    )


def wm_symmetries(config, velocities) -> tuple[np.ndarray, np.ndarray] | None:
    """The object dynamics train under the square's symmetries (`world_model.make_batch`)."""
    if config.wm.dynamics != "object":
        return None
    return wmodel.square_symmetries(np.asarray(velocities))


def value_horizon(config) -> int:
    """Actions per success-to-go training window: a branch's length (0 = no value head)."""
    return config.wm.branch_chunks * config.policy.chunk


def _field(config, dotted):
    node = config
    for part in dotted.split("."):
        node = node[part]
    return json.loads(json.dumps(node.to_dict() if hasattr(node, "to_dict") else node))


def fingerprint(config, stage: str) -> dict:
    """The fields a stage depends on (`image` only where the policy reads images)."""
    fields = [f for f in STAGE_FIELDS[stage] if f != "image" or config.obs == "image"]
    return {f: _field(config, f) for f in fields}


def stage_done(stage_dir: Path, config) -> dict | None:
    path = Path(stage_dir) / "done.json"
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    want = fingerprint(config, Path(stage_dir).name)
    saved = {**STAGE_FIELD_DEFAULTS, **report.get("config", {})}
    diff = sorted(k for k in want if saved.get(k) != want[k])
    if diff:
        raise ConfigError(
            "config.init_dir",
            f"{stage_dir} was made with a different config (fields: {', '.join(diff)}); "
            "use another init_dir or the same settings",
        )
    return report


def finish_stage(stage_dir: Path, config, report: dict) -> dict:
    report = {**report, "config": fingerprint(config, Path(stage_dir).name)}
    ckpt.write_json(Path(stage_dir) / "done.json", report)
    return report


# ----------------------------------------------------------------------------- demos


def demos_stage(config, stage_dir: Path, pool: rollout.EnvPool) -> tuple[rollout.Episodes, dict]:
    stage_dir = Path(stage_dir)
    report = stage_done(stage_dir, config)
    path = stage_dir / "episodes.npz"
    if report is not None:
        with np.load(path) as f:
            return rollout.Episodes(**{k: f[k] for k in f.files}), report
    t0 = time.monotonic()
    train, _ = tasks_of(config)
    rng = np.random.default_rng([config.seed, 1])
    starts = rollout.sample_starts(rng, train, config.demos.episodes, pool.spec)
    eps = rollout.expert_demos(pool, starts)
    stage_dir.mkdir(parents=True, exist_ok=True)
    np.savez(path, **eps.to_dict())
    report = {
        "episodes": len(eps),
        "expert_success": float(eps.success.mean()),
        "real_episodes": len(eps),
        "time_s": time.monotonic() - t0,
    }
    return eps, finish_stage(stage_dir, config, report)


# ----------------------------------------------------------------------------- BC


def chunk_dataset(eps: rollout.Episodes, chunk: int) -> dict:
    """Every time step of every episode as (obs, next H expert actions, mask)."""
    n, T = eps.actions.shape
    t = np.arange(T)
    idx = t[:, None] + np.arange(chunk)[None]
    mask = (idx < T).astype(np.float32)
    acts = eps.actions[:, np.minimum(idx, T - 1)]  # [n, T, H]
    return {
        "words": np.repeat(eps.words[:, None], T, 1).reshape(n * T, -1),
        "obs": eps.obs[:, :T].reshape(n * T, -1),
        "actions": acts.reshape(n * T, chunk),
        "mask": np.broadcast_to(mask, (n, T, chunk)).reshape(n * T, chunk),
    }


def bc_stage(config, stage_dir: Path, demos: rollout.Episodes):
    """Returns (graphdef, params, report)."""
    stage_dir = Path(stage_dir)
    spec = policy_spec(config)
    graphdef, params = pol.init_policy(spec, config.seed)
    report = stage_done(stage_dir, config)
    if report is not None:
        return graphdef, ckpt.load_tree(stage_dir / "params.npz", params), report
    t0 = time.monotonic()
    keep = demos.success > 0 if config.demos.successful_only else np.ones(len(demos), bool)
    data = chunk_dataset(
        rollout.Episodes(**{k: v[keep] for k, v in demos.to_dict().items()}), spec.chunk
    )
    steps, bs = config.policy.bc_steps, config.policy.bc_batch_size
    tx = optax.adamw(
        optax.warmup_cosine_decay_schedule(
            0, config.policy.bc_learning_rate, max(steps // 20, 1), max(steps, 2)
        )
    )
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, b):
        loss, g = jax.value_and_grad(pol.bc_loss)(params, graphdef, **b)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    rng = np.random.default_rng([config.seed, 2])
    n = len(data["obs"])
    loss = float("nan")
    shift = spec.image.bc_shift if spec.obs == "image" else 0.0
    for _ in range(steps):
        i = rng.integers(0, n, bs)
        batch = {k: v[i] for k, v in data.items()}
        if shift:
            batch["obs"] = shift_scene(batch["obs"], rng.uniform(-shift, shift, (bs, 2)))
        params, opt, loss = step(params, opt, {k: jnp.asarray(v) for k, v in batch.items()})
    stage_dir.mkdir(parents=True, exist_ok=True)
    ckpt.save_tree(stage_dir / "params.npz", params)
    report = {
        "bc_steps": steps,
        "examples": n,
        "demos_used": int(keep.sum()),
        "final_loss": float(loss),
        "time_s": time.monotonic() - t0,
    }
    return graphdef, params, finish_stage(stage_dir, config, report)


def shift_scene(obs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """obs [B, 14] (7 xy points: pusher, blocks now, blocks' starts) with every point moved by
    its row's offset [B, 2]: the same scene elsewhere on the floor (the same expert actions)."""
    return obs + np.tile(offsets, (1, scene.OBS_DIM // 2)).astype(obs.dtype)


# ----------------------------------------------------------------------------- WM


def make_actor(graphdef, params, key, temperature=1.0, greedy=False):
    """An `act(words, obs, chunk_index)` for `rollout.policy_rollouts` (jitted policy)."""
    fn = jax.jit(pol.sample_chunk, static_argnums=(0,), static_argnames=("greedy",))

    def act(words, obs, c):
        a, lp = fn(
            graphdef,
            params,
            jnp.asarray(words),
            jnp.asarray(obs),
            jax.random.fold_in(key, c),
            temperature,
            greedy=greedy,
        )
        return np.asarray(a), np.asarray(lp)

    return act


def wm_stage(
    config, stage_dir: Path, pool: rollout.EnvPool, demos: rollout.Episodes, graphdef, bc_params
):
    """Returns (wm params, pretraining data dict, report)."""
    stage_dir = Path(stage_dir)
    spec = wm_spec(config)
    params = wmodel.init_wm(spec, config.seed + 7)
    report = stage_done(stage_dir, config)
    if report is not None:
        with np.load(stage_dir / "data.npz") as f:
            data = {k: f[k] for k in f.files}
        return ckpt.load_tree(stage_dir / "params.npz", params), data, report
    t0 = time.monotonic()
    train, _ = tasks_of(config)
    rng = np.random.default_rng([config.seed, 3])
    starts = rollout.sample_starts(rng, train, config.wm.policy_rollouts, pool.spec)
    act = make_actor(
        graphdef, bc_params, jax.random.PRNGKey(config.seed + 3), config.rl.temperature
    )
    rolls = rollout.policy_rollouts(pool, starts, act, config.policy.chunk)
    eps = rollout.Episodes.concat([demos, rolls])
    data = wmodel.episode_data(
        eps.obs, eps.actions, eps.task, eps.success, config.env.push_distance
    )
    velocities = jnp.asarray(pool.spec.velocities())
    steps = config.wm.pretrain_steps
    tx = optax.adamw(
        optax.warmup_cosine_decay_schedule(
            0, config.wm.learning_rate, max(steps // 20, 1), max(steps, 2)
        )
    )
    opt = tx.init(params)
    step = wmodel.make_train_step(tx, velocities, config.env.push_distance, config.wm.contact_gate)
    brng = np.random.default_rng([config.seed, 4])
    symmetries = wm_symmetries(config, pool.spec.velocities())
    metrics = {}
    for _ in range(steps):
        b = wmodel.make_batch(
            brng,
            data,
            spec.num_members,
            config.wm.batch_transitions,
            config.wm.batch_episodes,
            config.wm.unroll,
            value_horizon(config),
            symmetries,
        )
        params, opt, metrics = step(params, opt, b)
    stage_dir.mkdir(parents=True, exist_ok=True)
    ckpt.save_tree(stage_dir / "params.npz", params)
    np.savez(stage_dir / "data.npz", **data)
    report = {
        "pretrain_steps": steps,
        "episodes": len(eps),
        "bc_rollouts": len(rolls),
        "bc_rollout_success": float(rolls.success.mean()),
        "real_episodes": len(rolls),  # demos are counted by their own stage
        "final": {k: float(v) for k, v in metrics.items()},
        "time_s": time.monotonic() - t0,
    }
    return params, data, finish_stage(stage_dir, config, report)
