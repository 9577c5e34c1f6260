"""The world model's observation heads: runtime (censored log-normal) and the time-out-aware
score, on hand numbers; and a tiny training run in which the heads learn a planted signal."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from wmrl.autoresearch import model_setup
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.observation import ERROR_TYPES
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
    b = model_setup.wm_batch(rows, idx, np.random.default_rng(0), 50, runtime=True)
    np.testing.assert_array_equal(b["runtime_mask"], [1, 1, 0, 1, 0])
    np.testing.assert_array_equal(b["timed_out"], [False, True, False, False, False])
    np.testing.assert_allclose(b["log_runtime"][[0, 1, 3]], np.log([2.0, 15.0, 0.01]), rtol=1e-6)
    assert (b["member_weights"][[1, 4]] == 0).all() and b["member_weights"][0].sum() > 0
    np.testing.assert_array_equal(b["graded"], [True, False, True, True, False])
    plain = model_setup.wm_batch(rows, idx, np.random.default_rng(0), 50)
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


ERRORS = ("NameError", "KeyError", "ValueError", "TypeError")
PLANTED = (Status.RUNTIME_ERROR, Status.NO_SUBMISSION, Status.INVALID_SUBMISSION, Status.VALID)


def _planted(rng, n):
    """Each field set by one token (the rest noise): token 1 (of 4..11) the log runtime
    (linear, noise sd 0.2) under a 20 s limit, the slowest codes time out (recorded at the
    limit: censored) and are TIMEOUT; token 2 the status otherwise (one of `PLANTED`); token 3
    the exception class of a RUNTIME_ERROR (one of `ERRORS`); token 4 the validation metric of
    a VALID script."""
    tokens = rng.integers(24, 44, (n, 6)).astype(np.int32)
    code = rng.integers(4, 12, n)
    s_code, e_code, v_code = rng.integers(0, 4, n), rng.integers(0, 4, n), rng.integers(0, 4, n)
    tokens[:, 1], tokens[:, 2], tokens[:, 3] = code, 12 + s_code, 16 + e_code
    tokens[:, 4] = 20 + v_code
    log_rt = (code - 4) * 0.6 - 1.0 + 0.2 * rng.normal(size=n)
    timed_out = log_rt > math.log(20.0)
    status = np.where(timed_out, int(Status.TIMEOUT), np.array([int(s) for s in PLANTED])[s_code])
    error = np.where(status == int(Status.RUNTIME_ERROR),
                     np.array([ERROR_TYPES.index(e) for e in ERRORS])[e_code], -1)  # fmt: skip
    validation = np.where(status == int(Status.VALID), 0.6 + 0.1 * v_code, np.nan)
    return {
        "tokens": tokens, "log_runtime": np.minimum(log_rt, math.log(20.0)).astype(np.float32),
        "timed_out": timed_out, "status": status.astype(np.int32),
        "error_type": error.astype(np.int32), "validation": validation.astype(np.float32),
    }  # fmt: skip


WM_ALL = dataclasses.replace(WM_RT, num_error_types=len(ERROR_TYPES), validation_head=True)


@pytest.fixture(scope="module")
def trained():
    rng = np.random.default_rng(0)
    d = _planted(rng, 2048)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    tx = optax.adam(3e-3)
    graphdef, state = init_train_state(lambda: WorldModel(WM_ALL, rngs=nnx.Rngs(0)), tx, mesh)

    def batch(idx):
        v = d["validation"][idx]
        return {
            "tokens": d["tokens"][idx], "input_mask": np.ones((len(idx), 6), bool),
            "target": np.full(len(idx), 0.5, np.float32),
            "member_weights": np.ones((len(idx), 3), np.float32), "class_label": d["status"][idx],
            "log_runtime": d["log_runtime"][idx], "runtime_mask": np.ones(len(idx), np.float32),
            "timed_out": d["timed_out"][idx], "error_type": d["error_type"][idx],
            "validation": np.nan_to_num(v), "validation_mask": np.isfinite(v).astype(np.float32),
        }  # fmt: skip

    shard = jax.tree.map(lambda x: x.sharding, state)
    step = make_wm_train_step(graphdef, tx, shard, batch(np.arange(64)), mesh, runtime_coef=1.0,
                              error_type_coef=1.0, validation_coef=1.0)  # fmt: skip
    for _ in range(200):
        state, _ = step(state, batch(rng.integers(0, 2048, 64)))
    score = make_wm_score_fn(graphdef, shard, mesh)
    test = _planted(np.random.default_rng(1), 512)
    limits = np.full(512, 20.0)
    out = score(state.params, test["tokens"], np.ones(test["tokens"].shape, bool), limits,
                outputs=True)  # fmt: skip
    return {"score": score, "params": state.params, "test": test, "out": out}


def test_the_runtime_head_learns_a_planted_runtime_and_its_timeouts(trained):
    test, out = trained["test"], trained["out"]
    pred = np.log(np.asarray(out["runtime_s"]))
    done = ~test["timed_out"]
    # Chance is 0 with a null sd of 1/sqrt(n) ~ 0.05: 0.5 is a 10-sd margin (the planted
    # code explains ~97% of the variance; a tiny mean-pooled trunk gets ~0.8 in 150 steps).
    corr = np.corrcoef(pred[done], test["log_runtime"][done])[0, 1]
    assert corr > 0.5, corr
    # AUC: chance 0.5, null sd ~ sqrt((n1 + n0 + 1) / (12 n1 n0)) < 0.05 here: 0.8 is > 6 sd.
    p = np.asarray(out["p_timeout"])
    auc = (p[~done][:, None] > p[done][None, :]).mean()
    assert (~done).sum() > 20 and auc > 0.8, auc
    # a tighter limit makes every script more likely to time out, and lowers its score
    tokens = test["tokens"]
    tight = trained["score"](trained["params"], tokens, np.ones(tokens.shape, bool),
                             np.full(512, 2.0))  # fmt: skip
    assert (np.asarray(tight["p_timeout"]) >= p - 1e-6).all()
    slow = tokens[:, 1] >= 10
    assert np.asarray(tight["score"])[slow].mean() < np.asarray(out["score"])[slow].mean()


def test_status_error_type_and_validation_heads_learn_planted_fields(trained):
    test, raw = trained["test"], trained["out"]["outputs"]
    status = test["status"]
    acc = (np.asarray(raw["class_logits"]).argmax(1) == status).mean()
    chance = np.bincount(status).max() / len(status)  # always the majority class
    # null sd of an accuracy at the chance rate: sqrt(c (1 - c) / n) ~ 0.02; margin >= 10 sd
    assert acc > chance + 0.2, (acc, chance)
    rt = status == int(Status.RUNTIME_ERROR)
    err_acc = (np.asarray(raw["error_logits"]).argmax(1)[rt] == test["error_type"][rt]).mean()
    assert rt.sum() > 60 and err_acc > 0.25 + 0.3, err_acc  # chance 1/4, null sd ~ 0.05
    ok = status == int(Status.VALID)
    corr = np.corrcoef(np.asarray(raw["validation_mean"])[ok], test["validation"][ok])[0, 1]
    assert corr > 0.5, corr


def test_predict_observation_from_the_trained_heads_recovers_the_planted_fields(trained):
    """The observations written from the trained WM's heads carry the planted status, error
    type and runtime (a tiny task stands in for each row's leaderboard and metric)."""
    from types import SimpleNamespace

    from wmrl.autoresearch.env.metrics import get_metric
    from wmrl.autoresearch.wm_observation import predict_observation

    test, out = trained["test"], trained["out"]
    task = SimpleNamespace(reference_scores=(0.5, 0.7, 0.9), metric=get_metric("accuracy"),
                           metric_name="accuracy")  # fmt: skip
    n = len(test["status"])
    scripts = ["print(1)\n"] * n  # compiles, binds every name: the static check knows nothing
    obs = predict_observation(out, [task] * n, scripts, np.full(n, 20.0), static="names")
    got = np.array([int(o.status) for o in obs])
    chance = np.bincount(test["status"]).max() / n
    assert (got == test["status"]).mean() > chance + 0.2
    both = (got == int(Status.RUNTIME_ERROR)) & (test["status"] == int(Status.RUNTIME_ERROR))
    err = np.array([ERROR_TYPES.index(o.error_type) for o in obs])
    assert both.sum() > 40 and (err[both] == test["error_type"][both]).mean() > 0.55
    assert all(o.error_type == "none" for o in obs if o.status != Status.RUNTIME_ERROR)
    assert all(o.runtime_s == 20.0 for o in obs if o.status == Status.TIMEOUT)
    assert all(o.runtime_s <= 20.0 for o in obs)
    valid = [o for o in obs if o.status == Status.VALID]
    assert valid and all(0.5 <= o.validation <= 0.9 for o in valid)  # on the leaderboard
    assert all(o.validation is None for o in obs if o.status != Status.VALID)


def test_corpus_targets_runtime_and_error_type_from_the_records():
    from wmrl.autoresearch.data import reward_targets

    tb = "Traceback (most recent call last):\n  File \"x.py\", line 3\nKeyError: 'Label'\n"
    recs = [
        {"status": int(Status.RUNTIME_ERROR), "reward": 0.1, "runtime_s": 1.5, "stderr_tail": tb},
        {"status": int(Status.MALFORMED), "reward": 0.0, "runtime_s": 0.0, "stderr_tail": ""},
        {"status": int(Status.VALID), "reward": 0.8, "runtime_s": 3.0, "stderr_tail": "",
         "validation": 0.84},
        {"status": int(Status.UNGRADED), "reward": None, "runtime_s": 2.0, "stderr_tail": ""},
        {"status": int(Status.RUNTIME_ERROR), "reward": 0.1, "runtime_s": 0.5,
         "error_type": "TypeError"},  # an episode record carries its own
    ]  # fmt: skip
    t = reward_targets(recs)
    np.testing.assert_array_equal(np.isnan(t["runtime"]), [False, True, False, True, False])
    np.testing.assert_allclose(t["runtime"][[0, 2, 4]], [1.5, 3.0, 0.5])
    names = [ERROR_TYPES[i] if i >= 0 else None for i in t["error_type"]]
    assert names == ["KeyError", "none", "none", None, "TypeError"]
    np.testing.assert_allclose(t["validation"][2], 0.84, rtol=1e-6)
    assert np.isnan(t["validation"][[0, 1, 3, 4]]).all()
