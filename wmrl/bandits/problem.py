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
import warnings

import jax
import jax.numpy as jnp
import ml_collections

from wmrl.config_errors import ConfigError
from wmrl.core.correct import MODE_SPECS

# Five of the six modes of the shared table (`wmrl.core.correct`; not the `static_anchors` control,
# which needs a static check: a bandit has none), then the bandit-only ablations and controls
# (`wmrl.bandits.train.VARIANT_SPECS` says what each turns on).
VARIANTS = (
    *(m for m, spec in MODE_SPECS.items() if not spec.constant),
    "debias_monotone_only", "constant_bias", "cross_arm_iv",
)  # fmt: skip


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


def anchor_rho(b: ml_collections.ConfigDict) -> tuple[float, str]:
    """The target anchor fraction `bandit.rho` (the name RL uses too, `correction.rho`) and
    the field it came from. `bandit.anchor_fraction`, its old name, still works when set (it
    is None otherwise) and says so; `anchor_fraction` in metrics is the *realised* fraction."""
    old = b.get("anchor_fraction")
    if old is None:
        return b.rho, "bandit.rho"
    warnings.warn(
        "config.bandit.anchor_fraction is deprecated: the target anchor fraction is "
        f"config.bandit.rho now (as correction.rho in RL); using anchor_fraction={old}",
        FutureWarning,
        stacklevel=2,
    )
    return old, "bandit.anchor_fraction"


def validate_bandit_config(config: ml_collections.ConfigDict) -> None:
    """Raise ConfigError naming the field for any inconsistent or out-of-range setting."""
    b = config.bandit
    k = len(b.true_rewards)
    if k < 2:
        raise ConfigError("config.bandit.true_rewards", f"needs at least 2 arms, got {k}")
    for name in ("wm_bias", "wm_noise"):
        if len(getattr(b, name)) != k:
            raise ConfigError(
                f"config.bandit.{name}",
                f"has {len(getattr(b, name))} entries but true_rewards has {k}",
            )
    if any(v < 0 for v in b.wm_noise):
        raise ConfigError("config.bandit.wm_noise", f"noise scales must be >= 0, got {b.wm_noise}")
    if len(b.head_scales) < 1 or any(v <= 0 for v in b.head_scales):
        raise ConfigError(
            "config.bandit.head_scales", f"needs >= 1 positive multiplier, got {b.head_scales}"
        )
    if b.real_noise < 0:
        raise ConfigError("config.bandit.real_noise", f"must be >= 0, got {b.real_noise}")
    rho, field = anchor_rho(b)
    if not 0.0 <= rho <= 1.0:
        raise ConfigError(f"config.{field}", f"must be in [0, 1], got {rho}")
    if b.real_cost <= 0:
        raise ConfigError("config.bandit.real_cost", f"must be > 0, got {b.real_cost}")
    if b.group_size < 2:
        raise ConfigError("config.bandit.group_size", f"must be >= 2, got {b.group_size}")
    if b.batch_size < 1 or b.batch_size % b.group_size:
        raise ConfigError(
            "config.bandit.batch_size",
            f"must be a positive multiple of group_size={b.group_size}, got {b.batch_size}",
        )
    if b.contextual and b.context_dim < 1:
        raise ConfigError("config.bandit.context_dim", f"must be >= 1, got {b.context_dim}")
    if b.baseline not in ("mean", "rloo"):
        raise ConfigError("config.bandit.baseline", f"must be 'mean' or 'rloo', got {b.baseline}")
    if b.wm_sampling not in ("exact", "heads"):
        raise ConfigError(
            "config.bandit.wm_sampling", f"must be 'exact' or 'heads', got {b.wm_sampling!r}"
        )
    unknown = [v for v in config.variants if v not in VARIANTS]
    if unknown or not config.variants:
        raise ConfigError(
            "config.variants", f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}"
        )
    for name, ok, want in (
        ("num_seeds", config.num_seeds >= 1, ">= 1"),
        ("num_steps", config.num_steps >= 1, ">= 1"),
        ("learning_rate", config.learning_rate > 0, "> 0"),
        ("threshold", config.threshold > 0, "> 0"),
        ("log_points", config.log_points >= 1, ">= 1"),
    ):
        if not ok:
            raise ConfigError(f"config.{name}", f"must be {want}, got {config[name]}")


def make_problem(config: ml_collections.ConfigDict) -> BanditProblem:
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
