"""The one rank helper, Spearman and ROC AUC (`wmrl.core.stats`) against hand numbers and
scipy, and the two interval methods over seeds (`wmrl.experiment.stats`) against hand
numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sp

from wmrl.core.stats import auc, ranks, spearman, within_group_auc
from wmrl.experiment.stats import mean_bootstrap_ci95, mean_ci95


def test_ranks_by_hand_ties_at_their_average_and_masked_entries_left_out():
    x = jnp.asarray([3.0, 1.0, 3.0, 2.0, 0.0])
    np.testing.assert_array_equal(ranks(x), [3.5, 1.0, 3.5, 2.0, 0.0])
    valid = jnp.asarray([True, True, True, False, False])
    # among {3, 1, 3}: 1 -> 0, the two 3s share ranks 1 and 2
    np.testing.assert_array_equal(ranks(x, valid), [1.5, 0.0, 1.5, 0.0, 0.0])


@pytest.mark.parametrize("seed", range(6))
def test_spearman_equals_scipy_on_random_inputs_with_ties_and_masks(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 40))
    if seed % 2:  # many ties
        x, y = rng.integers(0, 4, n).astype(np.float32), rng.integers(0, 3, n).astype(np.float32)
    else:
        x, y = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    want = sp.spearmanr(x, y).statistic
    np.testing.assert_allclose(float(spearman(jnp.asarray(x), jnp.asarray(y))), want, atol=2e-6)
    valid = rng.uniform(size=n) < 0.7
    valid[:3] = True
    got = spearman(jnp.asarray(x), jnp.asarray(y), jnp.asarray(valid))
    want = sp.spearmanr(x[valid], y[valid]).statistic
    if np.isnan(want):  # a masked side without variation
        assert np.isnan(float(got))
    else:
        np.testing.assert_allclose(float(got), want, atol=2e-6)
    jitted = jax.jit(spearman)(jnp.asarray(x), jnp.asarray(y), jnp.asarray(valid))
    np.testing.assert_allclose(float(jitted), float(got), atol=1e-6, equal_nan=True)


def test_spearman_undefined_is_nan_or_the_value_asked_for():
    flat, up = jnp.asarray([0.5, 0.5, 0.5]), jnp.asarray([0.1, 0.2, 0.3])
    assert np.isnan(float(spearman(flat, up)))  # no variation on one side
    assert float(spearman(flat, up, undefined=0.0)) == 0.0  # a pooled report's "no information"
    one = jnp.asarray([True, False, False])
    assert np.isnan(float(spearman(up, up, one)))  # fewer than two entries
    assert float(spearman(up, -up)) == pytest.approx(-1.0)
    # by hand: x ranks 0 1 2 3, y ranks 1 0 3 2 -> 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 0.6
    x, y = jnp.asarray([1.0, 2.0, 3.0, 4.0]), jnp.asarray([2.0, 1.0, 4.0, 3.0])
    assert float(spearman(x, y)) == pytest.approx(0.6, abs=1e-6)


def test_auc_by_hand_and_against_the_mann_whitney_statistic():
    # pos {0.9, 0.5} vs neg {0.1, 0.5}: 0.9 beats both, 0.5 beats 0.1 and ties 0.5
    assert auc(np.array([0.9, 0.1, 0.5, 0.5]), np.array([1, 0, 1, 0], bool)) == 0.875
    assert auc(np.array([0.3, 0.4]), np.array([True, True])) is None  # one class only
    rng = np.random.default_rng(3)
    s = rng.integers(0, 5, 50).astype(float)  # ties between the classes
    y = rng.uniform(size=50) < 0.4
    u = sp.mannwhitneyu(s[y], s[~y]).statistic  # counts ties one half
    assert auc(s, y) == pytest.approx(u / (y.sum() * (~y).sum()), abs=1e-12)


def test_within_group_auc_by_hand():
    scores = np.array([[0.9, 0.1, 0.5, 0.5], [0.2, 0.2, 0.2, 0.2], [0.3, 0.7, 0.1, 0.9]])
    success = np.array([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]]) > 0.5
    got, n = within_group_auc(scores, success)
    # group 1: pos {0.9, 0.5} vs neg {0.1, 0.5}: (1 + 1 + 1 + 0.5) / 4; group 2 skipped;
    # group 3: pos {0.3, 0.7} vs neg {0.1, 0.9}: (1 + 0 + 1 + 0) / 4
    assert n == 2 and got == pytest.approx((0.875 + 0.5) / 2)
    got, n = within_group_auc(scores[1:2], success[1:2])
    assert n == 0 and np.isnan(got)


def test_the_two_interval_methods_by_hand():
    t = mean_ci95([0.1, 0.3, 0.8])
    # Student t: mean 0.4, sd sqrt(0.13), half-width t_{0.975, 2} sqrt(0.13 / 3) = 0.895668
    assert t["ci95"] == pytest.approx([0.4 - 0.895668, 0.4 + 0.895668], abs=1e-5)
    b = mean_bootstrap_ci95([0.1, 0.3, 0.8, None])
    # the bootstrap can only resample the three values: a resample of one value thrice has
    # probability 1/27 > 2.5%, so the interval is [min, max] = [0.1, 0.8], far narrower
    assert b["mean"] == pytest.approx(0.4) and b["n"] == 3 and b["per_seed"][-1] is None
    assert b["ci95"] == pytest.approx([0.1, 0.8], abs=1e-12)
    assert b["ci95"][1] - b["ci95"][0] < t["ci95"][1] - t["ci95"][0]
    assert mean_bootstrap_ci95([5.0, 5.0])["ci95"] == [5.0, 5.0]
