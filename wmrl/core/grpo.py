"""GRPO maths: group-normalised advantages and the PPO-clip / KL token loss.

All functions are pure and jittable. Shapes use N = number of trajectories (a multiple of the
static group size G), B x T = trajectories x tokens.

Why the details matter:
* The group size is a static shape. A batch that does not divide by it is a bug upstream, so we
  raise instead of silently reshaping (a known failure mode of GRPO trainers).
* Ungraded trajectories (the sandbox broke, not the agent) carry no information about the
  policy. They are masked out of the group statistics and get advantage 0; scoring them 0 would
  punish the agent for infrastructure failures.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

Baseline = Literal["mean", "rloo"]
KLEstimator = Literal["k1", "k2", "k3"]
Metrics = dict[str, tuple[jax.Array, jax.Array]]


def _check_group_size(n: int, group_size: int) -> None:
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if n % group_size != 0:
        raise ValueError(
            f"batch of {n} trajectories does not divide into groups of group_size={group_size}; "
            "group size is a static shape and is never reshaped silently"
        )


def group_advantages(
    rewards: jax.Array,
    group_size: int,
    *,
    valid: jax.Array | None = None,
    normalize_std: bool = True,
    baseline: Baseline = "mean",
    eps: float = 1e-6,
) -> jax.Array:
    """Group-relative advantages.

    Args:
      rewards: [N] rewards, N = num_groups * group_size, groups contiguous.
      group_size: G, static.
      valid: optional [N] bool; False marks ungraded trajectories, which are excluded from the
        group statistics and receive advantage 0.
      normalize_std: divide by the group's std (GRPO); False gives Dr.GRPO's centred rewards.
      baseline: "mean" (group mean including the sample) or "rloo" (leave-one-out mean of the
        other valid members).
      eps: added to the std.

    Returns:
      [N] advantages; exactly 0 for invalid samples, for groups with fewer than 2 valid samples
      (verl would give them r / (1 + eps); we give no signal where there is no comparison) and
      for groups whose valid rewards are all equal.

    The std is the population std of the group's valid rewards (divide by the count, as the
    paper's reference does), not the sample std that verl and Tunix use (divide by count - 1):
    for a group of n valid rewards, ours = theirs * sqrt((n - 1) / n) before eps.
    """
    n = rewards.shape[0]
    _check_group_size(n, group_size)
    if baseline not in ("mean", "rloo"):
        raise ValueError(f"baseline must be 'mean' or 'rloo', got {baseline!r}")
    r = rewards.reshape(-1, group_size).astype(jnp.float32)
    m = (
        jnp.ones_like(r, dtype=bool)
        if valid is None
        else jnp.asarray(valid, bool).reshape(-1, group_size)
    )
    mf = m.astype(jnp.float32)
    count = mf.sum(axis=1, keepdims=True)
    # The float32 mean of G equal values can land one ulp off the value; divided by (a std of
    # one ulp) + eps that would give an all-equal group advantages of order 0.1, all of one
    # sign. Such a group is detected exactly (max == min over its valid rows) and gets 0.
    lo = jnp.min(jnp.where(m, r, jnp.inf), axis=1, keepdims=True)
    hi = jnp.max(jnp.where(m, r, -jnp.inf), axis=1, keepdims=True)
    total = (r * mf).sum(axis=1, keepdims=True)
    mean = total / jnp.maximum(count, 1.0)
    if baseline == "mean":
        centred = r - mean
    else:
        centred = r - (total - r) / jnp.maximum(count - 1.0, 1.0)
    if normalize_std:
        var = (jnp.square(r - mean) * mf).sum(axis=1, keepdims=True) / jnp.maximum(count, 1.0)
        denom = jnp.sqrt(var) + eps
        centred = centred / jnp.where(denom > 0, denom, 1.0)
    # A group whose valid rewards are all equal carries no signal: exactly 0, whatever the baseline.
    informative = (count >= 2) & (hi > lo)
    adv = jnp.where(m & informative, centred, 0.0)
    return adv.reshape(n)


def apply_anchor_weight(
    advantages: jax.Array, group_size: int, anchor_groups: jax.Array, weight: jax.Array | float
) -> jax.Array:
    """Multiply the (post-normalisation) advantages of anchor groups by the anchor weight.

    Args:
      advantages: [N].
      group_size: G.
      anchor_groups: [N // G] bool, True for groups scored by real execution.
      weight: scalar anchor weight from stream-level denoising.
    """
    n = advantages.shape[0]
    _check_group_size(n, group_size)
    scale = jnp.where(jnp.asarray(anchor_groups, bool), weight, 1.0)
    return (advantages.reshape(-1, group_size) * scale[:, None]).reshape(n)


def kl_penalty(
    logp: jax.Array,
    ref_logp: jax.Array,
    estimator: KLEstimator = "k3",
    clamp: float | None = None,
) -> jax.Array:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi.

    k1 = log pi - log pi_ref (unbiased, high variance, can be negative);
    k2 = 0.5 (log pi - log pi_ref)^2;
    k3 = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1 (unbiased, always >= 0).
    `clamp` bounds the estimate to [-clamp, clamp] so one rare token cannot dominate the loss.
    """
    log_ratio = ref_logp - logp
    if estimator == "k1":
        kl = -log_ratio
    elif estimator == "k2":
        kl = 0.5 * jnp.square(log_ratio)
    elif estimator == "k3":
        kl = jnp.expm1(log_ratio) - log_ratio
    else:
        raise ValueError(f"kl estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")
    if clamp is not None:
        kl = jnp.clip(kl, -clamp, clamp)
    return kl


def token_policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    ref_logp: jax.Array | None,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    kl_clamp: float | None = None,
    entropy: jax.Array | None = None,
    entropy_coef: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """PPO clipped-ratio token loss with a KL penalty and an optional entropy bonus.

    Args:
      logp: [B, T] log-probs of the taken tokens under the current policy.
      old_logp: [B, T] under the sampling policy (no gradient flows through it).
      ref_logp: [B, T] under the frozen reference policy, or None when kl_coef == 0.
      advantages: [B] (broadcast over tokens) or [B, T].
      mask: [B, T], 1 on completion tokens that count.
      entropy: optional [B, T] per-token policy entropy.

    Returns:
      (loss_sum, metrics): the sum of the per-token loss over masked tokens, and metrics as
      {name: (sum, count)}. The caller divides by the *global* masked-token count, which keeps
      gradient accumulation over micro-batches exact.
    """
    mask = mask.astype(jnp.float32)
    adv = advantages[:, None] if advantages.ndim == 1 else advantages
    adv = jax.lax.stop_gradient(adv.astype(jnp.float32))
    log_ratio = logp - jax.lax.stop_gradient(old_logp)
    ratio = jnp.exp(log_ratio)
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    pg = -jnp.minimum(unclipped, clipped)
    per_token = pg
    count = mask.sum()
    metrics: Metrics = {
        "pg_loss": ((pg * mask).sum(), count),
        "clip_frac": (((clipped < unclipped).astype(jnp.float32) * mask).sum(), count),
        "ratio": ((ratio * mask).sum(), count),
    }
    if ref_logp is not None and kl_coef != 0.0:
        kl = kl_penalty(logp, jax.lax.stop_gradient(ref_logp), kl_estimator, kl_clamp)
        per_token = per_token + kl_coef * kl
        metrics["kl"] = ((kl * mask).sum(), count)
    if entropy is not None:
        per_token = per_token - entropy_coef * entropy
        metrics["entropy"] = ((entropy * mask).sum(), count)
    loss_sum = (per_token * mask).sum()
    metrics["loss"] = (loss_sum, count)
    return loss_sum, metrics


def reduce_metrics(metrics: Metrics) -> dict[str, jax.Array]:
    """Turn (sum, count) pairs into means (0 where the count is 0)."""
    return {k: s / jnp.maximum(c, 1) for k, (s, c) in metrics.items()}


def add_metrics(a: Metrics, b: Metrics) -> Metrics:
    """Accumulate (sum, count) metrics across micro-batches exactly."""
    return {k: (a[k][0] + b[k][0], a[k][1] + b[k][1]) for k in a}
