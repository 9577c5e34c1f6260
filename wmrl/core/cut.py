"""The correction of rows a cap cut (cost-aware routing, docs/method.md 3.11; ours).

Under `routing = cost` every row outside the anchor groups runs for real under a short cap.
A row that finishes there has its real reward. A row the cap cuts has one observation, "ran
longer than the cap", and takes the WM's score given it (`r_cut`: P(timeout) of a script
known to run past the cap under its real limit, the reward head otherwise), corrected by an
estimator of its own, fitted only on the anchor rows that ran past the cap: the anchors are
whole groups drawn at random and executed in full, so their rows past the cap are a random
sample of exactly the population the cut rows come from, and a map fitted on them is
unbiased for the cut rows (one fitted on every anchor would mix in the fast scripts, whose
WM errors differ).

`CutState` is that estimator: a monotone map (`wmrl.core.debias`, the same settings as the
main one: identity until `min_pairs` pairs) for the modes that debias, and for the control
`static_anchors` one shared reward (`fidelity.AnchorMeanState`: the recent mean real reward
of past-cap anchor rows, what a WM that knows only that population's average would say).
Modes without debiasing use `r_cut` as it is. It lives in `CorrectionState.cut` (None
without cost routing, so other runs keep their checkpoint layout).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from wmrl.core import debias as debias_lib
from wmrl.core import fidelity


@struct.dataclass
class CutState:
    """The cut rows' estimators, fitted on past-cap anchor pairs `(r_cut, r_env)`."""

    debias: debias_lib.DebiasState
    mean: fidelity.AnchorMeanState


def init_cut_state(config: debias_lib.DebiasConfig, prior_reward: float) -> CutState:
    """`prior_reward`: the shared cut reward of `static_anchors` before any past-cap pair."""
    return CutState(
        debias=debias_lib.init_debias_state(config), mean=fidelity.init_anchor_mean(prior_reward)
    )


class CutRows(NamedTuple):
    """What `correct_cut_rows` returns."""

    state: CutState  # after this step's past-cap anchor pairs
    rewards: jax.Array  # [N] real under the cap, the cut stream where cut, `rewards` elsewhere
    cut_stream: jax.Array  # [N] the corrected score each row would get if cut
    calibrated: jax.Array  # bool: the cut map was fitted before this step
    pairs: jax.Array  # int: past-cap anchor pairs folded in this step
    shared: jax.Array | None  # `static_anchors`: the cut rows' one reward this step


def cut_stream(
    state: CutState, r_cut: jax.Array, *, debias_on: bool, constant_on: bool,
    config: debias_lib.DebiasConfig,
) -> jax.Array:  # fmt: skip
    """[N] the reward of a cut row: the shared reward (`constant_on`), the WM's conditional
    score through the cut map (`debias_on`), or that score as it is."""
    if constant_on:
        return jnp.full(r_cut.shape, fidelity.anchor_mean(state.mean), jnp.float32)
    if debias_on:
        return debias_lib.apply_debias(state.debias, r_cut, None, config)
    return r_cut.astype(jnp.float32)


def correct_cut_rows(
    state: CutState,
    rewards: jax.Array,
    r_env: jax.Array,
    real_rows: jax.Array,
    cut_mask: jax.Array,
    r_cut: jax.Array,
    pair_r_cut: jax.Array,
    pair_r_env: jax.Array,
    pair_mask: jax.Array,
    *,
    debias_on: bool,
    constant_on: bool,
    config: debias_lib.DebiasConfig,
    refit: bool = True,
) -> CutRows:
    """The step's rewards with the capped rows' outcomes in, and the cut estimator updated.

    rewards: [N] the step's rewards so far (anchor groups real, the WM stream elsewhere);
    r_env / real_rows: [N] real rewards and the rows outside the anchor groups that finished
    under the cap; cut_mask: [N] the rows the cap cut; r_cut: [N] each row's WM score given
    it ran past the cap. pair_*: [P] the anchor rows (flattened) with their `r_cut` and real
    reward, `pair_mask` the graded ones that ran past the cap: the only pairs the cut
    estimator sees. The cut rows are scored with the estimator as it was before this step's
    pairs (out of sample, as the main map)."""
    stream = cut_stream(state, r_cut, debias_on=debias_on, constant_on=constant_on, config=config)
    out = jnp.where(real_rows, r_env, jnp.where(cut_mask, stream, rewards))
    mean, deb = state.mean, state.debias
    if constant_on:
        mean = fidelity.update_anchor_mean(mean, pair_r_env, pair_mask)
    if debias_on:
        deb = debias_lib.update_debias(
            deb, pair_r_cut, pair_r_env, None, pair_mask, config, refit=refit
        )
    shared = fidelity.anchor_mean(state.mean) if constant_on else None
    return CutRows(
        CutState(debias=deb, mean=mean), out, stream, state.debias.monotone.fitted,
        pair_mask.sum().astype(jnp.int32), shared,
    )  # fmt: skip
