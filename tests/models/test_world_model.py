"""World model: loss/metric maths vs hand numbers, per-member bootstrap masks, and a
synthetic task with a known target, known noise and an off-distribution probe."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from wmrl.models.config import TransformerConfig
from wmrl.models.sharding import make_mesh
from wmrl.models.train_steps import init_train_state, make_wm_train_step
from wmrl.models.world_model import (
    WorldModel,
    WorldModelConfig,
    bootstrap_weights,
    calibration_metrics,
    gaussian_nll,
    interval_ece,
    predict,
    spearman,
    wm_loss,
    wm_normalisers,
)

TRUNK = TransformerConfig(
    vocab_size=48, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, mlp_dim=64, max_len=16
)
WM = WorldModelConfig(trunk=TRUNK, num_members=5, num_classes=3, head_hidden=32)


def test_gaussian_nll_hand_numbers():
    # y=1, mu=0, v=e: 0.5*(log 2pi + 1 + 1/e)
    got = gaussian_nll(jnp.array(0.0), jnp.array(1.0), jnp.array(1.0))
    np.testing.assert_allclose(got, 0.5 * (math.log(2 * math.pi) + 1 + math.exp(-1)), rtol=1e-6)


def test_predict_fuses_by_inverse_variance():
    out = {"mean": jnp.array([[1.0], [3.0]]), "log_var": jnp.log(jnp.array([[1.0], [3.0]]))}
    p = predict(out)
    # weights 1 and 1/3: mu = (1 + 1) / (4/3) = 1.5, v = 3/4; spread Var(1,3) = 1; mean var 2
    np.testing.assert_allclose(p["score"], [1.5], rtol=1e-6)
    np.testing.assert_allclose(p["score_var"], [0.75], rtol=1e-6)
    np.testing.assert_allclose(p["epistemic_var"], [1.0], rtol=1e-6)
    np.testing.assert_allclose(p["predictive_var"], [3.0], rtol=1e-6)


def test_spearman_and_ece_against_independent_numbers():
    np.testing.assert_allclose(
        spearman(jnp.array([1.0, 2, 3, 4]), jnp.array([10.0, 20, 40, 30])), 0.8, rtol=1e-6
    )
    rng = np.random.default_rng(0)
    mu = rng.normal(size=20_000)
    sd = rng.uniform(0.5, 2.0, size=20_000)
    y = mu + sd * rng.normal(size=20_000)
    assert float(interval_ece(mu, sd**2, y)) < 0.01
    # intervals 3x too narrow: coverage(p) = erf(z_p / (3 sqrt 2)) with z_p the N(0,1) quantile
    levels = np.linspace(0.1, 0.9, 9)
    z = np.array([_ndtri((1 + p) / 2) for p in levels])
    expected = np.mean(np.abs([math.erf(zi / (3 * math.sqrt(2))) for zi in z] - levels))
    np.testing.assert_allclose(float(interval_ece(mu, (sd / 3) ** 2, y)), expected, atol=0.01)


def _ndtri(p):
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p else (lo, mid)
    return lo


def test_bootstrap_mask_zero_means_no_gradient_for_that_member():
    model = WorldModel(WM, rngs=nnx.Rngs(0))
    tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) + 4
    weights = jnp.ones((2, 5)).at[:, 1].set(0.0)
    batch = {
        "tokens": tokens,
        "input_mask": jnp.ones((2, 6), bool),
        "target": jnp.array([0.2, 0.7]),
        "member_weights": weights,
        "class_label": jnp.array([1, -1]),
    }
    norm = wm_normalisers(batch)
    assert float(norm["nll"]) == 8.0 and float(norm["ce"]) == 1.0

    def loss(m):
        return wm_loss(m(batch["tokens"], batch["input_mask"]), batch, norm)[0]

    grads = nnx.jit(nnx.grad(loss))(model)
    g = np.asarray(grads["head_w1"].get_value())
    assert np.all(g[1] == 0.0) and np.all(np.abs(g[[0, 2, 3, 4]]).sum(axis=(1, 2)) > 0)
    w = bootstrap_weights(jax.random.key(0), 4000, 5)
    assert abs(float(w.mean()) - 1.0) < 0.05 and not np.allclose(w[:, 0], w[:, 1])


def _synthetic(rng, n, lo, hi):
    """Tokens in [lo, hi) after a noise-flag token (2 = noisy, 3 = clean).

    target = fraction of the 6 body tokens below 14, noise sd 0.3 (noisy) / 0.03 (clean);
    class = count bucket {<2, <4, >=4} of those tokens.
    """
    body = rng.integers(lo, hi, (n, 6))
    noisy = rng.random(n) < 0.5
    tokens = np.concatenate([np.where(noisy, 2, 3)[:, None], body], axis=1).astype(np.int32)
    count = (body < 14).sum(axis=1)
    clean = count / 6.0
    sd = np.where(noisy, 0.3, 0.03)
    target = (clean + sd * rng.normal(size=n)).astype(np.float32)
    cls = np.digitize(count, [2, 4]).astype(np.int32)
    return tokens, clean, target, noisy, cls


@pytest.fixture(scope="module")
def trained():
    rng = np.random.default_rng(0)
    N = 4096
    tokens, _, target, _, cls = _synthetic(rng, N, 4, 24)
    weights = np.asarray(bootstrap_weights(jax.random.key(1), N, WM.num_members))
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    tx = optax.adam(3e-3)
    factory = lambda: WorldModel(WM, rngs=nnx.Rngs(0))
    graphdef, state = init_train_state(factory, tx, mesh)

    def batch(idx):
        return {
            "tokens": tokens[idx],
            "input_mask": np.ones((len(idx), 7), bool),
            "target": target[idx],
            "member_weights": weights[idx],
            "class_label": cls[idx],
        }

    step = make_wm_train_step(
        graphdef,
        tx,
        jax.tree.map(lambda x: x.sharding, state),
        batch(np.arange(128)),
        mesh,
        num_micro_batches=2,
    )
    first = None
    for i in range(400):
        state, metrics = step(state, batch(rng.integers(0, N, 128)))
        if i == 0:
            first = float(metrics["nll"][0] / metrics["nll"][1])
    last = float(metrics["nll"][0] / metrics["nll"][1])
    return (
        nnx.merge(graphdef, state.params),
        first,
        last,
        float(metrics["class_acc"][0] / metrics["class_acc"][1]),
    )


def test_synthetic_wm_learns_target_noise_and_uncertainty(trained):
    model, first_nll, last_nll, class_acc = trained
    assert last_nll < first_nll - 1.0
    rng = np.random.default_rng(123)  # held-out draw
    tokens, clean, target, noisy, _ = _synthetic(rng, 2000, 4, 24)
    mask = np.ones_like(tokens, bool)
    pred = predict(model(jnp.asarray(tokens), jnp.asarray(mask)))
    score = np.asarray(pred["score"])
    # learns the known target: error far below the spread of the target itself
    rmse = np.sqrt(np.mean((score - clean) ** 2))
    assert rmse < 0.35 * clean.std(), (rmse, clean.std())
    assert float(spearman(jnp.asarray(score), jnp.asarray(clean))) > 0.9
    # predicted (aleatoric) sd tracks the injected noise: 0.3 on noisy rows, 0.03 on clean
    sd = np.sqrt(np.asarray(pred["aleatoric_var"]))
    assert 0.24 < np.median(sd[noisy]) < 0.36, np.median(sd[noisy])
    assert np.median(sd[~noisy]) < 0.06, np.median(sd[~noisy])
    # members disagree more off-distribution (tokens never seen in training)
    ood_tokens, *_ = _synthetic(rng, 2000, 24, 44)
    ood = predict(model(jnp.asarray(ood_tokens), jnp.asarray(mask)))
    ratio = float(ood["epistemic_var"].mean() / pred["epistemic_var"].mean())
    assert ratio > 3.0, ratio
    cal = calibration_metrics(
        model, {"tokens": jnp.asarray(tokens), "input_mask": jnp.asarray(mask), "target": target}
    )
    # rank correlation with the noisy truth: close to the oracle that knows the clean target
    oracle = float(spearman(jnp.asarray(clean), jnp.asarray(target)))
    assert float(cal["ece"]) < 0.1 and float(cal["spearman"]) > oracle - 0.05
    assert class_acc > 0.6


def test_pairwise_rank_loss_hand_numbers_and_pairs():
    from wmrl.models.world_model import pairwise_rank_loss, ranked_pairs

    target = jnp.array([1.0, 0.0, 0.5, 0.9, 0.9, 0.2])
    group = jnp.array([0, 0, 0, 1, 1, -1])
    graded = jnp.array([True, True, True, True, True, True])
    pairs = np.asarray(ranked_pairs(target, group, graded))
    want = np.zeros((6, 6))
    want[0, 1] = want[0, 2] = want[2, 1] = 1.0  # group 1 is a tie, row 5 is in no group
    np.testing.assert_array_equal(pairs, want)
    mean = jnp.array([[0.2, 0.5, 0.1, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    total, count = pairwise_rank_loss(mean, jnp.asarray(pairs))
    sp = lambda x: math.log1p(math.exp(x))
    np.testing.assert_allclose(float(total), sp(0.3) + sp(-0.1) + sp(0.4) + 3 * sp(0.0), rtol=1e-6)
    assert float(count) == 6.0
    # an ungraded row forms no pair
    pairs = ranked_pairs(target, group, graded.at[2].set(False))
    assert float(jnp.sum(pairs)) == 1.0


def test_rank_loss_gradient_orders_a_group_the_nll_leaves_flat():
    """With targets whose group means equal the global mean, the ranking term's gradient
    raises the higher-reward row and lowers the other; the loss is added with rank_coef."""
    model = WorldModel(WM, rngs=nnx.Rngs(0))
    tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) + 4
    batch = {
        "tokens": tokens,
        "input_mask": jnp.ones((2, 6), bool),
        "target": jnp.array([0.9, 0.1]),
        "member_weights": jnp.ones((2, 5)),
        "group": jnp.array([3, 3]),
        "graded": jnp.array([True, True]),
    }
    norm = wm_normalisers(batch)
    assert float(norm["rank"]) == 5.0  # one ordered pair x 5 members
    out = model(batch["tokens"], batch["input_mask"])
    base, _ = wm_loss(out, batch, norm)
    with_rank, metrics = wm_loss(out, batch, norm, rank_coef=0.5)
    assert float(metrics["rank"][1]) == 5.0
    diff = np.asarray(out["mean"][:, 0] - out["mean"][:, 1])
    want = 0.5 * np.mean(np.log1p(np.exp(-diff)))
    np.testing.assert_allclose(float(with_rank - base), want, rtol=1e-5)

    def rank_term(mean):
        o = {**out, "mean": mean}
        return wm_loss(o, batch, norm, rank_coef=1.0)[0] - wm_loss(o, batch, norm)[0]

    g = np.asarray(jax.grad(rank_term)(out["mean"]))
    assert np.all(g[:, 0] < 0) and np.all(g[:, 1] > 0)  # descent raises row 0, lowers row 1
