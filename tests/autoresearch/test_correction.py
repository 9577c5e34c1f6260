"""The trainer's per-step correction (`wmrl.core.correct.correct_rewards`) against hand numbers:
anchors use real rewards, WM groups calibrated WM scores, ungraded trajectories are masked,
and the anchor weight reaches only the anchor groups' advantages. Plus the WM replay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wmrl.autoresearch.config import MODE_SPECS
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.state import Replay
from wmrl.core.correct import StepInputs, correct_rewards
from wmrl.core.debias import DebiasConfig, init_debias_state, update_debias
from wmrl.core.denoise import DenoiseConfig, DenoiseState
from wmrl.core.state import CorrectionState, init_correction_state

G = 3
# Two bins over [0, 1]. The pairs below put the points (mean WM score, mean real reward) of
# the bins at (0.15, 0) and (0.85, 1), so between them the fitted g(x) = (x - 0.15) / 0.7, and
# the map blends it with the identity (min_slope 0.05): f(x) = 0.95 g(x) + 0.05 x.
DEBIAS = DebiasConfig(mode="monotone", num_bins=2, min_pairs=4, refit_every=1, min_slope=0.05)


def cal(x):
    return 0.95 * (x - 0.15) / 0.7 + 0.05 * x


DENOISE = DenoiseConfig(half_life=4.0, warmup_groups=1, target=2.0, w_max=4.0)


def fitted_state() -> CorrectionState:
    deb = update_debias(
        init_debias_state(DEBIAS),
        jnp.array([0.1, 0.2, 0.8, 0.9]),
        jnp.array([0.0, 0.0, 1.0, 1.0]),
        None,
        jnp.ones(4, bool),
        DEBIAS,
    )
    assert bool(deb.monotone.fitted)
    return init_correction_state(DEBIAS).replace(debias=deb)


def numpy_grpo(r, valid):
    """GRPO advantages by hand: per group, standardise over the valid members."""
    out = np.zeros_like(r)
    for g in range(len(r) // G):
        sl = slice(g * G, (g + 1) * G)
        rg, vg = r[sl], valid[sl]
        if vg.sum() < 2:
            continue
        mean, std = rg[vg].mean(), rg[vg].std()
        out[sl] = np.where(vg, (rg - mean) / (std + 1e-6), 0.0)
    return out


# Three groups; group 1 is the anchor group. WM scores of groups 0 and 2 lie between the
# two points, so their calibrated values are cal(x).
R_WM = np.array([0.3, 0.5, 0.7, 0.6, 0.4, 0.35, 0.45, 0.65, 0.55], np.float32)
R_ENV = np.array([0, 0, 0, 0.2, 0.9, 0.5, 0, 0, 0], np.float32)
ANCHOR_GROUPS = np.array([False, True, False])
ANCHOR_ROWS = np.repeat(ANCHOR_GROUPS, G)


def run(correction, mode, env_valid=None, static=None):
    """(new correction state, the StepCorrection, its stats) of one step on the fixed rows."""
    inputs = StepInputs(
        r_wm=R_WM, r_env=R_ENV, env_valid=ANCHOR_ROWS if env_valid is None else env_valid,
        anchor_groups=ANCHOR_GROUPS, anchor_index=np.array([1]),
        static_mask=None if static is None else static >= 0, static_reward=static,
    )  # fmt: skip
    res = correct_rewards(
        correction, jax.tree.map(jnp.asarray, inputs), group_size=G, spec=MODE_SPECS[mode],
        debias_cfg=DEBIAS, denoise_cfg=DENOISE, normalize_std=True, baseline="mean",
    )  # fmt: skip
    return res.correction, res, res.stats


def test_anchors_use_real_rewards_and_wm_groups_calibrated_scores():
    _, out, stats = run(fitted_state(), "debias_only")
    expected = np.where(ANCHOR_ROWS, R_ENV, cal(R_WM))
    np.testing.assert_allclose(out.rewards, expected, atol=1e-6)
    np.testing.assert_allclose(out.advantages, numpy_grpo(expected, np.ones(9, bool)), atol=1e-5)
    assert bool(stats.calibrated)
    # wm_only uses the raw WM scores for the same groups
    _, raw, _ = run(fitted_state(), "wm_only")
    np.testing.assert_allclose(raw.rewards, np.where(ANCHOR_ROWS, R_ENV, R_WM), atol=1e-6)


def test_static_check_rows_take_the_exact_reward_and_stay_out_of_the_map():
    """Rows the environment fixes without executing take that reward in WM groups (a script
    that does not compile: 0; one that reads an undefined name: RUNTIME_ERROR's 0.1); an
    anchor row that is static keeps its real reward but is no pair for the monotone map."""
    static = np.full(9, -1.0)  # the static reward per row, -1 = none
    static[1] = 0.0  # a WM row of group 0: MALFORMED
    static[7] = 0.1  # a WM row of group 2: RUNTIME_ERROR
    static[5] = 0.0  # an anchor row (the trainer flags those whose real status is MALFORMED)
    state = init_correction_state(DEBIAS)
    new, out, _ = run(state, "debias_only", static=static)
    expected = np.where(ANCHOR_ROWS, R_ENV, R_WM)  # the map is not fitted yet: identity
    expected[1], expected[7] = 0.0, 0.1
    np.testing.assert_allclose(out.rewards, expected, atol=1e-6)  # anchors keep real ones
    np.testing.assert_allclose(out.advantages, numpy_grpo(expected, np.ones(9, bool)), atol=1e-5)
    # Pairs entering the map's window: the two non-static anchor rows (3 and 4), not row 5;
    # without the static rows all three enter.
    assert int(new.debias.monotone.size) == 2
    assert int(run(state, "debias_only")[0].debias.monotone.size) == 3


def test_ungraded_trajectories_are_masked_not_scored_zero():
    valid = ANCHOR_ROWS.copy()
    valid[4] = False  # the anchor group's middle script came back ungraded
    _, out, _ = run(fitted_state(), "debias_only", env_valid=valid)
    assert not bool(out.valid[4]) and float(out.advantages[4]) == 0.0
    # the other two anchors are standardised between themselves only: +1 and -1
    mask = np.ones(9, bool)
    mask[4] = False
    expected = numpy_grpo(np.where(ANCHOR_ROWS, R_ENV, cal(R_WM)), mask)
    np.testing.assert_allclose(out.advantages, expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.advantages)[[3, 5]], [-1.0, 1.0], atol=1e-4)


def test_anchor_weight_reaches_only_anchor_groups():
    frozen = DenoiseState(
        ema=jnp.float32(0.5), ema_norm=jnp.float32(1.0), num_groups=jnp.int32(10),
        scale=jnp.float32(3.0), frozen=jnp.bool_(True),
    )  # fmt: skip
    corr = fitted_state().replace(denoise=frozen)
    _, plain, _ = run(corr, "debias_only")
    _, weighted, stats = run(corr, "wmrl")
    w = float(stats.anchor_weight)
    # by hand: the anchor group's disagreement after calibration, folded into the EMA
    real = R_ENV[3:6]
    c = cal(R_WM[3:6])  # the anchor group's calibrated WM scores
    s2 = np.mean(((c - c.mean()) - (real - real.mean())) ** 2) / np.var(real)
    decay = 0.5 ** (1 / DENOISE.half_life)
    ema = (decay * 0.5 + (1 - decay) * s2) / (decay * 1.0 + (1 - decay))
    assert w == pytest.approx(min(max(1 + 3.0 * ema, 1.0), 4.0), rel=1e-4)
    assert w > 1.5
    adv_p, adv_w = np.asarray(plain.advantages), np.asarray(weighted.advantages)
    np.testing.assert_allclose(adv_w[ANCHOR_ROWS], w * adv_p[ANCHOR_ROWS], rtol=1e-5)
    np.testing.assert_array_equal(adv_w[~ANCHOR_ROWS], adv_p[~ANCHOR_ROWS])


def test_real_mode_diagnostics_do_not_touch_the_correction_state():
    state = init_correction_state(DEBIAS)
    new, _, stats = run(state, "real")
    assert float(stats.anchor_weight) == 1.0
    assert int(new.debias.monotone.size) == int(state.debias.monotone.size) == 0


def test_replay_keeps_only_graded_real_outcomes_and_wraps():
    rp = Replay.empty(capacity=3, width=2)
    rows = {"tokens": np.arange(8).reshape(4, 2), "input_mask": np.ones((4, 2), bool)}
    status = np.array([Status.VALID, Status.UNGRADED, Status.RUNTIME_ERROR, Status.VALID])
    rp = rp.add(rows, np.array([0.9, 0.0, 0.1, 0.7], np.float32), status.astype(np.int32))
    assert rp.count == 3 and rp.next == 0
    np.testing.assert_allclose(rp.target, [0.9, 0.1, 0.7])
    np.testing.assert_array_equal(rp.tokens[:, 0], [0, 4, 6])
    rp = rp.add(
        {k: v[:1] for k, v in rows.items()},
        np.array([0.5], np.float32),
        status[:1].astype(np.int32),
    )
    np.testing.assert_allclose(rp.target, [0.5, 0.1, 0.7])  # oldest overwritten
    back = jax.tree.unflatten(jax.tree.structure(rp), [np.asarray(x) for x in jax.tree.leaves(rp)])
    assert back.count == 3 and back.next == 1
    np.testing.assert_array_equal(
        back.class_label, [Status.VALID, Status.RUNTIME_ERROR, Status.VALID]
    )
