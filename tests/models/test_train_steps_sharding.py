"""Train steps: same update on 4 meshes of 8 fake devices, exact grad accumulation,
parameters sharded as the rules say, mesh/batch errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from tests.support.policy_step_case import (
    CFG,
    LOSS,
    LR,
    factory,
    global_batch,
    single_process_reference,
)
from wmrl.models.sharding import make_mesh, resolve_mesh_shape
from wmrl.models.train_steps import init_train_state, make_policy_train_step
from wmrl.models.transformer import token_logprobs

_factory = factory
_batch = global_batch


def _run(mesh_shape, devices, micro):
    mesh = make_mesh(mesh_shape, devices)
    tx = optax.sgd(LR)
    graphdef, state = init_train_state(_factory, tx, mesh)
    batch = _batch()
    step = make_policy_train_step(
        graphdef,
        tx,
        jax.tree.map(lambda x: x.sharding, state),
        batch,
        mesh,
        LOSS,
        num_micro_batches=micro,
    )
    state, metrics = step(state, batch)
    return state, metrics


@pytest.fixture(scope="module")
def reference():
    return single_process_reference()


@pytest.mark.parametrize(
    "mesh_shape, n_devices, micro",
    [((1, 1, 1), 1, 1), ((8, 1, 1), 8, 2), ((4, 1, 2), 8, 1), ((2, 2, 2), 8, 2)],
)
def test_same_update_on_every_mesh(mesh_shape, n_devices, micro, reference):
    ref_loss, ref_params = reference
    state, metrics = _run(mesh_shape, jax.devices()[:n_devices], micro)
    loss_sum, count = metrics["loss"]
    assert float(count) == float(_batch()["loss_mask"].sum())
    np.testing.assert_allclose(float(loss_sum / count), float(ref_loss), rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4),
        state.params,
        ref_params,
    )
    assert int(state.step) == 1
    # parameters live where the rules table says
    q = state.params["blocks"]["attn"]["q_dnh"]
    embed = state.params["embed_vd"]
    down = state.params["blocks"]["mlp"]["down_fd"]
    if mesh_shape == (2, 2, 2):
        assert q.sharding.spec == P(None, "fsdp", "tensor", None)
        assert embed.sharding.spec == P("tensor", "fsdp")
        assert down.sharding.spec == P(None, "tensor", "fsdp")
        shard = q.addressable_shards[0].data.shape
        assert shard == (CFG.num_layers, CFG.d_model // 2, CFG.num_heads // 2, CFG.head_dim)
    if mesh_shape == (8, 1, 1):
        assert q.sharding.is_fully_replicated


def test_adam_moments_follow_param_sharding():
    mesh = make_mesh((2, 2, 2))
    _, state = init_train_state(_factory, optax.adam(1e-3), mesh)
    mu = state.opt_state[0].mu["blocks"]["mlp"]["gate_df"]
    assert mu.sharding.spec == P(None, "fsdp", "tensor")
    assert state.opt_state[0].count.sharding.is_fully_replicated


def test_bad_mesh_and_batch_raise():
    with pytest.raises(ValueError, match=r"needs 6 devices, but 8 are available"):
        make_mesh((3, 2, 1))
    with pytest.raises(ValueError, match="does not divide the 8 devices"):
        make_mesh((3, -1, 1))
    assert resolve_mesh_shape((2, -1), 8) == (2, 4, 1)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    tx = optax.sgd(LR)
    graphdef, state = init_train_state(_factory, tx, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    with pytest.raises(ValueError, match="not divisible by num_micro_batches=3"):
        make_policy_train_step(graphdef, tx, shardings, _batch(), mesh, LOSS, 3)
    empty = {k: v[:0] for k, v in _batch().items()}
    with pytest.raises(ValueError, match="empty batch"):
        make_policy_train_step(graphdef, tx, shardings, empty, mesh, LOSS, 1)


# Slow (16 s): the policy step on every mesh stays in the fast suite
# (test_same_update_on_every_mesh); this is the WM step on a 3-D mesh.
@pytest.mark.slow
def test_wm_step_same_on_single_device_and_3d_mesh():
    from wmrl.models.config import TransformerConfig
    from wmrl.models.train_steps import make_wm_score_fn, make_wm_train_step
    from wmrl.models.world_model import WorldModel, WorldModelConfig, bootstrap_weights

    trunk = TransformerConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=4,
                              num_kv_heads=2, max_len=16)  # fmt: skip
    wm_cfg = WorldModelConfig(trunk=trunk, num_members=3, num_classes=4, head_hidden=8)
    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(1, 32, (8, 6)).astype(np.int32),
        "input_mask": np.ones((8, 6), bool),
        "target": rng.normal(size=8).astype(np.float32),
        "member_weights": np.asarray(bootstrap_weights(jax.random.key(0), 8, 3)),
        "class_label": np.array([0, 1, 2, 3, -1, 0, 1, 2], np.int32),
    }
    results = []
    for shape, n in [((1, 1, 1), 1), ((2, 2, 2), 8)]:
        mesh = make_mesh(shape, jax.devices()[:n])
        tx = optax.sgd(0.5)
        graphdef, state = init_train_state(lambda: WorldModel(wm_cfg, rngs=nnx.Rngs(0)), tx, mesh)
        step = make_wm_train_step(graphdef, tx, jax.tree.map(lambda x: x.sharding, state), batch,
                                  mesh, num_micro_batches=2)  # fmt: skip
        state, metrics = step(state, batch)
        results.append((state, metrics))
    (s1, m1), (s8, m8) = results
    assert float(m1["class_ce"][1]) == 7.0  # one unlabelled example is skipped
    np.testing.assert_allclose(m1["nll"][0], m8["nll"][0], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4),
                 s1.params, s8.params)  # fmt: skip
    assert s8.params["head_w1"].sharding.spec == P(None, "fsdp", "tensor")
    mesh = make_mesh((2, 2, 2))
    score = make_wm_score_fn(graphdef, jax.tree.map(lambda x: x.sharding, s8), mesh)
    pred = score(s8.params, batch["tokens"], batch["input_mask"])
    model = nnx.merge(graphdef, jax.tree.map(np.asarray, s1.params))
    outputs = model(jnp.asarray(batch["tokens"]), jnp.asarray(batch["input_mask"]))
    w = np.exp(-np.asarray(outputs["log_var"]))  # independent inverse-variance fusion
    expected = (w * np.asarray(outputs["mean"])).sum(0) / w.sum(0)
    np.testing.assert_allclose(pred["score"], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pred["score_var"], 1 / w.sum(0), rtol=1e-4)


def test_logprobs_fn_and_data_parallel_divisibility():
    from wmrl.models.train_steps import make_logprobs_fn

    mesh = make_mesh((2, 2, 2))
    tx = optax.sgd(LR)
    graphdef, state = init_train_state(_factory, tx, mesh)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    b = _batch()
    logp = make_logprobs_fn(graphdef, shardings, mesh)(state.params, b["tokens"], b["input_mask"])
    ref = token_logprobs(_factory(), jnp.asarray(b["tokens"]), jnp.asarray(b["input_mask"]))
    np.testing.assert_allclose(logp, ref, atol=1e-5)
    small = {k: v[:8] for k, v in b.items()}  # 8 / 2 micro-batches = 4 rows for 4 data ways: ok
    make_policy_train_step(graphdef, tx, shardings, small, mesh, LOSS, 2)
    with pytest.raises(ValueError, match=r"micro-batch size 2 .* data\*fsdp=4"):
        make_policy_train_step(graphdef, tx, shardings, small, mesh, LOSS, 4)


def test_sampler_runs_on_sharded_train_state_params():
    from wmrl.models.sampler import SamplingConfig, generate, sample

    mesh = make_mesh((2, 2, 2))
    graphdef, state = init_train_state(_factory, optax.sgd(LR), mesh)
    prompts = jnp.asarray(_batch()["tokens"][:4, :6])
    pmask = prompts != 0
    sc = SamplingConfig(max_new_tokens=5, eos_id=-1, num_samples=2, greedy=True)
    with jax.set_mesh(mesh):
        out = generate(graphdef, state.params, prompts, pmask, jax.random.key(0), sc, CFG.max_len)
    ref = sample(_factory(), prompts, pmask, jax.random.key(0), sc)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
