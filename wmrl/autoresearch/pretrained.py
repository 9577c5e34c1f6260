"""Starting the AutoResearch trainer from a pretrained Hugging Face checkpoint.

With `config.pretrained.checkpoint` set to a local directory holding a Qwen3 or Llama dense
checkpoint (`config.json`, `*.safetensors`, `tokenizer.json` or `tokenizer.model`), the
pipeline changes in three places and nowhere else:

* tokenizer: the checkpoint's own (`wmrl.hf_tokenizer`), not a SentencePiece model trained
  on the corpus; EOS and padding ids come from it;
* policy: the checkpoint's architecture and weights (`wmrl.models.hf_import`), placed shard
  by shard onto the mesh, instead of `config.policy.*`'s tiny random transformer;
* world model: its trunk starts from the same weights when `pretrained.wm_trunk` (the
  reward and class heads are new), else it is `config.wm.*`'s random trunk over the
  checkpoint's vocabulary.

The prompt (the task card's facts) is wrapped in `pretrained.prompt_template`, e.g. a chat
template for an instruction-tuned checkpoint. Warm start (SFT on the authored corpus), WM
pretraining and RL then run exactly as for the tiny model.

Everything checkable is checked by `validate` from the config and the checkpoint's small
files (config.json, tokenizer) before any device memory is allocated; tensor names and
shapes are checked by `load_hf_checkpoint` before the first tensor is placed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path

from wmrl.config_errors import ConfigError
from wmrl.models.config import TransformerConfig, from_mapping

PROMPT_FIELD = "{prompt}"

# Fields of `config.model` (the pod configs' architecture, read by the AOT check) that must
# agree with the checkpoint. max_len is the run's context (prompt + script), dtypes and remat
# are the run's numerics: those come from the config, not the checkpoint.
ARCHITECTURE_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(TransformerConfig)
    if f.name not in ("max_len", "dtype", "param_dtype", "remat")
)


def enabled(config) -> bool:
    return bool(config.get("pretrained", {}).get("checkpoint", ""))


def checkpoint_dir(config) -> str:
    return os.fspath(config.pretrained.checkpoint)


def prompt(config, text: str) -> str:
    """`text` in the configured prompt template (identity without one)."""
    template = config.get("pretrained", {}).get("prompt_template", PROMPT_FIELD)
    return template.replace(PROMPT_FIELD, text)


def model_config(config, max_len: int) -> TransformerConfig:
    """The checkpoint's architecture with this run's context length and numerics."""
    from wmrl.models.hf_import import config_from_hf

    p = config.pretrained
    path = Path(checkpoint_dir(config)) / "config.json"
    try:
        hf = json.loads(path.read_text())
        cfg = config_from_hf(hf, dtype=p.dtype, param_dtype=p.param_dtype, max_len=max_len)
    except (OSError, ValueError) as e:
        raise ConfigError("config.pretrained.checkpoint", f"{path}: {e}") from e
    return cfg.replace(remat=bool(p.remat))


def load_tokenizer(config):
    """The checkpoint's tokenizer, parsed once per process (Qwen3's tokenizer.json is 11 MB;
    validation, the data stage and the weight import all need it)."""
    try:
        return _checkpoint_tokenizer(os.path.abspath(checkpoint_dir(config)))
    except (OSError, ValueError, ImportError) as e:
        raise ConfigError("config.pretrained.checkpoint", f"cannot load its tokenizer: {e}") from e


@functools.lru_cache(maxsize=4)
def _checkpoint_tokenizer(path: str):
    from wmrl.hf_tokenizer import load_checkpoint_tokenizer

    return load_checkpoint_tokenizer(path)


def validate(config, max_len: int) -> None:
    """Config-level checks of the pretrained start (no device memory, no tensor data read).

    The directory, its config.json (a supported architecture), its tokenizer (present, fits
    the embedding), the prompt template, and agreement with `config.model` when the config
    spells the architecture out (the pod configs do, for the AOT check).
    """
    if not enabled(config):
        if "model" in config:
            raise ConfigError(
                "config.pretrained.checkpoint",
                "this config is for a pretrained model (it has config.model) but no checkpoint "
                "is given; pass --config.pretrained.checkpoint=DIR (a local Hugging Face "
                "checkpoint directory, see the config's docstring)",
            )
        return
    from wmrl import storage
    from wmrl.models.hf_import import check_tokenizer_vocab

    p = config.pretrained
    field = "config.pretrained.checkpoint"
    if not storage.is_local(p.checkpoint):
        raise ConfigError(
            field,
            f"{p.checkpoint!r} is not a local directory: the tensors are memory-mapped from "
            "local files. Copy the checkpoint to every host first (docs/checkpoints.md)",
        )
    ckpt = Path(checkpoint_dir(config))
    if not ckpt.is_dir():
        raise ConfigError(field, f"{str(ckpt)!r} is not a directory")
    if not (ckpt / "config.json").exists():
        raise ConfigError(field, f"{str(ckpt)!r} has no config.json (not a HF checkpoint)")
    for name in ("dtype", "param_dtype"):
        if p[name] not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"config.pretrained.{name}", f"unknown dtype {p[name]!r}")
    if PROMPT_FIELD not in p.prompt_template:
        raise ConfigError(
            "config.pretrained.prompt_template", f"must contain {PROMPT_FIELD!r} (the task card)"
        )
    cfg = model_config(config, max_len)
    tok = load_tokenizer(config)
    try:
        check_tokenizer_vocab(tok.vocab_size, cfg)
    except ValueError as e:
        raise ConfigError(field, str(e)) from e
    if tok.eos_id < 0:
        raise ConfigError(field, "its tokenizer has no EOS token (scripts could not end)")
    if "model" in config:
        want = from_mapping(config.model.to_dict())
        diff = [
            f"{f}: config {getattr(want, f)!r} vs checkpoint {getattr(cfg, f)!r}"
            for f in ARCHITECTURE_FIELDS
            if getattr(want, f) != getattr(cfg, f)
        ]
        if diff:
            raise ConfigError(
                "config.model",
                f"does not match the checkpoint in {ckpt} ({'; '.join(diff)}); point "
                "pretrained.checkpoint at the model this config is for",
            )


def load_params(config, cfg: TransformerConfig, mesh) -> dict:
    """The checkpoint's weights as our parameter tree, each shard placed on its devices."""
    from wmrl.models.hf_import import load_hf_checkpoint

    tokenizer_vocab = load_tokenizer(config).vocab_size
    try:
        loaded, params = load_hf_checkpoint(
            checkpoint_dir(config), mesh, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            max_len=cfg.max_len, tokenizer_vocab_size=tokenizer_vocab,
        )  # fmt: skip
    except ValueError as e:
        raise ConfigError("config.pretrained.checkpoint", str(e)) from e
    if loaded.replace(remat=cfg.remat) != cfg:  # the same config.json, read twice
        raise AssertionError(f"checkpoint config changed while loading: {loaded} != {cfg}")
    return params
