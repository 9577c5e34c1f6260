"""The world model's observation heads: runtime (censored log-normal) and the time-out-aware
score, on hand numbers; and a tiny training run in which the heads learn a planted signal."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from wmrl.envs.autoresearch.grader import Status
from wmrl.models.config import TransformerConfig
from wmrl.models.sharding import make_mesh
from wmrl.models.train_steps import init_train_state, make_wm_score_fn, make_wm_train_step
from wmrl.models.world_model import (
    WorldModel,
    WorldModelConfig,
    censored_gaussian_nll,
    gaussian_nll,
    predict,
    timeout_probability,
    wm_loss,
    wm_normalisers,
)
from wmrl.rl import models

TRUNK = TransformerConfig(
    vocab_size=48, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, mlp_dim=64, max_len=16
)
WM_RT = WorldModelConfig(trunk=TRUNK, num_members=3, num_classes=6, head_hidden=32,
                         runtime_head=True, timeout_reward=0.1)  # fmt: skip


def _phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def test_censored_nll_and_timeout_probability_hand_numbers():
    mu, lv, y = jnp.array([0.0, 0.0]), jnp.log(jnp.array([4.0, 4.0])), jnp.array([1.0, 1.0])
    got = censored_gaussian_nll(mu, lv, y, jnp.array([False, True]))
    np.testing.assert_allclose(got[0], gaussian_nll(0.0, math.log(4.0), 1.0), rtol=1e-6)
    # censored: -log P(y > 1) with sd 2 = -log(1 - Phi(0.5))
    np.testing.assert_allclose(got[1], -math.log(1 - _phi(0.5)), rtol=1e-5)
    p = timeout_probability(jnp.log(jnp.array([10.0, 10.0, 10.0])), jnp.zeros(3),
                            jnp.array([10.0, 10.0 * math.e, jnp.inf]))  # fmt: skip
    np.testing.assert_allclose(p, [0.5, 1 - _phi(1.0), 0.0], atol=1e-6)


def test_predict_mixes_the_timeout_reward_in_by_p_timeout():
    out = {
        "mean": jnp.array([[0.9, 0.9]]), "log_var": jnp.zeros((1, 2)),
        "runtime_mean": jnp.log(jnp.array([30.0, 1.0])), "runtime_log_var": jnp.zeros(2),
    }  # fmt: skip
    p = predict(out, jnp.array([30.0, 30.0]), timeout_reward=0.1)
    # row 0: median runtime at the limit -> p = 0.5 -> 0.5 * 0.9 + 0.5 * 0.1 = 0.5
    p1 = 1 - _phi(math.log(30.0))  # row 1: log(30) sds below the limit
    np.testing.assert_allclose(p["p_timeout"], [0.5, p1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(p["score"], [0.5, (1 - p1) * 0.9 + p1 * 0.1], rtol=1e-5)
    np.testing.assert_allclose(p["score_raw"], [0.9, 0.9], rtol=1e-6)
    np.testing.assert_allclose(p["runtime_s"], [30.0, 1.0], rtol=1e-5)
    assert "p_timeout" not in predict(out)  # no limit given: the reward head's score alone
    np.testing.assert_allclose(predict(out)["score"], [0.9, 0.9], rtol=1e-6)


def test_wm_batch_runtime_targets_and_timeouts_out_of_the_reward_fit():
    status = np.array([Status.VALID, Status.TIMEOUT, Status.MALFORMED, Status.RUNTIME_ERROR,
                       Status.UNGRADED], np.int32)  # fmt: skip
    rows = {
        "tokens": np.ones((5, 4), np.int32), "input_mask": np.ones((5, 4), bool),
        "target": np.array([0.8, 0.1, 0.0, 0.1, 0.0], np.float32),
        "class_label": status, "valid": status != Status.UNGRADED,
        "runtime": np.array([2.0, 15.0, np.nan, 0.001, 3.0], np.float32),
        "group": np.zeros(5, np.int32),
    }  # fmt: skip
    idx = np.arange(5)
    b = models.wm_batch(rows, idx, np.random.default_rng(0), 50, runtime=True)
    np.testing.assert_array_equal(b["runtime_mask"], [1, 1, 0, 1, 0])
    np.testing.assert_array_equal(b["timed_out"], [False, True, False, False, False])
    np.testing.assert_allclose(b["log_runtime"][[0, 1, 3]], np.log([2.0, 15.0, 0.01]), rtol=1e-6)
    assert (b["member_weights"][[1, 4]] == 0).all() and b["member_weights"][0].sum() > 0
    np.testing.assert_array_equal(b["graded"], [True, False, True, True, False])
    plain = models.wm_batch(rows, idx, np.random.default_rng(0), 50)
    assert "runtime_mask" not in plain and plain["member_weights"][1].sum() > 0
    np.testing.assert_array_equal(plain["member_weights"][0], b["member_weights"][0])  # same rng


def test_runtime_loss_term_equals_the_masked_mean_of_censored_nll():
    model = WorldModel(WM_RT, rngs=nnx.Rngs(0))
    batch = {
        "tokens": jnp.arange(16, dtype=jnp.int32).reshape(4, 4) + 4,
        "input_mask": jnp.ones((4, 4), bool), "target": jnp.array([0.2, 0.7, 0.5, 0.1]),
        "member_weights": jnp.ones((4, 3)), "class_label": jnp.array([5, 5, 2, 1]),
        "log_runtime": jnp.log(jnp.array([1.0, 2.0, 15.0, 1.0])),
        "runtime_mask": jnp.array([1.0, 1.0, 1.0, 0.0]),
        "timed_out": jnp.array([False, False, True, False]),
    }  # fmt: skip
    out = model(batch["tokens"], batch["input_mask"])
    assert out["runtime_mean"].shape == (4,) and out["runtime_log_var"].shape == (4,)
    norm = wm_normalisers(batch)
    base, _ = wm_loss(out, batch, norm)
    with_rt, metrics = wm_loss(out, batch, norm, runtime_coef=0.5)
    mu, lv = np.asarray(out["runtime_mean"]), np.asarray(out["runtime_log_var"])
    y, sd = np.log([1.0, 2.0, 15.0]), np.exp(0.5 * lv[:3])
    nll = [0.5 * (math.log(2 * math.pi) + lv[i] + (y[i] - mu[i]) ** 2 / sd[i] ** 2)
           for i in range(2)]  # fmt: skip
    nll.append(-math.log(1 - _phi((y[2] - mu[2]) / sd[2])))
    np.testing.assert_allclose(float(with_rt - base), 0.5 * np.mean(nll), rtol=1e-4)
    assert float(metrics["runtime_nll"][1]) == 3.0 and float(metrics["runtime_log_mae"][1]) == 2.0


def test_runtime_head_params_exist_only_when_on():
    cfg = WorldModelConfig(trunk=TRUNK, num_members=3, num_classes=6)
    plain = nnx.to_pure_dict(nnx.state(WorldModel(cfg, rngs=nnx.Rngs(0))))
    on = nnx.to_pure_dict(nnx.state(WorldModel(WM_RT, rngs=nnx.Rngs(0))))
    assert not any(k.startswith("runtime_") for k in plain)
    assert set(on) - set(plain) == {"runtime_w1", "runtime_b1", "runtime_w2", "runtime_b2"}


def _planted(rng, n):
    """Token 1 (of 4..11) sets the log runtime (linear, noise sd 0.2) under a 20 s limit:
    the slowest codes time out, recorded at the limit (censored)."""
    tokens = rng.integers(4, 40, (n, 6)).astype(np.int32)
    code = rng.integers(4, 12, n)
    tokens[:, 1] = code
    log_rt = (code - 4) * 0.6 - 1.0 + 0.2 * rng.normal(size=n)
    timed_out = log_rt > math.log(20.0)
    log_rt = np.minimum(log_rt, math.log(20.0))
    return tokens, log_rt.astype(np.float32), timed_out


@pytest.fixture(scope="module")
def trained_runtime():
    rng = np.random.default_rng(0)
    tokens, log_rt, timed_out = _planted(rng, 2048)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    tx = optax.adam(3e-3)
    graphdef, state = init_train_state(lambda: WorldModel(WM_RT, rngs=nnx.Rngs(0)), tx, mesh)
    status = np.where(timed_out, int(Status.TIMEOUT), int(Status.VALID)).astype(np.int32)

    def batch(idx):
        return {
            "tokens": tokens[idx], "input_mask": np.ones((len(idx), 6), bool),
            "target": np.full(len(idx), 0.5, np.float32),
            "member_weights": np.ones((len(idx), 3), np.float32), "class_label": status[idx],
            "log_runtime": log_rt[idx], "runtime_mask": np.ones(len(idx), np.float32),
            "timed_out": timed_out[idx],
        }  # fmt: skip

    shard = jax.tree.map(lambda x: x.sharding, state)
    step = make_wm_train_step(graphdef, tx, shard, batch(np.arange(64)), mesh, runtime_coef=1.0)
    for _ in range(150):
        state, _ = step(state, batch(rng.integers(0, len(tokens), 64)))
    return graphdef, state, shard, mesh


def test_the_runtime_head_learns_a_planted_runtime_and_its_timeouts(trained_runtime):
    graphdef, state, shard, mesh = trained_runtime
    tokens, log_rt, timed_out = _planted(np.random.default_rng(1), 512)
    score = make_wm_score_fn(graphdef, shard, mesh)
    out = score(state.params, tokens, np.ones(tokens.shape, bool), np.full(512, 20.0))
    pred = np.log(np.asarray(out["runtime_s"]))
    done = ~timed_out
    # Chance is 0 with a null sd of 1/sqrt(n) ~ 0.05: 0.5 is a 10-sd margin (the planted
    # code explains ~97% of the variance; a tiny mean-pooled trunk gets ~0.8 in 150 steps).
    corr = np.corrcoef(pred[done], log_rt[done])[0, 1]
    assert corr > 0.5, corr
    # AUC: chance 0.5, null sd ~ sqrt((n1 + n0 + 1) / (12 n1 n0)) < 0.05 here: 0.8 is > 6 sd.
    p = np.asarray(out["p_timeout"])
    auc = (p[timed_out][:, None] > p[done][None, :]).mean()
    assert timed_out.sum() > 20 and auc > 0.8, auc
    # a tighter limit makes every script more likely to time out, and lowers its score
    tight = score(state.params, tokens, np.ones(tokens.shape, bool), np.full(512, 2.0))
    assert (np.asarray(tight["p_timeout"]) >= p - 1e-6).all()
    slow = tokens[:, 1] >= 10
    assert np.asarray(tight["score"])[slow].mean() < np.asarray(out["score"])[slow].mean()
