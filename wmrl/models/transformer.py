"""Decoder-only transformer in Flax NNX: RMSNorm, RoPE, GQA, SwiGLU, optional QK-norm.

Sized entirely by `TransformerConfig`. Every parameter carries logical axis
names (see `wmrl.models.sharding`) and the main activations are constrained by
logical names, so one rules table decides how the model is laid out on a mesh.

Conventions (B batch, T query length, S key length, D d_model, H query heads,
K kv heads, G = H // K, Dh head_dim, F mlp_dim, V vocab):

* `mask` is the `[B, T, S]` boolean attention mask (True = may attend).
* Positions come from the padding mask (`positions_from_mask`), so a
  left-padded prompt gets the same rotary positions as the unpadded one.
* The layers are one `Block` whose parameters are stacked on a leading
  `layers` axis and run with `lax.scan`: compile time and program size do not
  grow with depth (a 36-layer model compiles like a 1-layer one).
* The KV cache is an explicit pytree, a `(k, v)` pair of `[L, B, S, K, Dh]`
  arrays, passed in and returned, never hidden module state, so the sampler
  can donate it to a jitted loop. It rides in the scan carry and each layer
  writes only its new chunk into it, so XLA updates it in place.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wmrl.models.config import TransformerConfig
from wmrl.models.sharding import constrain

KVCache = tuple[jax.Array, jax.Array]
_NEG_INF = -1e30  # finite, so a fully masked row (left padding) gives a uniform softmax, not NaN


def _param(rngs: nnx.Rngs, shape, axes, dtype, stddev: float) -> nnx.Param:
    init = jax.nn.initializers.normal(stddev)
    return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=axes)


class RMSNorm(nnx.Module):
    """Root-mean-square norm over the last axis, computed in float32."""

    def __init__(self, dim: int, *, eps: float, param_dtype, axis: str = "norm"):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=(axis,))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale.get_value().astype(jnp.float32)).astype(x.dtype)


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """`[B, T]` token positions counting only real tokens; padding gets position 0."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def causal_padding_mask(mask: jax.Array) -> jax.Array:
    """`[B, T] -> [B, T, T]`: query t may attend key s iff s <= t and s is a real token."""
    T = mask.shape[-1]
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    return causal[None] & mask.astype(bool)[:, None, :]


def rope_inv_freq(cfg: TransformerConfig) -> jax.Array:
    """`[head_dim // 2]` float32 rotary inverse frequencies, after `cfg.rope_scaling`.

    `linear` divides every frequency by `rope_factor` (positions squeezed by
    that factor). `llama3` keeps the local position resolution the model was
    trained with and stretches only the long range: frequencies whose
    wavelength `2 pi / f` is below `original / high_freq_factor` are kept,
    those above `original / low_freq_factor` are divided by `rope_factor`, and
    in between `f` blends the two with weight
    `smooth = (original / wavelength - low) / (high - low)` on the unscaled
    one. Clipping `smooth` to [0, 1] gives the two outer cases exactly.
    """
    dim = cfg.head_dim
    inv_freq = cfg.rope_theta ** (-jnp.arange(dim // 2, dtype=jnp.float32) * 2.0 / dim)
    if cfg.rope_scaling == "linear":
        return inv_freq / cfg.rope_factor
    if cfg.rope_scaling == "llama3":
        low, high = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        wavelength = 2 * jnp.pi / inv_freq
        smooth = jnp.clip((cfg.rope_original_max_len / wavelength - low) / (high - low), 0, 1)
        return (1 - smooth) * inv_freq / cfg.rope_factor + smooth * inv_freq
    return inv_freq


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotary embedding on `x: [B, T, N, Dh]` at integer `positions: [B, T]`.

    `inv_freq: [Dh // 2]` comes from `rope_inv_freq`.
    """
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh // 2]
    sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def fused_attention(q, k, v, mask, impl: str, causal: bool) -> jax.Array:
    """`jax.nn.dot_product_attention` on `q: [B, T, H, Dh]`, `k, v: [B, S, K, Dh]` with the
    boolean `mask: [B, T, S]` -> `[B, T, H, Dh]`.

    `impl` is `dot_product_attention` (JAX picks the kernel: XLA on CPU) or `cudnn` (cuDNN
    flash attention, GPU only). `causal` (no KV cache: the chunk attends to itself, and every
    mask is then causal) also passes `is_causal`, which changes nothing the mask does not
    already exclude but lets cuDNN skip the upper triangle. Real query rows equal the `xla`
    path's up to rounding; a fully masked row (left padding) is a uniform average in both
    but over different key sets, and nothing reads those rows.
    """
    if impl == "cudnn" and jax.default_backend() != "gpu":
        raise ValueError(
            f"model config: attention_impl='cudnn' needs a GPU, the backend is "
            f"{jax.default_backend()!r}; use 'dot_product_attention' or 'xla'"
        )
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask[:, None], is_causal=causal,
        implementation="cudnn" if impl == "cudnn" else None,
    )  # fmt: skip


class Attention(nnx.Module):
    """Grouped-query attention; einsum weights named by their dims (`q_dnh` = [D, H, Dh])."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        D, H, K, Dh = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        pd = cfg.storage_dtype
        self.q_dnh = _param(rngs, (D, H, Dh), ("embed", "heads", "head_dim"), pd, D**-0.5)
        self.k_dkh = _param(rngs, (D, K, Dh), ("embed", "kv_heads", "head_dim"), pd, D**-0.5)
        self.v_dkh = _param(rngs, (D, K, Dh), ("embed", "kv_heads", "head_dim"), pd, D**-0.5)
        self.o_nhd = _param(rngs, (H, Dh, D), ("heads", "head_dim", "embed"), pd, (H * Dh) ** -0.5)
        self.q_norm = RMSNorm(Dh, eps=cfg.norm_eps, param_dtype=pd) if cfg.qk_norm else None
        self.k_norm = RMSNorm(Dh, eps=cfg.norm_eps, param_dtype=pd) if cfg.qk_norm else None
        self.cfg = cfg

    def __call__(self, x, positions, mask, cache=None, cache_index=0, layer=0):
        """`x: [B, T, D]`, `mask: [B, T, S]` -> (`[B, T, D]`, updated cache or None).

        With `cache` (the whole stack, a `[L, B, S, K, Dh]` pair) this chunk's
        keys/values are written in place at `[layer, :, cache_index]` and
        attention runs over that layer's cache.
        """
        cfg = self.cfg
        dt = cfg.compute_dtype
        B, T, _ = x.shape
        K, Dh = cfg.num_kv_heads, cfg.head_dim
        G = cfg.num_heads // K
        q = jnp.einsum("btd,dnh->btnh", x, self.q_dnh.get_value().astype(dt))
        k = jnp.einsum("btd,dkh->btkh", x, self.k_dkh.get_value().astype(dt))
        v = jnp.einsum("btd,dkh->btkh", x, self.v_dkh.get_value().astype(dt))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        inv_freq = rope_inv_freq(cfg)
        q = apply_rope(q, positions, inv_freq)
        k = apply_rope(k, positions, inv_freq)
        q = constrain(q, ("batch", "length", "heads", "head_dim"))
        if cache is not None:
            ck, cv = cache
            idx = (layer, 0, cache_index, 0, 0)
            ck = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype)[None], idx)
            cv = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype)[None], idx)
            cache = (ck, cv)
            k = jax.lax.dynamic_index_in_dim(ck, layer, keepdims=False).astype(dt)
            v = jax.lax.dynamic_index_in_dim(cv, layer, keepdims=False).astype(dt)
        k = constrain(k, ("batch", "length", "kv_heads", "head_dim"))
        if cfg.attention_impl == "xla":
            q = q.reshape(B, T, K, G, Dh)
            scores = jnp.einsum("btkgh,bskh->bkgts", q, k, preferred_element_type=jnp.float32)
            scores = scores * Dh**-0.5
            scores = jnp.where(mask[:, None, None, :, :], scores, _NEG_INF)
            probs = jax.nn.softmax(scores, axis=-1).astype(dt)
            out = jnp.einsum("bkgts,bskh->btkgh", probs, v).reshape(B, T, K * G, Dh)
        else:
            out = fused_attention(q, k, v, mask, cfg.attention_impl, causal=cache is None)
        out = constrain(out, ("batch", "length", "heads", "head_dim"))
        y = jnp.einsum("btnh,nhd->btd", out, self.o_nhd.get_value().astype(dt))
        return y, cache


class MLP(nnx.Module):
    """SwiGLU feed-forward: `down(silu(x @ gate) * (x @ up))`."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        D, F, pd = cfg.d_model, cfg.mlp_dim, cfg.storage_dtype
        self.gate_df = _param(rngs, (D, F), ("embed", "mlp"), pd, D**-0.5)
        self.up_df = _param(rngs, (D, F), ("embed", "mlp"), pd, D**-0.5)
        self.down_fd = _param(rngs, (F, D), ("mlp", "embed"), pd, F**-0.5)
        self.dtype = cfg.compute_dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = self.dtype
        gate = x @ self.gate_df.get_value().astype(dt)
        up = x @ self.up_df.get_value().astype(dt)
        h = constrain(jax.nn.silu(gate) * up, ("batch", "length", "mlp"))
        return h @ self.down_fd.get_value().astype(dt)


class Block(nnx.Module):
    """Pre-norm residual block: attention then SwiGLU MLP."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        pd = cfg.storage_dtype
        self.attn_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, param_dtype=pd)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, param_dtype=pd)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, positions, mask, cache=None, cache_index=0, layer=0):
        h, cache = self.attn(self.attn_norm(x), positions, mask, cache, cache_index, layer)
        x = x + h
        x = x + self.mlp(self.mlp_norm(x))
        return constrain(x, ("batch", "length", "embed")), cache


def remat_policy(name: str):
    """`jax.checkpoint` policy of a `remat_policy` config value (`full`: save nothing)."""
    if name == "full":
        return None
    return getattr(jax.checkpoint_policies, name)


def stacked_blocks(cfg: TransformerConfig, rngs: nnx.Rngs) -> Block:
    """`num_layers` independently initialised blocks as one `Block` whose parameters
    have a leading `layers` axis (logical name `layers`)."""
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Block(cfg, rngs=nnx.Rngs(0))))
    keys = jax.random.split(rngs.params(), cfg.num_layers)
    state = jax.vmap(lambda key: nnx.state(Block(cfg, rngs=nnx.Rngs(params=key))))(keys)
    blocks = nnx.merge(graphdef, state)
    for _, var in nnx.iter_graph(blocks):
        if isinstance(var, nnx.Param):
            var.set_metadata(logical_axes=("layers", *var.get_metadata()["logical_axes"]))
    return blocks


class Transformer(nnx.Module):
    """Decoder-only LM. `hidden` gives the final normed states (the WM reads these),
    `__call__` gives float32 logits."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        D, V, pd = cfg.d_model, cfg.vocab_size, cfg.storage_dtype
        self.embed_vd = _param(rngs, (V, D), ("vocab", "embed"), pd, D**-0.5)
        self.blocks = stacked_blocks(cfg, rngs)
        self.final_norm = RMSNorm(D, eps=cfg.norm_eps, param_dtype=pd)
        self.unembed_dv = (
            None if cfg.tie_embeddings else _param(rngs, (D, V), ("embed", "vocab"), pd, D**-0.5)
        )

    def hidden(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        cache_index: int | jax.Array = 0,
    ) -> tuple[jax.Array, KVCache | None]:
        """`tokens, positions: [B, T]`, `mask: [B, T, S]` -> (`[B, T, D]`, updated cache)."""
        # Gather the fsdp-sharded embed dim first: a lookup into a table sharded on the
        # same axis as the batch forces XLA into a full rematerialisation.
        table = constrain(self.embed_vd.get_value(), ("vocab", None))
        x = jnp.take(table, tokens, axis=0).astype(self.cfg.compute_dtype)
        x = constrain(x, ("batch", "length", "embed"))
        graphdef, stacked = nnx.split(self.blocks)

        def layer(carry, xs):
            x, cache = carry
            params, i = xs
            block = nnx.merge(graphdef, params)
            x, cache = block(x, positions, mask, cache, cache_index, i)
            return (x, cache), None

        if self.cfg.remat:
            layer = jax.checkpoint(layer, policy=remat_policy(self.cfg.remat_policy))
        layer_ids = jnp.arange(self.cfg.num_layers)
        (x, cache), _ = jax.lax.scan(layer, (x, cache), (stacked, layer_ids))
        return self.final_norm(x), cache

    def logits(self, h: jax.Array) -> jax.Array:
        """`[B, T, D] -> [B, T, V]` float32 logits."""
        dt = self.cfg.compute_dtype
        if self.unembed_dv is None:
            out = jnp.einsum(
                "btd,vd->btv",
                h,
                self.embed_vd.get_value().astype(dt),
                preferred_element_type=jnp.float32,
            )
        else:
            out = jnp.einsum(
                "btd,dv->btv",
                h,
                self.unembed_dv.get_value().astype(dt),
                preferred_element_type=jnp.float32,
            )
        return constrain(out, ("batch", "length", "vocab"))

    def __call__(self, tokens, positions, mask, cache=None, cache_index=0):
        h, new_cache = self.hidden(tokens, positions, mask, cache, cache_index)
        return self.logits(h), new_cache


def init_cache(cfg: TransformerConfig, batch: int, length: int, dtype=None) -> KVCache:
    """Zeroed KV cache: a `(k, v)` pair of `[L, batch, length, K, Dh]`."""
    dtype = cfg.compute_dtype if dtype is None else dtype
    shape = (cfg.num_layers, batch, length, cfg.num_kv_heads, cfg.head_dim)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


def logprobs_from_hidden(
    model: Transformer, h: jax.Array, tokens: jax.Array, mask: jax.Array, start: int = 0
) -> tuple[jax.Array, jax.Array]:
    """`[B, T, D]` final hidden states -> (`[B, T]` log-probs with
    `out[:, t] = log p(tokens[t] | tokens[<t])`, zero on padding, and the `[B, T - s, V]`
    logits they came from), unembedding only the positions that predict tokens from
    `s = max(start, 1)` on; the log-probs before column `s` are 0.

    A static `start` (the width of a left-padded prompt region that carries no loss) skips
    the prompt's unembedding and log-softmax, a large share of the forward and backward cost
    of a small model with a large vocabulary (d=128, V=4000, a quarter of the columns a
    prompt: ~8% off the policy train step, `wmrl.benchmarks.train_step --skip_prompt_logits`).
    """
    s = max(int(start), 1)
    logits = model.logits(h[:, s - 1 : -1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, s:, None], axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (s, 0))) * mask.astype(picked.dtype), logits


def token_logprobs(
    model: Transformer, tokens: jax.Array, mask: jax.Array, start: int = 0
) -> jax.Array:
    """Training-side log-probs: `[B, T]` with `out[:, t] = log p(tokens[t] | tokens[<t])`.

    `mask: [B, T]` marks real (non-pad) tokens; `out[:, 0] = 0` (no prefix). This
    is the reference the sampler's log-probs are tested against. With a static `start`, only
    columns `>= start` are computed (zeros before; `logprobs_from_hidden`): exact for every
    caller that scores nothing before `start`, e.g. completions after a `start`-wide prompt.
    """
    h, _ = model.hidden(tokens, positions_from_mask(mask), causal_padding_mask(mask))
    return logprobs_from_hidden(model, h, tokens, mask, start)[0]
