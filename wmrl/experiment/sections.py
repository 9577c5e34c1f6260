"""The config sections AutoResearch and embodied share, each declared once.

* `RunConfig`: the fields at the top of both (`seed`, `mode`, `routing`, `init_dir`);
* `RLConfig`: the GRPO run (`config.rl`), among its fields the B groups of G samples per step
  (`rl.groups_per_step`: a group is a task in AutoResearch, a start state in embodied); each
  experiment extends it with its own fields (`AutoResearchRL`, `EmbodiedRL`);
* `CorrectionConfig`: anchors, Online Debiasing, Inverse-Variance Denoising, sample-level
  fusion and the adaptive anchor fraction (`config.correction`), with the builders of the
  core's settings from it.

Defaults: the correction's are the core's own (`RoutingConfig`, `DebiasConfig`,
`DenoiseConfig`, `AdaptiveRhoConfig`: one source); the RL run's are the AutoResearch job's,
with every optional feature off (`rl.anchor_lag = 0`, `rl.static_check = "off"`,
`correction.adaptive_rho = False`, uniform routing). An experiment's config file sets its
own values; a feature an experiment does not implement is refused there by name
(`wmrl.embodied.config`).
"""

from __future__ import annotations

from wmrl.config_errors import ConfigError
from wmrl.core.correct import MODES, SAMPLE_FUSIONS
from wmrl.core.debias import DebiasConfig
from wmrl.core.denoise import DenoiseConfig
from wmrl.core.fidelity import AdaptiveRhoConfig
from wmrl.core.routing import RoutingConfig
from wmrl.experiment.config import Section, section, setting

ROUTINGS = ("uniform", "uncertainty", "cost")
# rl.static_check: which outcomes the WM stream takes from a static check instead of the WM
# (off; compile: MALFORMED; names: also RUNTIME_ERROR for a name read but never defined).
STATIC_CHECKS = ("off", "compile", "names")
# Modes under the names saved configs may hold (the control's, before one table named it).
RENAMED_MODES = {"constant_wm": "static_anchors"}


@section
class RunConfig(Section):
    """What a WMRL run is: its seed, its mode (`wmrl.core.correct.MODE_SPECS`), how anchor
    groups are chosen, and where its shared stages live."""

    seed: int = setting(0, low=0)  # the stages' seed (and the RL run's, rl.seed = -1)
    # real | wm_only | debias_only | denoise_only | wmrl | static_anchors | permuted_wm
    mode: str = "wmrl"
    # Which groups are anchors: uniform (the paper's seeded draw) | uncertainty (a share,
    # correction.uncertainty_share, of them the groups the WM is least sure of) | cost
    # (uniform anchors; every other row also runs for real under the short cap
    # correction.cheap_limit_s or cheap_quantile, and only the rows it cuts take the WM's
    # score: docs/method.md 3.11).
    routing: str = setting("uniform", choices=ROUTINGS)
    init_dir: str = ""  # stages shared between runs ('' = <workdir>/init)

    def check(self) -> None:
        if self.mode in RENAMED_MODES:
            raise ConfigError(
                "mode",
                f"{self.mode!r} is now called {RENAMED_MODES[self.mode]!r} (the control's one "
                "name in every experiment)",
            )
        if self.mode not in MODES:
            raise ConfigError("mode", f"unknown mode {self.mode!r}; one of {MODES}")


@section
class RLConfig(Section):
    """The GRPO run (`config.rl`), the fields both experiments have."""

    steps: int = setting(20, low=1)
    # B groups per step, each G = group_size samples of one prompt (AutoResearch: a task;
    # embodied: a start state, instruction + layout). Saved AutoResearch configs may hold it
    # under its old name (`wmrl.experiment.renamed`).
    groups_per_step: int = setting(8, low=1)
    # The RL run's seed (policy sampling, task order, routing, executions); -1 = `seed`. The
    # stages before RL use `seed`: runs differing only here share them.
    seed: int = setting(-1, low=-1, note="-1 = config.seed")
    group_size: int = setting(4, low=2, note="GRPO needs groups of at least 2 samples")
    learning_rate: float = setting(2e-4, above=0)
    clip_eps: float = setting(0.2, low=0)
    kl_coef: float = setting(0.05, low=0)
    temperature: float = setting(0.7, above=0)  # sampling; log-probs are the untempered policy's
    # Divide a group's advantages by its std (GRPO) or not (Dr.GRPO).
    normalize_std: bool = False
    eval_every: int = setting(5, low=1)
    checkpoint_every: int = setting(5, low=1)
    # Anchor groups of step t execute while step t+1 generates and trains; step t+1 trains on
    # them (one update old: the PPO ratio against their sampling log-probs corrects for it).
    # 0 = wait for them in their own step. Modes with a WM stream only.
    anchor_lag: int = setting(
        0, choices=(0, 1), note="0: anchors trained on in the step that sampled them; 1: one "
        "step later, executing meanwhile",
    )  # fmt: skip
    # Outcomes the WM stream takes from a static check (no execution) instead of the WM:
    # "compile": a script that does not compile gets MALFORMED's exact reward 0; "names":
    # also RUNTIME_ERROR's for a script that reads a name it never defines; "off".
    static_check: str = setting("off", choices=STATIC_CHECKS)


def rl_seed(config) -> int:
    """The RL run's seed (`rl.seed`, or `seed` when it is -1): policy sampling, task order,
    routing, the WM's online updates and the real executions. The stages before RL use
    `seed`, so runs that differ only in `rl.seed` share them."""
    s = config.rl.seed
    return config.seed if s == -1 else s


@section
class CorrectionConfig(Section):
    """Anchors and the correction of the WM stream (`config.correction`)."""

    # Anchor fraction: the share of each step's groups executed for real.
    rho: float = setting(RoutingConfig.rho, low=0.0, high=1.0)
    min_groups: int = setting(RoutingConfig.min_groups, low=0)  # anchor groups per step, at least
    # With routing = uncertainty: this share of the anchors are the least certain groups.
    uncertainty_share: float = setting(RoutingConfig.uncertainty_share, low=0.0, high=1.0)
    # Fidelity-driven anchor fraction (off = the fixed `rho`): it moves between rho_min (the
    # WM stream ranks the anchors' samples as their real rewards do: agreement >= corr_high)
    # and rho_max (it has collapsed: agreement <= corr_low), linearly between, from an EMA of
    # the anchors' within-group agreement (half-life rho_half_life groups); `rho` holds until
    # the rule has measured rho_warmup_groups groups. Modes with a WM stream, not the control.
    adaptive_rho: bool = False
    rho_min: float = setting(AdaptiveRhoConfig.rho_min, low=0.0, high=1.0)
    rho_max: float = setting(AdaptiveRhoConfig.rho_max, low=0.0, high=1.0)
    corr_low: float = setting(AdaptiveRhoConfig.corr_low, low=-1.0, high=1.0)
    corr_high: float = setting(AdaptiveRhoConfig.corr_high, low=-1.0, high=1.0)
    rho_half_life: float = setting(AdaptiveRhoConfig.half_life, above=0.0)
    rho_warmup_groups: int = setting(AdaptiveRhoConfig.warmup_groups, low=0)
    # Online Debiasing: the monotone map from WM scores to real rewards, fitted on the anchor
    # pairs (keyed offsets by task would cancel inside a group: its samples share the task).
    debias: str = setting(
        DebiasConfig.mode, choices=("monotone",),
        note="a group shares one task, so offsets keyed by task would cancel inside it",
    )  # fmt: skip
    min_pairs: int = setting(DebiasConfig.min_pairs, low=0)  # identity until this many pairs
    refit_every: int = setting(DebiasConfig.refit_every, low=1)
    num_bins: int = setting(DebiasConfig.num_bins, low=1)
    # Equal-width bins (the paper's) or equal-mass (quantiles of the window's WM scores); the
    # map is blended with the identity (weight min_slope) so it is strictly increasing.
    bin_spacing: str = setting(DebiasConfig.bin_spacing, choices=("equal_width", "equal_mass"))
    min_slope: float = setting(DebiasConfig.min_slope, low=0.0, high=0.999999)
    capacity: int = setting(DebiasConfig.capacity, low=1)  # anchor pairs kept
    # Inverse-Variance Denoising at stream level: the anchor weight's warm-up, the half-life
    # of its disagreement estimate (anchor groups), its target and cap.
    denoise_warmup_groups: int = setting(DenoiseConfig.warmup_groups, low=1)
    denoise_half_life: float = setting(DenoiseConfig.half_life, above=0.0)
    denoise_target: float = setting(DenoiseConfig.target, low=1.0)
    denoise_w_max: float = setting(DenoiseConfig.w_max, low=1.0)
    # Cost-aware routing (routing = cost; exactly one of the two, 0 = unset): the cap, in
    # seconds, under which every non-anchor row runs for real, or the adaptive cap: this
    # quantile, in (0, 1), of the recent anchors' execution times (anchors run in full, so
    # they are a random sample of the policy's runtimes; docs/method.md 3.11).
    cheap_limit_s: float = setting(0.0, low=0.0, note="seconds; 0 = no fixed cap")
    cheap_quantile: float = setting(
        0.0, low=0.0, below=1.0, note="a quantile in (0, 1) of recent execution times; 0 = off"
    )
    # How the WM ensemble's members become one score (sample level): auto = the mode's
    # (inverse-variance fusion in denoise_only and wmrl, the members' mean in the others), or
    # force inverse_variance | mean.
    sample_fusion: str = setting("auto", choices=SAMPLE_FUSIONS)

    def check(self) -> None:
        if self.cheap_limit_s and self.cheap_quantile:
            raise ConfigError(
                "cheap_quantile",
                f"({self.cheap_quantile!r}) and correction.cheap_limit_s ({self.cheap_limit_s!r}) "
                "are both set: the cap is either fixed or a quantile of recent execution "
                "times; set one of them to 0",
            )
        if self.rho_min > self.rho_max:
            raise ConfigError(
                "rho_min", f"({self.rho_min!r}) must be <= config.correction.rho_max "
                f"({self.rho_max!r})",
            )  # fmt: skip
        if not self.corr_low < self.corr_high:
            raise ConfigError(
                "corr_low", f"({self.corr_low!r}) must be < config.correction.corr_high "
                f"({self.corr_high!r})",
            )  # fmt: skip
        if self.adaptive_rho and not self.rho_min <= self.rho <= self.rho_max:
            raise ConfigError(
                "rho",
                f"({self.rho!r}) is the anchor fraction before the adaptive rule has measured "
                f"the WM; with adaptive_rho it must lie in [correction.rho_min, "
                f"correction.rho_max] = [{self.rho_min!r}, {self.rho_max!r}]",
            )

    def debias_config(self, mode: str, num_keys: int = 1) -> DebiasConfig:
        """The core's Online Debiasing settings (`mode`: the experiment's for its mode)."""
        return DebiasConfig(
            mode=mode, num_keys=num_keys, capacity=self.capacity, num_bins=self.num_bins,
            bin_spacing=self.bin_spacing, min_slope=self.min_slope, min_pairs=self.min_pairs,
            refit_every=self.refit_every, reward_range=(0.0, 1.0),
        )  # fmt: skip

    def denoise_config(self) -> DenoiseConfig:
        return DenoiseConfig(
            half_life=self.denoise_half_life, warmup_groups=self.denoise_warmup_groups,
            target=self.denoise_target, w_max=self.denoise_w_max,
        )  # fmt: skip

    def adaptive_rho_config(self) -> AdaptiveRhoConfig:
        """The fidelity-driven anchor fraction's rule (whether it is on is the caller's)."""
        return AdaptiveRhoConfig(
            rho=self.rho, rho_min=self.rho_min, rho_max=self.rho_max, corr_low=self.corr_low,
            corr_high=self.corr_high, half_life=self.rho_half_life,
            warmup_groups=self.rho_warmup_groups,
        )  # fmt: skip
