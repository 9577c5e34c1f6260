"""Training the embodied world model (`wmrl.embodied.world_model`): the per-member losses,
the bootstrap batches of real episodes and the jitted train step, kept apart from the model
and its imagination, which the RL step runs every step.

* `wm_loss`: the dynamics' open-loop unroll loss on K-action windows, the head's success /
  log-variance / progress losses on the member's own replay of whole episodes, and (with a
  value head) the success-to-go loss on replayed windows.
* `make_batch`: one bootstrap draw per member of windows and whole episodes from the real
  episodes (`episode_data`), each window seen under one of the square's symmetries
  (`square_symmetries`) with the `object` dynamics.
* `make_train_step`: one jitted gradient step of all members at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from wmrl.embodied import env as scene
from wmrl.embodied import policy as pol
from wmrl.embodied.world_model import (
    dyn_step,
    head,
    head_features,
    head_kind,
    value,
    value_features,
)


def wm_loss(params, batch, velocities, push_distance, gate: float = 0.0):
    """Per-member losses; batch arrays carry a leading member axis (bootstrap draws).

    dynamics: MSE of the scaled states along a K-action open-loop unroll from a real state;
    head: BCE on success, Gaussian NLL of the log-variance around the (stopped) mean, MSE on
    progress, on the member's own replay.
    """

    def one(member, b):
        # K-step unroll from a real state (K = the window's length): the loss sees the
        # compounding error that open-loop imagination of a whole episode suffers.
        def unroll(o, xs):
            a, target = xs
            o = dyn_step(member, o, a, velocities, gate)
            return o, jnp.mean(jnp.square((o - target)[:, :8] * pol.OBS_SCALE))

        _, errs = jax.lax.scan(unroll, b["obs"], (b["action"].T, b["next_obs"].transpose(1, 0, 2)))
        dyn = errs.mean()

        def body(o, a):
            nxt = dyn_step(jax.lax.stop_gradient(member), o, a, velocities, gate)
            return nxt, nxt[:, 0:2]

        final, path = jax.lax.scan(body, b["ep_obs0"], b["ep_actions"].T)
        path = path.transpose(1, 0, 2)
        kind = head_kind(member)
        feats = head_features(b["ep_obs0"], final, b["ep_task"], push_distance, path, kind)
        mu, logvar, progress, logit = head(member, feats)
        y = b["ep_success"]
        bce = jnp.mean(optax.sigmoid_binary_cross_entropy(logit, y))
        nll = jnp.mean(0.5 * (logvar + jnp.square(y - jax.lax.stop_gradient(mu)) / jnp.exp(logvar)))
        prog = jnp.mean(jnp.square(progress - b["ep_progress"]))
        loss, out = dyn + bce + 0.1 * nll + 0.1 * prog, {"dyn_mse": dyn, "head_bce": bce}
        if "value" in member and "v_obs" in b:
            # Success-to-go on the member's own open-loop replay of a real window (what a
            # branch's end state is), labelled with that episode's real outcome.
            v_final, _ = jax.lax.scan(body, b["v_obs"], b["v_actions"].T)
            vf = value_features(v_final, b["v_task"], push_distance, b["v_left"])
            v_mu, v_logvar, v_logit = value(member, vf)
            vy = b["v_success"]
            v_bce = jnp.mean(optax.sigmoid_binary_cross_entropy(v_logit, vy))
            v_nll = jnp.mean(
                0.5 * (v_logvar + jnp.square(vy - jax.lax.stop_gradient(v_mu)) / jnp.exp(v_logvar))
            )
            loss = loss + v_bce + 0.1 * v_nll
            out["value_bce"] = v_bce
        return loss, out

    losses, metrics = jax.vmap(one)(params, batch)
    return losses.sum(), jax.tree.map(jnp.mean, metrics)


def progress_target(obs0, final, task_idx, push_distance) -> np.ndarray:
    """1 - |named block - goal| / |start - goal| (numpy, real episodes)."""
    colour = task_idx // len(scene.DIRECTIONS)
    vecs = np.asarray([scene.DIRECTION_VECTORS[d] for d in scene.DIRECTIONS], np.float32)
    dvec = vecs[task_idx % len(scene.DIRECTIONS)]
    n = np.arange(len(task_idx))
    start = obs0[:, 8:14].reshape(-1, 3, 2)[n, colour]
    end = final[:, 2:8].reshape(-1, 3, 2)[n, colour]
    goal = start + push_distance * dvec
    return np.clip(1 - np.linalg.norm(end - goal, axis=-1) / push_distance, -1, 1).astype(
        np.float32
    )


def make_batch(
    rng: np.random.Generator,
    data: dict,
    members: int,
    transitions: int,
    episodes: int,
    unroll: int = 1,
    value_horizon: int = 0,
    symmetries: tuple[np.ndarray, np.ndarray] | None = None,
):
    """Bootstrap draws (one per member) of `unroll`-step windows and whole episodes from
    `data` (numpy: obs [E, T+1, 14], actions [E, T], task [E], success [E], progress [E]).
    Windows: obs [M, n, 14] at the start, action [M, n, K], next_obs [M, n, K, 14]; with
    `symmetries` (`square_symmetries`), each window is seen under one of them, drawn.
    `value_horizon` h > 0 adds the success-to-go head's windows (one per whole-episode draw):
    v_obs [M, e, 14] a real state, v_actions [M, e, h] the actions that follow it, v_left
    [M, e] the fraction of the episode left after them, v_task, v_success."""
    n_ep, T = data["actions"].shape
    k = min(unroll, T)
    ei = rng.integers(0, n_ep, (members, transitions))
    ti = rng.integers(0, T - k + 1, (members, transitions))
    steps = ti[..., None] + np.arange(k)
    ej = rng.integers(0, n_ep, (members, episodes))
    out = {} if value_horizon <= 0 else _value_windows(rng, data, members, episodes, value_horizon)
    windows = {
        "obs": data["obs"][ei, ti],
        "action": data["actions"][ei[..., None], steps],
        "next_obs": data["obs"][ei[..., None], steps + 1],
    }
    if symmetries is not None:
        mats, action_maps = symmetries
        g = rng.integers(0, len(mats), (members, transitions))
        windows = {
            "obs": transform_points(windows["obs"], mats[g]),
            "action": action_maps[g[..., None], windows["action"]],
            "next_obs": transform_points(windows["next_obs"], mats[g][:, :, None]),
        }
    return (
        out
        | windows
        | {
            "ep_obs0": data["obs"][ej, 0],
            "ep_actions": data["actions"][ej],
            "ep_task": data["task"][ej],
            "ep_success": data["success"][ej],
            "ep_progress": data["progress"][ej],
        }
    )


def square_symmetries(velocities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 rotations and reflections of the square, as 2x2 matrices [8, 2, 2], and for each
    the action tokens they map to [8, A] (the action grid is square, so each maps onto it).
    The scene is symmetric under them: the table is square, the cubes start axis-aligned, a
    transformed cube is a cube (its yaw, unobserved, transforms too)."""
    mats = []
    for c, s in ((1, 0), (0, 1), (-1, 0), (0, -1)):
        rot = np.asarray([[c, -s], [s, c]], np.float32)
        mats += [rot, rot @ np.diag([1.0, -1.0]).astype(np.float32)]
    mats = np.stack(mats)
    moved = np.einsum("gij,aj->gai", mats, velocities)  # [8, A, 2]
    dist = np.linalg.norm(moved[:, :, None] - velocities[None, None], axis=-1)
    action_maps = dist.argmin(-1).astype(np.int32)
    if dist.min(-1).max() > 1e-6:
        raise ValueError("the action grid is not symmetric under the square's rotations")
    return mats, action_maps


def transform_points(obs: np.ndarray, mats: np.ndarray) -> np.ndarray:
    """obs [..., 14] (7 xy points) mapped by mats [..., 2, 2] (broadcast over the points)."""
    pts = obs.reshape(*obs.shape[:-1], 7, 2)
    return np.einsum("...ij,...pj->...pi", mats, pts).reshape(obs.shape).astype(obs.dtype)


def _value_windows(rng, data, members, episodes, h):
    n_ep, T = data["actions"].shape
    h = min(h, T)
    ev = rng.integers(0, n_ep, (members, episodes))
    tv = rng.integers(0, T - h + 1, (members, episodes))
    steps = tv[..., None] + np.arange(h)
    return {
        "v_obs": data["obs"][ev, tv],
        "v_actions": data["actions"][ev[..., None], steps],
        "v_left": ((T - tv - h) / T).astype(np.float32),
        "v_task": data["task"][ev],
        "v_success": data["success"][ev],
    }


def episode_data(obs, actions, task, success, push_distance) -> dict:
    return {
        "obs": obs,
        "actions": actions,
        "task": task,
        "success": success.astype(np.float32),
        "progress": progress_target(obs[:, 0], obs[:, -1], task, push_distance),
    }


def make_train_step(tx, velocities, push_distance, gate: float = 0.0):
    @jax.jit
    def step(params, opt_state, batch):
        (loss, metrics), grads = jax.value_and_grad(wm_loss, has_aux=True)(
            params, batch, velocities, push_distance, gate
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, **metrics}

    return step
