"""How far the world model's imagination is from the simulator (a measurement).

    python -m wmrl.embodied.imagination --init_dir=DIR [--groups=24] [--set wm.unroll=20]
        [--out=FILE.json]

(the stages under DIR are loaded, or built with the config and its `--set` overrides)

On fresh start states (held-out and training instructions, G rollouts per start, the stages'
BC policy or any policy params), two comparisons:

* `replay`: real policy episodes; their actions replayed open-loop through the WM from the same
  start (how the trainer scores its anchors). Per chunk boundary: position error of the
  imagined pusher / named block / other blocks against the real ones (members' mean), the
  no-move baseline for the blocks, the members' spread; the WM's success (head score > 0.5,
  and the success rule on the imagined final blocks) against the real success of the same
  trajectory.
* `imagined`: episodes imagined with the policy in the loop (`world_model.imagine`, as a
  WM-scored RL group is), whose action tokens are then executed open-loop in the simulator
  here (a measurement only: the trainer never does this). Per chunk: the error of the state the
  policy read against the real state those same actions lead to, and what the policy does on
  the two: log-prob of the emitted tokens, KL(pi(.|real) || pi(.|imagined)), argmax agreement.
  Real success of the imagined action sequences vs the WM's score of them (disagreement,
  within-group AUC): what GRPO's WM-scored groups are trained on.

Positions are in cm; errors are Euclidean per object.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from wmrl.embodied import env as scene
from wmrl.embodied import policy as pol
from wmrl.embodied import rollout
from wmrl.embodied import world_model as wmodel


def execute_actions(pool: rollout.EnvPool, starts, actions: np.ndarray) -> np.ndarray:
    """Fixed action sequences [N, T] stepped in MuJoCo from `starts` -> obs [N, T + 1, 14]."""
    n, T = actions.shape
    envs = pool.get(n)
    obs = np.zeros((n, T + 1, scene.OBS_DIM), np.float32)
    for i, (env, s) in enumerate(zip(envs, starts, strict=True)):
        obs[i, 0] = env.reset(s)
        for t in range(T):
            obs[i, t + 1] = env.step(actions[i, t])
    return obs


def success_rule(obs0: np.ndarray, final: np.ndarray, task: np.ndarray, spec) -> np.ndarray:
    """`env.success` on states (numpy): obs0 / final [N, 14], task [N] -> [N] bool."""
    colour = task // len(scene.DIRECTIONS)
    dvec = np.asarray([scene.DIRECTION_VECTORS[d] for d in scene.DIRECTIONS])[
        task % len(scene.DIRECTIONS)
    ]
    n = np.arange(len(task))
    start = obs0[:, 8:14].reshape(-1, 3, 2)
    end = final[:, 2:8].reshape(-1, 3, 2)
    at_goal = (
        np.linalg.norm(end[n, colour] - start[n, colour] - spec.push_distance * dvec, axis=-1)
        < spec.success_radius
    )
    moved = np.linalg.norm(end - start, axis=-1)
    moved[n, colour] = 0.0
    return at_goal & (moved < spec.success_radius).all(-1)


def replay_states(wm, obs0, actions, velocities, gate: float = 0.0) -> np.ndarray:
    """Every member's open-loop states [M, N, T + 1, 14] for actions [N, T] from obs0."""

    def member(m):
        def body(o, a):
            o2 = wmodel.dyn_step(m, o, a, velocities, gate)
            return o2, o2

        _, traj = jax.lax.scan(body, obs0, actions.T)
        return jnp.concatenate([obs0[None], traj], 0).transpose(1, 0, 2)

    return np.asarray(jax.jit(jax.vmap(member))(wm))


def object_errors(im: np.ndarray, real: np.ndarray, task: np.ndarray) -> dict:
    """im / real [N, K, 14] -> per-K mean error (cm) of the pusher, the named block and the
    other blocks, and the blocks' no-move baseline (real displacement from the start)."""
    colour = task // len(scene.DIRECTIONS)
    n = np.arange(len(task))
    e_p = np.linalg.norm(im[..., 0:2] - real[..., 0:2], axis=-1)
    bi, br = im[..., 2:8].reshape(*im.shape[:2], 3, 2), real[..., 2:8].reshape(*im.shape[:2], 3, 2)
    e_b = np.linalg.norm(bi - br, axis=-1)  # [N, K, 3]
    move = np.linalg.norm(br - real[:, :1, 8:14].reshape(-1, 1, 3, 2), axis=-1)
    named = np.zeros_like(e_b, bool)
    named[n, :, colour] = True

    def per_k(x, mask=None):
        if mask is None:
            return (100 * x.mean(0)).round(2).tolist()
        return (100 * (x * mask).sum((0, 2)) / mask.sum((0, 2))).round(2).tolist()

    return {
        "pusher_cm": per_k(e_p),
        "named_block_cm": per_k(e_b, named),
        "other_blocks_cm": per_k(e_b, ~named),
        "named_block_no_move_cm": per_k(move, named),
        "other_blocks_no_move_cm": per_k(move, ~named),
    }


def _auc(scores, y, g):
    from wmrl.embodied.rl import within_group_auc

    return within_group_auc(scores.reshape(-1, g), y.reshape(-1, g))


def fidelity(config, wm, graphdef, params, starts, key, group_size: int) -> dict:
    """The two comparisons (module docstring) on `starts` (G consecutive rows per start)."""
    spec = scene.env_spec_from_config(config.env)
    pool = rollout.EnvPool(spec)
    H, T = config.policy.chunk, config.env.episode_len
    vel = jnp.asarray(spec.velocities())
    words = np.stack([scene.encode_instruction(s.task) for s in starts])
    task = np.asarray([rollout.task_index(s.task) for s in starts], np.int32)
    obs0 = np.stack([scene.make_obs(s) for s in starts])
    gate = config.wm.contact_gate
    sample = jax.jit(pol.sample_chunk, static_argnums=(0,))

    def act(w, o, c):
        a, lp = sample(graphdef, params, jnp.asarray(w), jnp.asarray(o), jax.random.fold_in(key, c))
        return np.asarray(a), np.asarray(lp)

    def score_fn(o0, a, t):
        finals, paths = wmodel.replay(wm, o0, a, vel, gate)
        return wmodel.score_finals(wm, o0, finals, t, config.env.push_distance, paths)

    score = jax.jit(score_fn)
    out = {"episodes": len(starts), "group_size": group_size}

    # ---- replay: real episodes, their actions open-loop through the WM
    real = rollout.policy_rollouts(pool, starts, act, H)
    states = replay_states(wm, jnp.asarray(real.obs[:, 0]), jnp.asarray(real.actions), vel, gate)
    mean = states.mean(0)
    b = np.arange(H, T + 1, H)  # chunk boundaries (after each chunk)
    mu, _ = score(jnp.asarray(real.obs[:, 0]), jnp.asarray(real.actions), jnp.asarray(task))
    wm_score = np.asarray(mu).mean(0)
    y = real.success > 0.5
    rule = success_rule(real.obs[:, 0], mean[:, -1], task, spec)
    sd = np.sqrt(states[..., 2:8].var(0))  # members' std [N, T + 1, 6]
    spread = np.linalg.norm(sd.reshape(len(task), T + 1, 3, 2), axis=-1)
    out["replay"] = {
        **object_errors(mean[:, b], real.obs[:, b], task),
        "member_spread_blocks_cm": (100 * spread[:, b].mean((0, 2))).round(2).tolist(),
        "real_success": float(y.mean()),
        "wm_score_mean": float(wm_score.mean()),
        "head_disagreement": float(((wm_score > 0.5) != y).mean()),
        "rule_on_imagined_success": float(rule.mean()),
        "rule_disagreement": float((rule != y).mean()),
        "within_group_auc": _auc(wm_score, real.success, group_size)[0],
    }

    # ---- imagined: the policy in the loop on imagined states; the same tokens executed
    im = jax.jit(
        lambda k: wmodel.imagine(
            wm,
            graphdef,
            params,
            jnp.asarray(words),
            jnp.asarray(task),
            jnp.asarray(obs0),
            k,
            chunk=H,
            episode_len=T,
            velocities=vel,
            push_distance=config.env.push_distance,
            gate=gate,
        )
    )(jax.random.fold_in(key, 10_000))
    acts = np.asarray(im["actions"])
    im_obs = np.asarray(im["obs"])  # [N, C, 14] what the policy read
    im_score = np.asarray(im["means"]).mean(0)
    ex = execute_actions(pool, starts, acts)
    real_at = ex[:, 0:T:H]  # the real states the same tokens were emitted in
    y_im = success_rule(ex[:, 0], ex[:, -1], task, spec)
    n, C = im_obs.shape[:2]
    rep_w = np.repeat(words, C, 0)
    lg = jax.jit(lambda o: jax.nn.log_softmax(pol.apply(graphdef, params, jnp.asarray(rep_w), o)))
    lp_im = np.asarray(lg(jnp.asarray(im_obs.reshape(n * C, -1)))).reshape(n, C, H, -1)
    lp_re = np.asarray(lg(jnp.asarray(real_at.reshape(n * C, -1)))).reshape(n, C, H, -1)
    a4 = acts.reshape(n, C, H, 1)
    tok_im = np.take_along_axis(lp_im, a4, -1)[..., 0]
    tok_re = np.take_along_axis(lp_re, a4, -1)[..., 0]
    kl = (np.exp(lp_re) * (lp_re - lp_im)).sum(-1)  # [n, C, H]
    agree = lp_im.argmax(-1) == lp_re.argmax(-1)
    im_rule = success_rule(
        obs0, replay_states(wm, obs0, acts, vel, gate).mean(0)[:, -1], task, spec
    )
    out["imagined"] = {
        **object_errors(im_obs, real_at, task),
        "token_logp_on_imagined": np.round(tok_im.mean((0, 2)), 3).tolist(),
        "token_logp_on_real": np.round(tok_re.mean((0, 2)), 3).tolist(),
        "kl_real_vs_imagined": np.round(kl.mean((0, 2)), 3).tolist(),
        "argmax_agreement": np.round(agree.mean((0, 2)), 3).tolist(),
        "member_spread_max_cm": np.round(100 * np.asarray(im["spread"]).mean(0), 2).tolist(),
        "real_success_of_imagined_actions": float(y_im.mean()),
        "wm_score_mean": float(im_score.mean()),
        "head_disagreement": float(((im_score > 0.5) != y_im).mean()),
        "rule_on_imagined_success": float(im_rule.mean()),
        "rule_disagreement": float((im_rule != y_im).mean()),
        "within_group_auc": _auc(im_score, y_im.astype(np.float32), group_size)[0],
    }
    if config.wm.branch_chunks:
        out["branch"] = branch_fidelity(
            config, wm, graphdef, params, real, starts, key, pool, group_size
        )
    return out


def branch_fidelity(config, wm, graphdef, params, real, starts, key, pool, g: int) -> dict:
    """`wm.branch_chunks` = k: what a branched WM group is. Per group, one real episode's state
    at a chunk boundary j (drawn); G branches of k chunks imagined from it with the policy in
    the loop and scored by the success-to-go head (`world_model.imagine_branch`, as the
    trainer does). Here only, the same branches are executed for real: the source episode's
    prefix replayed in MuJoCo, the branch's tokens, then the policy acting in the simulator to
    the end. Within-group AUC of the head's score (on the imagined end state, and on the real
    one) against that real success: does the WM rank the branches as reality does?"""
    spec = pool.spec
    H, T = config.policy.chunk, config.env.episode_len
    C, k = T // H, config.wm.branch_chunks
    n = len(starts)
    vel = jnp.asarray(spec.velocities())
    rng = np.random.default_rng(5)
    groups = n // g
    j = np.repeat(rng.integers(0, C - k + 1, groups), g)
    src = np.repeat(np.arange(groups) * g, g)
    t0 = j * H
    im = wmodel.imagine_branch(
        wm,
        graphdef,
        params,
        jnp.asarray(real.words[src]),
        jnp.asarray(real.task[src]),
        jnp.asarray(real.obs[src, t0]),
        jnp.asarray(t0, jnp.float32),
        jax.random.fold_in(key, 20_000),
        num_chunks=k,
        chunk=H,
        episode_len=T,
        velocities=vel,
        push_distance=config.env.push_distance,
        gate=config.wm.contact_gate,
    )
    acts = np.asarray(im["actions"])
    v_im = np.asarray(im["means"]).mean(0)
    sample = jax.jit(pol.sample_chunk, static_argnums=(0,))
    envs = pool.get(n)
    obs = np.zeros((n, scene.OBS_DIM), np.float32)
    after = np.zeros((n, scene.OBS_DIM), np.float32)
    prefix_err = 0.0
    for i, env in enumerate(envs):
        o = env.reset(starts[src[i]])
        for a in real.actions[src[i], : t0[i]]:
            o = env.step(a)
        # the simulator is deterministic: the replayed prefix is the source episode's state
        prefix_err = max(prefix_err, float(np.abs(o - real.obs[src[i], t0[i]]).max()))
        for a in acts[i]:
            obs[i] = env.step(a)
        after[i] = obs[i]
    for c in range(C):
        live = j + k <= c
        if not live.any():
            continue
        a, _ = sample(
            graphdef,
            params,
            jnp.asarray(real.words[src]),
            jnp.asarray(obs),
            jax.random.fold_in(key, 30_000 + c),
        )
        a = np.asarray(a)
        for i in np.nonzero(live)[0]:
            for h in range(H):
                obs[i] = envs[i].step(a[i, h])
    y = np.asarray([env.succeeded() for env in envs], np.float32)
    m = jax.tree.leaves(wm)[0].shape[0]
    left = jnp.asarray((T - t0 - k * H) / T, jnp.float32)
    v_real = np.asarray(
        wmodel.score_values(
            wm,
            jnp.broadcast_to(jnp.asarray(after), (m, *after.shape)),
            jnp.asarray(real.task[src]),
            config.env.push_distance,
            left,
        )[0]
    ).mean(0)
    yg = y.reshape(groups, g)
    mixed = ((yg > 0.5).any(1) & (yg <= 0.5).any(1)).mean()
    return {
        "branch_chunks": k,
        "prefix_replay_error_cm": 100 * prefix_err,
        "real_success_of_branches": float(y.mean()),
        "groups_with_mixed_outcomes": float(mixed),
        "value_on_imagined_mean": float(v_im.mean()),
        "within_group_auc_imagined": _auc(v_im, y, g)[0],
        "within_group_auc_real_state": _auc(v_real, y, g)[0],
        "imagined_vs_real_state_value_corr": float(np.corrcoef(v_im, v_real)[0, 1]),
    }


def main(argv=None) -> dict:
    import argparse

    from configs import embodied_push
    from wmrl.embodied import stages

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--init_dir", required=True)
    p.add_argument("--config_arg", default="")
    p.add_argument("--groups", type=int, default=24)
    p.add_argument("--group_size", type=int, default=8)
    p.add_argument("--seed", type=int, default=77)
    p.add_argument("--out", default="")
    p.add_argument("--set", action="append", default=[], help="config override FIELD=VALUE")
    a = p.parse_args(argv)
    config = embodied_push.get_config(a.config_arg or None)
    for item in a.set:
        field, _, value = item.partition("=")
        node, *path = field.split(".")
        parent = config
        for part in [node, *path][:-1]:
            parent = parent[part]
        parent[field.split(".")[-1]] = ast.literal_eval(value)
    init = Path(a.init_dir)
    spec = stages.env_spec(config)
    pool = rollout.EnvPool(spec)
    demos, _ = stages.demos_stage(config, init / "demos", pool)
    graphdef, bc, _ = stages.bc_stage(config, init / "bc", demos)
    wm, _, wm_rep = stages.wm_stage(config, init / "wm", pool, demos, graphdef, bc)
    train, held = stages.tasks_of(config)
    res = {"wm_stage": {k: wm_rep[k] for k in ("pretrain_steps", "final", "time_s")}}
    for name, tasks in (("heldout", held), ("train", train)):
        rng = np.random.default_rng([a.seed, len(name)])
        starts = rollout.sample_starts(rng, tasks, a.groups, spec, repeat=a.group_size)
        key = jax.random.PRNGKey(a.seed)
        res[name] = fidelity(config, wm, graphdef, bc, starts, key, a.group_size)
    text = json.dumps(res, indent=1)
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
