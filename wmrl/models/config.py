"""Transformer model configuration: one frozen dataclass, validation, named sizes.

The same dataclass sizes the policy and the world-model trunk. Named sizes run
from `tiny` (CPU tests in seconds) to `9b` (pod-scale AOT checks). Every field
is validated up front so a bad config fails with a message naming the field,
not with a shape error deep inside a jitted function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

_DTYPES = ("float32", "bfloat16", "float16")
_ROPE_SCALINGS = ("none", "linear", "llama3")
ATTENTION_IMPLS = ("xla", "dot_product_attention", "cudnn")
REMAT_POLICIES = ("full", "dots_saveable", "dots_with_no_batch_dims_saveable")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Shape and numerics of a decoder-only transformer.

    `head_dim` may differ from `d_model // num_heads` (as in Gemma); 0 means
    "derive it". `dtype` is the compute dtype, `param_dtype` the storage dtype of
    the master parameters (bf16 compute with fp32 params is the usual choice).
    `remat` recomputes each block's activations in the backward pass, trading
    ~1/3 more FLOPs for activation memory that no longer grows with depth;
    `remat_policy` (read only with `remat`) says what the backward pass keeps:
    `full` nothing but the layer inputs, `dots_saveable` every matmul output
    (`jax.checkpoint_policies`; less recompute, more memory),
    `dots_with_no_batch_dims_saveable` the weight matmuls but not attention's
    batched score/value products.

    `attention_impl` picks the attention kernel (same maths, same masks):
    `xla` the einsum + softmax of `Attention` (the reference), `dot_product_attention`
    `jax.nn.dot_product_attention` with the implementation left to JAX (XLA on CPU),
    `cudnn` the same call pinned to cuDNN's fused flash attention (GPU only).

    `rope_scaling` stretches the rotary frequencies of a model pretrained at a
    shorter context (see `wmrl.models.transformer.rope_inv_freq`): `linear`
    divides all of them by `rope_factor`; `llama3` (Llama 3.1/3.2) divides only
    the low ones, per `rope_low_freq_factor`, `rope_high_freq_factor` and the
    pretraining context `rope_original_max_len`. The other `rope_*` fields are
    read only by the scaling that uses them.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0
    mlp_dim: int = 0
    max_len: int = 256
    dtype: str = "float32"
    param_dtype: str = "float32"
    qk_norm: bool = False
    tie_embeddings: bool = True
    rope_theta: float = 10_000.0
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 0
    norm_eps: float = 1e-6
    remat: bool = False
    remat_policy: str = "full"
    attention_impl: str = "xla"

    def __post_init__(self) -> None:
        validate(self)
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.d_model // self.num_heads)
        if self.mlp_dim == 0:
            object.__setattr__(self, "mlp_dim", 4 * self.d_model)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def storage_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes: Any) -> TransformerConfig:
        return dataclasses.replace(self, **changes)


def validate(cfg: TransformerConfig) -> None:
    """Raise `ValueError` naming the first offending field of `cfg`."""
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "max_len"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"model config: {name} must be a positive int, got {value!r}")
    for name in ("head_dim", "mlp_dim"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 0:
            raise ValueError(
                f"model config: {name} must be an int >= 0 (0 = derive), got {value!r}"
            )
    if cfg.d_model % cfg.num_heads != 0:
        raise ValueError(
            f"model config: d_model={cfg.d_model} is not divisible by num_heads={cfg.num_heads}"
        )
    if cfg.num_heads % cfg.num_kv_heads != 0:
        raise ValueError(
            f"model config: num_heads={cfg.num_heads} is not a multiple of "
            f"num_kv_heads={cfg.num_kv_heads} (grouped-query attention shares each KV head "
            "across an equal number of query heads)"
        )
    if cfg.head_dim % 2 != 0 or (cfg.head_dim == 0 and (cfg.d_model // cfg.num_heads) % 2):
        raise ValueError("model config: head_dim must be even for rotary embeddings")
    for name in ("dtype", "param_dtype"):
        if getattr(cfg, name) not in _DTYPES:
            raise ValueError(
                f"model config: {name} must be one of {_DTYPES}, got {getattr(cfg, name)!r}"
            )
    for name, allowed in (("attention_impl", ATTENTION_IMPLS), ("remat_policy", REMAT_POLICIES)):
        if getattr(cfg, name) not in allowed:
            raise ValueError(
                f"model config: {name} must be one of {allowed}, got {getattr(cfg, name)!r}"
            )
    _validate_rope_scaling(cfg)


def _validate_rope_scaling(cfg: TransformerConfig) -> None:
    if cfg.rope_scaling not in _ROPE_SCALINGS:
        raise ValueError(
            f"model config: rope_scaling must be one of {_ROPE_SCALINGS}, got {cfg.rope_scaling!r}"
        )
    for name in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"model config: {name} must be a positive number, got {value!r}")
    if cfg.rope_scaling != "llama3":
        return
    if not cfg.rope_high_freq_factor > cfg.rope_low_freq_factor:
        # The smooth interpolation between the two divides by their difference.
        raise ValueError(
            f"model config: rope_high_freq_factor={cfg.rope_high_freq_factor} must exceed "
            f"rope_low_freq_factor={cfg.rope_low_freq_factor} for llama3 rope scaling"
        )
    original = cfg.rope_original_max_len
    if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
        raise ValueError(
            "model config: rope_original_max_len must be a positive int (the pretraining "
            f"context) for llama3 rope scaling, got {original!r}"
        )


# Named sizes. Parameter counts (tied unless stated) are approximate; the AOT
# tool prints the exact figure.
NAMED_SIZES: dict[str, dict[str, Any]] = {
    # ~70K params: unit tests and CPU benchmarks.
    "tiny": dict(
        vocab_size=256,
        d_model=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=128,
        max_len=256,
    ),
    # ~100M params (GPT-2-small-like width with GQA and SwiGLU).
    "small": dict(
        vocab_size=32_000,
        d_model=768,
        num_layers=12,
        num_heads=12,
        num_kv_heads=4,
        head_dim=64,
        mlp_dim=2048,
        max_len=2048,
    ),
    # ~1.0B params.
    "1b": dict(
        vocab_size=32_000,
        d_model=2048,
        num_layers=20,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=5632,
        max_len=4096,
    ),
    # ~4.0B params, untied embeddings.
    "4b": dict(
        vocab_size=64_000,
        d_model=3072,
        num_layers=36,
        num_heads=24,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=8192,
        max_len=8192,
        tie_embeddings=False,
        qk_norm=True,
    ),
    # ~9.2B params (Gemma-2-9B-like shapes, 256-wide heads).
    "9b": dict(
        vocab_size=256_000,
        d_model=3584,
        num_layers=42,
        num_heads=16,
        num_kv_heads=8,
        head_dim=256,
        mlp_dim=14_336,
        max_len=8192,
        qk_norm=True,
    ),
}


def named_config(name: str, **overrides: Any) -> TransformerConfig:
    """Return the named size (`tiny`, `small`, `1b`, `4b`, `9b`) with overrides applied."""
    if name not in NAMED_SIZES:
        raise ValueError(f"unknown model size {name!r}; choose one of {sorted(NAMED_SIZES)}")
    return TransformerConfig(**{**NAMED_SIZES[name], **overrides})


def from_mapping(fields: Mapping[str, Any]) -> TransformerConfig:
    """Build a config from a mapping (e.g. an ml_collections `ConfigDict.model`).

    Unknown keys are an error so a typo in a config file does not pass silently.
    """
    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"model config: unknown fields {sorted(unknown)}; known: {sorted(known)}")
    return TransformerConfig(**dict(fields))


def num_params(cfg: TransformerConfig) -> int:
    """Exact parameter count of `wmrl.models.transformer.Transformer` for `cfg`."""
    D, H, K, Dh, F = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    attn = D * H * Dh + 2 * D * K * Dh + H * Dh * D + (2 * Dh if cfg.qk_norm else 0)
    block = attn + 3 * D * F + 2 * D
    embed = cfg.vocab_size * D * (1 if cfg.tie_embeddings else 2)
    return cfg.num_layers * block + embed + D
