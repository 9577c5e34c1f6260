"""Transformer: numpy reference forward, masks, padding, config validation, axis names."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wmrl.models.config import TransformerConfig, from_mapping, named_config, num_params
from wmrl.models.sharding import logical_to_spec, param_logical_axes
from wmrl.models.transformer import (
    Transformer,
    causal_padding_mask,
    positions_from_mask,
    rope_inv_freq,
    token_logprobs,
)

CFG = TransformerConfig(
    vocab_size=32,
    d_model=16,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=24,
    max_len=32,
    qk_norm=True,
    tie_embeddings=False,
)


def _np_rms(x, scale, eps):
    return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps) * scale


def _np_rope(x, pos, theta):
    half = x.shape[-1] // 2
    freq = theta ** (-np.arange(half) * 2.0 / x.shape[-1])
    ang = pos[:, None] * freq  # [T, half]
    s, c = np.sin(ang)[:, None], np.cos(ang)[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def numpy_forward(p, cfg, tokens):
    """Independent single-sequence reference (no padding), float64, loops over heads."""
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = p["embed_vd"][tokens]
    G = cfg.num_heads // cfg.num_kv_heads
    for i in range(cfg.num_layers):
        layer = jax.tree.map(lambda a, i=i: a[i], p["blocks"])
        a = layer["attn"]
        h = _np_rms(x, layer["attn_norm"]["scale"], cfg.norm_eps)
        out = np.zeros((T, cfg.num_heads, cfg.head_dim))
        for n in range(cfg.num_heads):
            kv = n // G
            q = h @ a["q_dnh"][:, n]
            k = h @ a["k_dkh"][:, kv]
            v = h @ a["v_dkh"][:, kv]
            q = _np_rms(q, a["q_norm"]["scale"], cfg.norm_eps)
            k = _np_rms(k, a["k_norm"]["scale"], cfg.norm_eps)
            q = _np_rope(q[:, None], pos, cfg.rope_theta)[:, 0]
            k = _np_rope(k[:, None], pos, cfg.rope_theta)[:, 0]
            s = q @ k.T / np.sqrt(cfg.head_dim)
            s = np.where(np.tril(np.ones((T, T))) > 0, s, -np.inf)
            w = np.exp(s - s.max(-1, keepdims=True))
            out[:, n] = (w / w.sum(-1, keepdims=True)) @ v
        x = x + np.einsum("tnh,nhd->td", out, a["o_nhd"])
        m = layer["mlp"]
        h = _np_rms(x, layer["mlp_norm"]["scale"], cfg.norm_eps)
        g = h @ m["gate_df"]
        x = x + ((g / (1 + np.exp(-g))) * (h @ m["up_df"])) @ m["down_fd"]
    x = _np_rms(x, p["final_norm"]["scale"], cfg.norm_eps)
    return x @ p["unembed_dv"]


def _np_params(model):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), nnx.to_pure_dict(nnx.state(model)))


def _random_norm_scales(model, seed=1):
    """Perturb the RMSNorm scales so the reference checks they are applied."""
    rng = np.random.default_rng(seed)
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param) and path[-1] == "scale":
            var.set_value(jnp.asarray(1 + 0.3 * rng.standard_normal(var.get_value().shape)))


def test_forward_matches_numpy_reference():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    _random_norm_scales(model)
    tokens = np.array([3, 7, 1, 30, 12, 5, 9])
    ref = numpy_forward(_np_params(model), CFG, tokens)
    mask = jnp.ones((1, len(tokens)), bool)
    pos, attn = positions_from_mask(mask), causal_padding_mask(mask)
    logits, _ = model(jnp.asarray(tokens)[None], pos, attn)
    np.testing.assert_allclose(np.asarray(logits[0]), ref, rtol=2e-4, atol=2e-4)


def test_left_padding_and_causality():
    model = Transformer(CFG, rngs=nnx.Rngs(1))
    seq = jnp.array([4, 8, 15, 16, 23])
    padded = jnp.stack([jnp.concatenate([jnp.zeros(3, jnp.int32), seq]), jnp.arange(8) % 32])
    mask = jnp.stack([jnp.arange(8) >= 3, jnp.ones(8, bool)])
    lp_pad = token_logprobs(model, padded, mask)
    lp_alone = token_logprobs(model, seq[None], jnp.ones((1, 5), bool))
    np.testing.assert_allclose(lp_pad[0, 4:], lp_alone[0, 1:], rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(lp_pad[0, :3]) == 0.0)
    # changing a later token must not change earlier log-probs
    changed = padded.at[1, 6].set(31)
    lp_changed = token_logprobs(model, changed, mask)
    np.testing.assert_allclose(lp_changed[1, :6], lp_pad[1, :6], rtol=1e-6, atol=1e-6)
    assert not np.allclose(lp_changed[1, 6:], lp_pad[1, 6:])


def test_bf16_compute_with_fp32_params_tracks_fp32():
    cfg32 = CFG.replace(tie_embeddings=True)
    m32 = Transformer(cfg32, rngs=nnx.Rngs(2))
    m16 = Transformer(cfg32.replace(dtype="bfloat16"), rngs=nnx.Rngs(2))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(m16)))
    toks = jnp.array([[1, 2, 3, 4, 5, 6]])
    mask = jnp.ones_like(toks, bool)
    a, b = token_logprobs(m32, toks, mask), token_logprobs(m16, toks, mask)
    assert b.dtype == jnp.float32
    np.testing.assert_allclose(a, b, atol=0.1)


def test_param_count_and_logical_axes():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    leaves = jax.tree.leaves(nnx.state(model))
    # hand count: embed+unembed 2*32*16; per layer q/o 2*16*4*8, k/v 2*16*2*8,
    # qk-norm 2*8, mlp 3*16*24, norms 2*16; final norm 16
    per_layer = 2 * 16 * 4 * 8 + 2 * 16 * 2 * 8 + 2 * 8 + 3 * 16 * 24 + 2 * 16
    assert sum(x.size for x in leaves) == 2 * 32 * 16 + 2 * per_layer + 16 == num_params(CFG)
    axes = param_logical_axes(nnx.state(model))
    assert axes["blocks"]["attn"]["q_dnh"] == ("layers", "embed", "heads", "head_dim")
    assert axes["blocks"]["mlp"]["down_fd"] == ("layers", "mlp", "embed")
    assert nnx.state(model)["blocks"]["attn"]["q_dnh"].get_value().shape == (2, 16, 4, 8)
    assert logical_to_spec(axes["embed_vd"]) == jax.sharding.PartitionSpec("tensor", "fsdp")
    batch_spec = jax.sharding.PartitionSpec(("data", "fsdp"), None)
    assert logical_to_spec(("batch", "length")) == batch_spec


def test_named_sizes_have_advertised_scale():
    expected = {"small": 1e8, "1b": 1e9, "4b": 4e9, "9b": 9.2e9}
    for name, n in expected.items():
        assert abs(num_params(named_config(name)) / n - 1) < 0.05, name


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(d_model=18, num_heads=4), "d_model=18 is not divisible by num_heads=4"),
        (dict(num_heads=4, num_kv_heads=3), "num_heads=4 is not a multiple of num_kv_heads=3"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(dtype="float8"), "dtype"),
        (dict(rope_scaling="yarn"), "rope_scaling must be one of"),
        (dict(rope_scaling="linear", rope_factor=0.0), "rope_factor"),
        (dict(rope_scaling="llama3", rope_factor=8.0), "rope_original_max_len"),
        (
            dict(rope_scaling="llama3", rope_original_max_len=64, rope_high_freq_factor=1.0),
            "rope_high_freq_factor=1.0 must exceed rope_low_freq_factor=1.0",
        ),
    ],
)
def test_bad_config_raises(fields, message):
    base = dict(vocab_size=32, d_model=16, num_layers=1, num_heads=4, num_kv_heads=2)
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**{**base, **fields})


def test_rope_inv_freq_scalings_match_hand_computation():
    """Llama 3.1 rope scaling, case by case from its definition, in float64.

    head_dim 16, theta 1e4: wavelengths 2 pi * 10^(i/2) = 6.3, 19.9, 62.8, 199, ...; with
    pretraining context 64 and factors 1/4 the first is kept (< 64/4), the next two are
    interpolated (between 16 and 64) and the rest divided by the factor 8 (> 64/1).
    """
    base = dict(vocab_size=8, d_model=64, num_layers=1, num_heads=4, num_kv_heads=2)
    plain = 10_000.0 ** (-np.arange(8) * 2.0 / 16)
    expected, cases = [], []
    for f in plain:
        wavelength = 2 * np.pi / f
        if wavelength < 64 / 4:
            expected.append(f)
            cases.append("kept")
        elif wavelength > 64 / 1:
            expected.append(f / 8)
            cases.append("divided")
        else:
            smooth = (64 / wavelength - 1) / (4 - 1)
            expected.append((1 - smooth) * f / 8 + smooth * f)
            cases.append("interpolated")
    assert cases == ["kept"] + ["interpolated"] * 2 + ["divided"] * 5
    llama3 = TransformerConfig(
        **base, rope_scaling="llama3", rope_factor=8.0, rope_original_max_len=64
    )
    np.testing.assert_allclose(rope_inv_freq(llama3), expected, rtol=1e-6)
    # wavelength 19.9: smooth = (64 / 19.87 - 1) / 3 = 0.7404, so 0.2596 / 8 + 0.7404 = 0.7728 of f
    np.testing.assert_allclose(rope_inv_freq(llama3)[1] / plain[1], 0.7728, atol=1e-4)
    np.testing.assert_allclose(rope_inv_freq(TransformerConfig(**base)), plain, rtol=1e-6)
    linear = TransformerConfig(**base, rope_scaling="linear", rope_factor=2.0)
    np.testing.assert_allclose(rope_inv_freq(linear), plain / 2, rtol=1e-6)


def test_unknown_config_field_raises():
    with pytest.raises(ValueError, match=r"unknown fields.*num_head"):
        from_mapping(dict(vocab_size=8, d_model=8, num_layers=1, num_head=2, num_kv_heads=1))


def test_remat_gives_identical_gradients():
    cfg = CFG.replace(num_layers=2)
    tokens, mask = jnp.arange(8)[None] % 32, jnp.ones((1, 8), bool)
    grads = [
        nnx.to_pure_dict(
            nnx.grad(lambda m: token_logprobs(m, tokens, mask).sum())(
                Transformer(cfg.replace(remat=remat), rngs=nnx.Rngs(0))
            )
        )
        for remat in (False, True)
    ]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), *grads)


def _np_logprobs(logits, tokens):
    """log p(tokens[t] | tokens[<t]) from `[T, V]` float64 logits; 0 at t = 0."""
    z = logits - logits.max(-1, keepdims=True)
    lsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return np.concatenate([[0.0], lsm[np.arange(len(tokens) - 1), tokens[1:]]])


@pytest.mark.parametrize("start", [0, 1, 4, 7])
def test_logprobs_from_a_start_column_match_the_numpy_reference(start):
    """`start` skips the prompt columns' unembedding: the columns from `start` on equal the
    full computation (independent numpy forward), the ones before are exactly 0."""
    model = Transformer(CFG, rngs=nnx.Rngs(5))
    _random_norm_scales(model)
    tokens = np.array([3, 7, 1, 30, 12, 5, 9, 22, 2])
    ref = _np_logprobs(numpy_forward(_np_params(model), CFG, tokens), tokens)
    mask = jnp.ones((1, len(tokens)), bool)
    got = np.asarray(token_logprobs(model, jnp.asarray(tokens)[None], mask, start))
    s = max(start, 1)
    np.testing.assert_allclose(got[0, s:], ref[s:], rtol=2e-4, atol=2e-4)
    assert np.all(got[0, :s] == 0.0)


def test_policy_loss_with_prompt_logits_skipped_has_the_same_loss_and_gradients():
    """`PolicyLossConfig.logits_from` = the prompt width changes nothing the loss sees (no
    loss before it), with and without the entropy bonus."""
    from wmrl.models.train_steps import PolicyLossConfig, policy_loss_fn

    model = Transformer(CFG, rngs=nnx.Rngs(6))
    rng = np.random.default_rng(0)
    B, P, N = 3, 5, 6
    tokens = rng.integers(1, CFG.vocab_size, (B, P + N))
    input_mask = np.ones((B, P + N), bool)
    input_mask[0, :2] = False  # a left-padded prompt
    input_mask[1, P + 4 :] = False  # a completion that ended early
    loss_mask = np.concatenate([np.zeros((B, P)), input_mask[:, P:]], 1).astype(np.float32)
    batch = {
        "tokens": jnp.asarray(tokens), "input_mask": jnp.asarray(input_mask),
        "loss_mask": jnp.asarray(loss_mask),
        "old_logp": jnp.asarray(-2.0 + 0.3 * rng.standard_normal((B, P + N)) * loss_mask),
        "ref_logp": jnp.asarray(-2.5 + 0.3 * rng.standard_normal((B, P + N)) * loss_mask),
        "advantages": jnp.asarray([0.5, -1.0, 0.25]),
    }  # fmt: skip
    for entropy_coef in (0.0, 0.01):
        out = []
        for logits_from in (0, P):
            cfg = PolicyLossConfig(kl_coef=0.05, entropy_coef=entropy_coef, logits_from=logits_from)
            fn = policy_loss_fn(cfg)
            (loss, metrics), grads = nnx.value_and_grad(
                lambda m, fn=fn: fn(m, batch, float(loss_mask.sum())), has_aux=True
            )(model)
            out.append((loss, metrics, nnx.to_pure_dict(grads)))
        (l0, m0, g0), (l1, m1, g1) = out
        np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-6)
        for k in m0:
            np.testing.assert_allclose(m1[k][0], m0[k][0], rtol=1e-5, atol=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g1, g0)


def test_entropy_bonus_gradient_and_the_rl_config_reaching_it():
    """With `entropy_coef` c the loss is the plain loss minus c x the masked mean next-token
    entropy (computed here independently from the logits), gradients likewise; the trainer's
    loss config takes `rl.entropy_coef` from the config."""
    from configs.autoresearch_tiny import get_config
    from wmrl.autoresearch.model_setup import policy_loss_config
    from wmrl.models.train_steps import PolicyLossConfig, policy_loss_fn

    model = Transformer(CFG, rngs=nnx.Rngs(2))
    rng = np.random.default_rng(1)
    B, T = 2, 7
    tokens = jnp.asarray(rng.integers(1, CFG.vocab_size, (B, T)))
    loss_mask = jnp.asarray(np.array([[0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 0]], np.float32))
    batch = {
        "tokens": tokens, "input_mask": jnp.ones((B, T), bool), "loss_mask": loss_mask,
        "old_logp": jnp.full((B, T), -2.0), "ref_logp": jnp.full((B, T), -2.0),
        "advantages": jnp.asarray([0.5, -1.0]),
    }  # fmt: skip
    n = float(loss_mask.sum())

    def entropy_mean(m):
        ones = jnp.ones((B, T), bool)
        logits, _ = m(tokens, positions_from_mask(ones), causal_padding_mask(ones))
        logits = logits[:, :-1].astype(jnp.float32)
        p = jax.nn.softmax(logits, -1)
        ent = -jnp.sum(p * jnp.log(p), -1)  # predicts tokens 1..T-1
        return jnp.sum(ent * loss_mask[:, 1:]) / n

    c = 0.3
    plain = policy_loss_fn(PolicyLossConfig())
    bonus = policy_loss_fn(PolicyLossConfig(entropy_coef=c))
    l0, g0 = nnx.value_and_grad(lambda m: plain(m, batch, n)[0])(model)
    l1, g1 = nnx.value_and_grad(lambda m: bonus(m, batch, n)[0])(model)
    he, ge = nnx.value_and_grad(entropy_mean)(model)
    np.testing.assert_allclose(float(l1), float(l0) - c * float(he), rtol=1e-5, atol=1e-6)
    want = jax.tree.map(lambda a, b: a - c * b, nnx.to_pure_dict(g0), nnx.to_pure_dict(ge))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
        nnx.to_pure_dict(g1), want,
    )  # fmt: skip
    config = get_config()
    config.rl.entropy_coef = 0.02
    assert policy_loss_config(config).entropy_coef == 0.02
