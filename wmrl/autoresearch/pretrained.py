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


# Qwen3's chat format with thinking switched off (what its chat template renders for
# `enable_thinking=False`): the task card is the user turn, the script the assistant's answer,
# ended by the tokenizer's EOS (<|im_end|>).
QWEN3_CHAT_TEMPLATE = (
    "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def pod_config(
    base,
    model: dict,
    *,
    mesh_shape: tuple[int, ...],
    tasks_per_step: int,
    group_size: int,
    max_prompt_len: int,
    max_new_tokens: int,
    num_micro_batches: int,
    learning_rate: float,
    prompt_template: str = QWEN3_CHAT_TEMPLATE,
):
    """A WMRL trainer config for a pretrained checkpoint on a pod, from the pipeline's base
    config (`configs/autoresearch_tiny.py`, loaded by the caller).

    `model` (a `TransformerConfig` dict: the checkpoint's architecture with the run's
    numerics) is kept as `config.model`, which the AOT check compiles and `validate` compares
    with the checkpoint. The policy step's shape is (tasks_per_step * group_size) x
    (max_prompt_len + max_new_tokens) in `num_micro_batches` chunks.
    `pretrained.checkpoint` is left empty: the launch command sets it.
    """
    from wmrl.autoresearch.env.suite import suite_tasks

    c = base
    c.model = dict(model)
    c.mesh_shape = tuple(mesh_shape)
    p = c.pretrained
    p.dtype, p.param_dtype, p.remat = model["dtype"], model["param_dtype"], model["remat"]
    p.wm_trunk = True
    p.prompt_template = prompt_template
    c.suite.tasks = tuple(t.id for t in suite_tasks())  # every built-in task
    c.suite.workers = 32  # sandbox slots per host (TPU VM hosts have 100+ cores)
    c.suite.time_limit_s = 60.0
    c.data.scripts_per_task = 32  # executed: WM pretraining data
    c.data.sft_scripts_per_task = 64
    c.data.max_prompt_len = max_prompt_len
    c.data.max_new_tokens = max_new_tokens
    c.policy.sft_steps = 200  # teaches the script contract (DATA_DIR, SUBMISSION_PATH)
    c.policy.sft_batch_size = tasks_per_step * group_size
    c.policy.sft_learning_rate = 1e-5
    c.wm.num_members = 4
    c.wm.pretrain_steps = 300
    c.wm.batch_size = tasks_per_step * group_size
    c.wm.learning_rate = 1e-5
    c.wm.online_learning_rate = 2e-6
    c.wm.replay_size = 4096
    c.rl.steps = 300
    c.rl.tasks_per_step = tasks_per_step
    c.rl.group_size = group_size
    c.rl.num_micro_batches = num_micro_batches
    c.rl.learning_rate = learning_rate
    c.rl.kl_coef = 0.01
    c.rl.temperature = 1.0
    c.rl.eval_every = 10
    c.rl.eval_samples = 8
    c.rl.checkpoint_every = 10
    c.correction.min_pairs = 64
    return c
