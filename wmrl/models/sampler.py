"""Jitted sampler: one prefill, then a `lax.while_loop` decode over a donated KV cache.

Layout of one call with B prompts of (left-padded) length P, G samples per
prompt and N = `max_new_tokens`:

* `prefill` runs the prompts once (`[B, P]`), writes their keys/values into a
  cache of length P + N, then repeats cache rows G times so the GRPO group
  shares one prefill (the prompt is never recomputed per sample).
* `decode` runs the while loop on `B*G` rows with the cache donated, so XLA
  updates it in place. Each row stops at EOS or after N tokens; the loop exits
  as soon as every row has stopped.

The returned log-probs are those of the *policy* distribution `softmax(logits)`
for the sampled tokens, independent of the temperature/top-k/top-p used to
draw them: they are exactly what the trainer's forward pass computes
(`wmrl.models.transformer.token_logprobs`), which a test checks.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from wmrl.models.transformer import (
    KVCache,
    Transformer,
    causal_padding_mask,
    init_cache,
    positions_from_mask,
)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How tokens are drawn. `greedy=True` ignores temperature/top-k/top-p."""

    max_new_tokens: int
    eos_id: int
    pad_id: int = 0
    num_samples: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False


class SampleOutput(NamedTuple):
    """Rows are prompt-major: row `b * G + g` is sample g of prompt b.

    tokens: `[B*G, N]` int32 completion tokens (pad after EOS).
    mask: `[B*G, N]` bool, True for generated tokens including the EOS.
    logprobs: `[B*G, N]` float32 policy log-probs of `tokens` (0 where masked).
    """

    tokens: jax.Array
    mask: jax.Array
    logprobs: jax.Array


class DecodeState(NamedTuple):
    cache: KVCache
    key_mask: jax.Array  # [R, S] bool: cache slots holding real tokens
    next_logits: jax.Array  # [R, V] float32
    next_position: jax.Array  # [R] int32 rotary position of the next token
    step: jax.Array  # [] int32
    done: jax.Array  # [R] bool
    tokens: jax.Array  # [R, N]
    mask: jax.Array  # [R, N]
    logprobs: jax.Array  # [R, N]
    rng: jax.Array
    constraint_state: object = None  # a token program's per-row state (schema_decoding)


def filter_logits(logits: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """Temperature, then top-k, then nucleus (top-p) filtering of `[R, V]` logits."""
    logits = logits / temperature
    neg = jnp.finfo(logits.dtype).min
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each token
        cutoff_index = jnp.sum(before < top_p, axis=-1, keepdims=True) - 1
        cutoff = jnp.take_along_axis(sorted_logits, cutoff_index, axis=-1)
        logits = jnp.where(logits < cutoff, neg, logits)
    return logits


def _choose(logits: jax.Array, rng: jax.Array, sc: SamplingConfig) -> jax.Array:
    if sc.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    filtered = filter_logits(logits, sc.temperature, sc.top_k, sc.top_p)
    return jax.random.categorical(rng, filtered, axis=-1).astype(jnp.int32)


def check_prompts(prompts: jax.Array, prompt_mask: jax.Array, max_len: int, max_new: int) -> None:
    """Clear errors for inputs that would otherwise fail deep inside jit."""
    if prompts.ndim != 2 or prompts.shape[0] == 0 or prompts.shape[1] == 0:
        raise ValueError(
            f"empty batch: prompts must be a non-empty [B, P] array, got {prompts.shape}"
        )
    if prompt_mask.shape != prompts.shape:
        raise ValueError(f"prompt_mask shape {prompt_mask.shape} != prompts shape {prompts.shape}")
    if prompts.shape[1] + max_new > max_len:
        raise ValueError(
            f"prompt length {prompts.shape[1]} + max_new_tokens {max_new} exceeds the model's "
            f"max_len {max_len}"
        )


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "num_samples"))
def prefill(graphdef, params, prompts, prompt_mask, *, max_new_tokens: int, num_samples: int):
    """Run the `[B, P]` prompts once; return a decode-ready cache for `B*G` rows.

    Returns (cache over P + N slots, key_mask `[B*G, P+N]`, last-token logits
    `[B*G, V]`, next rotary position `[B*G]`).
    """
    model: Transformer = nnx.merge(graphdef, params)
    B, P = prompts.shape
    S = P + max_new_tokens
    prompt_mask = prompt_mask.astype(bool)
    cache = init_cache(model.cfg, B, S)
    attn = jnp.pad(causal_padding_mask(prompt_mask), ((0, 0), (0, 0), (0, max_new_tokens)))
    logits, cache = model(prompts, positions_from_mask(prompt_mask), attn, cache, 0)
    key_mask = jnp.pad(prompt_mask, ((0, 0), (0, max_new_tokens)))
    next_position = jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)
    rep = lambda x, axis=0: jnp.repeat(x, num_samples, axis=axis)
    cache = jax.tree.map(lambda c: rep(c, 1), cache)  # [L, B, S, K, Dh]: batch is axis 1
    return cache, rep(key_mask), rep(logits[:, -1]), rep(next_position)


@functools.partial(jax.jit, static_argnames=("graphdef", "sc", "prompt_len"), donate_argnums=(2,))
def decode(
    graphdef, params, cache, key_mask, next_logits, next_position, rng, *, sc, prompt_len,
    constraint=None,
):  # fmt: skip
    """While-loop decode over the donated cache.

    Returns (`SampleOutput`, final cache). The cache is returned so its donated
    input buffer aliases the output: the loop then updates it in place instead
    of copying it once per call.

    `constraint` (a `wmrl.models.schema_decoding.Program`, None = free decoding) masks each
    step's logits to the tokens its program allows in each row before the token is drawn,
    so the output follows the program's schema; the log-probs stay the policy's own.
    """
    model: Transformer = nnx.merge(graphdef, params)
    R = next_logits.shape[0]
    N = sc.max_new_tokens

    def cond(s: DecodeState):
        return (s.step < N) & ~jnp.all(s.done)

    def body(s: DecodeState):
        rng, sub = jax.random.split(s.rng)
        logits = s.next_logits
        if constraint is not None:
            allowed = constraint.allowed_tokens(s.constraint_state)
            logits = jnp.where(allowed, logits, jnp.finfo(logits.dtype).min)
        token = _choose(logits, sub, sc)
        logp = jnp.take_along_axis(jax.nn.log_softmax(s.next_logits), token[:, None], axis=-1)[:, 0]
        live = ~s.done
        token = jnp.where(live, token, sc.pad_id)
        cstate = s.constraint_state
        if constraint is not None:  # rows that stopped keep their state
            new = constraint.advance(cstate, token)
            keep = lambda a, b: jnp.where(live.reshape(live.shape + (1,) * (a.ndim - 1)), a, b)
            cstate = jax.tree.map(keep, new, cstate)
        tokens = s.tokens.at[:, s.step].set(token)
        mask = s.mask.at[:, s.step].set(live)
        logprobs = s.logprobs.at[:, s.step].set(jnp.where(live, logp, 0.0))
        done = s.done | (token == sc.eos_id)
        slot = prompt_len + s.step
        key_mask = s.key_mask.at[:, slot].set(live)
        logits, cache = model(
            token[:, None], s.next_position[:, None], key_mask[:, None, :], s.cache, slot
        )
        return DecodeState(
            cache, key_mask, logits[:, 0], s.next_position + 1, s.step + 1, done,
            tokens, mask, logprobs, rng, cstate,
        )  # fmt: skip

    init = DecodeState(
        cache, key_mask, next_logits, next_position, jnp.int32(0), jnp.zeros((R,), bool),
        jnp.full((R, N), sc.pad_id, jnp.int32), jnp.zeros((R, N), bool),
        jnp.zeros((R, N), jnp.float32), rng, None if constraint is None else constraint.init(R),
    )  # fmt: skip
    final = jax.lax.while_loop(cond, body, init)
    return SampleOutput(final.tokens, final.mask, final.logprobs), final.cache


def generate(
    graphdef: nnx.GraphDef,
    params: dict,
    prompts: jax.Array,
    prompt_mask: jax.Array,
    rng: jax.Array,
    sc: SamplingConfig,
    max_len: int,
    constraint=None,
) -> SampleOutput:
    """Sample from a policy given as (graphdef, pure-dict params), as a train state holds it.

    prompts, prompt_mask: `[B, P]` (left padding; mask True on real tokens).
    `max_len` is the model's `cfg.max_len`; P + `sc.max_new_tokens` must fit in it.
    `constraint`: a token program every row's output follows (`decode`).
    """
    check_prompts(prompts, prompt_mask, max_len, sc.max_new_tokens)
    cache, key_mask, logits, position = prefill(
        graphdef, params, prompts, prompt_mask,
        max_new_tokens=sc.max_new_tokens, num_samples=sc.num_samples,
    )  # fmt: skip
    out, _ = decode(
        graphdef, params, cache, key_mask, logits, position, rng, sc=sc,
        prompt_len=prompts.shape[1], constraint=constraint,
    )  # fmt: skip
    return out


def sample(
    model: Transformer,
    prompts: jax.Array,
    prompt_mask: jax.Array,
    rng: jax.Array,
    sc: SamplingConfig,
) -> SampleOutput:
    """Sample `sc.num_samples` completions per left-padded `[B, P]` prompt from `model`."""
    graphdef, params = nnx.split(model)
    return generate(
        graphdef, nnx.to_pure_dict(params), prompts, prompt_mask, rng, sc, model.cfg.max_len
    )


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _full_forward_last(graphdef, params, tokens, mask, index):
    model: Transformer = nnx.merge(graphdef, params)
    logits, _ = model(tokens, positions_from_mask(mask), causal_padding_mask(mask))
    return jax.lax.dynamic_index_in_dim(logits, index, axis=1, keepdims=False)


def naive_greedy(
    model: Transformer, prompts: jax.Array, prompt_mask: jax.Array, max_new_tokens: int
) -> jax.Array:
    """Reference decoder: a Python loop that recomputes the full forward pass per token.

    No KV cache, no while loop; one compiled forward over a fixed `[B, P+N]`
    buffer (so it compiles once). Used to test the cached sampler and as the
    benchmark baseline. Returns `[B, N]` greedy tokens (no EOS stopping).
    """
    check_prompts(prompts, prompt_mask, model.cfg.max_len, max_new_tokens)
    graphdef, params = nnx.split(model)
    params = nnx.to_pure_dict(params)
    P = prompts.shape[1]
    tokens = jnp.pad(prompts, ((0, 0), (0, max_new_tokens)))
    mask = jnp.pad(prompt_mask.astype(bool), ((0, 0), (0, max_new_tokens)))
    for i in range(max_new_tokens):
        logits = _full_forward_last(graphdef, params, tokens, mask, P + i - 1)
        nxt = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        tokens = tokens.at[:, P + i].set(nxt)
        mask = mask.at[:, P + i].set(True)
    return tokens[:, P:]
