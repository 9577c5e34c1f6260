"""The correction estimator's whole state as one checkpointable pytree."""

from __future__ import annotations

from flax import struct

from wmrl.core.cut import CutState
from wmrl.core.debias import DebiasConfig, DebiasState, init_debias_state
from wmrl.core.denoise import DenoiseState, init_denoise_state
from wmrl.core.fidelity import AnchorMeanState, init_anchor_mean


@struct.dataclass
class CorrectionState:
    """Online Debiasing + stream-level denoising state, saved with the rest of training, and
    the `static_anchors` control's shared reward (`wmrl.core.fidelity.AnchorMeanState`);
    under cost-aware routing also the estimator of the rows the cap cut (`wmrl.core.cut`;
    None otherwise, so those runs keep their checkpoint layout)."""

    debias: DebiasState
    denoise: DenoiseState
    anchor_mean: AnchorMeanState
    cut: CutState | None = None


def init_correction_state(debias: DebiasConfig, prior_reward: float = 0.5) -> CorrectionState:
    """`prior_reward`: the control's shared reward before any anchor outcome (the trainer
    passes the executed corpus's mean reward)."""
    return CorrectionState(
        debias=init_debias_state(debias),
        denoise=init_denoise_state(),
        anchor_mean=init_anchor_mean(prior_reward),
    )
