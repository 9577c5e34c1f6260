"""Sharded, jitted train steps with exact gradient accumulation over micro-batches.

State is one explicit pytree (`TrainState`: step, params as a pure dict,
optax state). Each step is `jax.jit` with explicit in/out shardings derived
from the logical-axis rules, and the state argument is donated so parameters
and optimiser moments are updated in place.

Exact accumulation: a loss function returns a *sum* over its micro-batch,
divided by a normaliser computed once from the *whole* batch (e.g. the global
count of completion tokens). Summing micro-batch gradients then gives exactly
the full-batch gradient, whatever the split. Metrics are `(sum, count)` pairs
for the same reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec

from wmrl.core.grpo import token_policy_loss
from wmrl.distributed import host_to_global
from wmrl.models.sharding import batch_sharding, constrain, param_shardings
from wmrl.models.transformer import (
    Transformer,
    causal_padding_mask,
    logprobs_from_hidden,
    positions_from_mask,
    token_logprobs,
)
from wmrl.models.world_model import predict, wm_loss_fn, wm_normalisers

Metrics = dict[str, tuple[jax.Array, jax.Array]]
# loss_fn(model, micro_batch, normaliser) -> (loss divided by the global normaliser, metrics)
LossFn = Callable[[Any, dict, Any], tuple[jax.Array, Metrics]]


class TrainState(struct.PyTreeNode):
    step: jax.Array
    params: dict
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """PPO-clip / KL / entropy settings passed to `wmrl.core.grpo.token_policy_loss`."""

    clip_eps: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_clamp: float | None = None
    entropy_coef: float = 0.0
    # Static width of the prompt region (no loss there): logits only from this column on.
    logits_from: int = 0


def abstract_model(factory: Callable[[], nnx.Module]) -> tuple[nnx.GraphDef, nnx.State]:
    """Graph definition and shape-only state of `factory()`, allocating nothing."""
    return nnx.split(nnx.eval_shape(factory))


def state_shardings(abstract_state: nnx.State, tx: optax.GradientTransformation, mesh):
    """`TrainState` of `NamedSharding`s: params by the rules table, optimiser moments
    like their parameters, scalars (step, counts) replicated."""
    p_shard = param_shardings(abstract_state, mesh)
    abstract_params = nnx.to_pure_dict(abstract_state)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_shard = optax.tree_map_params(
        tx, lambda _, s: s, abstract_opt, p_shard, transform_non_params=lambda _: replicated
    )
    return TrainState(step=replicated, params=p_shard, opt_state=opt_shard)


def init_train_state(
    factory: Callable[[], nnx.Module], tx, mesh
) -> tuple[nnx.GraphDef, TrainState]:
    """Build the model and optimiser state directly in their shardings (jitted init)."""
    graphdef, abstract_state = abstract_model(factory)
    shardings = state_shardings(abstract_state, tx, mesh)

    def init():
        params = nnx.to_pure_dict(nnx.state(factory()))
        return TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params))

    with jax.set_mesh(mesh):
        state = jax.jit(init, out_shardings=shardings)()
    return graphdef, state


def batch_shardings(batch: dict, mesh) -> dict:
    """Every batch field is sharded on its leading (example) dim over the data axes."""
    return {k: batch_sharding(mesh, jnp.ndim(v)) for k, v in batch.items()}


def _check_batch(batch: dict, num_micro_batches: int) -> int:
    sizes = {k: jnp.shape(v)[0] if jnp.ndim(v) else None for k, v in batch.items()}
    B = next(iter(sizes.values()), None)
    if not batch or not B:
        raise ValueError(f"empty batch: every field needs a non-empty leading dim, got {sizes}")
    if any(s != B for s in sizes.values()):
        raise ValueError(f"batch fields disagree on the batch size: {sizes}")
    if B % num_micro_batches != 0:
        raise ValueError(
            f"batch size {B} is not divisible by num_micro_batches={num_micro_batches}"
        )
    return B


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    loss_fn: LossFn,
    normaliser_fn: Callable[[dict], Any],
    shardings: TrainState,
    example_batch: dict,
    mesh,
    num_micro_batches: int = 1,
) -> Callable[[TrainState, dict], tuple[TrainState, Metrics]]:
    """Jitted `(state, batch) -> (state, metrics)` with donated state.

    `batch` is a dict of arrays with a common leading dim B; it is split into
    `num_micro_batches` chunks scanned with `lax.scan`, so peak activation
    memory is that of one micro-batch.
    """
    B = _check_batch(example_batch, num_micro_batches)
    M = num_micro_batches
    data_ways = mesh.shape["data"] * mesh.shape["fsdp"]
    if (B // M) % data_ways != 0:
        raise ValueError(
            f"micro-batch size {B // M} (batch {B} / {M} micro-batches) is not divisible by "
            f"the data-parallel ways data*fsdp={data_ways} of the mesh"
        )
    b_shard = batch_shardings(example_batch, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())

    def step_fn(state: TrainState, batch: dict):
        normaliser = normaliser_fn(batch)
        micro = jax.tree.map(
            lambda x: constrain(
                x.reshape(M, x.shape[0] // M, *x.shape[1:]),
                (None, "batch") + (None,) * (x.ndim - 1),
            ),
            batch,
        )

        def grad_of(params, mb):
            def f(p):
                return loss_fn(nnx.merge(graphdef, p), mb, normaliser)

            return jax.grad(f, has_aux=True)(params)

        def body(carry, mb):
            grads, metrics = carry
            g, m = grad_of(state.params, mb)
            grads = jax.tree.map(jnp.add, grads, g)
            metrics = {k: (metrics[k][0] + m[k][0], metrics[k][1] + m[k][1]) for k in m}
            return (grads, metrics), None

        first_grads, first_metrics = grad_of(state.params, jax.tree.map(lambda x: x[0], micro))
        if M > 1:
            rest = jax.tree.map(lambda x: x[1:], micro)
            (grads, metrics), _ = jax.lax.scan(body, (first_grads, first_metrics), rest)
        else:
            grads, metrics = first_grads, first_metrics
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics)
        metrics["grad_norm"] = (optax.tree.norm(grads), jnp.float32(1.0))
        return TrainState(state.step + 1, params, opt_state), metrics

    jitted = jax.jit(
        step_fn,
        in_shardings=(shardings, b_shard),
        out_shardings=(shardings, replicated),
        donate_argnums=(0,),
    )

    def train_step(state: TrainState, batch: dict) -> tuple[TrainState, Metrics]:
        _check_batch(batch, M)
        batch = host_to_global(batch, b_shard)  # several processes: each feeds its rows
        with jax.set_mesh(mesh):
            return jitted(state, batch)

    train_step.jitted = jitted
    return train_step


def policy_loss_fn(cfg: PolicyLossConfig) -> LossFn:
    """GRPO/PPO token loss on a batch with fields
    `tokens, input_mask, loss_mask, old_logp, ref_logp: [B, T]`, `advantages: [B]`."""

    def loss_fn(model: Transformer, mb: dict, normaliser):
        tokens, input_mask = mb["tokens"], mb["input_mask"]
        positions, mask = positions_from_mask(input_mask), causal_padding_mask(input_mask)
        h, _ = model.hidden(tokens, positions, mask)
        logp, logits = logprobs_from_hidden(model, h, tokens, input_mask, cfg.logits_from)
        entropy = None
        if cfg.entropy_coef:
            lsm = jax.nn.log_softmax(logits, axis=-1)
            ent = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)  # entropy of the next-token dist
            entropy = jnp.pad(ent, ((0, 0), (tokens.shape[1] - ent.shape[1], 0)))
        loss_sum, metrics = token_policy_loss(
            logp, mb["old_logp"], mb["ref_logp"], mb["advantages"], mb["loss_mask"],
            clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
            kl_clamp=cfg.kl_clamp, entropy=entropy, entropy_coef=cfg.entropy_coef,
        )  # fmt: skip
        return loss_sum / normaliser, metrics

    return loss_fn


def masked_token_count(batch: dict) -> jax.Array:
    """Global number of completion tokens (>= 1), the policy loss normaliser."""
    return jnp.maximum(jnp.sum(batch["loss_mask"].astype(jnp.float32)), 1.0)


def make_policy_train_step(
    graphdef, tx, shardings, example_batch, mesh, loss_cfg=PolicyLossConfig(), num_micro_batches=1
):
    """`policy_train_step(state, batch) -> (state, metrics)` for the GRPO policy loss."""
    return make_train_step(
        graphdef, tx, policy_loss_fn(loss_cfg), masked_token_count, shardings, example_batch,
        mesh, num_micro_batches,
    )  # fmt: skip


def make_wm_train_step(
    graphdef, tx, shardings, example_batch, mesh, class_coef=1.0, num_micro_batches=1,
    rank_coef=0.0, runtime_coef=0.0, error_type_coef=0.0, validation_coef=0.0,
):  # fmt: skip
    """`wm_train_step(state, batch) -> (state, metrics)`: bootstrap-weighted Gaussian NLL per
    ensemble member + class cross-entropy (+ the within-group ranking loss with `rank_coef`,
    + the runtime head's censored NLL with `runtime_coef`, the error-type and validation
    heads' with `error_type_coef`, `validation_coef`; see
    `wmrl.models.world_model.wm_loss`)."""
    return make_train_step(
        graphdef, tx,
        wm_loss_fn(class_coef, rank_coef, runtime_coef, error_type_coef, validation_coef),
        wm_normalisers,
        shardings, example_batch, mesh, num_micro_batches,
    )  # fmt: skip


def make_logprobs_fn(graphdef: nnx.GraphDef, shardings: TrainState, mesh, start: int = 0):
    """Jitted `(params, tokens, input_mask) -> [B, T]` log-probs (`token_logprobs`) with the
    train state's parameter shardings: recomputes `old_logp`/`ref_logp` for a batch,
    e.g. with a frozen copy of the initial params as the reference policy. With `start`,
    only the columns from `start` on (the completions after a `start`-wide prompt)."""

    def fn(params, tokens, input_mask):
        return token_logprobs(nnx.merge(graphdef, params), tokens, input_mask, start)

    data = batch_sharding(mesh, 2)
    jitted = jax.jit(fn, in_shardings=(shardings.params, data, data), out_shardings=data)

    def logprobs(params, tokens, input_mask):
        tokens, input_mask = host_to_global((tokens, input_mask), (data, data))
        with jax.set_mesh(mesh):
            return jitted(params, tokens, input_mask)

    logprobs.jitted = jitted
    return logprobs


def make_wm_score_fn(graphdef: nnx.GraphDef, shardings: TrainState, mesh, fuse: bool = True):
    """Jitted `(params, tokens, input_mask, time_limit_s=None) -> predict(...)` dict of `[B]`
    arrays (WM score, score_var, epistemic/aleatoric/predictive variances; with a runtime head
    also `runtime_s`, `p_timeout` and `score_raw`, the score then accounting for a time-out
    under the rows' `time_limit_s` [B], None = no limit) with the train state's shardings.
    With `outputs=True` the raw head outputs (`class_logits`, ...) come back too, under
    `outputs`. `fuse`: the members fused by inverse variance (else their mean)."""

    def fn(params, tokens, input_mask, time_limit_s):
        model = nnx.merge(graphdef, params)
        raw = model(tokens, input_mask)
        out = predict(raw, time_limit_s, model.cfg.timeout_reward, fuse=fuse)
        return out, raw

    data, rows = batch_sharding(mesh, 2), batch_sharding(mesh, 1)
    jitted = jax.jit(fn, in_shardings=(shardings.params, data, data, rows))

    def score(params, tokens, input_mask, time_limit_s=None, outputs=False):
        if time_limit_s is None:
            time_limit_s = np.full(np.shape(tokens)[0], np.inf, np.float32)
        time_limit_s = np.asarray(time_limit_s, np.float32)
        tokens, input_mask, time_limit_s = host_to_global(
            (tokens, input_mask, time_limit_s), (data, data, rows)
        )
        with jax.set_mesh(mesh):
            out, raw = jitted(params, tokens, input_mask, time_limit_s)
        return {**out, "outputs": raw} if outputs else out

    score.jitted = jitted
    return score
