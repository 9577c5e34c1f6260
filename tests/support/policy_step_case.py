"""The tiny policy-train-step case shared by the sharding tests, the multi-process worker and its
test: one model, one global batch, and the plain single-process reference update."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wmrl.core.grpo import token_policy_loss
from wmrl.models.config import named_config
from wmrl.models.train_steps import PolicyLossConfig
from wmrl.models.transformer import Transformer, token_logprobs

CFG = named_config("tiny", vocab_size=64, max_len=32)
B, T, LR = 16, 12, 0.1
LOSS = PolicyLossConfig(clip_eps=0.2, kl_coef=0.05)


def factory() -> Transformer:
    return Transformer(CFG, rngs=nnx.Rngs(0))


def global_batch() -> dict[str, np.ndarray]:
    """The whole global batch, identical on every process (each feeds only its rows)."""
    return {k: v.copy() for k, v in _global_batch().items()}


@functools.cache
def _global_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 64, (B, T)).astype(np.int32)
    input_mask = np.ones((B, T), bool)
    input_mask[::3, :2] = False
    tokens[~input_mask] = 0
    loss_mask = np.zeros((B, T), np.float32)
    loss_mask[:, 6:] = 1.0
    loss_mask[1, 9:] = 0.0
    ref = nnx.jit(token_logprobs)(factory(), jnp.asarray(tokens), jnp.asarray(input_mask))
    ref = np.asarray(ref)
    return {
        "tokens": tokens,
        "input_mask": input_mask,
        "loss_mask": loss_mask,
        "old_logp": ref + rng.normal(0, 0.1, (B, T)).astype(np.float32),
        "ref_logp": ref + rng.normal(0, 0.1, (B, T)).astype(np.float32),
        "advantages": rng.normal(size=(B,)).astype(np.float32),
    }


def _loss(model, b):
    """The full-batch policy loss, token mean."""
    logp = token_logprobs(model, b["tokens"], b["input_mask"])
    s, _ = token_policy_loss(
        logp, b["old_logp"], b["ref_logp"], b["advantages"], b["loss_mask"],
        clip_eps=LOSS.clip_eps, kl_coef=LOSS.kl_coef,
    )  # fmt: skip
    return s / b["loss_mask"].sum()


@nnx.jit
def _value_and_grad(model, b):
    return nnx.value_and_grad(_loss)(model, b)


def _sgd(model, grads) -> None:
    nnx.update(model, jax.tree.map(lambda p, g: p - LR * g, nnx.state(model), grads))


def single_process_reference() -> tuple[jax.Array, dict]:
    """Plain full-batch loss and SGD update: no mesh, no sharding, no accumulation, one
    process (jitted whole: same maths as eager, ~20x faster here)."""
    model = factory()
    value, grads = _value_and_grad(model, jax.tree.map(jnp.asarray, global_batch()))
    _sgd(model, grads)
    return value, nnx.to_pure_dict(nnx.state(model))


# ----------------------------------------------------------------------------- WMRL steps
# A few WMRL steps on the same batch: each step's advantages come from the trainer's
# `correct_rewards` (monotone map fitted on the anchor pairs as they arrive, anchor weight,
# GRPO) on a deterministic stream of WM scores and real rewards, then one policy update. The
# correction state evolves across steps and is computed identically on every process.
WMRL_STEPS = 3
WMRL_G = 4


def wmrl_configs():
    from wmrl.core.debias import DebiasConfig
    from wmrl.core.denoise import DenoiseConfig

    return (
        DebiasConfig(mode="monotone", num_bins=4, min_pairs=4, refit_every=2),
        DenoiseConfig(half_life=4.0, warmup_groups=1),
    )


def wmrl_inputs(step: int) -> dict[str, np.ndarray]:
    """Step `step`'s rewards: the WM distorts the scale of the real reward, plus noise."""
    rng = np.random.default_rng(100 + step)
    r_env = rng.uniform(0, 1, B).astype(np.float32)
    r_wm = np.clip(0.2 + 0.6 * r_env**2 + rng.normal(0, 0.05, B), 0, 1).astype(np.float32)
    groups = B // WMRL_G
    anchor_groups = np.arange(groups) == step % groups
    anchor_rows = np.repeat(anchor_groups, WMRL_G)
    return {
        "r_wm": r_wm, "r_env": r_env, "env_valid": anchor_rows, "anchor_rows": anchor_rows,
        "anchor_groups": anchor_groups, "anchor_index": np.array([step % groups]),
    }  # fmt: skip


def wmrl_advantages(correction, step: int):
    """(new correction state, [B] advantages) of one WMRL step."""
    from wmrl.autoresearch.config import MODE_SPECS
    from wmrl.core.correct import StepInputs, correct_rewards

    debias_cfg, denoise_cfg = wmrl_configs()
    x = {k: jnp.asarray(v) for k, v in wmrl_inputs(step).items()}
    res = correct_rewards(
        correction,
        StepInputs(r_wm=x["r_wm"], r_env=x["r_env"], env_valid=x["env_valid"],
                   anchor_groups=x["anchor_groups"], anchor_index=x["anchor_index"]),
        group_size=WMRL_G, spec=MODE_SPECS["wmrl"], debias_cfg=debias_cfg,
        denoise_cfg=denoise_cfg, normalize_std=True, baseline="mean",
    )  # fmt: skip
    return res.correction, np.asarray(res.advantages)


def wmrl_reference() -> dict:
    """WMRL_STEPS plain (single-process, unsharded) correction + SGD steps; final params."""
    from wmrl.core.state import init_correction_state

    model = factory()
    correction = init_correction_state(wmrl_configs()[0])
    batch = global_batch()
    for step in range(WMRL_STEPS):
        correction, adv = wmrl_advantages(correction, step)
        b = {k: jnp.asarray(v) for k, v in {**batch, "advantages": adv}.items()}
        _, grads = _value_and_grad(model, b)
        _sgd(model, grads)
    return nnx.to_pure_dict(nnx.state(model))
