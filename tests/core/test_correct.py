"""`wmrl.core.correct.correct`, the one correction of bandits and trainer: the anchor weight is
read after this step's anchor groups are folded into the disagreement EMA (hand numbers), the
anchor rows take real rewards, and keyed offsets are applied by arm before the update."""

import jax.numpy as jnp
import numpy as np
import pytest

from wmrl.core.correct import correct
from wmrl.core.debias import DebiasConfig
from wmrl.core.denoise import DenoiseConfig, DenoiseState
from wmrl.core.state import init_correction_state

G = 4
DENOISE = DenoiseConfig(half_life=2.0, warmup_groups=1, target=2.0, w_max=4.0)


def test_anchor_weight_is_read_after_this_steps_groups():
    frozen = DenoiseState(
        ema=jnp.float32(0.2), ema_norm=jnp.float32(1.0), num_groups=jnp.int32(5),
        scale=jnp.float32(2.0), frozen=jnp.bool_(True),
    )  # fmt: skip
    deb = DebiasConfig(mode="none")
    corr = init_correction_state(deb).replace(denoise=frozen)
    r_wm = np.array([0.1, 0.2, 0.3, 0.4, 0.9, 0.1, 0.5, 0.3], np.float32)  # group 1: anchor
    r_env = np.array([0, 0, 0, 0, 0.0, 1.0, 0.5, 0.2], np.float32)
    rows = np.repeat([False, True], G)
    c = correct(
        corr, jnp.asarray(r_wm), jnp.asarray(r_env[4:].reshape(1, G)), jnp.array([1]),
        group_size=G, debias_on=False, denoise_on=True, debias_cfg=deb, denoise_cfg=DENOISE,
    )  # fmt: skip
    d, s = r_wm[4:], r_env[4:]
    s2 = np.mean(((d - d.mean()) - (s - s.mean())) ** 2) / np.var(s)
    decay = 0.5 ** (1 / DENOISE.half_life)
    ema = (decay * 0.2 + (1 - decay) * s2) / (decay * 1.0 + (1 - decay))
    assert float(c.weight) == pytest.approx(min(1 + 2.0 * ema, 4.0), rel=1e-5)
    assert float(c.weight) != pytest.approx(1 + 2.0 * 0.2, rel=1e-3)  # not the old state's
    np.testing.assert_array_equal(np.asarray(c.rewards), np.where(rows, r_env, r_wm))


def test_keyed_offsets_apply_by_arm_then_learn_from_the_anchor_pairs():
    deb = DebiasConfig(mode="keyed", num_keys=2, window=8, min_count=1)
    corr = init_correction_state(deb)
    arms = jnp.array([0, 1, 0, 1])
    r_wm = jnp.array([0.5, 0.9, 0.5, 0.9])
    r_env = jnp.array([0.0, 0.0, 0.2, 0.4])  # group 1 (rows 2, 3) is the anchor group
    kw = dict(group_size=2, debias_on=True, denoise_on=False, debias_cfg=deb,
              denoise_cfg=DENOISE, keys=arms)  # fmt: skip
    anchor_env = r_env[2:].reshape(1, 2)
    c = correct(corr, r_wm, anchor_env, jnp.array([1]), **kw)
    np.testing.assert_allclose(c.calibrated, r_wm)  # no pairs yet: nothing to subtract
    assert float(c.weight) == 1.0  # denoising off
    again = correct(c.correction, r_wm, anchor_env, jnp.array([1]), **kw)
    # Offsets learnt from the pairs: arm 0: 0.5 - 0.2 = 0.3, arm 1: 0.9 - 0.4 = 0.5.
    np.testing.assert_allclose(again.calibrated, [0.2, 0.4, 0.2, 0.4], atol=1e-6)


def test_the_static_anchors_control_gives_wm_rows_one_shared_reward():
    """`constant_on`: WM rows the static check does not fix get the control's shared reward
    (the prior before any anchor), fixed rows keep theirs, anchors their real rewards; then
    the unflagged, graded anchor rewards are folded into the shared reward (hand EMA)."""
    from wmrl.core import fidelity
    from wmrl.core.correct import MODE_SPECS, MODES

    assert "static_anchors" in MODES and MODE_SPECS["static_anchors"].constant
    spec = MODE_SPECS["static_anchors"]
    assert spec.uses_wm and not spec.debias and not spec.denoise
    deb = DebiasConfig(mode="none")
    corr = init_correction_state(deb, prior_reward=0.4)
    r_wm = jnp.array([0.9, 0.1, 0.7, 0.3, 0.5, 0.6])  # 3 groups of 2; group 2 is the anchor
    static = jnp.array([False, True, False, False, False, True])
    static_reward = jnp.array([0.0, 0.1, 0.0, 0.0, 0.0, 0.0])
    anchor_env = jnp.array([[0.8, 0.0]])
    ok = jnp.array([[True, True]])
    c = correct(
        corr, r_wm, anchor_env, jnp.array([2]), group_size=2, debias_on=False,
        denoise_on=False, debias_cfg=deb, denoise_cfg=DENOISE, anchor_ok=ok,
        static_mask=static, static_reward=static_reward, constant_on=True,
    )  # fmt: skip
    np.testing.assert_allclose(c.rewards, [0.4, 0.1, 0.4, 0.4, 0.8, 0.0], atol=1e-6)
    assert float(c.weight) == 1.0
    d = 0.5 ** (1 / 64.0)  # only the anchor's unflagged row (0.8) is folded in
    assert float(fidelity.anchor_mean(c.correction.anchor_mean)) == pytest.approx(
        (1 - d) * 0.8 / (1 - d), rel=1e-6
    )


def _permuted_by_hand(values, movable, u, group_size):
    """`permute_within_groups` computed another way: per group, the movable values taken in
    the order of their uniform draws `u`, written into the movable slots in row order."""
    out = np.array(values, np.float64).reshape(-1, group_size)
    m, u = np.asarray(movable).reshape(out.shape), np.asarray(u).reshape(out.shape)
    for g in range(len(out)):
        slots = np.flatnonzero(m[g])
        drawn = slots[np.argsort(u[g][slots], kind="stable")]
        out[g, slots] = out[g, drawn].copy()
    return out.reshape(-1)


def test_permute_within_groups_moves_only_the_movable_rows_within_their_group():
    """Hand-built groups: every group keeps its fixed rows in place and its movable values
    as a multiset; the draw is the key's (the same key, the same permutation; exact values
    against a second implementation from the same uniforms); over keys, every permutation of
    a group of three movable rows appears."""
    import jax

    from wmrl.core.correct import permute_within_groups

    G = 4
    values = jnp.array([0.1, 0.2, 0.3, 0.4, 1.0, 2.0, 3.0, 4.0, 7.0, 8.0, 9.0, 5.0])
    movable = jnp.array([1, 1, 0, 1, 0, 1, 1, 1, 0, 0, 0, 1], bool)  # group 3: one movable
    seen = set()
    for seed in range(40):
        key = jax.random.key(seed)
        out = np.asarray(permute_within_groups(values, movable, key, G))
        u = jax.random.uniform(key, (3, G))
        np.testing.assert_array_equal(
            out, _permuted_by_hand(values, movable, u, G).astype(np.float32)
        )
        np.testing.assert_array_equal(
            out, np.asarray(permute_within_groups(values, movable, key, G))
        )
        v, m = np.asarray(values).reshape(3, G), np.asarray(movable).reshape(3, G)
        o = out.reshape(3, G)
        np.testing.assert_array_equal(o[~m], v[~m])  # fixed rows never move
        for g in range(3):
            assert sorted(o[g][m[g]]) == sorted(v[g][m[g]])  # a permutation within the group
        seen.add(tuple(o[0][m[0]]))
    assert len(seen) == 6  # 3! orders of group 0's movable values (0.1, 0.2, 0.4)


def _permuted_correction(permute_key):
    """One `correct` step of `wmrl`'s switches (debias and denoise on) on hand-built groups,
    with or without the `permuted_wm` draw."""
    deb = DebiasConfig(mode="monotone", min_pairs=2, refit_every=1)
    corr = init_correction_state(deb)
    # 3 groups of 4; group 1 is the anchor group; rows 1, 6 and 9 are fixed by the verifier.
    r_wm = jnp.array([0.9, 0.5, 0.7, 0.3, 0.6, 0.2, 0.8, 0.4, 0.35, 0.55, 0.75, 0.15])
    static = jnp.zeros(12, bool).at[jnp.array([1, 6, 9])].set(True)
    static_reward = jnp.zeros(12).at[1].set(0.1)
    anchor_env = jnp.array([[0.9, 0.2, 0.0, 0.6]])
    return correct(
        corr, r_wm, anchor_env, jnp.array([1]), group_size=G, debias_on=True, denoise_on=True,
        debias_cfg=deb, denoise_cfg=DENOISE, static_mask=static, static_reward=static_reward,
        permute_key=permute_key,
    ), np.asarray(static)  # fmt: skip


def test_permuted_wm_permutes_learned_wm_rows_and_leaves_verifier_and_anchor_rewards():
    """`permute_key`: in every WM group the learned rows' rewards are a permutation of
    `wmrl`'s within the group; the verifier's rows and the anchor group's real rewards are
    exactly `wmrl`'s, and so are the calibrated scores, the anchor weight and every estimator
    state (the anchors' pairs are the unpermuted ones). The same key draws the same."""
    import jax

    from wmrl.core.correct import MODE_SPECS

    spec = MODE_SPECS["permuted_wm"]
    assert spec.permute and spec.control and not spec.constant
    assert (spec.uses_wm, spec.debias, spec.denoise, spec.fuse) == (True, True, True, True)
    plain, static = _permuted_correction(None)
    key = jax.random.key(3)
    perm, _ = _permuted_correction(key)
    again, _ = _permuted_correction(key)
    np.testing.assert_array_equal(np.asarray(perm.rewards), np.asarray(again.rewards))
    want, got = np.asarray(plain.rewards), np.asarray(perm.rewards)
    fixed = static.copy()
    fixed[4:8] = True  # the anchor group: real rewards
    np.testing.assert_array_equal(got[fixed], want[fixed])
    np.testing.assert_array_equal(got[4:8], np.float32([0.9, 0.2, 0.0, 0.6]))
    np.testing.assert_array_equal(got[[1, 6, 9]], np.float32([0.1, 0.0, 0.0]))
    for g in (0, 2):  # the WM groups: their learned rows' rewards, permuted
        rows = [i for i in range(4 * g, 4 * g + 4) if not fixed[i]]
        assert sorted(got[rows]) == sorted(want[rows])
    # Exactly: the unfixed rows of every group drawn in the order of the key's uniforms (the
    # anchor group's draw is overwritten by its real rewards).
    exp = _permuted_by_hand(want, ~static, jax.random.uniform(key, (3, G)), G)
    exp[4:8] = want[4:8]
    np.testing.assert_array_equal(got, exp.astype(np.float32))
    moved = [k for k in range(20) if not np.array_equal(
        np.asarray(_permuted_correction(jax.random.key(k))[0].rewards), want)]  # fmt: skip
    assert moved  # some draws reorder (3 learned rows in group 0, 3 in group 2)
    np.testing.assert_array_equal(np.asarray(perm.calibrated), np.asarray(plain.calibrated))
    assert float(perm.weight) == float(plain.weight)
    for x, y in zip(jax.tree.leaves(perm.correction), jax.tree.leaves(plain.correction),
                    strict=True):  # fmt: skip
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_correct_rewards_takes_a_permutation_key_exactly_in_the_permuting_mode():
    """`StepInputs.permute_key` is required by `permuted_wm` and refused elsewhere; the key
    of a step is a pure function of the step's key (`permutation_key`)."""
    import jax

    from wmrl.core.correct import MODE_SPECS, StepInputs, correct_rewards, permutation_key

    deb = DebiasConfig(mode="monotone", min_pairs=2, refit_every=1)
    k = permutation_key(jax.random.fold_in(jax.random.key(0), 5))
    np.testing.assert_array_equal(
        np.asarray(k), np.asarray(permutation_key(jax.random.fold_in(jax.random.key(0), 5)))
    )
    assert not np.array_equal(
        np.asarray(k), np.asarray(permutation_key(jax.random.fold_in(jax.random.key(0), 6)))
    )
    x = StepInputs(
        r_wm=jnp.array([0.1, 0.5, 0.9, 0.2]), r_env=jnp.array([0.0, 0.0, 1.0, 0.0]),
        env_valid=jnp.array([False, False, True, True]), anchor_groups=jnp.array([False, True]),
        anchor_index=jnp.array([1]),
    )  # fmt: skip
    kw = dict(group_size=2, debias_cfg=deb, denoise_cfg=DENOISE, normalize_std=False,
              baseline="mean")  # fmt: skip
    with pytest.raises(ValueError, match="permute_key"):
        correct_rewards(init_correction_state(deb), x, spec=MODE_SPECS["permuted_wm"], **kw)
    with pytest.raises(ValueError, match="permute_key"):
        correct_rewards(
            init_correction_state(deb), x._replace(permute_key=k), spec=MODE_SPECS["wmrl"], **kw
        )
    out = correct_rewards(
        init_correction_state(deb), x._replace(permute_key=k), spec=MODE_SPECS["permuted_wm"],
        **kw,
    )  # fmt: skip
    assert sorted(np.asarray(out.rewards[:2]).tolist()) == pytest.approx([0.1, 0.5])
    np.testing.assert_array_equal(np.asarray(out.rewards[2:]), [1.0, 0.0])
