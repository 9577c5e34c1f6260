"""`attention_impl` (the einsum reference vs `jax.nn.dot_product_attention`) and `remat_policy`:
same logits for our masks (causal + left/right padding, the KV-cache decode of the sampler),
same gradients with every remat policy, clear errors for bad values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wmrl.models.config import TransformerConfig
from wmrl.models.sampler import SamplingConfig, sample
from wmrl.models.transformer import (
    Transformer,
    causal_padding_mask,
    positions_from_mask,
    token_logprobs,
)

CFG = TransformerConfig(
    vocab_size=48,
    d_model=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=48,
    max_len=32,
    qk_norm=True,
)
RNG = np.random.default_rng(0)
TOKENS = jnp.asarray(RNG.integers(1, CFG.vocab_size, (3, 12)), jnp.int32)
MASK = np.ones((3, 12), bool)
MASK[0, :4] = False  # a left-padded prompt
MASK[2, 9:] = False  # a right-padded (finished) completion
MASK[1, :2] = MASK[1, 10:] = False  # both
MASK = jnp.asarray(MASK)


def _logits(impl: str, dtype: str) -> np.ndarray:
    model = Transformer(CFG.replace(attention_impl=impl, dtype=dtype), rngs=nnx.Rngs(0))
    forward = nnx.jit(lambda m, t, k: m(t, positions_from_mask(k), causal_padding_mask(k))[0])
    return np.asarray(forward(model, TOKENS, MASK))


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 3e-2)])
def test_dot_product_attention_matches_the_einsum_path_on_real_tokens(dtype, tol):
    ref, got = _logits("xla", dtype), _logits("dot_product_attention", dtype)
    real = np.asarray(MASK)
    assert np.abs(ref[real]).max() > 1.0  # logits of a size the tolerance is relative to
    np.testing.assert_allclose(got[real], ref[real], atol=tol * np.abs(ref[real]).max(), rtol=0)
    if dtype == "float32":  # and not trivially: an fp32 check against the bf16 forward fails
        assert np.abs(_logits("xla", "bfloat16")[real] - ref[real]).max() > 10 * tol


def test_kv_cache_decode_with_dot_product_attention_matches(dtype="float32", tol=1e-5):
    """The sampler (prefill over a padded cache, then one-token steps attending to the cache):
    same greedy tokens and log-probs as the einsum path, and log-probs equal to the training
    forward of the same model."""
    prompts, pmask = TOKENS[:, :6], MASK[:, :6]  # rows 0 and 1 left-padded
    sc = SamplingConfig(max_new_tokens=8, eos_id=CFG.vocab_size, greedy=True)
    outs = {}
    for impl in ("xla", "dot_product_attention"):
        model = Transformer(CFG.replace(attention_impl=impl, dtype=dtype), rngs=nnx.Rngs(1))
        outs[impl] = out = sample(model, prompts, pmask, jax.random.key(0), sc)
        full = jnp.concatenate([prompts, out.tokens], axis=1)
        mask = jnp.concatenate([pmask, out.mask], axis=1)
        train_side = token_logprobs(model, full, mask)[:, prompts.shape[1] :]
        np.testing.assert_allclose(out.logprobs, train_side, atol=5 * tol, rtol=0)
    np.testing.assert_array_equal(outs["xla"].tokens, outs["dot_product_attention"].tokens)
    np.testing.assert_allclose(
        outs["dot_product_attention"].logprobs, outs["xla"].logprobs, atol=5 * tol, rtol=0
    )


def _grads(**changes):
    cfg = CFG.replace(**changes)
    model = Transformer(cfg, rngs=nnx.Rngs(2))
    loss = lambda m: token_logprobs(m, TOKENS, MASK).sum()
    return nnx.to_pure_dict(nnx.jit(nnx.grad(loss))(model))


def test_remat_policies_give_the_gradients_of_no_remat():
    """Every policy (with the fused attention, whose backward is JAX's own) gives the
    gradients of the einsum path without remat."""
    ref = _grads(attention_impl="xla")
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(ref)) > 1e-3
    for policy in ("full", "dots_saveable", "dots_with_no_batch_dims_saveable"):
        got = _grads(attention_impl="dot_product_attention", remat=True, remat_policy=policy)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), got, ref)
    got = _grads(attention_impl="xla", remat=True, remat_policy="dots_saveable")
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, ref)


@pytest.mark.parametrize("field", ["attention_impl", "remat_policy"])
def test_bad_attention_or_remat_value_names_the_field(field):
    with pytest.raises(ValueError, match=f"model config: {field} must be one of"):
        CFG.replace(**{field: "flash"})


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN is available on a GPU")
def test_cudnn_off_gpu_is_a_clear_error():
    model = Transformer(CFG.replace(attention_impl="cudnn"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="attention_impl='cudnn' needs a GPU"):
        model(TOKENS, positions_from_mask(MASK), causal_padding_mask(MASK))
