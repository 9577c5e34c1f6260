"""The per-step reward correction of WMRL (docs/method.md 3.4-3.6) and the table of modes.

`correct` is the one correction, shared by the bandits (`wmrl.bandits.train`) and the
AutoResearch trainer (`correct_rewards`, its jitted per-step form with advantages and
statistics): calibrate the WM scores, put real rewards in the anchor groups, fold the anchor
pairs into the estimators, read the anchor weight. `MODE_SPECS` is the one table of what
each mode turns on (the bandits' variants extend it, `wmrl.bandits.train.VARIANT_SPECS`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from wmrl.core import cut as cut_lib
from wmrl.core import debias as debias_lib
from wmrl.core import denoise as denoise_lib
from wmrl.core import fidelity
from wmrl.core.grpo import apply_anchor_weight, group_advantages
from wmrl.core.state import CorrectionState
from wmrl.core.stats import spearman

MODES = (
    "real", "wm_only", "debias_only", "denoise_only", "wmrl", "static_anchors", "permuted_wm",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ModeSpec:
    """Every switch of a mode, the same in every experiment.

    `real`: every group executed, no WM (standard GRPO). The others execute only the anchor
    groups (the same routing for all, so ablations differ only in the corrections) and
    fine-tune the WM on them; WM groups get the WM score, raw or calibrated.

    uses_wm: the non-anchor groups are scored by a world model.
    debias: Online Debiasing (the WM scores go through the estimator before advantages).
    denoise: the stream-level anchor weight on the anchor groups' advantages.
    fuse: sample-level denoising: the WM ensemble's members are fused by inverse variance
      into one score (else their plain mean); an experiment's `correction.sample_fusion`
      may override it by name (`resolve_fusion`).
    constant: the control `static_anchors`: the same anchors and verifiers as `wmrl`, but
      every WM row the verifiers do not fix gets one shared reward, the recent mean real
      reward of unflagged anchor scripts (a world model that knows only the average); anchor
      weight 1, no calibration. What `wmrl` gains over it is what the world model
      contributes.
    permute: the control `permuted_wm`: `wmrl` in everything (calibration, anchor weight,
      verifiers, the anchors' real rewards, the estimators' updates), except that the
      calibrated WM scores of each group's learned rows (those no verifier fixes) are
      permuted among themselves by a seeded draw before advantages: the spread of the WM's
      scores without their information (`permute_within_groups`)."""

    uses_wm: bool
    debias: bool
    denoise: bool
    fuse: bool = False
    constant: bool = False
    permute: bool = False

    @property
    def control(self) -> bool:
        """A control of the WM's contribution beside the verifiers (`static_anchors`,
        `permuted_wm`): offered where a static check exists, not by the bandits."""
        return self.constant or self.permute


MODE_SPECS = {
    "real": ModeSpec(uses_wm=False, debias=False, denoise=False),
    "wm_only": ModeSpec(uses_wm=True, debias=False, denoise=False),
    "debias_only": ModeSpec(uses_wm=True, debias=True, denoise=False),
    "denoise_only": ModeSpec(uses_wm=True, debias=False, denoise=True, fuse=True),
    "wmrl": ModeSpec(uses_wm=True, debias=True, denoise=True, fuse=True),
    "static_anchors": ModeSpec(uses_wm=True, debias=False, denoise=False, constant=True),
    "permuted_wm": ModeSpec(uses_wm=True, debias=True, denoise=True, fuse=True, permute=True),
}

# `correction.sample_fusion`: how a WM's ensemble members become one score. `auto` is the
# mode's `fuse`; the others force inverse-variance fusion or the members' plain mean.
SAMPLE_FUSIONS = ("auto", "inverse_variance", "mean")


def resolve_fusion(sample_fusion: str, spec: ModeSpec) -> bool:
    """Whether the members are fused by inverse variance under `sample_fusion` (one of
    `SAMPLE_FUSIONS`) in a mode of spec `spec`."""
    if sample_fusion not in SAMPLE_FUSIONS:
        raise ValueError(f"sample_fusion must be one of {SAMPLE_FUSIONS}, got {sample_fusion!r}")
    return spec.fuse if sample_fusion == "auto" else sample_fusion == "inverse_variance"


def permute_within_groups(
    values: jax.Array, movable: jax.Array, key: jax.Array, group_size: int
) -> jax.Array:
    """`values` [N] with, in each group of `group_size` consecutive rows, the entries where
    `movable` [N] (bool) is True permuted among themselves uniformly at random (one draw
    from `key`); the other entries stay where they are. A group's multiset of movable
    values is kept, so their spread is too; which row has which value is drawn."""
    G = group_size
    v, m = values.reshape(-1, G), movable.reshape(-1, G)
    u = jax.random.uniform(key, v.shape)

    def one(v, m, u):
        # Both orders list the movable slots first, the fixed slots after them in place:
        # `slots` in row order, `draw` in a random order (u < 1 < 2).
        slots = jnp.argsort(jnp.where(m, 0.0, 1.0), stable=True)
        draw = jnp.argsort(jnp.where(m, u, 2.0), stable=True)
        return v.at[slots].set(v[draw])

    return jax.vmap(one)(v, m, u).reshape(values.shape)


# The `permuted_wm` draw's stream of a step's key (`permutation_key`): apart from every
# other draw made from that key (they split it; this folds a constant in).
PERMUTE_STREAM = 0x7065726D


def permutation_key(step_key: jax.Array) -> jax.Array:
    """The raw key data (`StepInputs.permute_key`) of a step's `permuted_wm` draw, from the
    step's key (a pure function of the run's seed and the step, so a resumed run draws the
    same permutation)."""
    return jax.random.key_data(jax.random.fold_in(step_key, PERMUTE_STREAM))


class AnchorViews(NamedTuple):
    """The step's anchor groups seen from both streams ([A, G] unless said)."""

    raw: jax.Array  # raw WM scores
    stream: jax.Array  # the WM stream's rewards (calibrated, or fixed by a verifier)
    env: jax.Array  # real rewards
    ok: jax.Array  # bool: graded
    learned: jax.Array  # bool: graded and scored by the WM (no verifier fixed them)
    full: jax.Array  # [A] bool: every trajectory of the group graded


class Correction(NamedTuple):
    """What `correct` returns: the new estimator state and the step's rewards."""

    correction: CorrectionState
    calibrated: jax.Array  # [N] calibrated WM scores (raw where debiasing is off)
    rewards: jax.Array  # [N] real rewards on anchor rows, the WM stream's elsewhere
    valid: jax.Array  # [N] bool, False on ungraded anchor rows (masked, never scored 0)
    weight: jax.Array  # the anchor weight for this step's anchor groups (1 when off)
    anchors: AnchorViews


def correct(
    corr: CorrectionState,
    r_wm: jax.Array,
    anchor_env: jax.Array,
    anchor_index: jax.Array,
    *,
    group_size: int,
    debias_on: bool,
    denoise_on: bool,
    debias_cfg: debias_lib.DebiasConfig,
    denoise_cfg: denoise_lib.DenoiseConfig,
    keys: jax.Array | None = None,
    anchor_ok: jax.Array | None = None,
    static_mask: jax.Array | None = None,
    static_reward: jax.Array | None = None,
    refit: bool = True,
    constant_on: bool = False,
    permute_key: jax.Array | None = None,
) -> Correction:
    """One step of Online Debiasing and stream-level denoising on N = B*G rows.

    r_wm: [N] raw WM scores; anchor_env: [A, G] real rewards of the anchor groups
    `anchor_index` [A] (static count A), graded where `anchor_ok` [A, G] (default all);
    keys: [N] debiasing keys (arms) for keyed offsets; static_mask / static_reward: [N] rows
    whose outcome is known without execution and that reward (they replace the WM score, and
    their pairs stay out of the map); refit: refit the monotone map when due (the bandits
    refit outside their vmap over seeds instead); constant_on: the `static_anchors` control
    (every WM score replaced by the shared reward `fidelity.anchor_mean`, which then folds in
    this step's unflagged anchor rewards); permute_key: the `permuted_wm` control (the WM
    stream's learned rows, calibrated, are permuted within their groups by a draw from this
    key before the anchors' real rewards are put in; the estimators, the anchor views and
    `calibrated` are `wmrl`'s, unpermuted).

    The calibration applied to this step's scores is the estimator as it was *before* this
    step's pairs (out of sample). The anchor weight is read *after* this step's anchor groups
    are folded into the disagreement EMA: the weight then uses every disagreement measured
    so far, including that of the groups it scales, and the scale `c` applies from the very
    step whose groups complete the warm-up. (Reading it before would add a step of delay on
    top of `rl.anchor_lag`'s.) The trainer always read it after; the bandits read it before
    until the two were unified (tests/core/test_correct.py and tests/autoresearch/test_correction.py
    check the order by hand).
    """
    G = group_size
    calibrated = debias_lib.apply_debias(corr.debias, r_wm, keys, debias_cfg) if debias_on else r_wm
    if constant_on:
        calibrated = jnp.full_like(r_wm, fidelity.anchor_mean(corr.anchor_mean))
    stream = (
        calibrated if static_mask is None else jnp.where(static_mask, static_reward, calibrated)
    )
    trained = stream  # what the WM rows train on
    if permute_key is not None:
        learned = jnp.ones(r_wm.shape, bool) if static_mask is None else ~static_mask
        trained = permute_within_groups(stream, learned, permute_key, G)
    ok = jnp.ones(anchor_env.shape, bool) if anchor_ok is None else anchor_ok
    # An index past the last group is padding (the trainer sizes `anchor_index` to the most
    # anchor groups a step can have): nothing is written there, and it reads as ungraded.
    put = lambda rows, groups: (
        rows.reshape(-1, G).at[anchor_index].set(groups, mode="drop").reshape(-1)
    )
    rewards = put(trained, anchor_env)
    valid = put(jnp.ones(stream.shape, bool), ok)
    take = lambda x: x.reshape(-1, G).at[anchor_index].get(mode="fill", fill_value=0)
    pairs = ok if static_mask is None else ok & ~take(static_mask)  # the learned anchor rows
    a = AnchorViews(
        raw=take(r_wm), stream=take(stream), env=anchor_env, ok=ok, learned=pairs,
        full=ok.all(axis=1),
    )  # fmt: skip
    deb, den, mean = corr.debias, corr.denoise, corr.anchor_mean
    if constant_on:
        mean = fidelity.update_anchor_mean(mean, anchor_env.reshape(-1), pairs.reshape(-1))
    if debias_on:
        k = None if keys is None else take(keys).reshape(-1)
        deb = debias_lib.update_debias(
            deb, a.raw.reshape(-1), anchor_env.reshape(-1), k, pairs.reshape(-1), debias_cfg,
            refit=refit,
        )  # fmt: skip
    if denoise_on:
        den = denoise_lib.update_denoise(den, a.stream, anchor_env, denoise_cfg, a.full)
    weight = denoise_lib.anchor_weight(den, denoise_cfg) if denoise_on else jnp.float32(1.0)
    new = CorrectionState(debias=deb, denoise=den, anchor_mean=mean)
    return Correction(new, calibrated, rewards, valid, weight, a)


class StepInputs(NamedTuple):
    """What one step's N = B*G rows got: the input of `correct_rewards`.

    The anchor positions are the rows of the groups `anchor_groups`; `anchor_index` lists
    them (a static count A: the jitted correction compiles once; with `padded`, entries equal
    to B are padding). A row a verifier fixes (`static_mask`, e.g. a script that does not
    compile is MALFORMED) takes `static_reward` instead of a WM score, and as an anchor its
    pair stays out of the monotone map (the map calibrates the WM on what the WM scores)."""

    r_wm: jax.Array  # [N] raw WM scores (zeros without a WM)
    r_env: jax.Array  # [N] real rewards, read where env_valid
    env_valid: jax.Array  # [N] bool: graded anchor rows (UNGRADED ones are masked, not 0)
    anchor_groups: jax.Array  # [B] bool
    anchor_index: jax.Array  # [A] int
    static_mask: jax.Array | None = None  # [N] bool
    static_reward: jax.Array | None = None  # [N]
    # The `permuted_wm` control: the raw key data (`jax.random.key_data`) of the step's
    # permutation draw (None in every other mode).
    permute_key: jax.Array | None = None
    # Cost-aware routing (`wmrl.core.cut`; None without it): rows outside the anchor groups
    # that finished under the cap (their reward is `r_env`) and those it cut; every row's WM
    # score given it ran past the cap; the anchor rows that ran past it (the cut pairs).
    real_rows: jax.Array | None = None  # [N] bool
    cut_mask: jax.Array | None = None  # [N] bool
    r_cut: jax.Array | None = None  # [N]
    past_cap: jax.Array | None = None  # [N] bool


class CorrectionStats(NamedTuple):
    """The step's scalar diagnostics (metrics.jsonl fields of the same names)."""

    bias_reduction: jax.Array
    residual_before: jax.Array
    residual_after: jax.Array
    wm_rank_corr: jax.Array  # raw WM vs real over graded anchor rows (pooled)
    wm_stream_corr: jax.Array  # the WM stream's within-group Spearman on learned anchor rows
    wm_stream_collapsed_groups: jax.Array
    anchor_weight: jax.Array
    calibrated: jax.Array  # bool: the monotone map was fitted before this step
    train_reward: jax.Array  # mean reward over the valid rows
    static_anchors_reward: jax.Array | None = None  # the control's shared reward (else None)
    # Cost-aware routing only: the cut map fitted before this step, the past-cap anchor pairs
    # folded in, and in `static_anchors` the cut rows' one shared reward.
    cut_calibrated: jax.Array | None = None
    cut_pairs: jax.Array | None = None
    cut_shared_reward: jax.Array | None = None

    def as_dict(self) -> dict:
        """The fields that exist in this mode, by name."""
        return {k: v for k, v in self._asdict().items() if v is not None}


class StepCorrection(NamedTuple):
    """What `correct_rewards` returns."""

    correction: CorrectionState  # the estimators after this step's anchor groups
    rewards: jax.Array  # [N] real on anchor rows, the WM stream's elsewhere
    valid: jax.Array  # [N] bool
    advantages: jax.Array  # [N] group advantages, the anchor weight applied
    calibrated: jax.Array  # [N] calibrated WM scores
    stats: CorrectionStats
    anchor_agreement: jax.Array | None = None  # [A] with `padded`: each anchor group's agreement


def correct_rewards(
    correction: CorrectionState,
    inputs: StepInputs,
    *,
    group_size: int,
    spec: ModeSpec,
    debias_cfg: debias_lib.DebiasConfig,
    denoise_cfg: denoise_lib.DenoiseConfig,
    normalize_std: bool,
    baseline: str,
    std_eps: float = 1e-6,
    padded: bool = False,
) -> StepCorrection:
    """The trainers' step: `correct`, then advantages and statistics (jitted per config).

    padded: `inputs.anchor_index` may end in padding entries (the group count B), so that the
    number of anchor groups can change between steps without a new shape
    (`correction.adaptive_rho`): they are ignored like ungraded groups, the diagnostics are
    taken over the real groups only, and `anchor_agreement` [A] is each anchor group's
    within-group agreement of the WM stream (`fidelity.group_agreement`; NaN for padding and
    groups that say nothing), what the adaptive rule folds in.
    """
    G = group_size
    x = inputs
    r_wm, anchor_index = x.r_wm, x.anchor_index
    static_mask, static_reward = x.static_mask, x.static_reward
    if static_mask is None:
        static_mask = jnp.zeros(r_wm.shape, bool)
        static_reward = jnp.zeros_like(r_wm)
    take = lambda v: v.reshape(-1, G).at[anchor_index].get(mode="fill", fill_value=0)
    if spec.permute != (x.permute_key is not None):
        raise ValueError(f"permute_key must be given exactly in a permuting mode ({spec})")
    permute_key = None if x.permute_key is None else jax.random.wrap_key_data(x.permute_key)
    c = correct(
        correction, r_wm, take(x.r_env), anchor_index, group_size=G, debias_on=spec.debias,
        denoise_on=spec.denoise, debias_cfg=debias_cfg, denoise_cfg=denoise_cfg,
        anchor_ok=take(x.env_valid), static_mask=static_mask, static_reward=static_reward,
        constant_on=spec.constant, permute_key=permute_key,
    )  # fmt: skip
    a = c.anchors
    rewards, cut_stats = c.rewards, {}
    new_state = c.correction.replace(cut=correction.cut)
    if x.cut_mask is not None:  # cost-aware routing: the rows run under the cap
        cut = cut_lib.correct_cut_rows(
            correction.cut, c.rewards, x.r_env, x.real_rows, x.cut_mask, x.r_cut,
            take(x.r_cut).reshape(-1), a.env.reshape(-1), (take(x.past_cap) & a.ok).reshape(-1),
            debias_on=spec.debias, constant_on=spec.constant, config=debias_cfg,
        )  # fmt: skip
        rewards, new_state = cut.rewards, c.correction.replace(cut=cut.state)
        cut_stats = dict(
            cut_calibrated=cut.calibrated if spec.debias else jnp.bool_(False),
            cut_pairs=cut.pairs, cut_shared_reward=cut.shared,
        )  # fmt: skip
    masked = lambda v: jnp.where(a.full[:, None], v, 0.0).reshape(-1)
    diag = debias_lib.bias_diagnostic(masked(a.raw), masked(a.stream), masked(a.env), G)
    ok = a.ok.reshape(-1)
    if padded:  # over the real anchor groups only (padding would add tied zeros)
        live = anchor_index < r_wm.shape[0] // G
        scale = live.shape[0] / jnp.maximum(live.sum(), 1)  # the residuals average over A
        diag = {k: v * scale if k.startswith("residual") else v for k, v in diag.items()}
        rank = spearman(a.raw.reshape(-1), a.env.reshape(-1), ok)
    else:
        rank = spearman(
            jnp.where(ok, a.raw.reshape(-1), 0.0),
            jnp.where(ok, a.env.reshape(-1), 0.0),
            undefined=0.0,
        )
    adv = group_advantages(
        rewards, G, valid=c.valid, normalize_std=normalize_std, baseline=baseline, eps=std_eps
    )
    # The WM stream where GRPO uses it: its within-group order vs the real one on the anchor
    # groups' learned rows, and the groups it flattened to one value.
    stream, env, learned = a.stream.reshape(-1), a.env.reshape(-1), a.learned.reshape(-1)
    corr_g = fidelity.within_group_spearman(stream, env, learned, G)
    defined = ~jnp.isnan(corr_g)
    stream_corr = jnp.where(
        defined.any(), jnp.sum(jnp.where(defined, corr_g, 0.0)) / jnp.maximum(defined.sum(), 1),
        jnp.nan,
    )  # fmt: skip
    adv = apply_anchor_weight(adv, G, x.anchor_groups, c.weight)
    stats = CorrectionStats(
        bias_reduction=diag["bias_reduction"],
        residual_before=diag["residual_before"],
        residual_after=diag["residual_after"],
        wm_rank_corr=rank,
        wm_stream_corr=stream_corr,
        wm_stream_collapsed_groups=fidelity.collapsed_groups(stream, a.raw.reshape(-1), learned, G),
        anchor_weight=c.weight,
        calibrated=correction.debias.monotone.fitted if spec.debias else jnp.bool_(False),
        train_reward=jnp.sum(jnp.where(c.valid, rewards, 0.0)) / jnp.maximum(c.valid.sum(), 1),
        # the control's one shared reward this step (before its own anchors)
        static_anchors_reward=(
            fidelity.anchor_mean(correction.anchor_mean) if spec.constant else None
        ),
        **cut_stats,
    )
    agreement = fidelity.group_agreement(stream, env, learned, G) if padded else None
    return StepCorrection(new_state, rewards, c.valid, adv, c.calibrated, stats, agreement)
