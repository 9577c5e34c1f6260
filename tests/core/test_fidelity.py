"""The WM stream's within-group agreement, collapse count, and the adaptive anchor fraction."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from wmrl.core import fidelity


@pytest.mark.parametrize("seed", range(4))
def test_masked_spearman_equals_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, size=12).astype(float)  # many ties
    y = x + rng.integers(0, 3, size=12)
    valid = rng.uniform(size=12) < 0.75
    got = float(fidelity.masked_spearman(jnp.asarray(x), jnp.asarray(y), jnp.asarray(valid)))
    want = stats.spearmanr(x[valid], y[valid]).statistic
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_within_group_spearman_undefined_groups_and_collapse():
    real = jnp.asarray([0.1, 0.5, 0.9, 0.7, 0.2, 0.2, 0.2, 0.2, 0.1, 0.5, 0.9, 0.7])
    stream = jnp.asarray([0.3, 0.4, 0.6, 0.5, 0.1, 0.2, 0.3, 0.4, 0.6, 0.6, 0.6, 0.6])
    raw = jnp.asarray([0.3, 0.4, 0.6, 0.5, 0.1, 0.2, 0.3, 0.4, 0.61, 0.62, 0.63, 0.64])
    learned = jnp.ones(12, bool)
    corr = np.asarray(fidelity.within_group_spearman(stream, real, learned, 4))
    np.testing.assert_allclose(corr[0], 1.0, rtol=1e-6)  # same order
    assert np.isnan(corr[1])  # real rewards all equal: nothing to rank
    assert np.isnan(corr[2])  # stream flat: undefined as a correlation ...
    agree = np.asarray(fidelity.group_agreement(stream, real, learned, 4))
    assert agree[2] == 0.0 and np.isnan(agree[1])  # ... but no agreement for the fidelity rule
    assert int(fidelity.collapsed_groups(stream, raw, learned, 4)) == 1
    # a statically fixed row is left out: group 0 without its first row is still order 1
    learned = learned.at[0].set(False).at[9].set(False).at[10].set(False)
    np.testing.assert_allclose(
        fidelity.within_group_spearman(stream, real, learned, 4)[0], 1.0, rtol=1e-6
    )
    assert int(fidelity.collapsed_groups(stream, raw, learned, 4)) == 1  # rows 8 and 11 tie
    assert int(fidelity.collapsed_groups(stream, stream, learned, 4)) == 0  # raw tie too


def _stream(rng, quality, steps=40, groups=2, g=4):
    """Per step, `groups` anchor groups of real rewards and a WM stream of given quality."""
    cfg = fidelity.AdaptiveRhoConfig(rho=0.25, rho_min=0.125, rho_max=1.0)
    state = fidelity.init_adaptive_rho()
    rhos = []
    for _ in range(steps):
        real = rng.uniform(size=groups * g)
        if quality == "good":
            stream = real + 0.05 * rng.normal(size=real.shape)
        elif quality == "collapsed":
            stream = np.full(real.shape, 0.6)
        else:
            stream = rng.uniform(size=real.shape)
        corr = fidelity.group_agreement(
            jnp.asarray(stream), jnp.asarray(real), jnp.ones(real.shape, bool), g
        )
        state = fidelity.update_adaptive_rho(state, corr, cfg)
        rhos.append(float(fidelity.adaptive_rho(state, cfg)))
    return np.asarray(rhos), cfg


def test_adaptive_rho_falls_to_rho_min_for_a_good_wm_and_rises_for_a_collapsed_one():
    rng = np.random.default_rng(0)
    rhos, cfg = _stream(rng, "good")
    assert rhos[0] == cfg.rho  # warm-up: the configured target until 8 groups are measured
    np.testing.assert_allclose(rhos[-10:], cfg.rho_min, atol=1e-6)
    rhos, cfg = _stream(rng, "collapsed")
    np.testing.assert_allclose(rhos[-10:], cfg.rho_max, atol=1e-6)
    rhos, cfg = _stream(rng, "random", steps=200)
    assert rhos[-50:].mean() > 0.8  # agreement ~0: nearly every group executed


def test_adaptive_rho_ema_equals_a_sequential_numpy_ema():
    cfg = fidelity.AdaptiveRhoConfig(half_life=3.0, warmup_groups=0)
    rng = np.random.default_rng(2)
    state = fidelity.init_adaptive_rho()
    ema = norm = 0.0
    d = 0.5 ** (1 / 3.0)
    for _ in range(6):
        corr = rng.uniform(-1, 1, size=3)
        corr[rng.uniform(size=3) < 0.3] = np.nan
        state = fidelity.update_adaptive_rho(state, jnp.asarray(corr), cfg)
        for c in corr[~np.isnan(corr)]:
            ema, norm = d * ema + (1 - d) * c, d * norm + (1 - d)
    np.testing.assert_allclose(float(fidelity.agreement(state)), ema / norm, rtol=1e-5)
    t = np.clip((ema / norm - cfg.corr_low) / (cfg.corr_high - cfg.corr_low), 0, 1)
    want = cfg.rho_max - t * (cfg.rho_max - cfg.rho_min)
    np.testing.assert_allclose(float(fidelity.adaptive_rho(state, cfg)), want, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"rho_min": 0.6, "rho_max": 0.5}, "rho_min"),
        ({"rho": 1.5}, "rho"),
        ({"rho_max": -0.1}, "rho_max"),
        ({"rho": float("nan")}, "rho"),
        ({"corr_low": 0.5, "corr_high": 0.5}, "corr_low"),
    ],
)
def test_adaptive_rho_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"correction.{field}"):
        fidelity.AdaptiveRhoConfig(**kwargs)


def test_anchor_mean_is_the_prior_then_an_ema_of_unflagged_anchor_rewards():
    st = fidelity.init_anchor_mean(0.55)
    np.testing.assert_allclose(float(fidelity.anchor_mean(st)), 0.55)
    r = jnp.asarray([0.9, 0.1, 0.7, 0.5])
    st = fidelity.update_anchor_mean(st, r, jnp.asarray([True, False, True, True]), half_life=2)
    d = 0.5**0.5
    ema = norm = 0.0
    for x in (0.9, 0.7, 0.5):
        ema, norm = d * ema + (1 - d) * x, d * norm + (1 - d)
    np.testing.assert_allclose(float(fidelity.anchor_mean(st)), ema / norm, rtol=1e-6)
