"""The bandit problem: true rewards, the biased multi-head world model, real execution.

K arms. The real reward of arm a in context x is `r(a, x) + real_noise * eps`. The world model
has M heads; head m reports `r(a, x) + b(a, x) + wm_noise[a] * head_scales[m] * eps_m` together
with its (correct) variance, the way a calibrated ensemble member reports a mean and a
log-variance. In the contextual variant `r(a, x) = true_rewards[a] + s * <U_a, x>` and the WM's
bias also depends on the context, `b(a, x) = wm_bias[a] + s_b * <V_a, x>`, so a bias keyed by arm
alone leaves a context-dependent residual.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class BanditProblem:
    true_rewards: jax.Array  # [K]
    wm_bias: jax.Array  # [K]
    wm_noise: jax.Array  # [K] per-arm WM noise scale
    head_scales: jax.Array  # [M] per-head noise multipliers
    real_noise: float
    context_dim: int  # 0 for the plain K-armed bandit
    context_reward: jax.Array  # [K, d] U * context_scale
    context_bias: jax.Array  # [K, d] V * context_bias_scale

    @property
    def num_arms(self) -> int:
        return self.true_rewards.shape[0]

    @property
    def num_heads(self) -> int:
        return self.head_scales.shape[0]

    def rewards(self, x: jax.Array) -> jax.Array:
        """[..., K] true expected reward of every arm in contexts x [..., d]."""
        return self.true_rewards + x @ self.context_reward.T

    def bias(self, x: jax.Array) -> jax.Array:
        """[..., K] WM bias of every arm in contexts x."""
        return self.wm_bias + x @ self.context_bias.T


def make_problem(config) -> BanditProblem:
    """Build the (seed-independent) problem from a validated config."""
    b = config.bandit
    k = len(b.true_rewards)
    d = b.context_dim if b.contextual else 0
    ku, kv = jax.random.split(jax.random.key(config.problem_seed))
    scale = b.context_scale if b.contextual else 0.0
    bias_scale = b.context_bias_scale if b.contextual else 0.0
    return BanditProblem(
        true_rewards=jnp.asarray(b.true_rewards, jnp.float32),
        wm_bias=jnp.asarray(b.wm_bias, jnp.float32),
        wm_noise=jnp.asarray(b.wm_noise, jnp.float32),
        head_scales=jnp.asarray(b.head_scales, jnp.float32),
        real_noise=float(b.real_noise),
        context_dim=d,
        context_reward=scale * jax.random.normal(ku, (k, d)),
        context_bias=bias_scale * jax.random.normal(kv, (k, d)),
    )
