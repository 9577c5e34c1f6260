"""The bandit suite's config: its typed schema (every field's one default) and validation.

`BanditConfig` is a tree of frozen sections (`wmrl.experiment.config`): the suite's run
(seeds, steps, variants), the problem (`bandit`), and the correction's settings (`debias`,
`denoise`), whose defaults are the core's own (`DebiasConfig`, `DenoiseConfig`; the anchor
fraction's is `RoutingConfig`'s). configs/bandit.py sets the values the suite needs on top.
`validate_bandit_config` reads a ConfigDict (unchanged) into the schema; every error names
the field. The runs themselves stay one jitted scan (`wmrl.bandits.train`).
"""

from __future__ import annotations

import warnings

from wmrl.config_errors import ConfigError
from wmrl.core.correct import MODE_SPECS
from wmrl.core.debias import DebiasConfig
from wmrl.core.denoise import DenoiseConfig
from wmrl.core.routing import RoutingConfig
from wmrl.experiment import config as xconfig
from wmrl.experiment.config import Section, section, setting, subsection

# Five of the seven modes of the shared table (`wmrl.core.correct`; not the controls
# `static_anchors` and `permuted_wm`, which stand beside a static check: a bandit has none),
# then the bandit-only ablations and controls (`wmrl.bandits.train.VARIANT_SPECS` says what
# each turns on).
VARIANTS = (
    *(m for m, spec in MODE_SPECS.items() if not spec.control),
    "debias_monotone_only", "constant_bias", "cross_arm_iv",
)  # fmt: skip


@section
class BanditProblemConfig(Section):
    """The problem (`config.bandit`, `wmrl.bandits.problem`): a 5-armed bandit whose WM bias
    flips the argmax (arm 1 looks better than arm 0 to the WM) and whose best arm is also the
    WM's noisiest, and the GRPO batch that learns it."""

    true_rewards: tuple[float, ...] = (1.0, 0.9, 0.7, 0.5, 0.2)
    wm_bias: tuple[float, ...] = (0.0, 0.25, 0.0, 0.05, -0.1)
    wm_noise: tuple[float, ...] = setting((0.8, 0.2, 0.3, 0.3, 0.3), low=0.0)
    head_scales: tuple[float, ...] = setting((0.5, 1.0, 2.0, 4.0), above=0.0)
    real_noise: float = setting(0.3, low=0.0)
    rho: float = setting(RoutingConfig.rho, low=0.0, high=1.0)  # target anchor fraction
    # The deprecated name of rho: when set, it is used (and said, `anchor_rho`).
    anchor_fraction: float | None = setting(None, low=0.0, high=1.0)
    real_cost: float = setting(10.0, above=0.0)
    batch_size: int = setting(64, low=1)
    group_size: int = setting(8, low=2)
    baseline: str = setting("mean", choices=("mean", "rloo"))
    normalize_std: bool = True
    # How WM scores are drawn: "exact" samples the fused (or averaged) score from its exact
    # Gaussian law, one draw per pull; "heads" draws all M heads and combines them. Equal in
    # law; "exact" is ~2x faster on CPU.
    wm_sampling: str = setting("exact", choices=("exact", "heads"))
    constant_bias: float = 0.3  # the global offset of the `constant_bias` control
    contextual: bool = False
    context_dim: int = setting(4, low=0)
    context_scale: float = 0.1  # how much the context moves the true rewards
    context_bias_scale: float = 0.03  # how much it moves the WM bias (arm keys miss it)

    def check(self) -> None:
        k = len(self.true_rewards)
        if k < 2:
            raise ConfigError("true_rewards", f"needs at least 2 arms, got {k}")
        for name in ("wm_bias", "wm_noise"):
            n = len(getattr(self, name))
            if n != k:
                raise ConfigError(name, f"has {n} entries but true_rewards has {k}")
        if not self.head_scales:
            raise ConfigError("head_scales", "needs >= 1 positive multiplier, got ()")
        if self.batch_size % self.group_size:
            raise ConfigError(
                "batch_size",
                f"must be a positive multiple of group_size={self.group_size}, got "
                f"{self.batch_size}",
            )
        if self.contextual and self.context_dim < 1:
            raise ConfigError("context_dim", f"must be >= 1, got {self.context_dim}")


@section
class BanditDebiasConfig(Section):
    """Online Debiasing (`config.debias`; `DebiasConfig`): bandits key offsets by arm, the
    monotone map is the ablation."""

    offset_rule: str = setting(DebiasConfig.offset_rule, choices=("window", "ema"))
    window: int = setting(DebiasConfig.window, low=1)
    half_life: float = setting(DebiasConfig.half_life, above=0.0)
    min_count: int = setting(DebiasConfig.min_count, low=0)
    capacity: int = setting(DebiasConfig.capacity, low=1)
    num_bins: int = setting(DebiasConfig.num_bins, low=1)
    # Equal-width bins or equal-mass (quantiles of the window's scores)
    bin_spacing: str = setting(DebiasConfig.bin_spacing, choices=("equal_width", "equal_mass"))
    min_slope: float = setting(DebiasConfig.min_slope, low=0.0, below=1.0)  # the map's blend
    min_pairs: int = setting(DebiasConfig.min_pairs, low=0)
    refit_every: int = setting(DebiasConfig.refit_every, low=1)
    reward_range: tuple[float, ...] = DebiasConfig.reward_range

    def check(self) -> None:
        r = self.reward_range
        if len(r) != 2 or not r[1] > r[0]:
            raise ConfigError("reward_range", f"must be (low, high) with low < high, got {r}")


@section
class BanditDenoiseConfig(Section):
    """Inverse-Variance Denoising at stream level (`config.denoise`; `DenoiseConfig`)."""

    half_life: float = setting(DenoiseConfig.half_life, above=0.0)
    warmup_groups: int = setting(DenoiseConfig.warmup_groups, low=1)
    target: float = setting(DenoiseConfig.target, low=1.0)
    w_max: float = setting(DenoiseConfig.w_max, low=1.0)


@section
class BanditConfig(Section):
    """Every field of the bandit suite (configs/bandit.py)."""

    experiment: str = setting("bandit", choices=("bandit",))
    seed: int = setting(0, low=0)  # seeds of the runs: seed, seed+1, ...
    problem_seed: int = 1234  # the (fixed) problem: context weights, evaluation contexts
    num_seeds: int = setting(64, low=1)
    num_steps: int = setting(3000, low=1)
    learning_rate: float = setting(0.05, above=0.0)
    threshold: float = setting(0.05, above=0.0)  # suboptimality target
    log_points: int = setting(200, low=1)
    eval_contexts: int = setting(256, low=1)
    variants: tuple[str, ...] = setting(VARIANTS, choices=VARIANTS)
    bandit: BanditProblemConfig = subsection(BanditProblemConfig)
    debias: BanditDebiasConfig = subsection(BanditDebiasConfig)
    denoise: BanditDenoiseConfig = subsection(BanditDenoiseConfig)

    def check(self) -> None:
        if not self.variants:
            raise ConfigError("variants", f"choose at least one of {list(VARIANTS)}")


def defaults():
    """The ConfigDict every bandit config file starts from (every field's default)."""
    return xconfig.defaults(BanditConfig)


def anchor_rho(b) -> tuple[float, str]:
    """The target anchor fraction `bandit.rho` (the name RL uses too, `correction.rho`) and
    the field it came from. `bandit.anchor_fraction`, its old name, still works when set (it
    is None otherwise) and says so; `anchor_fraction` in metrics is the *realised* fraction."""
    old = getattr(b, "anchor_fraction", None)
    if old is None:
        return b.rho, "bandit.rho"
    warnings.warn(
        "config.bandit.anchor_fraction is deprecated: the target anchor fraction is "
        f"config.bandit.rho now (as correction.rho in RL); using anchor_fraction={old}",
        FutureWarning,
        stacklevel=2,
    )
    return old, "bandit.anchor_fraction"


def validate_bandit_config(config) -> BanditConfig:
    """The typed config read from `config` (unchanged); a `ConfigError` naming the field for
    any inconsistent or out-of-range setting."""
    cfg = xconfig.parse(BanditConfig, config)
    anchor_rho(cfg.bandit)  # says so when the deprecated name is used
    return cfg
