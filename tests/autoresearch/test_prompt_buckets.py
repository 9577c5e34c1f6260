"""Multi-turn stages train turn-1 rows at a narrow prompt width (`stages.prompt_buckets`,
`stages.trim_prompts`): the buckets, and that a trimmed row gives the full-width row's token
log-probs and WM outputs (a real tiny transformer and world model)."""

import numpy as np

from tests.support.rl_fixtures import load_config
from wmrl.autoresearch import model_setup
from wmrl.autoresearch.stages import prompt_buckets, trim_prompts

P, N = 64, 16


def _rows(prompt_lens, seed=0):
    """Rows in the shared layout: left-padded prompts of the given lengths, N-token scripts."""
    rng = np.random.default_rng(seed)
    n = len(prompt_lens)
    tokens = rng.integers(3, 100, (n, P + N)).astype(np.int32)
    mask = np.ones((n, P + N), bool)
    for i, k in enumerate(prompt_lens):
        mask[i, : P - k] = False
        tokens[i, : P - k] = 0
    mask[:, P + N - 3 :] = False  # script padding at the end, as EOS-terminated scripts have
    loss = np.zeros((n, P + N), np.float32)
    loss[:, P:] = mask[:, P:]
    return {"tokens": tokens, "input_mask": mask, "loss_mask": loss,
            "target": rng.random(n).astype(np.float32)}  # fmt: skip


def test_buckets_by_the_prompt_width_each_row_needs():
    rows = _rows([5, 20, 33, 40, 64, 10])
    (narrow, short), (full, long) = prompt_buckets(rows, P, multiple=8)
    # rows needing <= P/2 = 32 tokens: 5, 20, 10; their longest (20) rounded up to 8 is 24
    assert narrow == 24 and short.tolist() == [0, 1, 5]
    assert full == P and long.tolist() == [2, 3, 4]
    ((w, every),) = prompt_buckets(_rows([5, 9]), P, multiple=8)  # all short: one narrow bucket
    assert w == 16 and every.tolist() == [0, 1]
    ((w, every),) = prompt_buckets(_rows([40, 64]), P, multiple=8)  # none short: full width
    assert w == P and every.tolist() == [0, 1]
    trimmed = trim_prompts(rows, P, narrow)
    assert trimmed["tokens"].shape == (6, narrow + N) and trimmed["target"].shape == (6,)
    np.testing.assert_array_equal(trimmed["tokens"], rows["tokens"][:, P - narrow :])
    assert trim_prompts(rows, P, P) is rows


def _tiny(config):
    c = config
    c.data.max_prompt_len, c.data.max_new_tokens = P, N
    for part in (c.policy, c.wm):
        part.d_model, part.num_layers, part.mlp_dim, part.head_dim = 32, 2, 64, 8
    c.wm.num_members = 2
    return c


def test_a_trimmed_row_scores_as_at_full_width():
    import jax.numpy as jnp
    from flax import nnx

    from wmrl.models.transformer import token_logprobs

    c = _tiny(load_config())
    mesh = model_setup.make_rl_mesh(c)
    rows = _rows([7, 12, 18], seed=1)
    ((w, _),) = prompt_buckets(rows, P, multiple=8)
    assert w == 24
    short = trim_prompts(rows, P, w)
    policy = model_setup.build_policy(c, 100, model_setup.adam(1e-3), mesh, 0)
    model = nnx.merge(policy.graphdef, policy.state.params)
    full = token_logprobs(model, jnp.asarray(rows["tokens"]), jnp.asarray(rows["input_mask"]), P)
    cut = token_logprobs(model, jnp.asarray(short["tokens"]), jnp.asarray(short["input_mask"]), w)
    np.testing.assert_allclose(np.asarray(cut)[:, w:], np.asarray(full)[:, P:], atol=2e-5)
    assert np.abs(np.asarray(full)[:, P:]).sum() > 0  # (something was compared)
    wm = model_setup.build_wm(c, 100, model_setup.adam(1e-3), mesh, 1)
    world = nnx.merge(wm.graphdef, wm.state.params)
    a = world(jnp.asarray(rows["tokens"]), jnp.asarray(rows["input_mask"]))
    b = world(jnp.asarray(short["tokens"]), jnp.asarray(short["input_mask"]))
    for k in a:
        np.testing.assert_allclose(np.asarray(b[k]), np.asarray(a[k]), atol=2e-5, err_msg=k)


def test_one_bucket_batches_are_the_single_turn_order():
    """One bucket (every single-turn stage): the batches are the earlier loop's, epochs of
    `rng.permutation(n)` cut into batches of `bs`, from the same generator state."""
    from wmrl.autoresearch.stages import bucket_batches

    n, bs, steps = 10, 4, 7
    got = bucket_batches(np.random.default_rng(3), [(P, np.arange(n))], bs)
    rng, order, want = np.random.default_rng(3), np.zeros(0, np.int64), []
    for _ in range(steps):  # the loop warm_start had before the buckets
        while len(order) < bs:
            order = np.concatenate([order, rng.permutation(n)])
        want.append(order[:bs])
        order = order[bs:]
    for w in want:
        width, idx = next(got)
        assert width == P
        np.testing.assert_array_equal(idx, w)


def test_two_bucket_batches_stay_in_one_bucket_in_proportion():
    from wmrl.autoresearch.stages import bucket_batches

    narrow, wide = np.arange(0, 30), np.arange(30, 40)  # 3 : 1
    got = bucket_batches(np.random.default_rng(0), [(16, narrow), (P, wide)], 5)
    seen = {16: [], P: []}
    for _ in range(400):
        width, idx = next(got)
        assert len(idx) == 5 and set(idx) <= set(narrow if width == 16 else wide)
        seen[width].append(idx)
    assert 0.65 < len(seen[16]) / 400 < 0.85  # the narrow bucket's share is 0.75
    for width, rows in ((16, narrow), (P, wide)):  # every row, equally often (epochs)
        counts = np.bincount(np.concatenate(seen[width]), minlength=40)[rows]
        assert counts.max() - counts.min() <= 1
