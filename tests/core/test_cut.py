"""The correction of rows a cap cut (cost-aware routing, `wmrl.core.cut`), by hand: the cut
rows' map is fitted only on the anchor rows that ran past the cap, rows that finished under
the cap keep their real reward, and the control's cut rows share the past-cap anchors' mean.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from wmrl.core.correct import MODE_SPECS, StepInputs, correct_rewards
from wmrl.core.cut import init_cut_state
from wmrl.core.debias import DebiasConfig
from wmrl.core.denoise import DenoiseConfig
from wmrl.core.state import init_correction_state

G = 2
CFG = DebiasConfig(min_pairs=2, refit_every=1)  # equal-width bins, min_slope 0.05


def state(prior=0.5):
    s = init_correction_state(CFG, prior)
    return s.replace(cut=init_cut_state(CFG, prior))


def step(mode, st, *, r_wm, r_env, anchor_groups, real_rows, cut_mask, r_cut, past_cap):
    f = lambda v, dt=jnp.float32: jnp.asarray(np.asarray(v), dt)
    groups = np.asarray(anchor_groups)
    rows = np.repeat(groups, G)
    inputs = StepInputs(
        r_wm=f(r_wm), r_env=f(r_env), env_valid=f(rows, bool), anchor_groups=f(groups, bool),
        anchor_index=jnp.asarray(np.nonzero(groups)[0], jnp.int32),
        real_rows=f(real_rows, bool), cut_mask=f(cut_mask, bool), r_cut=f(r_cut),
        past_cap=f(past_cap, bool),
    )  # fmt: skip
    return correct_rewards(
        st, inputs, group_size=G, spec=MODE_SPECS[mode], debias_cfg=CFG,
        denoise_cfg=DenoiseConfig(), normalize_std=False, baseline="mean",
    )  # fmt: skip


# Step 1: groups 0 and 1 are anchors (rows 0-3). Rows 0 and 2 ran past the cap: their pairs
# (r_cut, r_env) = (0.25, 0.1) and (0.75, 0.9). Rows 1 and 3 finished under it, with pairs
# far off any line through the first two: (0.35, 1.0) and (0.3, 0.9). Rows 4-7 (groups 2, 3)
# ran under the cap: 4 and 6 finished (real 0.6, 0.7), 5 and 7 were cut.
STEP1 = dict(
    r_wm=[0.2, 0.4, 0.7, 0.3, 0.5, 0.5, 0.5, 0.5],
    r_env=[0.1, 1.0, 0.9, 0.9, 0.6, 0.0, 0.7, 0.0],
    anchor_groups=[True, True, False, False],
    real_rows=[False] * 4 + [True, False, True, False],
    cut_mask=[False] * 4 + [False, True, False, True],
    r_cut=[0.25, 0.35, 0.75, 0.3, 0.5, 0.35, 0.5, 0.6],
    past_cap=[True, False, True, False] + [False] * 4,
)


def test_the_cut_map_is_fitted_only_on_anchor_rows_past_the_cap():
    out = step("wmrl", state(), **STEP1)
    cut = out.correction.cut.debias.monotone
    # The cut window holds exactly the two past-cap pairs; the main map all four anchors'.
    assert int(cut.size) == 2 and int(out.correction.debias.monotone.size) == 4
    np.testing.assert_allclose(np.sort(np.asarray(cut.wm[:2])), [0.25, 0.75])
    np.testing.assert_allclose(np.sort(np.asarray(cut.env[:2])), [0.1, 0.9], atol=1e-7)
    assert bool(cut.fitted) and int(out.stats.cut_pairs) == 2
    assert not bool(out.stats.cut_calibrated)  # this step's cut rows: the map before, identity
    r = np.asarray(out.rewards)
    np.testing.assert_allclose(r[[0, 1, 2, 3]], STEP1["r_env"][:4], atol=1e-7)  # anchors real
    np.testing.assert_allclose(r[[4, 6]], [0.6, 0.7], atol=1e-7)  # finished under the cap
    np.testing.assert_allclose(r[[5, 7]], [0.35, 0.6], atol=1e-7)  # cut: r_cut, identity map

    # Step 2: a cut row with r_cut = 0.35 gets the map of the two past-cap pairs: linear
    # between (0.25, 0.1) and (0.75, 0.9) at 0.35 is 0.26, blended with the identity:
    # 0.95 * 0.26 + 0.05 * 0.35 = 0.2645. (Fitted on all four anchors it would not be.)
    nxt = dict(STEP1, past_cap=[False] * 8, r_cut=[0.5] * 5 + [0.35, 0.5, 0.5])
    out2 = step("wmrl", out.correction, **nxt)
    assert bool(out2.stats.cut_calibrated)
    assert float(out2.rewards[5]) == pytest.approx(0.95 * 0.26 + 0.05 * 0.35, abs=1e-6)
    # The cut row's value comes from r_cut through the cut map, not from r_wm.
    moved = dict(nxt, r_wm=[0.2, 0.4, 0.7, 0.3, 0.5, 0.9, 0.5, 0.5])
    again = step("wmrl", out.correction, **moved)
    assert float(again.rewards[5]) == pytest.approx(0.2645, abs=1e-6)


def test_static_anchors_cut_rows_share_the_past_cap_anchors_mean():
    one = dict(STEP1, past_cap=[False, False, True, False] + [False] * 4)  # row 2: 0.9
    out = step("static_anchors", state(prior=0.4), **one)
    r = np.asarray(out.rewards)
    np.testing.assert_allclose(r[[5, 7]], [0.4, 0.4], atol=1e-7)  # the prior, before any pair
    assert float(out.stats.cut_shared_reward) == pytest.approx(0.4)
    np.testing.assert_allclose(r[[4, 6]], [0.6, 0.7], atol=1e-7)
    out2 = step("static_anchors", out.correction, **one)
    # One past-cap pair so far, real reward 0.9 (the anchors under the cap, 1.0 and 0.9 and
    # 0.1, do not count): every cut row gets 0.9.
    np.testing.assert_allclose(np.asarray(out2.rewards)[[5, 7]], [0.9, 0.9], atol=1e-6)


def test_modes_without_debiasing_score_cut_rows_with_r_cut_as_it_is():
    out = step("wm_only", state(), **STEP1)
    np.testing.assert_allclose(np.asarray(out.rewards)[[5, 7]], [0.35, 0.6], atol=1e-7)
    assert int(out.correction.cut.debias.monotone.size) == 0  # nothing fitted


def test_without_cost_routing_the_correction_is_unchanged():
    st = init_correction_state(CFG, 0.5)
    base = {k: STEP1[k] for k in ("r_wm", "r_env", "anchor_groups")}
    f = lambda v, dt=jnp.float32: jnp.asarray(np.asarray(v), dt)
    groups = np.asarray(base["anchor_groups"])
    inputs = StepInputs(
        r_wm=f(base["r_wm"]), r_env=f(base["r_env"]), env_valid=f(np.repeat(groups, G), bool),
        anchor_groups=f(groups, bool), anchor_index=jnp.asarray([0, 1], jnp.int32),
    )  # fmt: skip
    out = correct_rewards(
        st, inputs, group_size=G, spec=MODE_SPECS["wmrl"], debias_cfg=CFG,
        denoise_cfg=DenoiseConfig(), normalize_std=False, baseline="mean",
    )  # fmt: skip
    assert out.correction.cut is None and "cut_pairs" not in out.stats.as_dict()
    np.testing.assert_allclose(np.asarray(out.rewards)[4:], [0.5] * 4)  # the WM stream
