"""Online Debiasing: isotonic fit vs a brute-force PAV, monotonicity, keyed offsets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wmrl.bandits.numpy_reference import pav as pav_reference
from wmrl.core import debias, grpo


@pytest.mark.parametrize("seed", range(5))
def test_isotonic_equals_bruteforce_pav(seed):
    rng = np.random.default_rng(seed)
    n = rng.integers(2, 16)
    y = rng.normal(size=n) + 0.2 * np.arange(n)
    w = rng.uniform(0.1, 5.0, size=n)
    got = np.asarray(debias.weighted_isotonic(jnp.asarray(y), jnp.asarray(w)))
    np.testing.assert_allclose(got, pav_reference(y, w), rtol=1e-4, atol=1e-5)
    assert np.all(np.diff(got) >= -1e-6)


def test_binned_fit_matches_numpy_bins_then_pav():
    cfg = debias.DebiasConfig(num_bins=10, min_pairs=0, min_slope=0.0)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=400)
    y = np.clip(np.sqrt(x) + 0.3 * rng.normal(size=400), 0, 1)
    x[x > 0.7] = x[x > 0.7] * 0.0 + 0.65  # empty bins 7..9
    bx, vals, filled = debias.fit_monotone_map(jnp.asarray(x), jnp.asarray(y), jnp.ones(400), cfg)
    idx = np.minimum((x * 10).astype(int), 9)
    counts = np.bincount(idx, minlength=10)
    means = np.bincount(idx, weights=y, minlength=10) / np.maximum(counts, 1)
    xmeans = np.bincount(idx, weights=x, minlength=10) / np.maximum(counts, 1)
    keep = counts > 0
    np.testing.assert_array_equal(np.asarray(filled), keep)
    np.testing.assert_allclose(np.asarray(bx)[keep], xmeans[keep], rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(vals)[keep], pav_reference(means[keep], counts[keep]), rtol=1e-4, atol=1e-5
    )
    # interpolation between the filled bins' mean WM scores, constant beyond the end points
    v, xm = np.asarray(vals), xmeans
    q = np.array([xm[0] - 0.01, 0.5 * (xm[0] + xm[1]), 0.95])
    out = np.asarray(debias.apply_monotone_map(jnp.asarray(q), bx, vals, filled, cfg))
    np.testing.assert_allclose(out[0], v[0], rtol=1e-5)
    np.testing.assert_allclose(out[1], 0.5 * (v[0] + v[1]), rtol=1e-5)
    np.testing.assert_allclose(out[2], v[6], rtol=1e-5)


def _fitted_map(x, y, **kwargs):
    cfg = debias.DebiasConfig(min_pairs=1, refit_every=1, capacity=len(x), **kwargs)
    st = debias.update_monotone_map(
        debias.init_monotone_map(cfg), jnp.asarray(x), jnp.asarray(y), jnp.ones(len(x), bool), cfg
    )
    return st, cfg


def _apply(st, cfg, r):
    return np.asarray(
        debias.apply_monotone_map(jnp.asarray(r), st.bin_x, st.bin_values, st.bin_filled, cfg)
    )


@pytest.mark.parametrize("spacing", ["equal_width", "equal_mass"])
def test_monotone_map_never_reorders_nor_ties_a_group(spacing):
    """Strictly increasing: distinct WM scores stay distinct, in the same order, also in flat
    PAV segments and beyond the end points."""
    rng = np.random.default_rng(4)
    x = rng.uniform(size=300)
    y = np.clip(x**3 + 0.2 * rng.normal(size=300), 0, 1)
    y[(x > 0.3) & (x < 0.6)] = 0.4  # a flat stretch: PAV pools it
    st, cfg = _fitted_map(x, y, bin_spacing=spacing)
    assert bool(st.fitted)
    for _ in range(20):
        g = rng.uniform(-0.2, 1.2, size=8)
        out = _apply(st, cfg, g)
        order = np.argsort(g)
        assert np.all(np.diff(out[order]) >= cfg.min_slope * np.diff(g[order]) * (1 - 1e-4))
        assert np.all(np.diff(out[order]) > 0)


def test_no_collapse_when_every_pair_sits_in_one_equal_width_bin():
    """The measured failure: WM scores inside one bin. Equal-width bins leave the map at the
    identity (one point defines no map); equal-mass bins split the window and fit."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0.41, 0.49, size=400)
    y = np.clip(8 * (x - 0.41) + 0.1 * rng.normal(size=400), 0, 1)
    group = np.linspace(0.42, 0.48, 8)
    st, cfg = _fitted_map(x, y, bin_spacing="equal_width")
    assert not bool(st.fitted)
    full = debias.DebiasState(keyed=debias.init_keyed_offsets(cfg), monotone=st)
    np.testing.assert_allclose(debias.apply_debias(full, jnp.asarray(group), None, cfg), group)
    st, cfg = _fitted_map(x, y, bin_spacing="equal_mass")
    assert bool(st.fitted) and int(st.bin_filled.sum()) == cfg.num_bins
    out = _apply(st, cfg, group)
    assert np.all(np.diff(out) > 0)
    assert out[-1] - out[0] > 10 * (group[-1] - group[0]) * 0.5  # the slope is learned (~8)


@pytest.mark.parametrize("spacing", ["equal_width", "equal_mass"])
@pytest.mark.parametrize("seed", range(3))
def test_fit_equals_independent_numpy_reference_formula(spacing, seed):
    from wmrl.bandits.numpy_reference import monotone_apply, monotone_fit

    rng = np.random.default_rng(seed)
    n = 250
    x = rng.beta(2, 5, size=n)
    y = np.clip(np.sin(3 * x) + 0.3 * rng.normal(size=n), 0, 1)
    st, cfg = _fitted_map(x, y, bin_spacing=spacing, min_slope=0.1)
    xs, ys = monotone_fit(np.stack([x, y], 1), cfg)
    np.testing.assert_allclose(np.asarray(st.bin_x)[np.asarray(st.bin_filled)], xs, rtol=2e-5)
    q = rng.uniform(-0.1, 1.1, size=64)
    np.testing.assert_allclose(_apply(st, cfg, q), monotone_apply(q, xs, ys, cfg), atol=2e-5)


def test_identity_until_min_pairs_then_refit_every_k():
    cfg = debias.DebiasConfig(mode="monotone", min_pairs=20, refit_every=8, capacity=30)
    st = debias.init_debias_state(cfg)
    x = jnp.linspace(0.05, 0.95, 10)
    upd = jax.jit(lambda s, a, b: debias.update_debias(s, a, b, None, jnp.ones(10, bool), cfg))
    st = upd(st, x, x**2)
    np.testing.assert_allclose(debias.apply_debias(st, x, None, cfg), x)  # 10 < 20: identity
    st = upd(st, x, x**2)
    assert bool(st.monotone.fitted) and int(st.monotone.since_fit) == 0
    fitted_vals = np.asarray(st.monotone.bin_values)
    np.testing.assert_allclose(debias.apply_debias(st, x, None, cfg), x**2, atol=0.02)
    # FIFO cap: 30 pairs max; new pairs with a different target replace the oldest
    st = upd(st, x, 1 - x)
    assert int(st.monotone.size) == 30 and int(st.monotone.since_fit) == 0
    assert not np.allclose(st.monotone.bin_values, fitted_vals)


def test_keyed_offsets_recover_per_key_bias_within_4_standard_errors():
    K, n = 4, 1600
    bias = np.array([0.3, -0.2, 0.0, 0.5])
    true_mean = np.array([1.0, 0.5, 0.2, -0.3])
    noise = 0.4
    rng = np.random.default_rng(7)
    keys = rng.integers(0, K, size=n)
    r_env = true_mean[keys] + noise * rng.normal(size=n)
    r_wm = r_env + bias[keys] + noise * rng.normal(size=n)
    for rule in ("window", "ema"):
        cfg = debias.DebiasConfig(
            mode="keyed", num_keys=K, offset_rule=rule, window=2000, half_life=5000, min_count=5
        )
        st = debias.update_debias(
            debias.init_debias_state(cfg),
            jnp.asarray(r_wm),
            jnp.asarray(r_env),
            jnp.asarray(keys),
            jnp.ones(n, bool),
            cfg,
        )
        # fresh WM samples: raw mean off by the bias, debiased mean within 4 s.e. of the truth
        m = 2000
        fresh_keys = np.repeat(np.arange(K), m)
        fresh = true_mean[fresh_keys] + bias[fresh_keys] + noise * rng.normal(size=K * m)
        out = np.asarray(debias.apply_debias(st, jnp.asarray(fresh), jnp.asarray(fresh_keys), cfg))
        counts = np.bincount(keys, minlength=K)
        for k in range(K):
            se = np.sqrt(2 * noise**2 / counts[k] + noise**2 / m)
            raw_mean = fresh[fresh_keys == k].mean()
            deb_mean = out[fresh_keys == k].mean()
            assert abs(deb_mean - true_mean[k]) < 4 * se, (rule, k)
            if bias[k] != 0:
                assert abs(raw_mean - true_mean[k]) > 4 * se


def test_keyed_offsets_wait_for_min_count_and_ignore_invalid():
    cfg = debias.DebiasConfig(mode="keyed", num_keys=2, min_count=3)
    st = debias.init_debias_state(cfg)
    st = debias.update_debias(
        st,
        jnp.array([1.0, 1.0, 9.0]),
        jnp.zeros(3),
        jnp.array([0, 0, 0]),
        jnp.array([True, True, False]),
        cfg,
    )
    out = debias.apply_debias(st, jnp.array([1.0, 1.0]), jnp.array([0, 1]), cfg)
    np.testing.assert_allclose(out, [1.0, 1.0])  # only 2 valid pairs for key 0
    st = debias.update_debias(
        st, jnp.array([1.0]), jnp.zeros(1), jnp.array([0]), jnp.array([True]), cfg
    )
    out = debias.apply_debias(st, jnp.array([1.0, 1.0]), jnp.array([0, 1]), cfg)
    np.testing.assert_allclose(out, [0.0, 1.0])


def test_window_rule_forgets_old_pairs():
    cfg = debias.DebiasConfig(mode="keyed", num_keys=1, window=4, min_count=1)
    st = debias.init_debias_state(cfg)
    resid = jnp.array([10.0, 10, 10, 10, 1, 2, 3, 4])
    st = debias.update_debias(st, resid, jnp.zeros(8), jnp.zeros(8, int), jnp.ones(8, bool), cfg)
    np.testing.assert_allclose(debias.apply_debias(st, jnp.zeros(1), jnp.zeros(1, int), cfg), -2.5)


def test_diagnostic_and_constant_offsets_cancel_in_groups():
    real = jnp.array([0.1, 0.5, 0.9, 0.2])
    raw = real + jnp.array([0.3, 0.3, -0.1, -0.1])  # group-constant offsets only
    d = debias.bias_diagnostic(raw, real, real, 2)
    assert float(d["residual_before"]) == pytest.approx(0.0, abs=1e-7)
    raw2 = real + jnp.array([0.2, 0.0, 0.0, 0.0])
    d = debias.bias_diagnostic(raw2, real, real, 2)
    np.testing.assert_allclose(d["residual_before"], 0.01 / 2, rtol=1e-5)
    np.testing.assert_allclose(d["bias_reduction"], 1.0)
    # a key = task offset is a no-op on GRPO advantages
    a = grpo.group_advantages(raw, 2)
    b = grpo.group_advantages(real, 2)
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"mode": "bogus"}, "mode"),
        ({"num_bins": 0}, "num_bins"),
        ({"reward_range": (1.0, 0.0)}, "reward_range"),
        ({"half_life": -1.0}, "half_life"),
        ({"bin_spacing": "quantile"}, "bin_spacing"),
        ({"min_slope": 1.0}, "min_slope"),
        ({"min_slope": float("nan")}, "min_slope"),
    ],
)
def test_config_errors_name_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        debias.DebiasConfig(**kwargs)


def test_incremental_bins_equal_a_fresh_fit_of_the_window():
    cfg = debias.DebiasConfig(min_pairs=1, refit_every=1, capacity=37)
    rng = np.random.default_rng(9)
    st = debias.init_monotone_map(cfg)
    upd = jax.jit(lambda s, a, b, v: debias.update_monotone_map(s, a, b, v, cfg))
    for _ in range(15):
        x = rng.uniform(-0.1, 1.1, size=8)
        v = rng.uniform(size=8) < 0.8
        st = upd(st, jnp.asarray(x), jnp.asarray(x**2), jnp.asarray(v))
    stored = np.arange(37) < int(st.size)
    bx, vals, filled = debias.fit_monotone_map(st.wm, st.env, jnp.asarray(stored), cfg)
    np.testing.assert_array_equal(st.bin_filled, filled)
    np.testing.assert_allclose(
        np.asarray(st.bin_values)[filled], np.asarray(vals)[filled], rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(np.asarray(st.bin_x)[filled], np.asarray(bx)[filled], atol=1e-5)


@pytest.mark.parametrize("rule", ["window", "ema"])
def test_batched_keyed_update_equals_sequential_numpy(rule):
    """The vectorised batch update equals feeding pairs one by one (independent numpy loop)."""
    K, W, hl = 3, 4, 3.0
    cfg = debias.DebiasConfig(
        mode="keyed", num_keys=K, offset_rule=rule, window=W, half_life=hl, min_count=1
    )
    rng = np.random.default_rng(11)
    st = debias.init_debias_state(cfg).keyed
    buffers = {k: [] for k in range(K)}
    ema, norm = np.zeros(K), np.zeros(K)
    d = 0.5 ** (1 / hl)
    for _ in range(4):
        n = 9
        keys = rng.integers(0, K, n)
        wm, env = rng.normal(size=n), rng.normal(size=n)
        valid = rng.uniform(size=n) < 0.8
        st = debias.update_keyed_offsets(
            st, jnp.asarray(wm), jnp.asarray(env), jnp.asarray(keys), jnp.asarray(valid), cfg
        )
        for k, a, b, v in zip(keys, wm, env, valid, strict=True):
            if v:
                buffers[k] = (buffers[k] + [a - b])[-W:]
                ema[k] = d * ema[k] + (1 - d) * (a - b)
                norm[k] = d * norm[k] + (1 - d)
    got, _ = debias.keyed_offsets(st, cfg)
    for k in range(K):
        if buffers[k]:
            want = np.mean(buffers[k]) if rule == "window" else ema[k] / norm[k]
            np.testing.assert_allclose(got[k], want, rtol=1e-4, atol=1e-6)


def test_deferred_refit_equals_refit_inside_the_update():
    """`refit=False` + `refit_monotone_map` is the same update, refits at the same calls."""
    cfg = debias.DebiasConfig(mode="monotone", min_pairs=20, refit_every=16, capacity=40)
    rng = np.random.default_rng(5)
    joint = split = debias.init_monotone_map(cfg)
    fits = 0
    for _ in range(12):
        x = jnp.asarray(rng.uniform(size=8))
        y, v = x**2, jnp.asarray(rng.uniform(size=8) < 0.9)
        joint = debias.update_monotone_map(joint, x, y, v, cfg)
        split = debias.update_monotone_map(split, x, y, v, cfg, refit=False)
        due = bool(debias.monotone_refit_due(split, cfg))
        fits += due
        split = debias.refit_monotone_map(split, cfg)
        assert not bool(debias.monotone_refit_due(split, cfg))
        for a, b in zip(jax.tree.leaves(joint), jax.tree.leaves(split), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert 3 <= fits < 12  # first fit at 20 pairs, then every 16 pairs: not at every update


@pytest.mark.parametrize("mode", ["keyed", "monotone"])
def test_ring_buffers_are_updated_in_place_inside_a_scan(mode):
    """No per-step copy of a window buffer in a vmapped scan (`debias.after_reads`).

    A performance property, not a numerical one: the update reads the entries it is about to
    evict, and XLA copies the whole buffer every step unless the write depends on those reads.
    """
    import re

    cfg = debias.DebiasConfig(mode=mode, num_keys=3, window=37, capacity=41, min_pairs=5)
    seeds = 6
    state = jax.vmap(lambda _: debias.init_debias_state(cfg))(jnp.arange(seeds))

    def run(st, x):
        def body(st, xt):
            upd = lambda s, a: debias.update_debias(
                s, a, a * a, jnp.arange(8) % 3, jnp.ones(8, bool), cfg
            )
            return jax.vmap(upd)(st, xt), None

        return jax.lax.scan(body, st, x)[0]

    x = jnp.zeros((4, seeds, 8))
    hlo = jax.jit(run).lower(state, x).compile().as_text()
    buffer = f"f32[{seeds},3,37]" if mode == "keyed" else f"f32[{seeds},41]"
    bodies = re.findall(r"body=%([\w.\-]+)", hlo)
    assert bodies
    for name in bodies:
        start = hlo.index(f"%{name} (")
        text = hlo[start : hlo.index("\n}\n", start)]
        copies = [line for line in text.splitlines() if f"= {buffer}" in line and " copy(" in line]
        assert not copies, copies
