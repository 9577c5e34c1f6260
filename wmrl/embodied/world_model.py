"""The embodied world model: an ensemble of M members (stacked params, `jax.vmap`), each a
learned dynamics MLP plus a progress/success head.

* Dynamics: (state, action token) -> next state (the 8 moving coordinates; the blocks' start
  positions are constant). Trained on K-action windows of real episodes (`wm.unroll`, an
  open-loop unroll loss), each member on its own bootstrap draw of the batch, so the members
  stay diverse. Two variants
  (`WMSpec.dynamics`, config `wm.dynamics`):
  - `object` (the default): the pusher moves by a learned linear map of the commanded
    velocity, and one MLP shared by the three blocks predicts a block's move from where the
    pusher is relative to it, the pusher's move and the two other blocks' offsets; a block
    moves only when the pusher's swept path passes within `SWEPT_CONTACT` of it (or it
    touches a block that does). Trained with the scene's 8 symmetries of the square (the
    cubes start axis-aligned and the action grid is square), so every transition counts 8
    times. Its open-loop error over whole episodes of the BC policy, per body, is measured in
    docs/results.md.
  - `mlp`: one MLP of the whole state and the action token (the earlier default; its blocks
    drift ~0.5 cm per chunk, worse than predicting that nothing moves).
* Imagination (`imagine`): from an episode's start state, the policy acts on the imagined
  state (the members' mean) every H actions, and every member advances its own state with
  the shared actions. **Nothing here steps the simulator.**
* Head: from the instruction, the start state and a member's imagined final state, a success
  probability (mean), a log-variance and a progress estimate. Trained on the member's own
  open-loop replay of real episodes' actions (`replay`), labelled with the real outcome, so
  the head learns how far to trust its own dynamics.

* Branches (`imagine_branch`, config `wm.branch_chunks` = k > 0, off by default): k chunks
  imagined with the policy in the loop from a real mid-episode state, scored by a
  success-to-go head (`value`: a member's imagined state, the instruction and the fraction
  of the episode left -> success probability, log-variance), trained on the member's own
  open-loop replay of k-chunk windows of real episodes, labelled with their real outcome
  (MBPO's short model rollouts branched from real states; docs/embodied.md).

A real episode's WM score (an anchor's pair) is its action sequence replayed open-loop
through the dynamics from the same start state and scored by the head: WM score and real
success of the same trajectory.

Its losses, batches and train step are `wmrl.embodied.wm_training`'s.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from wmrl.embodied import env as scene
from wmrl.embodied import policy as pol

LOGVAR_RANGE = (-5.0, 1.0)
MAX_MOVE = 0.03  # m per action (the pusher moves at most 0.02)
TABLE = 0.4  # |x|, |y| bound of imagined positions


@dataclasses.dataclass(frozen=True)
class WMSpec:
    num_members: int = 4
    hidden: int = 128
    head_hidden: int = 64
    num_actions: int = 25
    push_distance: float = 0.10
    # What the head reads (see HEAD_WIDTHS): the imagined final state (`final`, the config's
    # default, the best with the `object` dynamics), + the imagined pusher path in the named
    # block's frame (`final+path`), or the path alone (`path`: where the pusher was at each
    # quarter of the episode, how far it went along and across the push, how close it came to
    # the other blocks; the best with the `mlp` dynamics, whose blocks drift ~4 cm while the
    # pusher's path is ~6 mm off). The stage always passes the config's value.
    head_inputs: str = "path"
    # Contact gate (`mlp` dynamics only; m, 0 = off): a block's imagined move is zeroed unless
    # the pusher or another block is within this distance of it (a block only moves when
    # touched; 7 cm covers every real move, docs/results.md). Without it the one-step-trained
    # dynamics let every block drift ~0.5 cm per chunk, worse than predicting that no block
    # moves.
    contact_gate: float = 0.0
    # A success-to-go head (`value`): from a member's imagined state, the time left and the
    # instruction, the probability that the episode ends in success. It scores short branched
    # imaginations (`imagine_branch`, config `wm.branch_chunks`); None of it exists when off.
    value_head: bool = False
    # The dynamics' variant: object | mlp (module docstring). Read back from the params (an
    # `object` member has a pusher map), as `head_kind` reads the head's inputs.
    dynamics: str = "object"


def _dense(key, n_in, n_out):
    return {
        "w": jax.random.normal(key, (n_in, n_out)) * jnp.sqrt(2.0 / n_in),
        "b": jnp.zeros((n_out,)),
    }


def _mlp(params, x):
    for layer in params[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


DYN_IN = 32 + 25 + 2
HEAD_IN = 3 + 4 + 32 + 3 + 2
PATH_IN = 4 + 4 + 1 + 1 + 2  # along / across at 4 times, max along, max |across|, 2 clearances
# The head's inputs: the imagined final state (and the instruction), + the pusher's path, or
# the instruction and the path only. The variant is read back from the head's input width.
HEAD_WIDTHS = {"final": HEAD_IN, "final+path": HEAD_IN + PATH_IN, "path": 7 + PATH_IN}
VALUE_IN = HEAD_IN + 1  # the "final" features of a state and the fraction of the episode left
DYNAMICS = ("object", "mlp")
# Object dynamics, per block: its offset from the pusher (2), the pusher's move (2), the two
# other blocks' offsets from it, nearest first (4), the distance of the pusher's swept path (1).
OBJ_IN = 9
# A block's centre within this distance of the segment the pusher sweeps in one action can be
# touched (half a cube's diagonal 2.8 cm + the pusher's radius 1.5 cm, + 0.7 cm of margin).
SWEPT_CONTACT = 0.05
# A gated-in block can move a block whose centre is this close (a cube's side, 4 cm, + margin).
BLOCK_CONTACT = 0.06


def init_member(key, spec: WMSpec):
    # 9 draws, 6 used: saved stages were initialised from these (three went to an
    # object-centric dynamics variant, since dropped), so the split stays.
    k = jax.random.split(key, 9)
    h, hh = spec.hidden, spec.head_hidden
    if spec.head_inputs not in HEAD_WIDTHS:
        raise ValueError(f"wm.head_inputs: one of {list(HEAD_WIDTHS)}, got {spec.head_inputs!r}")
    head_in = HEAD_WIDTHS[spec.head_inputs]
    head_params = [_dense(k[3], head_in, hh), _dense(k[4], hh, hh), _dense(k[5], hh, 3)]
    if spec.dynamics not in DYNAMICS:
        raise ValueError(f"wm.dynamics: one of {list(DYNAMICS)}, got {spec.dynamics!r}")
    if spec.dynamics == "object":
        dyn = [_dense(k[0], OBJ_IN, h), _dense(k[1], h, h), _dense(k[2], h, 2)]
        # The pusher's move over one action, a linear map of the commanded velocity (learned;
        # starts at zero: nothing about the action's duration is built in).
        pusher = {"w": jnp.zeros((2, 2)), "b": jnp.zeros((2,))}
        member = {"dyn": dyn, "pusher": pusher, "head": head_params}
    else:
        dyn_in = 32 + spec.num_actions + 2
        dyn = [_dense(k[0], dyn_in, h), _dense(k[1], h, h), _dense(k[2], h, 8)]
        member = {"dyn": dyn, "head": head_params}
    if spec.value_head:
        member["value"] = [_dense(k[6], VALUE_IN, hh), _dense(k[7], hh, hh), _dense(k[8], hh, 2)]
    return member


def init_wm(spec: WMSpec, seed: int):
    keys = jax.random.split(jax.random.PRNGKey(seed), spec.num_members)
    return jax.vmap(lambda k: init_member(k, spec))(keys)


def contact_mask(obs, radius: float):
    """obs [N, 14] -> [N, 6] 1 for the coordinates of each block that the pusher or another
    block is within `radius` of (centre to centre), else 0."""
    blocks = obs[:, 2:8].reshape(-1, 3, 2)
    near = jnp.linalg.norm(blocks - obs[:, None, 0:2], axis=-1)  # [N, 3]
    pair = jnp.linalg.norm(blocks[:, :, None] - blocks[:, None], axis=-1) + 1e3 * jnp.eye(3)
    touched = jnp.minimum(near, pair.min(-1)) < radius
    return jnp.repeat(touched.astype(obs.dtype), 2, axis=-1)


def dynamics_kind(member) -> str:
    """A member's `WMSpec.dynamics` variant, from its params."""
    return "object" if "pusher" in member else "mlp"


def segment_distance(points, a, b):
    """Distance of points [..., 2] from the segments a -> b [..., 2]."""
    ab = b - a
    t = ((points - a) * ab).sum(-1) / jnp.maximum((ab * ab).sum(-1), 1e-12)
    nearest = a + jnp.clip(t, 0.0, 1.0)[..., None] * ab
    return jnp.linalg.norm(points - nearest, axis=-1)


def object_step(member, obs, action, velocities):
    """The `object` dynamics: obs [N, 14], action [N] -> next obs [N, 14]."""
    n = obs.shape[0]
    v = velocities[action]
    move = v @ member["pusher"]["w"] + member["pusher"]["b"]  # [N, 2]
    pusher = obs[:, 0:2]
    nxt = pusher + move
    blocks = obs[:, 2:8].reshape(n, 3, 2)
    swept = segment_distance(blocks, pusher[:, None], nxt[:, None])  # [N, 3]
    # The other two blocks of each block (cyclic order), their offsets and distances from it.
    o1, o2 = blocks[:, (1, 2, 0)] - blocks, blocks[:, (2, 0, 1)] - blocks  # [N, 3, 2]
    d1, d2 = jnp.linalg.norm(o1, axis=-1), jnp.linalg.norm(o2, axis=-1)
    direct = swept < SWEPT_CONTACT
    chained = ((d1 < BLOCK_CONTACT) & direct[:, (1, 2, 0)]) | (
        (d2 < BLOCK_CONTACT) & direct[:, (2, 0, 1)]
    )
    touched = (direct | chained).astype(obs.dtype)
    first = (d1 <= d2)[..., None]  # nearest first
    others = jnp.concatenate([jnp.where(first, o1, o2), jnp.where(first, o2, o1)], -1)
    feats = jnp.concatenate(
        [
            (blocks - pusher[:, None]) * pol.OBS_SCALE,
            jnp.broadcast_to(move[:, None] * 5 * pol.OBS_SCALE, (n, 3, 2)),
            jnp.clip(others, -0.1, 0.1) * pol.OBS_SCALE,
            swept[..., None] * pol.OBS_SCALE,
        ],
        -1,
    )
    delta = MAX_MOVE * jnp.tanh(_mlp(member["dyn"], feats) / 3.0) * touched[..., None]
    moved = jnp.concatenate([nxt, (blocks + delta).reshape(n, 6)], -1)
    return obs.at[:, :8].set(jnp.clip(moved, -TABLE, TABLE))


def dyn_step(member, obs, action, velocities, gate: float = 0.0):
    """One member, obs [N, 14], action [N] -> next obs [N, 14] (the member's variant, see the
    module docstring; `gate` > 0: the `mlp` variant's contact gate, `WMSpec.contact_gate`)."""
    if dynamics_kind(member) == "object":
        return object_step(member, obs, action, velocities)
    feats = pol.object_features(obs).reshape(obs.shape[0], -1)
    onehot = jax.nn.one_hot(action, velocities.shape[0])
    x = jnp.concatenate([feats, onehot, velocities[action] * 5.0], -1)
    # Bounded moves (at most MAX_MOVE per action) and a bounded table keep a long open-loop
    # imagination from drifting to states the head has never seen.
    delta = MAX_MOVE * jnp.tanh(_mlp(member["dyn"], x) / 3.0)
    if gate > 0:
        delta = delta.at[:, 2:8].multiply(contact_mask(obs, gate))
    return obs.at[:, :8].set(jnp.clip(obs[:, :8] + delta, -TABLE, TABLE))


def task_parts(task_idx):
    """[N] task indices -> (colour [N], direction vectors [N, 2], one-hots [N, 7])."""
    colour = task_idx // len(scene.DIRECTIONS)
    direction = task_idx % len(scene.DIRECTIONS)
    vecs = jnp.asarray([scene.DIRECTION_VECTORS[d] for d in scene.DIRECTIONS], jnp.float32)
    onehot = jnp.concatenate(
        [jax.nn.one_hot(colour, 3), jax.nn.one_hot(direction, len(scene.DIRECTIONS))], -1
    )
    return colour, vecs[direction], onehot


def path_features(obs0, path, task_idx):
    """The pusher's path [N, T, 2] -> [N, PATH_IN] features in the named block's frame (origin
    its start, x along the push direction): along / across offsets after each quarter of the
    episode, the furthest along, the widest across, and the closest the pusher came to each of
    the other two blocks' start positions (sorted)."""
    colour, dvec, _ = task_parts(task_idx)
    perp = jnp.stack([-dvec[:, 1], dvec[:, 0]], -1)
    start_blocks = obs0[:, 8:14].reshape(-1, 3, 2)
    sel = jax.nn.one_hot(colour, 3)
    named0 = (start_blocks * sel[..., None]).sum(1)
    rel = path - named0[:, None]
    along = (rel * dvec[:, None]).sum(-1)
    across = (rel * perp[:, None]).sum(-1)
    T = path.shape[1]
    at = jnp.asarray([T // 4, T // 2, 3 * T // 4, T]) - 1
    clear = jnp.linalg.norm(path[:, :, None] - start_blocks[:, None], axis=-1).min(1)  # [N, 3]
    others = jnp.sort(jnp.where(sel > 0, 1e3, clear), -1)[:, :2]
    feats = [
        along[:, at],
        across[:, at],
        along.max(1, keepdims=True),
        jnp.abs(across).max(1, keepdims=True),
        others,
    ]
    return pol.OBS_SCALE * jnp.concatenate(feats, -1)


def head_features(obs0, final, task_idx, push_distance, path=None, kind="final"):
    """Instruction, start and (imagined) final state -> [N, HEAD_IN] features, among them the
    named block's offset from its goal and how far the other blocks moved; `kind` final+path
    adds the pusher path's [N, T, 2] `path_features`, `path` keeps the instruction and those."""
    colour, dvec, onehot = task_parts(task_idx)
    if kind == "path":
        return jnp.concatenate([onehot, path_features(obs0, path, task_idx)], -1)
    start_blocks = obs0[:, 8:14].reshape(-1, 3, 2)
    blocks = final[:, 2:8].reshape(-1, 3, 2)
    sel = jax.nn.one_hot(colour, 3)[..., None]
    goal = (start_blocks * sel).sum(1) + push_distance * dvec
    named_off = ((blocks * sel).sum(1) - goal) * pol.OBS_SCALE
    moved = jnp.linalg.norm(blocks - start_blocks, axis=-1) * pol.OBS_SCALE
    others = jnp.sort(jnp.where(sel[..., 0] > 0, 0.0, moved), -1)[:, 1:]
    feats = pol.object_features(final).reshape(final.shape[0], -1)
    named_norm = jnp.linalg.norm(named_off, axis=-1, keepdims=True)
    out = [onehot, feats, named_off, named_norm, others]
    if kind == "final+path":
        out.append(path_features(obs0, path, task_idx))
    return jnp.concatenate(out, -1)


def head_kind(member) -> str:
    """A member's `head_inputs` variant, from its head's input width."""
    width = member["head"][0]["w"].shape[-2]
    return next(k for k, w in HEAD_WIDTHS.items() if w == width)


def head(member, feats):
    """-> (success probability [N], log-variance [N], progress [N])."""
    out = _mlp(member["head"], feats)
    return jax.nn.sigmoid(out[:, 0]), jnp.clip(out[:, 1], *LOGVAR_RANGE), out[:, 2], out[:, 0]


def value_features(state, task_idx, push_distance, time_left):
    """A state [N, 14] (its constant part holds the blocks' start positions), the task and the
    fraction of the episode left [N] -> [N, VALUE_IN]."""
    feats = head_features(state, state, task_idx, push_distance, kind="final")
    return jnp.concatenate([feats, time_left[:, None]], -1)


def value(member, feats):
    """Success-to-go -> (probability [N], log-variance [N], logit [N])."""
    out = _mlp(member["value"], feats)
    return jax.nn.sigmoid(out[:, 0]), jnp.clip(out[:, 1], *LOGVAR_RANGE), out[:, 0]


def score_values(params, states, task_idx, push_distance, time_left):
    """Every member's success-to-go on its own state: states [M, N, 14], time_left [N] ->
    member means and log-variances [M, N]."""

    def one(member, s):
        mu, logvar, _ = value(member, value_features(s, task_idx, push_distance, time_left))
        return mu, logvar

    return jax.vmap(one)(params, states)


def replay(params, obs0, actions, velocities, gate: float = 0.0):
    """Every member's open-loop replay of actions [N, T] from obs0 [N, 14] -> (finals
    [M, N, 14], pusher paths [M, N, T, 2])."""

    def member_final(member):
        def body(obs, a):
            nxt = dyn_step(member, obs, a, velocities, gate)
            return nxt, nxt[:, 0:2]

        final, path = jax.lax.scan(body, obs0, actions.T)
        return final, path.transpose(1, 0, 2)

    return jax.vmap(member_final)(params)


def score_finals(params, obs0, finals, task_idx, push_distance, paths=None):
    """finals [M, N, 14] (and pusher paths [M, N, T, 2]) -> member means and log-variances
    [M, N] of success."""

    def one(member, final, path):
        feats = head_features(obs0, final, task_idx, push_distance, path, head_kind(member))
        mu, logvar, _, _ = head(member, feats)
        return mu, logvar

    if paths is None:
        paths = jnp.zeros((*finals.shape[:2], 1, 2))
    return jax.vmap(one)(params, finals, paths)


def _imagine_chunks(
    wm_params,
    policy_graphdef,
    policy_params,
    words,
    obs0,
    key,
    *,
    num_chunks,
    chunk,
    velocities,
    temperature,
    gate,
):
    """The policy in the loop on the members' imagined states for `num_chunks` chunks from
    obs0 [N, 14] (no simulator). Returns (member final states [M, N, 14], the imagined states
    the policy read [N, C, 14] (members' mean), their spread [N, C], actions [N, C * H],
    logp [N, C * H], the members' pusher paths [M, N, C * H, 2])."""
    m = jax.tree.leaves(wm_params)[0].shape[0]
    states0 = jnp.broadcast_to(obs0, (m, *obs0.shape))

    def chunk_body(states, k):
        mean_obs = states.mean(0)
        sd = jnp.sqrt(jnp.var(states[..., 2:8], axis=0))  # members' std [N, 6]
        spread = jnp.linalg.norm(sd.reshape(-1, 3, 2), axis=-1).max(-1)
        acts, logp = pol.sample_chunk(
            policy_graphdef, policy_params, words, mean_obs, k, temperature
        )

        def member_roll(member, s):
            def body(o, a):
                nxt = dyn_step(member, o, a, velocities, gate)
                return nxt, nxt[:, 0:2]

            return jax.lax.scan(body, s, acts.T)

        states, pusher = jax.vmap(member_roll)(wm_params, states)  # pusher [M, H, N, 2]
        return states, (mean_obs, spread, acts, logp, pusher)

    keys = jax.random.split(key, num_chunks)
    finals, (obs, spread, acts, logp, pusher) = jax.lax.scan(chunk_body, states0, keys)
    n = obs0.shape[0]
    paths = pusher.transpose(1, 3, 0, 2, 4).reshape(m, n, num_chunks * chunk, 2)
    return (
        finals,
        obs.transpose(1, 0, 2),
        spread.T,
        acts.transpose(1, 0, 2).reshape(n, -1),
        logp.transpose(1, 0, 2).reshape(n, -1),
        paths,
    )


def imagine(
    wm_params,
    policy_graphdef,
    policy_params,
    words,
    task_idx,
    obs0,
    key,
    *,
    chunk: int,
    episode_len: int,
    velocities,
    push_distance: float,
    temperature: float = 1.0,
    gate: float = 0.0,
):
    """Imagined episodes with the policy in the loop (no simulator).

    Returns dict: obs [N, C, 14] (the imagined states the policy acted on, members' mean),
    spread [N, C] (the members' disagreement on those states: the largest over the blocks of
    the Euclidean std of a block's position across members, m), actions [N, T], logp [N, T],
    member means / log-variances [M, N] of success.
    """
    finals, obs, spread, acts, logp, paths = _imagine_chunks(
        wm_params,
        policy_graphdef,
        policy_params,
        words,
        obs0,
        key,
        num_chunks=episode_len // chunk,
        chunk=chunk,
        velocities=velocities,
        temperature=temperature,
        gate=gate,
    )
    mu, logvar = score_finals(wm_params, obs0, finals, task_idx, push_distance, paths)
    return {
        "obs": obs,
        "spread": spread,
        "actions": acts,
        "logp": logp,
        "means": mu,
        "log_vars": logvar,
    }


def imagine_branch(
    wm_params,
    policy_graphdef,
    policy_params,
    words,
    task_idx,
    obs_start,
    t_start,
    key,
    *,
    num_chunks: int,
    chunk: int,
    episode_len: int,
    velocities,
    push_distance: float,
    temperature: float = 1.0,
    gate: float = 0.0,
):
    """A short imagined branch (no simulator): `num_chunks` chunks of the policy in the loop
    from a real state obs_start [N, 14] reached after t_start [N] actions of a real episode,
    scored by the success-to-go head on each member's imagined state at its end. Same keys as
    `imagine` (obs / spread / actions / logp cover the branch's chunks only)."""
    finals, obs, spread, acts, logp, _ = _imagine_chunks(
        wm_params,
        policy_graphdef,
        policy_params,
        words,
        obs_start,
        key,
        num_chunks=num_chunks,
        chunk=chunk,
        velocities=velocities,
        temperature=temperature,
        gate=gate,
    )
    left = (episode_len - t_start - num_chunks * chunk) / episode_len
    mu, logvar = score_values(wm_params, finals, task_idx, push_distance, left)
    return {
        "obs": obs,
        "spread": spread,
        "actions": acts,
        "logp": logp,
        "means": mu,
        "log_vars": logvar,
    }


def replay_value(
    params,
    obs_start,
    actions,
    t_start,
    task_idx,
    *,
    episode_len,
    velocities,
    push_distance,
    gate: float = 0.0,
):
    """A real episode's actions [N, h] from its real state obs_start [N, 14] after t_start [N]
    actions, replayed open-loop through every member and scored by the success-to-go head:
    an anchor's pair for `imagine_branch` (member means and log-variances [M, N])."""
    finals, _ = replay(params, obs_start, actions, velocities, gate)
    left = (episode_len - t_start - actions.shape[1]) / episode_len
    return score_values(params, finals, task_idx, push_distance, left)
