"""Inverse-Variance Denoising at two levels (docs/method.md 3.5).

* Stream level (the paper's): on anchor groups, measure how much the calibrated WM scores
  disagree with the real scores *within* the group, track that disagreement with an EMA, and
  turn it into an anchor weight `w = clip(1 + c * s2, 1, w_max)` that up-weights the advantages
  of anchor groups (which use real rewards). `c` is frozen after a warm-up so that the weight
  equals `target` at the warm-up disagreement; afterwards `w` tracks how much worse the WM is
  than the real stream.
* Sample level (ours): fuse the M ensemble members' predictions for the *same* trajectory by
  inverse variance.

Inverse-variance weighting across *different* trajectories changes the objective (to
`sum_a pi(a) w(a) r(a)`) and is offered only as an explicit option (`cross_sample_weights`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import struct


def fuse_ensemble(
    means: jax.Array, log_vars: jax.Array, axis: int = 0
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Inverse-variance fusion of M estimates of the same quantity.

    Args:
      means: [..., M, ...] member means (members along `axis`).
      log_vars: same shape, member log-variances.
      axis: the member axis.

    Returns:
      (mu, var, epistemic_var): fused mean `sum(mu_m / v_m) / sum(1 / v_m)`, fused variance
      `1 / sum(1 / v_m)`, and the epistemic spread `Var_m(mu_m)` (population variance of the
      member means), each with `axis` removed. Weights depend only on variance ratios, so
      rescaling every variance by the same factor leaves `mu` unchanged.
    """
    # Subtracting the max log-precision before exponentiating keeps this stable for any scale.
    log_prec = -log_vars
    shift = jax.lax.stop_gradient(jnp.max(log_prec, axis=axis, keepdims=True))
    prec_scaled = jnp.exp(log_prec - shift)
    total = prec_scaled.sum(axis=axis, keepdims=True)
    mu = (prec_scaled * means).sum(axis=axis) / jnp.squeeze(total, axis)
    var = jnp.squeeze(jnp.exp(-shift) / total, axis)
    epistemic = jnp.var(means, axis=axis)
    return mu, var, epistemic


def combine_members(
    means: jax.Array, log_vars: jax.Array, fuse: bool, axis: int = 0
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """M member estimates of the same quantity as one: `fuse_ensemble` (inverse variance) or,
    with `fuse` False, the plain mean `mean_m(mu_m)` with its variance `sum_m(v_m) / M^2`
    (independent members). Returns (mu, var, epistemic `Var_m(mu_m)`), `axis` removed."""
    if fuse:
        return fuse_ensemble(means, log_vars, axis=axis)
    m = means.shape[axis]
    var = jnp.exp(log_vars).sum(axis=axis) / m**2
    return means.mean(axis=axis), var, jnp.var(means, axis=axis)


def cross_sample_weights(variances: jax.Array, group_size: int, eps: float = 1e-8) -> jax.Array:
    """OPTIONAL per-sample weights `(1/v_i) / mean_group(1/v)` across different trajectories.

    Caveat (docs/method.md 2): weighting *different* trajectories by their own inverse variance
    changes the optimised objective to `sum_a pi(a) w(a) r(a)`; on a bandit whose best arm is the
    noisiest it converges to a worse, low-noise arm. Never the default; use it only for
    ablations (the bandit variant `cross_arm_iv` demonstrates the failure).

    Args:
      variances: [N] predictive variances, groups contiguous.
      group_size: G.

    Returns:
      [N] weights with mean 1 in every group.
    """
    prec = 1.0 / (variances.reshape(-1, group_size) + eps)
    return (prec / prec.mean(axis=1, keepdims=True)).reshape(-1)


# ----------------------------------------------------------------------------- stream level


@dataclasses.dataclass(frozen=True)
class DenoiseConfig:
    """Stream-level denoising hyper-parameters (the method's defaults, docs/method.md 3)."""

    half_life: float = 64.0  # in anchor groups
    warmup_groups: int = 32
    target: float = 2.0
    w_max: float = 4.0
    degenerate_tol: float = 1e-8  # real scores with variance below this are 'all equal'
    # `c` is frozen only once the smoothed disagreement exceeds this floor. A stream that agrees
    # exactly (s2 = 0) has no `c` with 1 + c * s2 = target, and one at float32 rounding level
    # (s2 ~ 1e-14) would freeze c ~ 1e14 and jump to w_max at the first real disagreement. Below
    # the floor the WM stream is as good as the real one and the weight stays 1; the warm-up
    # simply continues until the disagreement is measurable. 1e-6 is a within-group RMS
    # deviation of 0.1% of the real scores' spread, far above float32 rounding (~1e-7 relative).
    freeze_floor: float = 1e-6

    def __post_init__(self):
        if self.half_life <= 0:
            raise ValueError(f"denoise.half_life must be > 0, got {self.half_life}")
        if self.warmup_groups < 1:
            raise ValueError(f"denoise.warmup_groups must be >= 1, got {self.warmup_groups}")
        if self.target < 1.0:
            raise ValueError(f"denoise.target must be >= 1, got {self.target}")
        if self.w_max < 1.0:
            raise ValueError(f"denoise.w_max must be >= 1, got {self.w_max}")
        if not self.freeze_floor > 0.0:
            raise ValueError(f"denoise.freeze_floor must be > 0, got {self.freeze_floor}")

    @property
    def decay(self) -> float:
        return math.pow(0.5, 1.0 / self.half_life)


@struct.dataclass
class DenoiseState:
    """Explicit, checkpointable stream-level state (all scalars)."""

    ema: jax.Array  # un-normalised EMA of s2
    ema_norm: jax.Array  # EMA of 1 (start-up correction)
    num_groups: jax.Array  # non-degenerate anchor groups seen
    scale: jax.Array  # c, valid once frozen
    frozen: jax.Array  # bool


def init_denoise_state() -> DenoiseState:
    return DenoiseState(
        ema=jnp.zeros((), jnp.float32),
        ema_norm=jnp.zeros((), jnp.float32),
        num_groups=jnp.zeros((), jnp.int32),
        scale=jnp.zeros((), jnp.float32),
        frozen=jnp.zeros((), bool),
    )


def group_disagreement(
    wm_scores: jax.Array, real_scores: jax.Array, tol: float = 1e-8
) -> tuple[jax.Array, jax.Array]:
    """Within-group disagreement `mean(((d - mean d) - (s - mean s))^2) / Var(s)`.

    Args:
      wm_scores: [A, G] calibrated WM scores d of A anchor groups.
      real_scores: [A, G] real scores s of the same trajectories.

    Returns:
      (s2 [A], valid [A]); groups whose real scores are all equal are not valid (s2 set to 0).
    """
    d = wm_scores - wm_scores.mean(axis=-1, keepdims=True)
    s = real_scores - real_scores.mean(axis=-1, keepdims=True)
    var_s = jnp.mean(jnp.square(s), axis=-1)
    valid = var_s > tol
    s2 = jnp.mean(jnp.square(d - s), axis=-1) / jnp.where(valid, var_s, 1.0)
    return jnp.where(valid, s2, 0.0), valid


def smoothed_disagreement(state: DenoiseState) -> jax.Array:
    """Start-up-corrected EMA of s2 (0 before any group)."""
    return jnp.where(state.ema_norm > 0, state.ema / jnp.maximum(state.ema_norm, 1e-12), 0.0)


def update_denoise(
    state: DenoiseState,
    wm_scores: jax.Array,
    real_scores: jax.Array,
    config: DenoiseConfig,
    group_mask: jax.Array | None = None,
) -> DenoiseState:
    """Fold A anchor groups into the disagreement EMA, freezing `c` after the warm-up.

    The EMA is start-up corrected: it is divided by the EMA of 1 over the same groups
    (`ema_norm`), so its first value is the first group's s2 rather than (1 - decay) * s2 pulled
    towards an arbitrary initial 0. The paper's reference seeds its EMA with the first group
    instead; both give an unbiased estimate from the first group on, and ours keeps the
    batched update a closed form. `c` is frozen at the first valid group that has completed
    the warm-up *and* whose smoothed s2 is above `config.freeze_floor`; see `DenoiseConfig`.

    Args:
      wm_scores, real_scores: [A, G].
      group_mask: optional [A] bool; False for padding rows (e.g. fewer anchors than capacity).
    """
    s2, valid = group_disagreement(wm_scores, real_scores, config.degenerate_tol)
    if group_mask is not None:
        valid = valid & jnp.asarray(group_mask, bool)
    decay = config.decay
    # Vectorised equivalent of feeding the groups one at a time: with c_j = number of valid
    # groups up to j, the EMA after group j is decay^c_j * ema0 + sum_{i<=j} P[j, i] x_i.
    c = jnp.cumsum(valid.astype(jnp.int32))
    vf = valid.astype(jnp.float32)
    lower = jnp.tril(jnp.ones((c.shape[0], c.shape[0]), bool))
    expo = (c[:, None] - c[None, :]).astype(jnp.float32)
    P = jnp.where(lower, (1 - decay) * vf[None, :] * decay**expo, 0.0)
    keep = decay ** c.astype(jnp.float32)
    ema_j = keep * state.ema + P @ s2
    norm_j = keep * state.ema_norm + P.sum(axis=1)
    n_j = state.num_groups + c
    # Freeze c at the first valid group that completes the warm-up with a disagreement above
    # the floor (the start-up-corrected EMA at that group); until then the weight stays 1.
    s2_hat_j = ema_j / jnp.maximum(norm_j, 1e-12)
    crossing = (
        valid & (n_j >= config.warmup_groups) & (s2_hat_j > config.freeze_floor) & (~state.frozen)
    )
    any_crossing = crossing.any()
    s2_hat = s2_hat_j[jnp.argmax(crossing)]
    scale = (config.target - 1.0) / jnp.maximum(s2_hat, config.freeze_floor)
    return DenoiseState(
        ema=ema_j[-1],
        ema_norm=norm_j[-1],
        num_groups=n_j[-1],
        scale=jnp.where(any_crossing, scale, state.scale),
        frozen=state.frozen | any_crossing,
    )


def anchor_weight(state: DenoiseState, config: DenoiseConfig) -> jax.Array:
    """`clip(1 + c * s2, 1, w_max)` once frozen; exactly 1 before the warm-up ends."""
    w = jnp.clip(1.0 + state.scale * smoothed_disagreement(state), 1.0, config.w_max)
    return jnp.where(state.frozen, w, 1.0)
