"""Ahead-of-time compile of the policy train step from abstract state (allocates nothing).

`jax.eval_shape` gives the parameter and optimiser shapes; the shardings come
from the logical-axis rules; `jit(...).lower(...).compile()` then proves the
step partitions and fits, and reports XLA's memory analysis per device.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from wmrl.models.config import TransformerConfig
from wmrl.models.train_steps import (
    PolicyLossConfig,
    TrainState,
    abstract_model,
    make_policy_train_step,
    state_shardings,
)
from wmrl.models.transformer import Transformer


def policy_batch_spec(batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes of a policy-train-step batch (see `train_steps.policy_loss_fn`)."""
    bt = (batch_size, seq_len)
    return {
        "tokens": jax.ShapeDtypeStruct(bt, jnp.int32),
        "input_mask": jax.ShapeDtypeStruct(bt, jnp.bool_),
        "loss_mask": jax.ShapeDtypeStruct(bt, jnp.float32),
        "old_logp": jax.ShapeDtypeStruct(bt, jnp.float32),
        "ref_logp": jax.ShapeDtypeStruct(bt, jnp.float32),
        "advantages": jax.ShapeDtypeStruct((batch_size,), jnp.float32),
    }


def _per_device_bytes(tree, shardings) -> int:
    def leaf_bytes(a, s):
        return math.prod(s.shard_shape(a.shape)) * jnp.dtype(a.dtype).itemsize

    return sum(jax.tree.leaves(jax.tree.map(leaf_bytes, tree, shardings)))


def aot_policy_step(
    cfg: TransformerConfig,
    mesh: jax.sharding.Mesh,
    batch_size: int,
    seq_len: int,
    num_micro_batches: int = 1,
    tx: optax.GradientTransformation | None = None,
) -> dict:
    """Lower and compile `policy_train_step` for `cfg` on `mesh`; return a report dict."""
    if seq_len > cfg.max_len:
        raise ValueError(f"seq_len {seq_len} is longer than the model's max_len {cfg.max_len}")
    tx = optax.adamw(1e-5) if tx is None else tx
    graphdef, abstract_state = abstract_model(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    shardings = state_shardings(abstract_state, tx, mesh)
    params = nnx.to_pure_dict(abstract_state)
    abstract = jax.eval_shape(lambda p: TrainState(jnp.int32(0), p, tx.init(p)), params)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    batch = policy_batch_spec(batch_size, seq_len)
    step = make_policy_train_step(
        graphdef, tx, shardings, batch, mesh, PolicyLossConfig(kl_coef=0.01), num_micro_batches
    )
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = step.jitted.lower(abstract, batch)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    report = {
        "num_params": sum(math.prod(a.shape) for a in jax.tree.leaves(params)),
        "mesh": dict(zip(mesh.axis_names, mesh.devices.shape, strict=True)),
        "num_devices": mesh.devices.size,
        "per_device_param_bytes": _per_device_bytes(abstract.params, shardings.params),
        "per_device_opt_bytes": _per_device_bytes(abstract.opt_state, shardings.opt_state),
        "lower_s": t1 - t0,
        "compile_s": t2 - t1,
    }
    for field in (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "alias_size_in_bytes",
        "temp_size_in_bytes",
        "generated_code_size_in_bytes",
    ):
        report[field] = int(getattr(mem, field, -1)) if mem is not None else -1
    return report


# The verdict scorer's completion width for the AOT check (no tokenizer there): the
# teacher-forced path of one outcome is ~25 tokens with Qwen3's tokenizer, ~40 with a small
# SentencePiece one.
VERDICT_COMPLETION_TOKENS = 48


def aot_verdict_scorer(
    cfg: TransformerConfig, mesh: jax.sharding.Mesh, rows: int, prompt_len: int,
    num_outcomes: int, completion_len: int = VERDICT_COMPLETION_TOKENS,
) -> dict:  # fmt: skip
    """Lower and compile the verdict WM's teacher-forced scoring
    (`wmrl.autoresearch.verdict_wm.outcome_logprobs`) of `rows` prompts of `prompt_len`
    tokens against `num_outcomes` completions, with the policy's parameter shardings and
    the rows on the batch axes; return the compiled memory analysis and timings."""
    from wmrl.autoresearch.verdict_wm import outcome_logprobs
    from wmrl.models.sharding import batch_sharding

    graphdef, abstract_state = abstract_model(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    params = nnx.to_pure_dict(abstract_state)
    shardings = state_shardings(abstract_state, optax.identity(), mesh).params
    params = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, shardings
    )
    rows_spec = lambda dtype: jax.ShapeDtypeStruct(
        (rows, prompt_len), dtype, sharding=batch_sharding(mesh, 2)
    )
    comp = jax.ShapeDtypeStruct((num_outcomes, completion_len), jnp.int32)
    comp_mask = jax.ShapeDtypeStruct((num_outcomes, completion_len), jnp.bool_)
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = outcome_logprobs.lower(
            graphdef, params, rows_spec(jnp.int32), rows_spec(jnp.bool_), comp, comp_mask
        )
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    report = {"lower_s": t1 - t0, "compile_s": t2 - t1, "rows": rows, "prompt_len": prompt_len}
    for field in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"):
        report[field] = int(getattr(mem, field, -1)) if mem is not None else -1
    return report
