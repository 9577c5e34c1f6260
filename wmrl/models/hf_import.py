"""Import Hugging Face safetensors checkpoints (Qwen3 and Llama dense) into `Transformer`.

`load_hf_checkpoint(dir)` reads `config.json` and the `*.safetensors` files
(one file, or shards listed in `model.safetensors.index.json`) and returns
`(TransformerConfig, params)`, where `params` is the pure-dict parameter tree
that `nnx.merge(graphdef, params)` and the train state expect.

Why the safetensors files are read by hand (header + `np.memmap`) instead of
through `safetensors.safe_open`: its numpy backend has no bfloat16 (the dtype
of every released Qwen3 checkpoint) and its flax backend puts each tensor on
the default accelerator, which would allocate device memory before the
checkpoint is validated and land every tensor on device 0. A memmap is lazy and
dtype-exact (`ml_dtypes.bfloat16`), and the format is an 8-byte header length,
a JSON header and raw little-endian bytes.

Order of work, so a bad checkpoint fails before any device memory is used:
1. read `config.json` -> `TransformerConfig` (unsupported features raise);
2. read every safetensors header; check every expected tensor exists with the
   shape the config implies, and no unexpected tensor is present;
3. check the tokenizer (if the checkpoint ships one) fits the embedding;
4. only then build each parameter on the host (layers stacked on the leading
   `layers` axis, one stacked tensor at a time) and place it straight onto the
   mesh with the sharding from `LOGICAL_AXIS_RULES`.

Name mapping (HF Linear weights are `[out, in]`; ours are `[in, out]` with the
head dims split out): `q_proj [H*Dh, D] -> q_dnh [D, H, Dh]`,
`k/v_proj [K*Dh, D] -> [D, K, Dh]`, `o_proj [D, H*Dh] -> o_nhd [H, Dh, D]`,
`gate/up_proj [F, D] -> [D, F]`, `down_proj [D, F] -> [F, D]`,
`lm_head [V, D] -> unembed_dv [D, V]`; norms and the embedding keep their layout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from wmrl.models.config import TransformerConfig
from wmrl.models.sharding import param_shardings
from wmrl.models.transformer import Transformer

SUPPORTED_MODEL_TYPES = ("qwen3", "llama")

_ST_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype(np.float64),
}


# HF rope_type -> our `TransformerConfig.rope_scaling`; anything else is refused.
_ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3"}


def _rope_scaling(field: str, entry: Mapping[str, Any], hf: Mapping[str, Any]) -> dict[str, Any]:
    """Our rope-scaling fields for one HF rope dict; `{}` for default rope."""
    rope_type = entry.get("rope_type", entry.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise ValueError(
            f"hf config: {field} with rope_type {rope_type!r} is not supported "
            f"(supported: {', '.join(_ROPE_TYPES)})"
        )
    if rope_type == "default":
        return {}
    keys = (
        ("factor", "low_freq_factor", "high_freq_factor") if rope_type == "llama3" else ("factor",)
    )
    for key in keys:
        if entry.get(key) is None:
            raise ValueError(f"hf config: {field} with rope_type {rope_type!r} lacks {key!r}")
    out = {"rope_scaling": _ROPE_TYPES[rope_type], "rope_factor": float(entry["factor"])}
    if rope_type == "llama3":
        original = hf.get("original_max_position_embeddings")  # wins, as in transformers
        if original is None:
            original = entry.get(
                "original_max_position_embeddings", hf.get("max_position_embeddings")
            )
        if original is None:
            raise ValueError(f"hf config: {field} lacks 'original_max_position_embeddings'")
        out.update(
            rope_low_freq_factor=float(entry["low_freq_factor"]),
            rope_high_freq_factor=float(entry["high_freq_factor"]),
            rope_original_max_len=int(original),
        )
    return out


def _rope_settings(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Our rope fields (`rope_theta` and the scaling) for an HF config.

    transformers < 4.56 writes `rope_theta` + `rope_scaling`; later versions
    write `rope_parameters = {"rope_type": ..., "rope_theta": ..., <scaling keys>}`.
    Both present with different scalings is refused: transformers versions
    disagree on which one wins.
    """
    params = hf.get("rope_parameters") or {}
    new, old = (_rope_scaling(f, hf.get(f) or {}, hf) for f in ("rope_parameters", "rope_scaling"))
    if new and old and new != old:
        raise ValueError("hf config: rope_parameters and rope_scaling give different rope scalings")
    theta = params.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise ValueError("hf config: rope_theta is missing")
    return {"rope_theta": float(theta), **(new or old)}


def config_from_hf(
    hf_config: Mapping[str, Any],
    *,
    dtype: str = "float32",
    param_dtype: str = "float32",
    max_len: int | None = None,
) -> TransformerConfig:
    """`TransformerConfig` for a Hugging Face `config.json` dict of a Qwen3 or Llama model.

    Raises `ValueError` naming the field for anything our decoder does not
    compute exactly as the reference: MoE, sliding-window attention, rope
    scaling other than linear/llama3 (YaRN, dynamic NTK, LongRoPE),
    attention/MLP biases, an activation other than SiLU.
    `max_len` defaults to `max_position_embeddings`.
    """
    model_type = hf_config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"hf config: model_type {model_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    for field in ("num_experts", "num_local_experts", "moe_intermediate_size"):
        if hf_config.get(field):
            raise ValueError(f"hf config: mixture-of-experts field {field!r} is not supported")
    if hf_config.get("use_sliding_window") or (
        model_type == "llama" and hf_config.get("sliding_window")
    ):
        raise ValueError("hf config: use_sliding_window/sliding_window is not supported")
    layer_types = hf_config.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise ValueError(f"hf config: layer_types {sorted(set(layer_types))} is not supported")
    for field in ("attention_bias", "mlp_bias"):
        if hf_config.get(field):
            raise ValueError(f"hf config: {field}=True is not supported (no biases in our model)")
    act = hf_config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hf config: hidden_act {act!r} is not supported (only silu/SwiGLU)")
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    for field in (*required, "intermediate_size"):
        if field not in hf_config:
            raise ValueError(f"hf config: required field {field!r} is missing")
    d_model = int(hf_config["hidden_size"])
    num_heads = int(hf_config["num_attention_heads"])
    head_dim = hf_config.get("head_dim") or d_model // num_heads
    return TransformerConfig(
        vocab_size=int(hf_config["vocab_size"]),
        d_model=d_model,
        num_layers=int(hf_config["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(hf_config.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        mlp_dim=int(hf_config["intermediate_size"]),
        max_len=int(max_len or hf_config.get("max_position_embeddings", 2048)),
        dtype=dtype,
        param_dtype=param_dtype,
        qk_norm=model_type == "qwen3",
        tie_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
        norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
        **_rope_settings(hf_config),
    )


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, byte offset of its data, dtype and shape."""

    file: str
    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]

    def read(self) -> np.ndarray:
        """A read-only memmap of the tensor (no copy until it is transformed)."""
        return np.memmap(self.file, self.dtype, "r", self.offset, self.shape)


def read_safetensors_header(path: str) -> dict[str, TensorInfo]:
    """Tensor name -> `TensorInfo` for one `.safetensors` file (reads only the header)."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    base = 8 + header_len
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {entry['dtype']}")
        start, _ = entry["data_offsets"]
        dtype, shape = _ST_DTYPES[entry["dtype"]], tuple(entry["shape"])
        out[name] = TensorInfo(path, base + start, dtype, shape)
    return out


def checkpoint_index(ckpt_dir: str) -> dict[str, TensorInfo]:
    """All tensors of a checkpoint directory: sharded (via the index json) or single-file."""
    index_path = os.path.join(ckpt_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(n for n in os.listdir(ckpt_dir) if n.endswith(".safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in checkpoint directory {ckpt_dir!r}")
    tensors: dict[str, TensorInfo] = {}
    for name in files:
        tensors.update(read_safetensors_header(os.path.join(ckpt_dir, name)))
    return tensors


# Our parameter path -> (HF name template, HF shape, transform HF array -> our layout).
_Spec = tuple[str, tuple[int, ...], Callable[[np.ndarray], np.ndarray]]


def _param_specs(cfg: TransformerConfig) -> dict[tuple[str, ...], _Spec]:
    """HF source of every parameter; `{i}` in a name marks a per-layer tensor to stack."""
    D, H, K, Dh, F, V = (
        cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim, cfg.vocab_size,
    )  # fmt: skip
    same = lambda a: a
    layer = "model.layers.{i}."
    specs: dict[tuple[str, ...], _Spec] = {
        ("embed_vd",): ("model.embed_tokens.weight", (V, D), same),
        ("final_norm", "scale"): ("model.norm.weight", (D,), same),
        ("blocks", "attn_norm", "scale"): (layer + "input_layernorm.weight", (D,), same),
        ("blocks", "mlp_norm", "scale"): (layer + "post_attention_layernorm.weight", (D,), same),
        ("blocks", "attn", "q_dnh"): (
            layer + "self_attn.q_proj.weight", (H * Dh, D), lambda a: a.T.reshape(D, H, Dh),
        ),
        ("blocks", "attn", "k_dkh"): (
            layer + "self_attn.k_proj.weight", (K * Dh, D), lambda a: a.T.reshape(D, K, Dh),
        ),
        ("blocks", "attn", "v_dkh"): (
            layer + "self_attn.v_proj.weight", (K * Dh, D), lambda a: a.T.reshape(D, K, Dh),
        ),
        ("blocks", "attn", "o_nhd"): (
            layer + "self_attn.o_proj.weight", (D, H * Dh), lambda a: a.T.reshape(H, Dh, D),
        ),
        ("blocks", "mlp", "gate_df"): (layer + "mlp.gate_proj.weight", (F, D), lambda a: a.T),
        ("blocks", "mlp", "up_df"): (layer + "mlp.up_proj.weight", (F, D), lambda a: a.T),
        ("blocks", "mlp", "down_fd"): (layer + "mlp.down_proj.weight", (D, F), lambda a: a.T),
    }  # fmt: skip
    if cfg.qk_norm:
        for name in ("q_norm", "k_norm"):
            source = f"{layer}self_attn.{name}.weight"
            specs[("blocks", "attn", name, "scale")] = (source, (Dh,), same)
    if not cfg.tie_embeddings:
        specs[("unembed_dv",)] = ("lm_head.weight", (V, D), lambda a: a.T)
    return specs


def _source_names(template: str, num_layers: int) -> list[str]:
    if "{i}" not in template:
        return [template]
    return [template.format(i=i) for i in range(num_layers)]


def validate_tensors(cfg: TransformerConfig, tensors: Mapping[str, TensorInfo]) -> None:
    """Raise `ValueError` naming the tensor for a missing, misshapen or unexpected tensor."""
    expected: set[str] = set()
    for template, shape, _ in _param_specs(cfg).values():
        for name in _source_names(template, cfg.num_layers):
            expected.add(name)
            if name not in tensors:
                raise ValueError(f"checkpoint: tensor {name!r} is missing")
            if tensors[name].shape != shape:
                raise ValueError(
                    f"checkpoint: tensor {name!r} has shape {tensors[name].shape}, "
                    f"expected {shape} from config.json"
                )
    # A tied checkpoint may still carry lm_head (equal to the embedding); it is unused.
    ignorable = {"lm_head.weight"} if cfg.tie_embeddings else set()
    unexpected = sorted(set(tensors) - expected - ignorable)
    if unexpected:
        raise ValueError(
            f"checkpoint: unexpected tensors {unexpected[:5]} (of {len(unexpected)}); "
            "the architecture has parameters our model does not (e.g. biases)"
        )


def check_tokenizer_vocab(tokenizer_vocab_size: int, cfg: TransformerConfig) -> None:
    """The tokenizer's ids must index the embedding.

    The embedding may be larger (Qwen3 pads 151,669 tokens to 151,936 rows for
    efficient sharding); a tokenizer with more ids than rows is an error.
    """
    if tokenizer_vocab_size > cfg.vocab_size:
        raise ValueError(
            f"tokenizer vocabulary size {tokenizer_vocab_size} exceeds the embedding's "
            f"vocab_size {cfg.vocab_size}"
        )


def abstract_transformer(cfg: TransformerConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """Graphdef and shape-only state of `Transformer(cfg)`; allocates nothing."""
    return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))


def _host_param(
    spec: _Spec, cfg: TransformerConfig, tensors: Mapping[str, TensorInfo]
) -> np.ndarray:
    """One parameter in our layout and storage dtype; per-layer tensors stacked on axis 0."""
    template, _, transform = spec
    dtype = cfg.storage_dtype
    names = _source_names(template, cfg.num_layers)
    if "{i}" not in template:
        return np.asarray(transform(tensors[names[0]].read()), dtype=dtype)
    first = transform(tensors[names[0]].read())
    out = np.empty((len(names), *first.shape), dtype)  # filled in place: one host copy
    for i, name in enumerate(names):
        out[i] = transform(tensors[name].read())
    return out


def _place(host: np.ndarray, sharding: jax.sharding.Sharding | None) -> jax.Array:
    """Put `host` on devices; with a sharding each device receives only its own slice."""
    if sharding is None:
        return jax.device_put(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _nested_set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _nested_get(tree: Mapping, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def load_hf_checkpoint(
    ckpt_dir: str | os.PathLike,
    mesh: jax.sharding.Mesh | None = None,
    *,
    dtype: str = "float32",
    param_dtype: str = "float32",
    max_len: int | None = None,
    tokenizer_vocab_size: int | None = None,
) -> tuple[TransformerConfig, dict]:
    """Load a HF Qwen3/Llama safetensors checkpoint directory.

    Returns `(cfg, params)`: `params` is the pure-dict tree of
    `nnx.split(Transformer(cfg))`'s state, each leaf a `jax.Array` in
    `param_dtype`, sharded over `mesh` by `LOGICAL_AXIS_RULES` (or on the
    default device without a mesh). `dtype` is the compute dtype.

    `tokenizer_vocab_size` (default: the size of the checkpoint's own
    `tokenizer.json`/`tokenizer.model`, when present) is checked against the
    embedding. All checks run before any device memory is allocated.
    """
    ckpt_dir = os.fspath(ckpt_dir)
    config_path = os.path.join(ckpt_dir, "config.json")
    if not os.path.exists(config_path):
        raise ValueError(f"checkpoint directory {ckpt_dir!r} has no config.json")
    with open(config_path) as f:
        hf_config = json.load(f)
    cfg = config_from_hf(hf_config, dtype=dtype, param_dtype=param_dtype, max_len=max_len)
    tensors = checkpoint_index(ckpt_dir)
    validate_tensors(cfg, tensors)
    if tokenizer_vocab_size is None:
        tokenizer_vocab_size = checkpoint_tokenizer_vocab_size(ckpt_dir)
    if tokenizer_vocab_size is not None:
        check_tokenizer_vocab(tokenizer_vocab_size, cfg)

    _, abstract_state = abstract_transformer(cfg)
    abstract_params = nnx.to_pure_dict(abstract_state)
    shardings = param_shardings(abstract_state, mesh) if mesh is not None else None
    params: dict = {}
    for path, spec in _param_specs(cfg).items():
        expected_shape = tuple(_nested_get(abstract_params, path).shape)
        host = _host_param(spec, cfg, tensors)
        if host.shape != expected_shape:  # guards the mapping table itself
            raise AssertionError(f"{path}: built {host.shape}, model expects {expected_shape}")
        sharding = _nested_get(shardings, path) if shardings is not None else None
        _nested_set(params, path, _place(host, sharding))
        del host
    if jax.tree.structure(params) != jax.tree.structure(abstract_params):  # table is complete
        raise AssertionError("hf import: the name mapping does not cover every model parameter")
    return cfg, params


def checkpoint_tokenizer_vocab_size(ckpt_dir: str) -> int | None:
    """Vocabulary size of the checkpoint's own tokenizer files, or None when it has none."""
    from wmrl.hf_tokenizer import load_checkpoint_tokenizer

    tok = load_checkpoint_tokenizer(ckpt_dir, required=False)
    return None if tok is None else tok.vocab_size
