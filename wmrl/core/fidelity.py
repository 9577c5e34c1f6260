"""How well the WM stream ranks scripts where GRPO uses it, and the anchor fraction it earns.

GRPO only sees differences inside a group, so the world model's worth is its within-group
rank agreement with real rewards, measured on the anchor groups (executed anyway). Rows whose
reward a cheap verifier fixed (the static check) are left out: they measure the verifier, not
the world model (docs/method.md 6).

* `within_group_spearman`: per group, the Spearman correlation of the WM stream's rewards with
  the real rewards over the group's learned rows (ties get their average rank); undefined
  (NaN) for a group with fewer than two learned rows or with no variation on either side.
* `collapsed_groups`: groups whose learned rows all received one WM-stream reward although
  their raw WM scores differ (the failure a flat calibration map causes).
* Fidelity-driven anchor fraction (docs/method.md 3.10, ours): an EMA of the per-group agreement
  moves the target anchor fraction between `rho_min` (the WM ranks well) and `rho_max`
  (it has collapsed: up to every group executed, i.e. standard GRPO), linearly between two
  agreement levels. Which groups are anchors stays a seeded uniform draw, so the calibration
  pairs stay unbiased; only how many changes.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import struct


def masked_ranks(x: jax.Array, valid: jax.Array) -> jax.Array:
    """Ranks of `x` [N] among its `valid` entries, ties at their average rank (0-based);
    invalid entries get 0. Pairwise O(N^2): N is a group's size."""
    v = valid.astype(jnp.float32)
    less = (x[None, :] < x[:, None]) * v[None, :]
    same = (x[None, :] == x[:, None]) * v[None, :]
    return jnp.where(valid, less.sum(1) + (same.sum(1) - 1.0) / 2.0, 0.0)


def masked_spearman(x: jax.Array, y: jax.Array, valid: jax.Array) -> jax.Array:
    """Spearman correlation of `x`, `y` [N] over the `valid` entries; NaN when undefined."""
    v = valid.astype(jnp.float32)
    n = v.sum()
    rx, ry = masked_ranks(x, valid), masked_ranks(y, valid)
    rx = (rx - (rx * v).sum() / jnp.maximum(n, 1.0)) * v
    ry = (ry - (ry * v).sum() / jnp.maximum(n, 1.0)) * v
    sxx, syy = (rx * rx).sum(), (ry * ry).sum()
    defined = (n >= 2) & (sxx > 0) & (syy > 0)
    return jnp.where(
        defined, (rx * ry).sum() / jnp.sqrt(jnp.where(defined, sxx * syy, 1.0)), jnp.nan
    )


def within_group_spearman(
    stream: jax.Array, real: jax.Array, learned: jax.Array, group_size: int
) -> jax.Array:
    """Per-group Spearman [N / group_size] of the WM stream vs real rewards on learned rows.

    stream, real, learned: [N] with contiguous groups (learned = not fixed by a verifier and
    graded). NaN where undefined.
    """
    g = lambda a: a.reshape(-1, group_size)
    return jax.vmap(masked_spearman)(g(stream), g(real), g(learned))


def group_agreement(
    stream: jax.Array, real: jax.Array, learned: jax.Array, group_size: int
) -> jax.Array:
    """What the adaptive anchor fraction measures per group: the within-group Spearman, and 0
    for a group whose real rewards differ but whose WM stream gave its learned rows one value
    (a collapsed stream carries no order: that is no agreement, not a missing measurement).
    NaN only where the real rewards say nothing (fewer than two learned rows, or all equal)."""
    corr = within_group_spearman(stream, real, learned, group_size)
    s, r, m = (a.reshape(-1, group_size) for a in (stream, real, learned))
    flat = (_spread(s, m) == 0) & (_spread(r, m) > 0) & (m.sum(1) >= 2)
    return jnp.where(flat, 0.0, corr)


def _spread(a: jax.Array, m: jax.Array) -> jax.Array:
    """max - min of each row of `a` over the entries where `m` (-inf when none)."""
    return jnp.max(jnp.where(m, a, -jnp.inf), 1) - jnp.min(jnp.where(m, a, jnp.inf), 1)


def collapsed_groups(
    stream: jax.Array, raw: jax.Array, learned: jax.Array, group_size: int
) -> jax.Array:
    """Number of groups whose >= 2 learned rows share one WM-stream reward while their raw WM
    scores differ."""
    s, r, m = (a.reshape(-1, group_size) for a in (stream, raw, learned))
    flat = (_spread(s, m) == 0) & (_spread(r, m) > 0) & (m.sum(1) >= 2)
    return jnp.sum(flat).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class AdaptiveRhoConfig:
    """The anchor fraction as a function of the WM stream's measured within-group agreement.

    rho = rho_max at an agreement <= corr_low, rho_min at >= corr_high, linear between; the
    agreement is an EMA over anchor groups (half-life in groups) with start-up correction, and
    `rho` (the configured target) holds until `warmup_groups` defined groups were measured.
    """

    rho: float = 0.25
    rho_min: float = 0.125
    rho_max: float = 1.0
    corr_low: float = 0.0
    corr_high: float = 0.5
    half_life: float = 16.0
    warmup_groups: int = 8

    def __post_init__(self):
        def bad(field, msg):
            raise ValueError(f"correction.{field} {msg}")

        for name in ("rho", "rho_min", "rho_max"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:  # also refuses NaN
                bad(name, f"must be in [0, 1], got {value}")
        if self.rho_min > self.rho_max:
            bad("rho_min", f"({self.rho_min}) must be <= correction.rho_max ({self.rho_max})")
        if not self.corr_low < self.corr_high:
            bad(
                "corr_low", f"must be < correction.corr_high, got {self.corr_low}, {self.corr_high}"
            )
        if not self.half_life > 0:
            bad("half_life", f"must be > 0, got {self.half_life}")
        if self.warmup_groups < 0:
            bad("warmup_groups", f"must be >= 0, got {self.warmup_groups}")


@struct.dataclass
class AdaptiveRhoState:
    ema: jax.Array  # un-normalised EMA of the per-group agreement
    norm: jax.Array  # EMA of 1 (start-up correction)
    groups: jax.Array  # defined groups measured so far (int32)


def init_adaptive_rho() -> AdaptiveRhoState:
    return AdaptiveRhoState(
        ema=jnp.zeros((), jnp.float32),
        norm=jnp.zeros((), jnp.float32),
        groups=jnp.zeros((), jnp.int32),
    )


def update_adaptive_rho(
    state: AdaptiveRhoState, group_corr: jax.Array, config: AdaptiveRhoConfig
) -> AdaptiveRhoState:
    """Fold this step's per-group agreements [A] (NaN = undefined, skipped) into the EMA, in
    order."""
    ok = ~jnp.isnan(group_corr)
    ema, norm = _fold_ema(state.ema, state.norm, group_corr, ok, config.half_life)
    return AdaptiveRhoState(ema=ema, norm=norm, groups=state.groups + ok.sum().astype(jnp.int32))


def _fold_ema(ema, norm, values, ok, half_life: float):
    """Fold `values` [N] where `ok`, in order, into an un-normalised EMA and its start-up norm
    (the EMA of 1): value i is discounted by decay^(later folded values), as one at a time."""
    decay = math.pow(0.5, 1.0 / half_life)
    later = (jnp.cumsum(ok[::-1])[::-1] - ok).astype(jnp.float32)
    w = jnp.where(ok, (1 - decay) * decay**later, 0.0)
    keep = decay ** ok.sum().astype(jnp.float32)
    return keep * ema + jnp.sum(w * jnp.where(ok, values, 0.0)), keep * norm + jnp.sum(w)


def agreement(state: AdaptiveRhoState) -> jax.Array:
    """The EMA of the within-group agreement (NaN before any defined group)."""
    return jnp.where(state.norm > 0, state.ema / jnp.maximum(state.norm, 1e-12), jnp.nan)


def adaptive_rho(state: AdaptiveRhoState, config: AdaptiveRhoConfig) -> jax.Array:
    """The target anchor fraction in force."""
    t = jnp.clip((agreement(state) - config.corr_low) / (config.corr_high - config.corr_low), 0, 1)
    rho = config.rho_max - t * (config.rho_max - config.rho_min)
    ready = (state.groups >= config.warmup_groups) & (state.groups > 0)  # NaN before any
    return jnp.where(ready, rho, config.rho).astype(jnp.float32)


# ----------------------------------------------------------------------------- the control


@struct.dataclass
class AnchorMeanState:
    """The `static_anchors` control's one shared reward (docs/method.md 3.9): a world model that
    knows only the average. An EMA (start-up corrected) of the real rewards of recent anchor
    scripts that the static check did not flag; `prior` (the executed corpus's mean reward)
    until the first one arrives."""

    ema: jax.Array
    norm: jax.Array
    prior: jax.Array


def init_anchor_mean(prior: float) -> AnchorMeanState:
    zero = jnp.zeros((), jnp.float32)
    return AnchorMeanState(ema=zero, norm=zero, prior=jnp.asarray(prior, jnp.float32))


def update_anchor_mean(
    state: AnchorMeanState, r_env: jax.Array, valid: jax.Array, half_life: float = 64.0
) -> AnchorMeanState:
    """Fold anchor rewards [N] (valid = graded and not statically fixed), in order."""
    ema, norm = _fold_ema(state.ema, state.norm, r_env, jnp.asarray(valid, bool), half_life)
    return state.replace(ema=ema, norm=norm)


def anchor_mean(state: AnchorMeanState) -> jax.Array:
    return jnp.where(state.norm > 0, state.ema / jnp.maximum(state.norm, 1e-12), state.prior)
