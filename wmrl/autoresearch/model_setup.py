"""Policy and world-model construction for the AutoResearch trainer, and their train steps."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from wmrl.autoresearch import pretrained
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.grader import reward as status_reward
from wmrl.autoresearch.env.observation import ERROR_TYPES
from wmrl.config_errors import ConfigError
from wmrl.models.config import named_config
from wmrl.models.sharding import make_mesh, param_shardings
from wmrl.models.train_steps import (
    PolicyLossConfig,
    TrainState,
    abstract_model,
    init_train_state,
    make_policy_train_step,
    make_train_step,
    make_wm_train_step,
    masked_token_count,
    state_shardings,
)
from wmrl.models.transformer import Transformer, token_logprobs
from wmrl.models.world_model import WorldModel, WorldModelConfig

NUM_CLASSES = len([s for s in Status if s != Status.UNGRADED])  # outcome classes the WM predicts
TIMEOUT_REWARD = status_reward(Status.TIMEOUT)


def seq_len(config) -> int:
    return config.data.max_prompt_len + config.data.max_new_tokens


def policy_config(config, vocab_size: int):
    p = config.policy
    return named_config(
        p.size, vocab_size=vocab_size, max_len=seq_len(config), d_model=p.d_model,
        num_layers=p.num_layers, mlp_dim=p.mlp_dim, head_dim=p.head_dim,
    )  # fmt: skip


def wm_config(config, vocab_size: int) -> WorldModelConfig:
    w = config.wm
    trunk = named_config(
        "tiny", vocab_size=vocab_size, max_len=seq_len(config), d_model=w.d_model,
        num_layers=w.num_layers, mlp_dim=w.mlp_dim, head_dim=w.head_dim,
    )  # fmt: skip
    return WorldModelConfig(trunk=trunk, num_members=w.num_members, num_classes=NUM_CLASSES,
                            **_head_fields(config))  # fmt: skip


def head_coefs(config) -> dict:
    """The loss weights of the WM's optional heads (`wm.runtime_coef`, `wm.error_type_coef`,
    `wm.validation_coef`); 0 = no such head."""
    w = config.wm
    return {"runtime_coef": float(w.runtime_coef), "error_type_coef": float(w.error_type_coef),
            "validation_coef": float(w.validation_coef)}  # fmt: skip


def _head_fields(config) -> dict:
    """The WM's optional heads, from their loss weights (0 = no head: the parameter layout of
    a WM without it, so such runs and stages load unchanged)."""
    c = head_coefs(config)
    return {
        "runtime_head": c["runtime_coef"] > 0,
        "timeout_reward": TIMEOUT_REWARD,
        "num_error_types": len(ERROR_TYPES) if c["error_type_coef"] > 0 else 0,
        "validation_head": c["validation_coef"] > 0,
    }


def make_rl_mesh(config):
    """The policy's and WM's mesh: `config.mesh_shape` (default one device).

    With several processes the mesh must hold every process's devices (a process without a
    device in it could not take part in the jitted steps): the default is then all devices,
    data-parallel, and an explicit shape must cover them all.
    """
    multi = jax.process_count() > 1
    shape = tuple(config.get("mesh_shape", (-1,) if multi else (1,)))
    devices = jax.devices()
    if -1 not in shape:
        if multi and math.prod(shape) != len(devices):
            raise ConfigError(
                "config.mesh_shape",
                f"{shape} uses {math.prod(shape)} devices, but a run of {jax.process_count()} "
                f"processes needs a mesh over all {len(devices)} (use -1 for the rest)",
            )
        devices = devices[: math.prod(shape)]
    return make_mesh(shape, devices)


def adam(lr: float, steps: int = 0, warmup: int = 0) -> optax.GradientTransformation:
    """AdamW with global-norm clipping; cosine decay over `steps` when given."""
    if steps:
        sched = optax.warmup_cosine_decay_schedule(0.0, lr, max(warmup, 1), max(steps, 2), lr * 0.1)
    else:
        sched = lr
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.0))


@dataclasses.dataclass
class Model:
    """A graphdef, its train state, optimiser and mesh, and the abstract state (shapes and
    logical axes) from which every optimiser's shardings are derived."""

    graphdef: nnx.GraphDef
    state: TrainState
    tx: optax.GradientTransformation
    mesh: jax.sharding.Mesh
    abstract: nnx.State

    @property
    def shardings(self) -> TrainState:
        return state_shardings(self.abstract, self.tx, self.mesh)

    def new_state(self, params, tx) -> TrainState:
        """`TrainState(0, params, tx.init(params))` placed in the train step's shardings (a
        state with other shardings would make the jitted step compile a second time)."""
        shardings = state_shardings(self.abstract, tx, self.mesh)
        init = lambda p: TrainState(jnp.int32(0), p, tx.init(p))
        return jax.jit(init, out_shardings=shardings)(params)

    def with_optimizer(self, tx) -> Model:
        """Same params, a fresh optimiser state (a new training phase)."""
        return Model(
            self.graphdef, self.new_state(self.state.params, tx), tx, self.mesh, self.abstract
        )


def _build(factory, tx, mesh) -> Model:
    graphdef, state = init_train_state(factory, tx, mesh)
    return Model(graphdef, state, tx, mesh, abstract_model(factory)[1])


def _from_params(factory, params, tx, mesh) -> Model:
    """A `Model` around given (already placed) params: no random initialisation."""
    graphdef, abstract = abstract_model(factory)
    m = Model(graphdef, None, tx, mesh, abstract)
    m.state = m.new_state(params, tx)
    return m


def _init_heads(factory, mesh) -> dict:
    """The randomly initialised params of a world model except its trunk, in their shardings.

    The whole model's init is traced (so the heads get exactly the values a full init gives
    them) but only the heads are returned: XLA drops the unused trunk init, so a
    checkpoint-sized random trunk is never materialised."""
    _, abstract = abstract_model(factory)
    shardings = {k: v for k, v in param_shardings(abstract, mesh).items() if k != "trunk"}

    def init():
        params = nnx.to_pure_dict(nnx.state(factory()))
        return {k: v for k, v in params.items() if k != "trunk"}

    with jax.set_mesh(mesh):
        return jax.jit(init, out_shardings=shardings)()


def vocab_size(config, tokenizer) -> int:
    """Embedding rows: the tokenizer's size, or a pretrained checkpoint's (possibly padded)
    embedding."""
    if pretrained.enabled(config):
        return pretrained.model_config(config, seq_len(config)).vocab_size
    return tokenizer.vocab_size


def build_policy(config, vocab_size: int, tx, mesh, seed: int) -> Model:
    """The tiny random policy of `config.policy`, or the pretrained checkpoint (its weights
    placed onto the mesh directly, no random initialisation)."""
    if pretrained.enabled(config):
        cfg = pretrained.model_config(config, seq_len(config))
        params = pretrained.load_params(config, cfg, mesh)
        return _from_params(lambda: Transformer(cfg, rngs=nnx.Rngs(seed)), params, tx, mesh)
    cfg = policy_config(config, vocab_size)
    return _build(lambda: Transformer(cfg, rngs=nnx.Rngs(seed)), tx, mesh)


def build_wm(config, vocab_size: int, tx, mesh, seed: int, trunk_params=None) -> Model:
    """The world model of `config.wm`; with `pretrained.wm_trunk` its trunk has the
    checkpoint's architecture, with `wm.trunk_from_policy` the tiny policy's, and it starts
    from `trunk_params` (the imported or warm-started policy weights, copied; the paper's WM
    shares the agent's backbone), the heads from random."""
    from_checkpoint = pretrained.enabled(config) and config.pretrained.wm_trunk
    if from_checkpoint or config.wm.trunk_from_policy:
        if from_checkpoint:
            trunk = pretrained.model_config(config, seq_len(config))
        else:
            trunk = policy_config(config, vocab_size)
        cfg = WorldModelConfig(trunk=trunk, num_members=config.wm.num_members,
                               num_classes=NUM_CLASSES, **_head_fields(config))  # fmt: skip
        if trunk_params is None:
            raise ValueError("build_wm: a WM trunk shared with the policy needs trunk_params")
        factory = lambda: WorldModel(cfg, rngs=nnx.Rngs(seed))
        heads = _init_heads(factory, mesh)
        params = {**heads, "trunk": jax.tree.map(jnp.copy, trunk_params)}
        return _from_params(factory, params, tx, mesh)
    cfg = wm_config(config, vocab_size)
    return _build(lambda: WorldModel(cfg, rngs=nnx.Rngs(seed)), tx, mesh)


def sft_loss_fn(model: Transformer, mb: dict, normaliser, start: int = 0):
    """Token cross-entropy on the script tokens (prompt tokens carry no loss; with `start` =
    the prompt width, their logits are not computed)."""
    logp = token_logprobs(model, mb["tokens"], mb["input_mask"], start)
    nll = -jnp.sum(logp * mb["loss_mask"])
    return nll / normaliser, {"nll": (nll, jnp.sum(mb["loss_mask"]))}


def sft_step(m: Model, example: dict, prompt_width: int = 0):
    """The SFT train step; rows carry no loss in their first `prompt_width` columns."""
    loss = functools.partial(sft_loss_fn, start=prompt_width)
    return make_train_step(m.graphdef, m.tx, loss, masked_token_count, m.shardings, example, m.mesh)


def policy_loss_config(config) -> PolicyLossConfig:
    return PolicyLossConfig(
        clip_eps=config.rl.clip_eps, kl_coef=config.rl.kl_coef,
        entropy_coef=config.rl.entropy_coef,
        logits_from=config.data.max_prompt_len,  # the rows' prompt width (no loss there)
    )  # fmt: skip


def policy_step(m: Model, example: dict, config):
    loss = policy_loss_config(config)
    micro = config.rl.num_micro_batches
    return make_policy_train_step(m.graphdef, m.tx, m.shardings, example, m.mesh, loss, micro)


def wm_step(
    m: Model, example: dict, rank_coef: float = 0.0, runtime_coef: float = 0.0,
    error_type_coef: float = 0.0, validation_coef: float = 0.0,
):  # fmt: skip
    """The WM train step; with `rank_coef` (and `group` in the batch) the within-group
    pairwise ranking loss is added to the NLL, with the other weights (`head_coefs`) the
    observation heads' losses."""
    return make_wm_train_step(
        m.graphdef, m.tx, m.shardings, example, m.mesh, rank_coef=rank_coef,
        runtime_coef=runtime_coef, error_type_coef=error_type_coef,
        validation_coef=validation_coef,
    )  # fmt: skip


def head_batch_flags(coefs: dict) -> dict:
    """`wm_batch`'s target flags for the heads with a non-zero weight (`head_coefs`)."""
    return {"runtime": coefs["runtime_coef"] > 0, "error_type": coefs["error_type_coef"] > 0,
            "validation": coefs["validation_coef"] > 0}  # fmt: skip


def wm_batch(
    rows: dict, idx: np.ndarray, rng: np.random.Generator, num_members: int, runtime=False,
    error_type=False, validation=False,
) -> dict:  # fmt: skip
    """A WM training batch: tokens, mask, reward target, class, Poisson(1) bootstrap weights
    per member (zero for ungraded rows, which carry no target).

    With `runtime` (a WM with the runtime head) also the runtime head's targets (log seconds,
    known where `rows["runtime"]` is finite; a TIMEOUT's is censored), and the reward head
    is fitted on the scripts that did not time out only (no NLL weight, no ranking pair):
    `predict` mixes in a time-out's reward with the runtime head's P(timeout). With
    `error_type` the exception class (index into `ERROR_TYPES`) of the RUNTIME_ERROR rows
    (-1 elsewhere: the head is P(class | runtime error)); with `validation` the raw
    validation metric where `rows["validation"]` is finite (masked elsewhere)."""
    valid = rows["valid"][idx]
    label = np.where(valid, rows["class_label"][idx], -1).astype(np.int32)
    timed_out = label == int(Status.TIMEOUT)
    fit = valid & ~timed_out if runtime else valid
    weights = rng.poisson(1.0, (len(idx), num_members)).astype(np.float32)
    out = {
        "tokens": rows["tokens"][idx],
        "input_mask": rows["input_mask"][idx],
        "target": rows["target"][idx],
        "class_label": label,
        "member_weights": weights * fit[:, None].astype(np.float32),
    }
    if "group" in rows:  # the task of each row: the ranking loss's pairs
        out["group"] = rows["group"][idx].astype(np.int32)
        out["graded"] = fit.astype(bool)
    if runtime:
        rt = rows["runtime"][idx]
        known = np.isfinite(rt) & valid
        out["log_runtime"] = np.log(np.where(known, np.maximum(rt, MIN_RUNTIME_S), 1.0))
        out["log_runtime"] = out["log_runtime"].astype(np.float32)
        out["runtime_mask"] = known.astype(np.float32)
        out["timed_out"] = timed_out & known
    if error_type:
        err = rows["error_type"][idx]
        ok = (label == int(Status.RUNTIME_ERROR)) & (err >= 0)
        out["error_type"] = np.where(ok, err, -1).astype(np.int32)
    if validation:
        v = rows["validation"][idx]
        known = np.isfinite(v) & valid
        out["validation"] = np.where(known, v, 0.0).astype(np.float32)
        out["validation_mask"] = known.astype(np.float32)
    return out


MIN_RUNTIME_S = 0.01  # runtimes below this are this (the log target stays finite)
