"""The tiny policy-train-step case shared by the sharding tests, the multi-process worker and its
test: one model, one global batch, and the plain single-process reference update."""

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
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 64, (B, T)).astype(np.int32)
    input_mask = np.ones((B, T), bool)
    input_mask[::3, :2] = False
    tokens[~input_mask] = 0
    loss_mask = np.zeros((B, T), np.float32)
    loss_mask[:, 6:] = 1.0
    loss_mask[1, 9:] = 0.0
    ref = np.asarray(token_logprobs(factory(), jnp.asarray(tokens), jnp.asarray(input_mask)))
    return {
        "tokens": tokens,
        "input_mask": input_mask,
        "loss_mask": loss_mask,
        "old_logp": ref + rng.normal(0, 0.1, (B, T)).astype(np.float32),
        "ref_logp": ref + rng.normal(0, 0.1, (B, T)).astype(np.float32),
        "advantages": rng.normal(size=(B,)).astype(np.float32),
    }


def single_process_reference() -> tuple[jax.Array, dict]:
    """Plain full-batch loss and SGD update: no jit, no mesh, no accumulation, one process."""
    model = factory()
    b = jax.tree.map(jnp.asarray, global_batch())

    def loss(m):
        logp = token_logprobs(m, b["tokens"], b["input_mask"])
        s, _ = token_policy_loss(
            logp,
            b["old_logp"],
            b["ref_logp"],
            b["advantages"],
            b["loss_mask"],
            clip_eps=LOSS.clip_eps,
            kl_coef=LOSS.kl_coef,
        )
        return s / b["loss_mask"].sum()

    value, grads = nnx.value_and_grad(loss)(model)
    params = nnx.to_pure_dict(nnx.state(model))
    grads = nnx.to_pure_dict(grads)
    return value, jax.tree.map(lambda p, g: p - LR * g, params, grads)
