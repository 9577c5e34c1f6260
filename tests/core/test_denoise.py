"""Inverse-variance fusion and stream-level denoising."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wmrl.core import denoise


def test_fused_variance_is_harmonic_and_below_plain_average():
    rng = np.random.default_rng(0)
    v = rng.uniform(0.1, 3.0, size=(5, 7))  # 5 members, 7 trajectories
    mu = rng.normal(size=(5, 7))
    m, var, epi = denoise.fuse_ensemble(jnp.asarray(mu), jnp.log(jnp.asarray(v)))
    np.testing.assert_allclose(var, 1 / (1 / v).sum(0), rtol=1e-5)
    np.testing.assert_allclose(m, (mu / v).sum(0) / (1 / v).sum(0), rtol=1e-5)
    np.testing.assert_allclose(epi, mu.var(0), rtol=1e-5)
    plain_var = v.sum(0) / 25.0  # variance of the plain mean of 5 independent estimates
    assert np.all(np.asarray(var) <= plain_var + 1e-7)
    eq = np.full((5, 7), 0.7)
    _, var_eq, _ = denoise.fuse_ensemble(jnp.asarray(mu), jnp.log(jnp.asarray(eq)))
    np.testing.assert_allclose(var_eq, eq.sum(0) / 25.0, rtol=1e-5)


def test_fusion_weights_invariant_to_variance_rescaling():
    rng = np.random.default_rng(1)
    mu = jnp.asarray(rng.normal(size=(4, 3)))
    lv = jnp.asarray(rng.normal(size=(4, 3)))
    a, va, _ = denoise.fuse_ensemble(mu, lv)
    b, vb, _ = denoise.fuse_ensemble(mu, lv + np.log(1e3))
    np.testing.assert_allclose(a, b, rtol=1e-5)
    np.testing.assert_allclose(vb, 1e3 * np.asarray(va), rtol=1e-4)


def test_fusion_lowers_empirical_error():
    """Monte-Carlo check: fusing heads of different noise beats their plain average."""
    rng = np.random.default_rng(2)
    scales = np.array([0.1, 0.5, 1.0, 2.0])
    truth = 0.3
    draws = truth + scales[:, None] * rng.normal(size=(4, 20000))
    fused, _, _ = denoise.fuse_ensemble(
        jnp.asarray(draws), jnp.log(jnp.asarray(np.broadcast_to(scales[:, None] ** 2, (4, 20000))))
    )
    assert np.var(np.asarray(fused)) < 0.5 * np.var(draws.mean(0))
    np.testing.assert_allclose(np.var(np.asarray(fused)), 1 / (1 / scales**2).sum(), rtol=0.05)


def test_cross_sample_weights_mean_one_per_group():
    w = denoise.cross_sample_weights(jnp.array([1.0, 2.0, 4.0, 4.0]), 2)
    np.testing.assert_allclose(w, [4 / 3, 2 / 3, 1, 1], rtol=1e-5)


def test_disagreement_hand_numbers_and_degenerate_groups():
    d = jnp.array([[0.0, 1.0], [5.0, 5.0], [0.0, 0.0]])
    s = jnp.array([[0.0, 2.0], [1.0, 3.0], [1.0, 1.0]])
    s2, valid = denoise.group_disagreement(d, s)
    # group 0: d-centred (-.5,.5), s-centred (-1,1): mean((.5)^2)=.25 / var 1 -> .25
    # group 1: d-centred 0, s-centred (-1,1): 1/1 = 1; group 2 degenerate
    np.testing.assert_allclose(s2, [0.25, 1.0, 0.0])
    assert list(np.asarray(valid)) == [True, True, False]


def test_anchor_weight_one_before_warmup_then_within_bounds():
    cfg = denoise.DenoiseConfig(half_life=8, warmup_groups=4, target=2.0, w_max=4.0)
    st = denoise.init_denoise_state()
    rng = np.random.default_rng(3)
    s = rng.normal(size=(3, 6))
    d = s + 0.5 * rng.normal(size=(3, 6))
    st = denoise.update_denoise(st, jnp.asarray(d), jnp.asarray(s), cfg)
    assert float(denoise.anchor_weight(st, cfg)) == 1.0
    # degenerate groups do not advance the warm-up
    st_deg = denoise.update_denoise(st, jnp.ones((5, 6)), jnp.ones((5, 6)), cfg)
    assert int(st_deg.num_groups) == 3 and float(denoise.anchor_weight(st_deg, cfg)) == 1.0
    st = denoise.update_denoise(st, jnp.asarray(d[:1]), jnp.asarray(s[:1]), cfg)
    assert bool(st.frozen)
    # right at freezing, the weight equals the target
    np.testing.assert_allclose(denoise.anchor_weight(st, cfg), 2.0, rtol=1e-5)
    # much worse WM -> weight grows but is capped; perfect WM -> weight decays towards 1
    for _ in range(10):
        st_bad = denoise.update_denoise(
            st, jnp.asarray(d + 10 * rng.normal(size=d.shape)), jnp.asarray(s), cfg
        )
        st_good = denoise.update_denoise(st, jnp.asarray(s), jnp.asarray(s), cfg)
        st = st_good
    w_bad = float(denoise.anchor_weight(st_bad, cfg))
    assert 1.0 <= w_bad <= 4.0 and w_bad == pytest.approx(4.0)
    assert 1.0 <= float(denoise.anchor_weight(st, cfg)) < 1.05


def test_ema_is_startup_corrected_with_half_life():
    cfg = denoise.DenoiseConfig(half_life=2, warmup_groups=100)
    st = denoise.init_denoise_state()
    d = jnp.array([[0.0, 1.0]])
    s = jnp.array([[0.0, 2.0]])  # s2 = 0.25
    st = denoise.update_denoise(st, d, s, cfg)
    np.testing.assert_allclose(denoise.smoothed_disagreement(st), 0.25, rtol=1e-6)
    st = denoise.update_denoise(st, jnp.array([[0.0, 0.0]]), s, cfg)  # s2 = 1
    a = 0.5**0.5
    expected = (a * (1 - a) * 0.25 + (1 - a) * 1.0) / (1 - a**2)
    np.testing.assert_allclose(denoise.smoothed_disagreement(st), expected, rtol=1e-5)


def test_update_is_jittable():
    cfg = denoise.DenoiseConfig()
    f = jax.jit(lambda st, d, s: denoise.update_denoise(st, d, s, cfg))
    st = f(denoise.init_denoise_state(), jnp.zeros((2, 4)), jnp.arange(8.0).reshape(2, 4))
    assert int(st.num_groups) == 2


@pytest.mark.parametrize(
    "kwargs,field", [({"half_life": 0}, "half_life"), ({"w_max": 0.5}, "w_max")]
)
def test_config_errors_name_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        denoise.DenoiseConfig(**kwargs)


def test_batched_update_equals_sequential_numpy():
    cfg = denoise.DenoiseConfig(half_life=5, warmup_groups=7, target=2.0)
    rng = np.random.default_rng(5)
    st = denoise.init_denoise_state()
    d_ = 0.5 ** (1 / 5)
    ema = norm = 0.0
    n, scale, frozen = 0, 0.0, False
    for _ in range(3):
        s = rng.normal(size=(4, 5))
        d = s + rng.normal(size=(4, 5)) * rng.uniform(0.1, 2, size=(4, 1))
        s[1] = 1.0  # a degenerate group
        st = denoise.update_denoise(st, jnp.asarray(d), jnp.asarray(s), cfg)
        for g in range(4):
            sc = s[g] - s[g].mean()
            if np.mean(sc**2) <= 1e-8:
                continue
            dc = d[g] - d[g].mean()
            x = np.mean((dc - sc) ** 2) / np.mean(sc**2)
            ema, norm, n = d_ * ema + (1 - d_) * x, d_ * norm + (1 - d_), n + 1
            if not frozen and n >= 7:
                scale, frozen = 1.0 / (ema / norm), True
    assert int(st.num_groups) == n and bool(st.frozen) == frozen
    np.testing.assert_allclose(denoise.smoothed_disagreement(st), ema / norm, rtol=1e-5)
    np.testing.assert_allclose(st.scale, scale, rtol=1e-5)


@pytest.mark.parametrize("warmup_s2", ["zero", "rounding"])
def test_no_freeze_while_the_stream_agrees_exactly(warmup_s2):
    """A warm-up of exactly agreeing (s2 = 0) or rounding-level (s2 ~ 1e-14) anchor groups has no
    `c` with 1 + c * s2 = target: the weight stays 1 and `c` freezes at the first measurable
    disagreement, where the weight equals the target (not c = 0 forever, not c ~ 1e12)."""
    cfg = denoise.DenoiseConfig(half_life=2, warmup_groups=3, target=2.0, w_max=4.0)
    s = jnp.array([[0.0, 1.0]] * 5)
    d = s if warmup_s2 == "zero" else s.at[:, 1].set(1.0 + 2.0**-23)  # one float32 ulp off
    x0 = 0.0 if warmup_s2 == "zero" else float(((2.0**-24) ** 2) / 0.25)  # = 2**-46 / 0.25
    st = denoise.update_denoise(denoise.init_denoise_state(), d, s, cfg)
    assert int(st.num_groups) == 5 and not bool(st.frozen)
    np.testing.assert_allclose(denoise.smoothed_disagreement(st), x0, rtol=1e-3, atol=1e-30)
    assert float(denoise.anchor_weight(st, cfg)) == 1.0
    # the first real disagreement: d = (0, 1) against s = (0, 2) is s2 = 0.25
    st = denoise.update_denoise(st, jnp.array([[0.0, 1.0]]), jnp.array([[0.0, 2.0]]), cfg)
    a = 0.5**0.5
    s2_hat = (a * x0 * (1 - a**5) + (1 - a) * 0.25) / (1 - a**6)
    assert bool(st.frozen)
    np.testing.assert_allclose(st.scale, 1.0 / s2_hat, rtol=1e-5)
    np.testing.assert_allclose(denoise.anchor_weight(st, cfg), 2.0, rtol=1e-5)
    # a further agreeing group pulls the weight down towards 1, never to w_max
    st = denoise.update_denoise(st, s[:1], s[:1], cfg)
    w = float(denoise.anchor_weight(st, cfg))
    np.testing.assert_allclose(w, 1.0 + a * (1 - a**6) / (1 - a**7), rtol=1e-5)
    assert 1.0 < w < 2.0


def test_freeze_floor_must_be_positive():
    with pytest.raises(ValueError, match="freeze_floor"):
        denoise.DenoiseConfig(freeze_floor=0.0)
