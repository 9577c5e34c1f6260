"""The bandit theory reproduction: expected qualitative results on the default problem."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.bandit import get_config
from wmrl.bandits import train as bt
from wmrl.bandits.experiment import run_suite
from wmrl.bandits.problem import make_problem
from wmrl.core import grpo

GAP_OF_WRONG_ARM = 1.0 - 0.9  # the WM's favourite arm (1) is 0.1 worse than the best arm (0)


@pytest.fixture(scope="module")
def suite():
    config = get_config()
    config.num_seeds = 16
    config.num_steps = 3000
    config.log_points = 30
    return run_suite(config)


def test_real_debias_and_wmrl_find_the_best_arm(suite):
    for v in ("real", "debias_only", "wmrl"):
        assert suite["variants"][v]["frac_seeds_optimal"] >= 0.9, v


def test_uncorrected_wm_plateaus_at_the_wrong_arms_gap(suite):
    for v in ("wm_only", "denoise_only"):
        s = suite["variants"][v]
        assert s["frac_seeds_optimal"] == 0.0, v
        assert abs(s["final_suboptimality"] - GAP_OF_WRONG_ARM) < 0.02, v
        assert s["steps_to_threshold"] is None


def test_global_monotone_map_keeps_the_wms_order_and_stays_trapped(suite):
    s = suite["variants"]["debias_monotone_only"]
    assert s["frac_seeds_optimal"] == 0.0
    assert s["final_suboptimality"] > 0.08


def test_wmrl_reaches_threshold_cheaper_than_real(suite):
    real = suite["variants"]["real"]["cost_to_threshold"]
    wmrl = suite["variants"]["wmrl"]["cost_to_threshold"]
    assert real is not None and wmrl is not None
    assert wmrl < real / 2  # real_cost = 10 in the default config


def test_constant_bias_behaves_like_no_bias(suite):
    s = suite["variants"]["constant_bias"]
    assert s["frac_seeds_optimal"] >= 0.9
    assert s["final_suboptimality"] < 0.02


def test_cross_arm_inverse_variance_weighting_fails_when_best_arm_is_noisiest(suite):
    noise = get_config().bandit.wm_noise
    assert int(np.argmax(noise)) == 0  # the best arm is the noisiest in the default
    s = suite["variants"]["cross_arm_iv"]
    assert s["frac_seeds_optimal"] <= 0.1
    assert s["final_suboptimality"] > 0.05


def test_cost_accounting_matches_hand_numbers(suite):
    cfg = get_config()
    steps = suite["_curves"]["steps"]
    b = cfg.bandit
    res = suite["_curves"]["results"]
    # real: every pull executed at real_cost
    np.testing.assert_allclose(res["real"]["curves"]["cost"][-1], steps[-1] * b.batch_size * 10)
    # wmrl, and wm_only (the same anchors, no correction): all pulls WM-scored
    # + round(0.1 * 8 groups) = 1 anchor group of 8 real pulls
    per_step = b.batch_size + 8 * 10
    for variant in ("wmrl", "wm_only"):
        np.testing.assert_allclose(res[variant]["curves"]["cost"][-1], steps[-1] * per_step)
    # constant_bias (the negative control): WM pulls only
    np.testing.assert_allclose(res["constant_bias"]["curves"]["cost"][-1], steps[-1] * b.batch_size)


def test_sample_level_fusion_lowers_gradient_variance_at_fixed_policy():
    config = get_config()
    problem = make_problem(config)
    params = bt.init_policy(problem)
    params["b"] = jnp.array([0.5, 0.3, 0.0, -0.2, -0.4])
    B, G = 64, 8

    def grad_sample(rng, fuse):
        """(noisy gradient, noise-free gradient on the same pulls)."""
        k_act, k_wm = jax.random.split(rng)
        x = jnp.zeros((B, 0))
        arms = jax.random.categorical(k_act, bt.policy_logits(params, x))
        bias = problem.wm_bias[arms]
        means, log_vars = bt.wm_heads(problem, k_wm, arms, x, bias)
        score, _ = bt.wm_score(means, log_vars, fuse)
        clean = problem.true_rewards[arms] + bias
        grad = lambda r: bt.policy_gradient(params, x, arms, grpo.group_advantages(r, G))["b"]
        return grad(score), grad(clean)

    keys = jax.random.split(jax.random.key(0), 4000)
    g_plain, clean = map(np.asarray, jax.vmap(lambda k: grad_sample(k, False))(keys))
    g_fused, clean2 = map(np.asarray, jax.vmap(lambda k: grad_sample(k, True))(keys))
    np.testing.assert_array_equal(clean, clean2)  # same keys -> same pulls
    # Variance the WM's noise adds to the gradient estimate (arm sampling held fixed) ...
    noise_plain = np.mean(np.sum((g_plain - clean) ** 2, axis=1))
    noise_fused = np.mean(np.sum((g_fused - clean) ** 2, axis=1))
    assert noise_fused < 0.6 * noise_plain, (noise_fused, noise_plain)
    # ... and the total Monte-Carlo variance, which also holds the arm-sampling part.
    assert g_fused.var(0).sum() < g_plain.var(0).sum()


def test_contextual_variant_runs_and_wmrl_beats_wm_only():
    config = get_config()
    config.bandit.contextual = True
    config.num_seeds = 8
    config.num_steps = 1500
    config.variants = ("wm_only", "wmrl")
    config.log_points = 10
    s = run_suite(config)["variants"]
    assert s["wmrl"]["final_suboptimality"] < s["wm_only"]["final_suboptimality"] - 0.02


@pytest.mark.parametrize("variant", ["wmrl", "debias_monotone_only"])
def test_jax_suite_agrees_with_independent_numpy_loop(variant):
    """Mid-training suboptimality of the JAX suite matches the numpy reference loop."""
    from wmrl.bandits.experiment import run_variant
    from wmrl.bandits.numpy_reference import run_numpy_variant

    config = get_config()
    config.num_steps = 400
    config.num_seeds = 64
    config.debias.min_pairs = 64  # let the monotone map switch on within 400 steps
    config.log_points = 4
    jax_sub = run_variant(config, variant)[0]["final_suboptimality"]
    np_sub = run_numpy_variant(config, variant, num_seeds=24, num_steps=400)["final_suboptimality"]
    se = np.sqrt(jax_sub.var() / jax_sub.size + np_sub.var() / np_sub.size)
    assert abs(jax_sub.mean() - np_sub.mean()) < 4 * se + 0.005, (jax_sub.mean(), np_sub.mean())


@pytest.mark.parametrize("fuse", [False, True])
def test_exact_law_score_sampling_matches_drawing_the_heads(fuse):
    """`wm_sampling="exact"` draws the combined score from the law of combining M heads."""
    problem = make_problem(get_config())
    n = 40000
    arms = jnp.asarray(np.repeat(np.arange(5), n // 5))
    x = jnp.zeros((n, 0))
    bias = problem.wm_bias[arms]
    k1, k2 = jax.random.split(jax.random.key(3))
    means, log_vars = bt.wm_heads(problem, k1, arms, x, bias)
    heads, var_h = bt.wm_score(means, log_vars, fuse)
    exact, var_e = bt.wm_score_exact(problem, jax.random.normal(k2, (n,)), arms, x, bias, fuse)
    np.testing.assert_allclose(var_h, var_e, rtol=1e-5)
    heads, exact, a = np.asarray(heads), np.asarray(exact), np.asarray(arms)
    for k in range(5):
        h, e = heads[a == k], exact[a == k]
        sd = np.sqrt(float(var_h[a == k][0]))
        mean = float(problem.true_rewards[k] + problem.wm_bias[k])
        for sample in (h, e):  # both unbiased with the reported spread (4 s.e. bounds)
            assert abs(sample.mean() - mean) < 4 * sd / np.sqrt(sample.size)
            assert abs(sample.std() / sd - 1) < 4 / np.sqrt(2 * sample.size)


def test_heads_sampling_mode_gives_the_same_suite_results():
    config = get_config()
    config.bandit.wm_sampling = "heads"
    config.num_seeds = 8
    config.num_steps = 2000
    config.variants = ("wm_only", "wmrl")
    config.log_points = 5
    s = run_suite(config)["variants"]
    assert s["wmrl"]["frac_seeds_optimal"] >= 0.9
    assert s["wm_only"]["frac_seeds_optimal"] == 0.0


def test_batched_refit_refits_exactly_the_seeds_that_are_due():
    """`refit_due_maps` (outside the vmap, under a cond) equals refitting each seed alone."""
    from wmrl.core import debias
    from wmrl.core.state import init_correction_state

    cfg = debias.DebiasConfig(mode="monotone", min_pairs=8, refit_every=8, capacity=32)
    rng = np.random.default_rng(0)
    corr = jax.vmap(lambda _: init_correction_state(cfg))(jnp.arange(3))
    # seed 0: nothing (not due); seed 1: 8 pairs (first fit due); seed 2: 4 pairs (not due)
    valid = jnp.asarray(np.arange(8)[None, :] < np.array([[0], [8], [4]]))
    x = jnp.asarray(rng.uniform(size=(3, 8)))
    append = jax.vmap(lambda m, a, v: debias.update_monotone_map(m, a, a**2, v, cfg, refit=False))
    corr = corr.replace(debias=corr.debias.replace(monotone=append(corr.debias.monotone, x, valid)))
    got = bt.refit_due_maps(corr, cfg).debias.monotone
    want = jax.vmap(lambda m: debias.refit_monotone_map(m, cfg))(corr.debias.monotone)
    np.testing.assert_array_equal(got.fitted, [False, True, False])
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # no seed due: the cond's skip branch leaves every map as it is
    nobody = corr.replace(debias=corr.debias.replace(monotone=got))
    same = bt.refit_due_maps(nobody, cfg).debias.monotone
    for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_old_anchor_fraction_name_still_works_and_says_it_is_rho():
    from wmrl.bandits.problem import anchor_rho, validate_bandit_config

    c = get_config()
    assert anchor_rho(c.bandit) == (0.1, "bandit.rho")
    c.bandit.anchor_fraction = 0.3
    with pytest.warns(FutureWarning, match=r"anchor_fraction is deprecated.*bandit\.rho"):
        assert anchor_rho(c.bandit) == (0.3, "bandit.anchor_fraction")
    with pytest.warns(FutureWarning):
        validate_bandit_config(c)
    assert c.bandit.anchor_fraction == 0.3 and c.bandit.rho == 0.1  # validation changes nothing
