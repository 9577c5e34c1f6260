"""Anchor routing: which whole GRPO groups are also executed for real this step.

The paper draws a fraction `rho` of groups uniformly at random. Our extension
(uncertainty-aware routing) spends a share of that budget on the groups with the highest WM
predictive variance; the rest stays uniformly random among the remaining groups, so the pairs
that calibrate the WM are still an unbiased sample. Every pick records the rule that made it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

NOT_ANCHOR, UNIFORM, UNCERTAINTY = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class RoutingConfig:
    rho: float = 0.10
    min_groups: int = 1
    uncertainty_share: float = 0.0  # 0 = the paper's uniform routing

    def __post_init__(self):
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"routing.rho must be in [0, 1], got {self.rho}")
        if self.min_groups < 0:
            raise ValueError(f"routing.min_groups must be >= 0, got {self.min_groups}")
        if not 0.0 <= self.uncertainty_share <= 1.0:
            raise ValueError(
                f"routing.uncertainty_share must be in [0, 1], got {self.uncertainty_share}"
            )


def num_anchor_groups(
    num_groups: int, free_capacity: jax.Array | int, config: RoutingConfig, rho=None
):
    """`min(max(floor(rho * num_groups + 0.5), min_groups), free_capacity, num_groups)`.

    The count rounds half up (`floor(x + 0.5)`: 0.5 -> 1, 2.5 -> 3), not half to even as
    Python's `round` does (2.5 -> 2); the uncertainty share of the budget rounds the same way.

    `free_capacity` is in groups (free sandbox slots // group size); it may be traced.
    `rho`: the target fraction in force when it is not `config.rho` (the fidelity-driven
    anchor fraction, `wmrl.core.fidelity.adaptive_rho`); a Python float or traced.
    `min_groups` stays a floor whatever the fraction.
    """
    rho = config.rho if rho is None else rho
    if isinstance(rho, jax.Array):
        want = jnp.maximum(jnp.floor(rho * num_groups + 0.5), config.min_groups)
    else:
        want = max(math.floor(rho * num_groups + 0.5), config.min_groups)
    return jnp.clip(jnp.minimum(want, free_capacity), 0, num_groups).astype(jnp.int32)


def _ranks(priority: jax.Array) -> jax.Array:
    """Rank of each entry in ascending order, ties broken by index (0 = smallest).

    Pairwise comparisons for the small group counts of a step (no sort: sorting is a slow
    custom call on CPU, and this runs inside a vmap over thousands of bandit seeds).
    """
    n = priority.shape[0]
    if n > 512:
        order = jnp.argsort(priority, stable=True)
        return jnp.zeros(n, jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
    idx = jnp.arange(n)
    before = (priority[None, :] < priority[:, None]) | (
        (priority[None, :] == priority[:, None]) & (idx[None, :] < idx[:, None])
    )
    return before.sum(axis=1).astype(jnp.int32)


def route_anchors(
    rng: jax.Array,
    num_groups: int,
    config: RoutingConfig,
    free_capacity: jax.Array | int | None = None,
    group_variance: jax.Array | None = None,
    num_anchors: jax.Array | int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Pick anchor groups.

    The groups rank by one seeded draw (after the uncertainty share), and the first n are
    anchors: for one key, the anchors of a smaller count are a subset of those of a larger
    one, so a changing anchor fraction changes how many groups are anchors, never the order
    in which they are drawn.

    Args:
      rng: PRNG key (routing is seeded and reproducible).
      num_groups: number of groups this step (static).
      config: routing hyper-parameters.
      free_capacity: groups the sandbox pool can take now (None = unlimited).
      group_variance: [num_groups] WM predictive variance per group; required when
        `uncertainty_share > 0`.
      num_anchors: the count to pick instead of the config's (e.g. `num_anchor_groups` at the
        adaptive fraction in force), still capped by `free_capacity` and `num_groups`.

    Returns:
      (is_anchor [num_groups] bool, picked_by [num_groups] int32 in {NOT_ANCHOR, UNIFORM,
      UNCERTAINTY}).
    """
    cap = num_groups if free_capacity is None else free_capacity
    if num_anchors is None:
        n = num_anchor_groups(num_groups, cap, config)
    else:
        n = jnp.clip(jnp.minimum(num_anchors, cap), 0, num_groups).astype(jnp.int32)
    if config.uncertainty_share > 0:
        if group_variance is None:
            raise ValueError("routing.uncertainty_share > 0 needs the groups' WM variance")
        n_unc = jnp.floor(config.uncertainty_share * n + 0.5).astype(jnp.int32)
        # Rank by variance (descending); ties broken by index for determinism.
        by_unc = _ranks(-group_variance) < n_unc
    else:
        n_unc = jnp.zeros((), jnp.int32)
        by_unc = jnp.zeros(num_groups, bool)
    # Uniform draw among the groups uncertainty did not take: random priorities, the
    # (n - n_unc) smallest win.
    priority = jnp.where(by_unc, jnp.inf, jax.random.uniform(rng, (num_groups,)))
    by_uniform = (~by_unc) & (_ranks(priority) < n - n_unc)
    picked = jnp.where(by_unc, UNCERTAINTY, jnp.where(by_uniform, UNIFORM, NOT_ANCHOR))
    return by_unc | by_uniform, picked.astype(jnp.int32)
