"""The correction estimator's whole state as one checkpointable pytree."""

from __future__ import annotations

from flax import struct

from wmrl.core.debias import DebiasConfig, DebiasState, init_debias_state
from wmrl.core.denoise import DenoiseState, init_denoise_state


@struct.dataclass
class CorrectionState:
    """Online Debiasing + stream-level denoising state, saved with the rest of training."""

    debias: DebiasState
    denoise: DenoiseState


def init_correction_state(debias: DebiasConfig) -> CorrectionState:
    return CorrectionState(debias=init_debias_state(debias), denoise=init_denoise_state())
