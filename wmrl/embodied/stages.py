"""The stages before RL, each saved once and reused:

    demos/  expert demonstrations (real episodes of the waypoint controller)
    bc/     the behaviour-cloned chunk policy
    wm/     the world model, pretrained on the demos and real rollouts of the BC policy

The stage folders are the shared ones (`wmrl.experiment.stages`): a stage clears a
half-written earlier attempt, writes its arrays and then, last, `done.json` (its report and
the config fields it depends on), so an interrupted pipeline redoes at most the stage it was
in; a stage made with other settings is refused, naming the fields. Parameters (`bc/`,
`wm/`) are Orbax checkpoints (`<stage>/params`); a stage folder of an older version with
`params.npz` instead still loads (`wmrl.embodied.legacy`). The data arrays stay `.npz`
(`demos/episodes.npz`, `wm/data.npz`): plain numpy episodes and transitions, read whole on
one host, which no template describes (their sizes are the data's) and nothing shards.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from wmrl.config_errors import ConfigError
from wmrl.embodied import env as scene
from wmrl.embodied import legacy, render, rollout
from wmrl.embodied import policy as pol
from wmrl.embodied import wm_training as wmtrain
from wmrl.embodied import world_model as wmodel
from wmrl.embodied.config import HISTORY
from wmrl.experiment import stages as xstages
from wmrl.experiment.renamed import upgrade_keys

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
    """`config.image` (read with obs = "image"; its values are checked by the schema,
    `wmrl.embodied.config.ImageConfig`)."""
    im = config.image
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
    """The object dynamics train under the square's symmetries (`wm_training.make_batch`)."""
    if config.wm.dynamics != "object":
        return None
    return wmtrain.square_symmetries(np.asarray(velocities))


def value_horizon(config) -> int:
    """Actions per success-to-go training window: a branch's length (0 = no value head)."""
    return config.wm.branch_chunks * config.policy.chunk


def fingerprint(config, stage: str) -> dict:
    """The fields a stage depends on (`image` only where the policy reads images)."""
    fields = [f for f in STAGE_FIELDS[stage] if f != "image" or config.obs == "image"]
    return xstages.config_fields(config, fields)


def stage_done(stage_dir: Path, config) -> dict | None:
    """The stage's report if it completed with this config; one made with another config is
    refused, naming the fields (`wmrl.embodied.config.HISTORY`: fields stages predate)."""
    want = fingerprint(config, Path(stage_dir).name)
    return xstages.done(stage_dir, HISTORY, want, upgrade=upgrade_keys)  # older keys too


def finish_stage(stage_dir: Path, config, report: dict) -> dict:
    return xstages.finish(stage_dir, report, fingerprint(config, Path(stage_dir).name))


def load_params(stage_dir: Path, like):
    """A finished stage's parameters: its Orbax `params`, or a legacy stage's `params.npz`."""
    stage_dir = Path(stage_dir)
    if not xstages.has_params(stage_dir) and (stage_dir / legacy.PARAMS).exists():
        print(f"loading {stage_dir / legacy.PARAMS} (a stage of an older wmrl)", flush=True)
        return legacy.load_npz_tree(stage_dir / legacy.PARAMS, like)
    return xstages.load_params(stage_dir, like)


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
    xstages.begin(stage_dir)
    np.savez(path, **eps.to_dict())
    report = {
        "episodes": len(eps),
        "expert_success": float(eps.success.mean()),
        "real_executions": len(eps),
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
        return graphdef, load_params(stage_dir, params), report
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
    xstages.begin(stage_dir)
    xstages.save_params(stage_dir, params)
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
        return load_params(stage_dir, params), data, report
    t0 = time.monotonic()
    train, _ = tasks_of(config)
    rng = np.random.default_rng([config.seed, 3])
    starts = rollout.sample_starts(rng, train, config.wm.policy_rollouts, pool.spec)
    act = make_actor(
        graphdef, bc_params, jax.random.PRNGKey(config.seed + 3), config.rl.temperature
    )
    rolls = rollout.policy_rollouts(pool, starts, act, config.policy.chunk)
    eps = rollout.Episodes.concat([demos, rolls])
    data = wmtrain.episode_data(
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
    step = wmtrain.make_train_step(tx, velocities, config.env.push_distance, config.wm.contact_gate)
    brng = np.random.default_rng([config.seed, 4])
    symmetries = wm_symmetries(config, pool.spec.velocities())
    metrics = {}
    for _ in range(steps):
        b = wmtrain.make_batch(
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
    xstages.begin(stage_dir)
    xstages.save_params(stage_dir, params)
    np.savez(stage_dir / "data.npz", **data)
    report = {
        "pretrain_steps": steps,
        "episodes": len(eps),
        "bc_rollouts": len(rolls),
        "bc_rollout_success": float(rolls.success.mean()),
        "real_executions": len(rolls),  # demos are counted by their own stage
        "final": {k: float(v) for k, v in metrics.items()},
        "time_s": time.monotonic() - t0,
    }
    return params, data, finish_stage(stage_dir, config, report)
