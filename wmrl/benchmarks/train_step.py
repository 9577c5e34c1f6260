"""Policy train-step throughput and model FLOPs utilisation (MFU).

  python -m wmrl.benchmarks.train_step --config=configs/model_tiny.py --peak_flops=1e11
  python -m wmrl.benchmarks.train_step --config=configs/model_small.py --peak_flops=989e12

`--peak_flops` is the per-device peak (e.g. 989e12 for H100/H200 dense bf16).
The batch's first quarter of columns is a prompt (no loss); `--skip_prompt_logits` does not
unembed it (`PolicyLossConfig.logits_from`), as the RL trainer does. MFU still counts the
full unembedding, so compare step times, not MFU, between the two.
Model FLOPs per token are the usual `6 N + 12 L H Dh T` (N = parameters used
in matmuls, so the input-embedding lookup is excluded unless tied to the
output; the second term is attention's score and value products), counted
once per token whether or not the step rematerialises.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

from wmrl.benchmarks.common import machine, report
from wmrl.models.config import TransformerConfig, num_params
from wmrl.models.model_configs import transformer_config
from wmrl.models.sharding import make_mesh
from wmrl.models.train_steps import (
    PolicyLossConfig,
    batch_shardings,
    init_train_state,
    make_policy_train_step,
)
from wmrl.models.transformer import Transformer

config_flags.DEFINE_config_file("config", "configs/model_tiny.py", "model config file")
flags.DEFINE_float("peak_flops", None, "peak FLOP/s of one device, for the MFU figure")
flags.DEFINE_integer("steps", 5, "timed steps (after one compile+warm-up step)")
flags.DEFINE_integer("batch_size", None, "override the config's batch_size")
flags.DEFINE_integer("seq_len", None, "override the config's seq_len")
flags.DEFINE_bool("skip_prompt_logits", False, "no logits for the prompt quarter of the row")
flags.DEFINE_string("out", None, "write the figures to this JSON file")
FLAGS = flags.FLAGS


def flops_per_token(cfg: TransformerConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) of the model's matmuls."""
    norms = cfg.num_layers * (2 * cfg.d_model + (2 * cfg.head_dim if cfg.qk_norm else 0))
    matmul_params = num_params(cfg) - norms - cfg.d_model
    if not cfg.tie_embeddings:
        matmul_params -= cfg.vocab_size * cfg.d_model  # the input lookup is not a matmul
    attention = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
    return 6.0 * matmul_params + attention


def prompt_len(T: int) -> int:
    return T // 4


def _batch(cfg: TransformerConfig, B: int, T: int) -> dict:
    rng = np.random.default_rng(0)
    loss_mask = np.zeros((B, T), np.float32)
    loss_mask[:, prompt_len(T) :] = 1.0
    return {
        "tokens": rng.integers(4, cfg.vocab_size, (B, T)).astype(np.int32),
        "input_mask": np.ones((B, T), bool),
        "loss_mask": loss_mask,
        "old_logp": np.full((B, T), -5.0, np.float32),
        "ref_logp": np.full((B, T), -5.0, np.float32),
        "advantages": rng.normal(size=(B,)).astype(np.float32),
    }


def measure(
    config,
    *,
    peak_flops: float | None = None,
    steps: int = 5,
    batch_size: int | None = None,
    seq_len: int | None = None,
    skip_prompt_logits: bool = False,
    model_overrides: dict | None = None,
) -> dict:
    """Time `steps` policy train steps (after one compile + warm-up step) of a loaded
    `configs/model_*.py`; `model_overrides` replace `TransformerConfig` fields."""
    cfg = transformer_config(config)
    if model_overrides:
        cfg = cfg.replace(**model_overrides)
    B = batch_size or config.batch_size
    T = seq_len or config.seq_len
    mesh = make_mesh(tuple(config.mesh_shape))
    tx = optax.adamw(config.learning_rate, weight_decay=config.weight_decay)
    graphdef, state = init_train_state(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), tx, mesh)
    batch = _batch(cfg, B, T)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    logits_from = prompt_len(T) if skip_prompt_logits else 0
    loss_cfg = PolicyLossConfig(kl_coef=0.01, logits_from=logits_from)
    step = make_policy_train_step(
        graphdef, tx, shardings, batch, mesh, loss_cfg, config.num_micro_batches,
    )  # fmt: skip
    batch = jax.device_put(batch, batch_shardings(batch, mesh))
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    tokens = B * T
    flops = flops_per_token(cfg, T) * tokens
    rows = {
        "tokens_per_s": tokens / step_s,
        "step_s": step_s,
        "compile_s": compile_s,
        "model_flops_per_step": flops,
        "achieved_flops_per_s": flops / step_s,
        "num_params": num_params(cfg),
        "batch_size": B,
        "seq_len": T,
        "logits_from": logits_from,
        "num_micro_batches": config.num_micro_batches,
        "dtype": cfg.dtype,
        "remat": cfg.remat,
        "remat_policy": cfg.remat_policy,
        "attention_impl": cfg.attention_impl,
        "num_devices": mesh.devices.size,
        "loss": float(metrics["loss"][0] / jnp.maximum(metrics["loss"][1], 1)),
        "machine": machine(),
    }
    if peak_flops:
        rows["peak_flops_per_device"] = peak_flops
        rows["mfu"] = flops / step_s / (peak_flops * mesh.devices.size)
    return rows


def run() -> dict:
    return measure(
        FLAGS.config, peak_flops=FLAGS.peak_flops, steps=FLAGS.steps,
        batch_size=FLAGS.batch_size, seq_len=FLAGS.seq_len,
        skip_prompt_logits=FLAGS.skip_prompt_logits,
    )  # fmt: skip


def main(_):
    report("policy train step", run(), FLAGS.out)


if __name__ == "__main__":
    app.run(main)
