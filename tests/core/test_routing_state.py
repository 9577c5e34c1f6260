"""Anchor routing, and the correction state's Orbax round trip."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from wmrl.core import debias, denoise, routing
from wmrl.core.state import init_correction_state


def test_anchor_count_rules():
    cfg = routing.RoutingConfig(rho=0.1, min_groups=1)
    key = jax.random.key(0)
    is_a, _ = routing.route_anchors(key, 64, cfg)
    assert int(is_a.sum()) == 6
    is_a, _ = routing.route_anchors(key, 4, cfg)
    assert int(is_a.sum()) == 1  # at least min_groups
    is_a, _ = routing.route_anchors(key, 64, cfg, free_capacity=2)
    assert int(is_a.sum()) == 2  # capped by free sandbox capacity
    is_a, picked = routing.route_anchors(key, 64, cfg, free_capacity=0)
    assert int(is_a.sum()) == 0 and int(picked.max()) == 0


def test_routing_is_seeded_and_uniform():
    cfg = routing.RoutingConfig(rho=0.25)
    a1, _ = routing.route_anchors(jax.random.key(3), 16, cfg)
    a2, _ = routing.route_anchors(jax.random.key(3), 16, cfg)
    np.testing.assert_array_equal(a1, a2)
    draws = jax.vmap(lambda k: routing.route_anchors(k, 16, cfg)[0])(
        jax.random.split(jax.random.key(0), 4000)
    )
    freq = np.asarray(draws).mean(0)  # each group picked with prob 4/16
    se = np.sqrt(0.25 * 0.75 / 4000)
    assert np.all(np.abs(freq - 0.25) < 5 * se)


def test_uncertainty_routing_takes_top_variance_and_records_rule():
    cfg = routing.RoutingConfig(rho=0.5, uncertainty_share=0.5)
    var = jnp.array([0.1, 5.0, 0.2, 3.0, 0.0, 0.3, 0.4, 0.5])
    is_a, picked = routing.route_anchors(jax.random.key(1), 8, cfg, group_variance=var)
    picked = np.asarray(picked)
    assert int(is_a.sum()) == 4
    assert set(np.flatnonzero(picked == routing.UNCERTAINTY)) == {1, 3}
    assert (picked == routing.UNIFORM).sum() == 2
    with pytest.raises(ValueError, match="variance"):
        routing.route_anchors(jax.random.key(1), 8, cfg)


def test_routing_jits_with_traced_capacity():
    cfg = routing.RoutingConfig(rho=0.5)
    f = jax.jit(lambda k, c: routing.route_anchors(k, 10, cfg, free_capacity=c)[0].sum())
    assert int(f(jax.random.key(0), 3)) == 3


def test_correction_state_orbax_round_trip(tmp_path):
    cfg = debias.DebiasConfig(mode="both", num_keys=3, min_pairs=5, capacity=64)
    st = init_correction_state(cfg)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(size=20))
    dstate = debias.update_debias(
        st.debias, x, x**2, jnp.asarray(rng.integers(0, 3, 20)), jnp.ones(20, bool), cfg
    )
    nstate = denoise.update_denoise(
        st.denoise,
        jnp.asarray(rng.normal(size=(40, 4))),
        jnp.asarray(rng.normal(size=(40, 4))),
        denoise.DenoiseConfig(),
    )
    st = st.replace(debias=dstate, denoise=nstate)
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "state", st)
    ckpt.wait_until_finished()
    restored = ckpt.restore(tmp_path / "state", init_correction_state(cfg))
    leaves_a, tree_a = jax.tree.flatten(st)
    leaves_b, tree_b = jax.tree.flatten(restored)
    assert tree_a == tree_b
    for a, b in zip(leaves_a, leaves_b, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert bool(restored.denoise.frozen) and bool(restored.debias.monotone.fitted)


def test_anchor_count_rounds_half_up():
    # 0.25 * 10 = 2.5 -> 3 and 0.5 * 5 = 2.5 -> 3 (Python's round gives 2); 0.25 * 2 = 0.5 -> 1
    cfg = routing.RoutingConfig(rho=0.25, min_groups=0)
    assert int(routing.num_anchor_groups(10, 10, cfg)) == 3
    assert int(routing.num_anchor_groups(10, 10, cfg, rho=jnp.float32(0.25))) == 3
    assert int(routing.num_anchor_groups(5, 5, cfg, rho=0.5)) == 3
    assert int(routing.num_anchor_groups(2, 2, cfg)) == 1
    assert int(routing.num_anchor_groups(10, 10, cfg, rho=0.24)) == 2
