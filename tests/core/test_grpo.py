"""GRPO maths against hand-computed numbers and numpy references."""

import jax.numpy as jnp
import numpy as np
import pytest

from wmrl.core import grpo


def test_group_advantages_hand_numbers():
    r = jnp.array([1.0, 3.0, 0.0, 0.0, 2.0, 4.0])
    adv = grpo.group_advantages(r, 2, eps=0.0)
    # (1,3): mean 2, std 1 -> (-1, 1); (0,0): all equal -> 0 even with eps=0; (2,4) -> (-1, 1)
    np.testing.assert_allclose(adv, [-1, 1, 0, 0, -1, 1], atol=1e-6)
    adv = grpo.group_advantages(r, 3, normalize_std=False)
    np.testing.assert_allclose(adv, [1 - 4 / 3, 3 - 4 / 3, -4 / 3, -2, 0, 2], atol=1e-6)


def test_advantages_sum_to_zero_and_match_numpy():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(8, 5))
    adv = np.asarray(grpo.group_advantages(jnp.asarray(r.reshape(-1)), 5)).reshape(8, 5)
    ref = (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(adv, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(adv.sum(1), 0, atol=1e-4)


def test_rloo_baseline():
    r = np.array([1.0, 2.0, 6.0])
    adv = grpo.group_advantages(jnp.asarray(r), 3, baseline="rloo", normalize_std=False)
    np.testing.assert_allclose(adv, [1 - 4, 2 - 3.5, 6 - 1.5], atol=1e-6)


def test_ungraded_are_masked_not_zero_scored():
    r = jnp.array([1.0, 3.0, 0.0, 100.0])
    valid = jnp.array([True, True, False, True])
    adv = grpo.group_advantages(r, 4, valid=valid, normalize_std=False)
    mean = (1 + 3 + 100) / 3
    np.testing.assert_allclose(adv, [1 - mean, 3 - mean, 0.0, 100 - mean], rtol=1e-6)
    # a group with a single valid member carries no signal
    adv = grpo.group_advantages(r, 2, valid=jnp.array([True, False, True, True]))
    assert float(adv[0]) == 0.0 and float(adv[1]) == 0.0


def test_group_size_must_divide():
    with pytest.raises(ValueError, match="group_size=4"):
        grpo.group_advantages(jnp.zeros(6), 4)


def test_affine_map_is_noop_after_standardisation():
    rng = np.random.default_rng(1)
    r = jnp.asarray(rng.normal(size=24))
    a = grpo.group_advantages(r, 6)
    b = grpo.group_advantages(3.0 * r + 7.0, 6)
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_anchor_weight_applies_to_anchor_groups_only():
    adv = jnp.arange(6.0)
    out = grpo.apply_anchor_weight(adv, 2, jnp.array([False, True, False]), 3.0)
    np.testing.assert_allclose(out, [0, 1, 6, 9, 4, 5])


def test_kl_estimators():
    logp = jnp.log(jnp.array([[0.2, 0.5]]))
    ref = jnp.log(jnp.array([[0.4, 0.5]]))
    k1 = grpo.kl_penalty(logp, ref, "k1")
    k3 = grpo.kl_penalty(logp, ref, "k3")
    np.testing.assert_allclose(k1, [[np.log(0.5), 0.0]], atol=1e-6)
    np.testing.assert_allclose(k3, [[2 - np.log(2) - 1, 0.0]], atol=1e-6)
    assert float(grpo.kl_penalty(logp, logp, "k3").sum()) == 0.0
    assert float(grpo.kl_penalty(logp, logp, "k1").sum()) == 0.0
    np.testing.assert_allclose(grpo.kl_penalty(logp, ref, "k3", clamp=0.1), [[0.1, 0.0]])


def test_k3_is_unbiased_estimate_of_kl():
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.3, 0.5])
    exact = float(np.sum(p * np.log(p / q)))
    rng = np.random.default_rng(0)
    a = rng.choice(3, size=200_000, p=p)
    k3 = np.asarray(grpo.kl_penalty(jnp.log(p[a]), jnp.log(q[a]), "k3"))
    assert abs(k3.mean() - exact) < 4 * k3.std() / np.sqrt(a.size)


def test_ppo_clip_loss_hand_numbers():
    old = jnp.zeros((1, 3))
    logp = jnp.log(jnp.array([[1.5, 0.5, 1.1]]))  # ratios 1.5, 0.5, 1.1
    mask = jnp.array([[1.0, 1.0, 0.0]])
    loss, m = grpo.token_policy_loss(logp, old, None, jnp.array([2.0]), mask, clip_eps=0.2)
    # A>0: -min(1.5*2, 1.2*2) = -2.4 ; -min(0.5*2, 0.8*2) = -1.0 ; third masked
    np.testing.assert_allclose(loss, -3.4, rtol=1e-6)
    s, c = m["clip_frac"]
    assert float(c) == 2 and float(s) == 1.0
    loss_neg, _ = grpo.token_policy_loss(logp, old, None, jnp.array([-1.0]), mask)
    # A<0: -min(-1.5, -1.2) = 1.5 ; -min(-0.5, -0.8) = 0.8
    np.testing.assert_allclose(loss_neg, 2.3, rtol=1e-6)


def test_kl_and_entropy_terms_and_metric_accumulation():
    logp = jnp.log(jnp.array([[0.2, 0.5]]))
    ref = jnp.log(jnp.array([[0.4, 0.5]]))
    mask = jnp.ones((1, 2))
    ent = jnp.array([[1.0, 2.0]])
    loss, m = grpo.token_policy_loss(
        logp, logp, ref, jnp.zeros(1), mask, kl_coef=0.5, entropy=ent, entropy_coef=0.1
    )
    np.testing.assert_allclose(loss, 0.5 * (1 - np.log(2)) - 0.1 * 3.0, rtol=1e-5)
    both = grpo.add_metrics(m, m)
    red = grpo.reduce_metrics(both)
    np.testing.assert_allclose(red["entropy"], 1.5)
    assert float(both["kl"][1]) == 4


@pytest.mark.parametrize("baseline", ["mean", "rloo"])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_all_equal_groups_get_exactly_zero(baseline, normalize_std):
    # float32 sums of eight 0.1s (or 0.2s, or 1e3 + 1e-4) do not divide back to the value: the
    # mean is an ulp off, and (ulp) / (std of an ulp + 1e-6) was an advantage of order 0.1.
    values = [0.1, 0.2, 0.3, 0.7, 1e3 + 1e-4, 1.0 / 3.0]
    r = np.repeat(np.float32(values), 8)
    mean32 = np.asarray(jnp.asarray(r).reshape(-1, 8).sum(1) / 8.0)
    assert np.all(mean32 != np.float32(values)), "each case must exercise the rounding"
    adv = grpo.group_advantages(
        jnp.asarray(r), 8, normalize_std=normalize_std, baseline=baseline, eps=1e-6
    )
    assert np.all(np.asarray(adv) == 0.0)


def test_all_equal_among_valid_rows_is_zero_and_masked_rows_do_not_count():
    # group 0: valid rows all 0.1, the masked row differs (and is NaN: ungraded) -> all zero;
    # group 1: valid rows 1e3 and 1e3 + 0.5 -> +-1 (population std 0.25), masked row 0;
    # group 2: one valid row -> 0.
    r = jnp.array([0.1, 0.1, np.nan, 0.1, 1e3, 1e3 + 0.5, 7.0, 1e3, 0.3, 0.9, 0.9, 0.9])
    valid = jnp.array([1, 1, 0, 1, 1, 1, 0, 1, 0, 1, 0, 0], bool)
    adv = np.asarray(grpo.group_advantages(jnp.nan_to_num(r), 4, valid=valid))
    # group 1: valid (1000, 1000.5, 1000): mean 1000 + 1/6, population std sqrt(1/18)
    sd = np.sqrt(1 / 18)
    expected_g1 = [(-1 / 6) / (sd + 1e-6), (1 / 3) / (sd + 1e-6), 0.0, (-1 / 6) / (sd + 1e-6)]
    np.testing.assert_array_equal(adv[:4], 0.0)
    np.testing.assert_allclose(adv[4:8], expected_g1, rtol=2e-3)
    np.testing.assert_array_equal(adv[8:], 0.0)


def test_nearly_equal_groups_are_not_zeroed():
    # 1e3 plus small noise is not an all-equal group: it keeps its ordering (float32 precision).
    rng = np.random.default_rng(0)
    r = (1e3 + 0.01 * rng.normal(size=(16, 8))).astype(np.float32)
    adv = np.asarray(grpo.group_advantages(jnp.asarray(r.reshape(-1)), 8)).reshape(16, 8)
    r64 = r.astype(np.float64)
    ref = (r64 - r64.mean(1, keepdims=True)) / (r64.std(1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(adv, ref, atol=0.05)
    assert np.all(np.argsort(adv, 1) == np.argsort(ref, 1))


def test_population_std_convention():
    # population std (divide by n): (1, 2, 3) has std sqrt(2/3), not the sample std 1.
    adv = grpo.group_advantages(jnp.array([1.0, 2.0, 3.0]), 3, eps=0.0)
    np.testing.assert_allclose(adv, [-np.sqrt(1.5), 0.0, np.sqrt(1.5)], rtol=1e-6)
