"""Sampler: log-probs equal the trainer's, KV-cache greedy equals full recompute, stopping."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wmrl.models.config import TransformerConfig
from wmrl.models.sampler import SamplingConfig, filter_logits, naive_greedy, sample
from wmrl.models.transformer import Transformer, token_logprobs

CFG = TransformerConfig(
    vocab_size=32,
    d_model=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    mlp_dim=64,
    max_len=32,
)
PROMPTS = jnp.array([[0, 0, 0, 5, 6, 7], [9, 3, 2, 4, 1, 8], [0, 0, 11, 12, 13, 14]], jnp.int32)
PMASK = PROMPTS != 0


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 6e-2)])
def test_sampler_logprobs_equal_training_forward(dtype, tol):
    model = Transformer(CFG.replace(dtype=dtype), rngs=nnx.Rngs(0))
    sc = SamplingConfig(max_new_tokens=8, eos_id=3, num_samples=2, temperature=0.7, top_k=12)
    out = sample(model, PROMPTS, PMASK, jax.random.key(1), sc)
    assert out.tokens.shape == out.mask.shape == out.logprobs.shape == (6, 8)
    full = jnp.concatenate([jnp.repeat(PROMPTS, 2, axis=0), out.tokens], axis=1)
    mask = jnp.concatenate([jnp.repeat(PMASK, 2, axis=0), out.mask], axis=1)
    ref = token_logprobs(model, full, mask)[:, PROMPTS.shape[1] :]
    assert int(out.mask.sum()) > 6
    np.testing.assert_allclose(out.logprobs, np.where(out.mask, ref, 0.0), atol=tol, rtol=0)
    assert np.all(np.asarray(out.logprobs)[np.asarray(out.mask)] < 0)


def test_greedy_kv_cache_equals_full_recompute():
    model = Transformer(CFG, rngs=nnx.Rngs(3))
    sc = SamplingConfig(max_new_tokens=10, eos_id=CFG.vocab_size, greedy=True)
    out = sample(model, PROMPTS, PMASK, jax.random.key(0), sc)
    ref = naive_greedy(model, PROMPTS, PMASK, 10)
    np.testing.assert_array_equal(out.tokens, ref)
    assert bool(out.mask.all())


def test_group_samples_share_prompt_and_stop_per_row():
    model = Transformer(CFG, rngs=nnx.Rngs(4))
    greedy = sample(
        model,
        PROMPTS,
        PMASK,
        jax.random.key(0),
        SamplingConfig(max_new_tokens=6, eos_id=99, num_samples=3, greedy=True),
    )
    tok = np.asarray(greedy.tokens).reshape(3, 3, 6)
    assert (tok == tok[:, :1]).all()  # each prompt's G greedy rows are identical
    assert not (tok[0, 0] == tok[1, 0]).all()
    # make the first greedy token of prompt 0 the EOS: its rows stop after 1 token
    eos = int(tok[0, 0, 0])
    out = sample(
        model,
        PROMPTS,
        PMASK,
        jax.random.key(0),
        SamplingConfig(max_new_tokens=6, eos_id=eos, num_samples=3, greedy=True),
    )
    m, t = np.asarray(out.mask), np.asarray(out.tokens)
    assert m[:3].sum(axis=1).tolist() == [1, 1, 1]
    assert (t[:3, 1:] == 0).all()
    for row_m, row_t in zip(m, t, strict=True):
        n = row_m.sum()
        assert row_m[:n].all() and not row_m[n:].any()  # mask is a prefix
        assert eos not in row_t[: n - 1]
        assert n == 6 or row_t[n - 1] == eos


def test_sampled_rows_differ_within_group():
    model = Transformer(CFG, rngs=nnx.Rngs(5))
    out = sample(
        model,
        PROMPTS[:1],
        PMASK[:1],
        jax.random.key(7),
        SamplingConfig(max_new_tokens=6, eos_id=99, num_samples=4),
    )
    rows = {tuple(r) for r in np.asarray(out.tokens).tolist()}
    assert len(rows) > 1


def test_filter_logits_hand_numbers():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    keep = lambda **kw: (np.asarray(filter_logits(logits, **kw)) > -1e30).tolist()[0]
    assert keep(temperature=1.0, top_k=0, top_p=0.7) == [True, True, False, False]
    assert keep(temperature=1.0, top_k=0, top_p=0.81) == [True, True, True, False]
    assert keep(temperature=1.0, top_k=3, top_p=1.0) == [True, True, True, False]
    assert keep(temperature=1.0, top_k=1, top_p=1.0) == [True, False, False, False]
    scaled = filter_logits(logits, temperature=2.0, top_k=0, top_p=1.0)
    np.testing.assert_allclose(scaled, logits / 2.0)


def test_bad_prompts_raise():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    sc = SamplingConfig(max_new_tokens=4, eos_id=1)
    long = jnp.ones((1, 30), jnp.int32)
    with pytest.raises(ValueError, match="exceeds the model's max_len 32"):
        sample(model, long, long > 0, jax.random.key(0), sc)
    empty = jnp.zeros((0, 4), jnp.int32)
    with pytest.raises(ValueError, match="empty batch"):
        sample(model, empty, empty > 0, jax.random.key(0), sc)
