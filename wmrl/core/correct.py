"""The per-step reward correction of WMRL (DESIGN.md 3.4-3.6) and the table of modes.

`correct_rewards` is the AutoResearch trainer's jitted correction: calibrate the WM scores
(monotone map), put real rewards in the anchor groups, update the estimators on the anchor
pairs, group advantages, anchor weight. `MODE_SPECS` is the one table of what each mode
turns on.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from wmrl.core import debias as debias_lib
from wmrl.core import denoise as denoise_lib
from wmrl.core.grpo import apply_anchor_weight, group_advantages
from wmrl.core.state import CorrectionState
from wmrl.core.stats import spearman

MODES = ("real", "wm_only", "debias_only", "denoise_only", "wmrl")


@dataclasses.dataclass(frozen=True)
class ModeSpec:
    """`real`: every group executed, no WM (standard GRPO). The others execute only the anchor
    groups (same routing for all, so ablations differ only in the corrections) and fine-tune
    the WM on them; WM groups get the WM score, raw or calibrated."""

    uses_wm: bool
    debias: bool
    denoise: bool


MODE_SPECS = {
    "real": ModeSpec(uses_wm=False, debias=False, denoise=False),
    "wm_only": ModeSpec(uses_wm=True, debias=False, denoise=False),
    "debias_only": ModeSpec(uses_wm=True, debias=True, denoise=False),
    "denoise_only": ModeSpec(uses_wm=True, debias=False, denoise=True),
    "wmrl": ModeSpec(uses_wm=True, debias=True, denoise=True),
}


def correct_rewards(
    correction: CorrectionState,
    r_wm: jax.Array,
    r_env: jax.Array,
    env_valid: jax.Array,
    anchor_rows: jax.Array,
    anchor_groups: jax.Array,
    anchor_index: jax.Array,
    static_mask: jax.Array | None = None,
    static_reward: jax.Array | None = None,
    *,
    group_size: int,
    spec: ModeSpec,
    debias_cfg: debias_lib.DebiasConfig,
    denoise_cfg: denoise_lib.DenoiseConfig,
    normalize_std: bool,
    baseline: str,
):
    """Rewards, advantages and the new correction state for one step (jitted per config).

    Returns `(new correction state, {"rewards", "valid", "advantages", "calibrated"} [N],
    scalar stats)`.

    r_wm: [N] raw WM scores (zeros in `real` mode); r_env: [N] real rewards (valid where
    `env_valid`); anchor_rows: [N] bool; anchor_groups: [B] bool; anchor_index: [A] indices of
    the anchor groups (static count A). static_mask / static_reward: [N] rows whose outcome
    the environment fixes without executing them (`rl.static_check`: a script that does not
    compile is MALFORMED) and that reward; they take it instead of a WM score, and their
    anchor pairs stay out of the monotone map (it calibrates the WM on what it scores).
    """
    G = group_size
    calibrated = (
        debias_lib.apply_debias(correction.debias, r_wm, None, debias_cfg) if spec.debias else r_wm
    )
    if static_mask is None:
        static_mask = jnp.zeros_like(anchor_rows)
        static_reward = jnp.zeros_like(r_wm)
    stream = jnp.where(static_mask, static_reward, calibrated)  # the WM stream's reward
    rewards = jnp.where(anchor_rows, r_env, stream)
    valid = jnp.where(anchor_rows, env_valid, True)
    # Anchor-group views [A, G] for the diagnostics and the stream-level statistics.
    take = lambda x: x.reshape(-1, G)[anchor_index]
    a_raw, a_cal, a_env, a_ok = take(r_wm), take(stream), take(r_env), take(env_valid)
    a_learned = ~take(static_mask)  # the anchor rows the WM stream would have scored
    full = a_ok.all(axis=1)  # groups with every trajectory graded
    diag = debias_lib.bias_diagnostic(
        jnp.where(full[:, None], a_raw, 0.0).reshape(-1),
        jnp.where(full[:, None], a_cal, 0.0).reshape(-1),
        jnp.where(full[:, None], a_env, 0.0).reshape(-1),
        G,
    )
    ok = a_ok.reshape(-1)
    rank = spearman(jnp.where(ok, a_raw.reshape(-1), 0.0), jnp.where(ok, a_env.reshape(-1), 0.0))
    deb, den = correction.debias, correction.denoise
    if spec.debias:
        deb = debias_lib.update_debias(
            deb, a_raw.reshape(-1), a_env.reshape(-1), None, ok & a_learned.reshape(-1), debias_cfg
        )
    if spec.denoise:
        den = denoise_lib.update_denoise(den, a_cal, a_env, denoise_cfg, group_mask=full)
    weight = denoise_lib.anchor_weight(den, denoise_cfg) if spec.denoise else jnp.float32(1.0)
    adv = group_advantages(rewards, G, valid=valid, normalize_std=normalize_std, baseline=baseline)
    adv = apply_anchor_weight(adv, G, anchor_groups, weight)
    stats = {
        "bias_reduction": diag["bias_reduction"],
        "residual_before": diag["residual_before"],
        "residual_after": diag["residual_after"],
        "wm_rank_corr": rank,
        "anchor_weight": weight,
        "calibrated": correction.debias.monotone.fitted if spec.debias else jnp.bool_(False),
        "train_reward": jnp.sum(jnp.where(valid, rewards, 0.0)) / jnp.maximum(valid.sum(), 1),
    }
    out = {"rewards": rewards, "valid": valid, "advantages": adv, "calibrated": calibrated}
    return CorrectionState(debias=deb, denoise=den), out, stats
