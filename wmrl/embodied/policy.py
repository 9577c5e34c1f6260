"""The language-conditioned policy: a small NNX transformer that reads the instruction tokens
and the scene state and emits a chunk of H discretised actions at once (one categorical per
action slot, ACT-style parallel decoding), and its behaviour-cloning loss.

Tokens (bidirectional attention): 5 instruction words, 1 pusher token, 3 block tokens (each
block's current xy, start xy, offset from the pusher and from its start, plus its colour
word's embedding), then H query tokens whose outputs are the action logits.

`obs = "image"` (VLA-style): the blocks are seen only in pixels. The block tokens are replaced
by the patch tokens of two top-down RGB images drawn from the state (`wmrl.embodied.render`:
the first frame and the current one, drawn in the instruction's frame when `canonical_frame`);
the pusher token stays (proprioception). The colour a word names must be matched to the
pixels by learning: no colour-word tie; with `image.film` the instruction scales and shifts
every patch embedding (FiLM, RT-1's conditioning of its image encoder).

Functional use: `graphdef, params = nnx.split(model, nnx.Param)`; `apply(graphdef, params,
words, obs)` gives logits [B, H, A]. The params are a plain pytree (checkpointed as such).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wmrl.embodied import render
from wmrl.embodied.env import (
    COLOURS,
    DIRECTION_VECTORS,
    DIRECTIONS,
    INSTRUCTION_LEN,
    VOCAB,
    EnvSpec,
)

OBS_SCALE = 10.0  # metres -> roughly unit features


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    num_actions: int
    chunk: int
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_dim: int = 128
    # Read the scene in the instruction's frame (push direction = +x) and rotate the action
    # tokens back: a built-in symmetry, so that an unseen colour-direction combination looks
    # like a seen one. False: the raw world frame.
    canonical_frame: bool = True
    # "state": block tokens from the state; "image": patch tokens of top-down images of it.
    obs: str = "state"
    image: render.ImageSpec = dataclasses.field(default_factory=render.ImageSpec)


def frame_tables(num_actions: int):
    """Per direction (DIRECTIONS order): the 2x2 world->canonical rotation and, for the
    action tokens, the permutation taking canonical-frame logits to world-frame logits."""
    bins = round(num_actions**0.5)
    grid = EnvSpec(action_bins=bins, max_speed=1.0)
    vel = grid.velocities()
    rots, perms = [], []
    for name in DIRECTIONS:
        dx, dy = DIRECTION_VECTORS[name]
        m = np.asarray([[dx, dy], [-dy, dx]], np.float32)  # m @ d = (1, 0)
        world_of_canon = grid.quantise(vel @ m)  # canonical token a -> world token (m^T v_a)
        rots.append(m)
        perms.append(np.argsort(world_of_canon))
    return np.stack(rots), np.stack(perms).astype(np.int32)


def direction_index(words: jax.Array) -> jax.Array:
    """[B] index into DIRECTIONS of each instruction's last word."""
    table = np.zeros(len(VOCAB), np.int32)
    for i, d in enumerate(DIRECTIONS):
        table[VOCAB.index(d)] = i
    return jnp.asarray(table)[words[:, -1]]


def to_frame(obs: jax.Array, rot: jax.Array) -> jax.Array:
    """obs [B, 14] (7 xy points) rotated by rot [B, 2, 2]."""
    pts = obs.reshape(obs.shape[0], 7, 2)
    return jnp.einsum("bij,bpj->bpi", rot, pts).reshape(obs.shape)


def object_features(obs: jax.Array) -> jax.Array:
    """obs [..., 14] -> [..., 4, 8] per-object features (pusher first, then the blocks)."""
    pusher = obs[..., 0:2]
    cur = obs[..., 2:8].reshape(*obs.shape[:-1], 3, 2)
    start = obs[..., 8:14].reshape(*obs.shape[:-1], 3, 2)
    blocks = jnp.concatenate([cur, start, cur - pusher[..., None, :], cur - start], -1)
    pusher_f = jnp.concatenate([pusher, jnp.zeros_like(pusher).repeat(3, -1)], -1)
    return OBS_SCALE * jnp.concatenate([pusher_f[..., None, :], blocks], -2)


class Block(nnx.Module):
    def __init__(self, d: int, heads: int, mlp: int, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(heads, d, qkv_features=d, decode=False, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.fc1 = nnx.Linear(d, mlp, rngs=rngs)
        self.fc2 = nnx.Linear(mlp, d, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(jax.nn.gelu(self.fc1(self.ln2(x))))


class ChunkPolicy(nnx.Module):
    def __init__(self, spec: PolicySpec, rngs: nnx.Rngs):
        d = spec.d_model
        self.image = spec.image if spec.obs == "image" else None
        scene_tokens = 4 if self.image is None else 1 + self.image.num_patches
        n_tokens = INSTRUCTION_LEN + scene_tokens + spec.chunk
        self.word = nnx.Embed(len(VOCAB), d, rngs=rngs)
        self.obj = nnx.Linear(8, d, rngs=rngs)
        if self.image is not None:
            self.patch = nnx.Linear(self.image.patch**2 * 6, d, rngs=rngs)
            if self.image.film:
                self.film = nnx.Linear(d, 2 * d, rngs=rngs)
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (n_tokens, d)))
        self.blocks = nnx.List(
            [Block(d, spec.num_heads, spec.mlp_dim, rngs) for _ in range(spec.num_layers)]
        )
        self.ln = nnx.LayerNorm(d, rngs=rngs)
        self.out = nnx.Linear(d, spec.num_actions, rngs=rngs)
        self.chunk = spec.chunk
        self.canonical = spec.canonical_frame
        self.num_actions = spec.num_actions

    def __call__(self, words: jax.Array, obs: jax.Array) -> jax.Array:
        """words [B, 5] int, obs [B, 14] -> logits [B, H, A] over world-frame action tokens."""
        b = words.shape[0]
        if self.canonical:
            rots, perms = frame_tables(self.num_actions)
            d = direction_index(words)
            obs = to_frame(obs, jnp.asarray(rots)[d])
        if self.image is None:
            # Each block token carries its colour word's embedding (tied with the instruction's
            # words), so "red" in the instruction and the red block share a vector to match on.
            colours = jnp.asarray([0] + [VOCAB.index(c) for c in COLOURS], jnp.int32)
            objects = (
                self.obj(object_features(obs))
                + self.word(colours)[None] * (colours > 0)[None, :, None]
            )
        else:  # the pusher's own state, then the pixels (drawn in the frame read above)
            images = render.frames(obs, self.image)
            pixels = self.patch(render.patches(images, self.image.patch))
            if self.image.film:  # the instruction scales and shifts every patch embedding
                scale, shift = jnp.split(self.film(self.word(words).mean(1)), 2, -1)
                pixels = pixels * (1.0 + scale[:, None]) + shift[:, None]
            objects = jnp.concatenate([self.obj(object_features(obs)[:, :1]), pixels], axis=1)
        x = jnp.concatenate(
            [
                self.word(words),
                objects,
                jnp.zeros((b, self.chunk, self.pos.shape[-1])),
            ],
            axis=1,
        )
        x = x + self.pos[None]
        for blk in self.blocks:
            x = blk(x)
        logits = self.out(self.ln(x[:, -self.chunk :]))
        if self.canonical:
            logits = jnp.take_along_axis(logits, jnp.asarray(perms)[d][:, None, :], axis=-1)
        return logits


def init_policy(spec: PolicySpec, seed: int):
    model = ChunkPolicy(spec, nnx.Rngs(seed))
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, params


def apply(graphdef, params, words: jax.Array, obs: jax.Array) -> jax.Array:
    return nnx.merge(graphdef, params)(words, obs)


def chunk_logprobs(graphdef, params, words, obs, actions, temperature: float = 1.0):
    """log pi(actions | words, obs): words [B, 5], obs [B, 14], actions [B, H] -> [B, H]."""
    logits = apply(graphdef, params, words, obs) / temperature
    logp = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(logp, actions[..., None], -1)[..., 0]


def sample_chunk(graphdef, params, words, obs, key, temperature: float = 1.0, greedy=False):
    """One action chunk per row: (actions [B, H] int32, log-probs [B, H] at temperature 1)."""
    logits = apply(graphdef, params, words, obs)
    if greedy:
        actions = logits.argmax(-1)
    else:
        actions = jax.random.categorical(key, logits / temperature)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), actions[..., None], -1)[..., 0]
    return actions.astype(jnp.int32), logp


def bc_loss(params, graphdef, words, obs, actions, mask):
    """Mean cross-entropy of the expert chunks: words [B,5], obs [B,14], actions/mask [B,H]."""
    logp = chunk_logprobs(graphdef, params, words, obs, actions)
    return -(logp * mask).sum() / jnp.maximum(mask.sum(), 1.0)
