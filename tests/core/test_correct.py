"""`wmrl.core.correct.correct`, the one correction of bandits and trainer: the anchor weight is
read after this step's anchor groups are folded into the disagreement EMA (hand numbers), the
anchor rows take real rewards, and keyed offsets are applied by arm before the update."""

import jax.numpy as jnp
import numpy as np
import pytest

from wmrl.core.correct import correct
from wmrl.core.debias import DebiasConfig
from wmrl.core.denoise import DenoiseConfig, DenoiseState
from wmrl.core.state import init_correction_state

G = 4
DENOISE = DenoiseConfig(half_life=2.0, warmup_groups=1, target=2.0, w_max=4.0)


def test_anchor_weight_is_read_after_this_steps_groups():
    frozen = DenoiseState(
        ema=jnp.float32(0.2), ema_norm=jnp.float32(1.0), num_groups=jnp.int32(5),
        scale=jnp.float32(2.0), frozen=jnp.bool_(True),
    )  # fmt: skip
    deb = DebiasConfig(mode="none")
    corr = init_correction_state(deb).replace(denoise=frozen)
    r_wm = np.array([0.1, 0.2, 0.3, 0.4, 0.9, 0.1, 0.5, 0.3], np.float32)  # group 1: anchor
    r_env = np.array([0, 0, 0, 0, 0.0, 1.0, 0.5, 0.2], np.float32)
    rows = np.repeat([False, True], G)
    c = correct(
        corr, jnp.asarray(r_wm), jnp.asarray(r_env[4:].reshape(1, G)), jnp.array([1]),
        group_size=G, debias_on=False, denoise_on=True, debias_cfg=deb, denoise_cfg=DENOISE,
    )  # fmt: skip
    d, s = r_wm[4:], r_env[4:]
    s2 = np.mean(((d - d.mean()) - (s - s.mean())) ** 2) / np.var(s)
    decay = 0.5 ** (1 / DENOISE.half_life)
    ema = (decay * 0.2 + (1 - decay) * s2) / (decay * 1.0 + (1 - decay))
    assert float(c.weight) == pytest.approx(min(1 + 2.0 * ema, 4.0), rel=1e-5)
    assert float(c.weight) != pytest.approx(1 + 2.0 * 0.2, rel=1e-3)  # not the old state's
    np.testing.assert_array_equal(np.asarray(c.rewards), np.where(rows, r_env, r_wm))


def test_keyed_offsets_apply_by_arm_then_learn_from_the_anchor_pairs():
    deb = DebiasConfig(mode="keyed", num_keys=2, window=8, min_count=1)
    corr = init_correction_state(deb)
    arms = jnp.array([0, 1, 0, 1])
    r_wm = jnp.array([0.5, 0.9, 0.5, 0.9])
    r_env = jnp.array([0.0, 0.0, 0.2, 0.4])  # group 1 (rows 2, 3) is the anchor group
    kw = dict(group_size=2, debias_on=True, denoise_on=False, debias_cfg=deb,
              denoise_cfg=DENOISE, keys=arms)  # fmt: skip
    anchor_env = r_env[2:].reshape(1, 2)
    c = correct(corr, r_wm, anchor_env, jnp.array([1]), **kw)
    np.testing.assert_allclose(c.calibrated, r_wm)  # no pairs yet: nothing to subtract
    assert float(c.weight) == 1.0  # denoising off
    again = correct(c.correction, r_wm, anchor_env, jnp.array([1]), **kw)
    # Offsets learnt from the pairs: arm 0: 0.5 - 0.2 = 0.3, arm 1: 0.9 - 0.4 = 0.5.
    np.testing.assert_allclose(again.calibrated, [0.2, 0.4, 0.2, 0.4], atol=1e-6)


def test_the_static_anchors_control_gives_wm_rows_one_shared_reward():
    """`constant_on`: WM rows the static check does not fix get the control's shared reward
    (the prior before any anchor), fixed rows keep theirs, anchors their real rewards; then
    the unflagged, graded anchor rewards are folded into the shared reward (hand EMA)."""
    from wmrl.core import fidelity
    from wmrl.core.correct import MODE_SPECS, MODES

    assert "static_anchors" in MODES and MODE_SPECS["static_anchors"].constant
    spec = MODE_SPECS["static_anchors"]
    assert spec.uses_wm and not spec.debias and not spec.denoise
    deb = DebiasConfig(mode="none")
    corr = init_correction_state(deb, prior_reward=0.4)
    r_wm = jnp.array([0.9, 0.1, 0.7, 0.3, 0.5, 0.6])  # 3 groups of 2; group 2 is the anchor
    static = jnp.array([False, True, False, False, False, True])
    static_reward = jnp.array([0.0, 0.1, 0.0, 0.0, 0.0, 0.0])
    anchor_env = jnp.array([[0.8, 0.0]])
    ok = jnp.array([[True, True]])
    c = correct(
        corr, r_wm, anchor_env, jnp.array([2]), group_size=2, debias_on=False,
        denoise_on=False, debias_cfg=deb, denoise_cfg=DENOISE, anchor_ok=ok,
        static_mask=static, static_reward=static_reward, constant_on=True,
    )  # fmt: skip
    np.testing.assert_allclose(c.rewards, [0.4, 0.1, 0.4, 0.4, 0.8, 0.0], atol=1e-6)
    assert float(c.weight) == 1.0
    d = 0.5 ** (1 / 64.0)  # only the anchor's unflagged row (0.8) is folded in
    assert float(fidelity.anchor_mean(c.correction.anchor_mean)) == pytest.approx(
        (1 - d) * 0.8 / (1 - d), rel=1e-6
    )
