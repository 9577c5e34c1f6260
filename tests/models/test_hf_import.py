"""HF safetensors import: parity with the `transformers` reference on tiny random Qwen3 models.

Needs the test extra (`requirements-test.txt`: CPU torch, transformers); skipped
without it. Each reference model is 2 layers, d_model 64, vocab 300.
"""

import importlib.util
import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from wmrl.models.config import from_mapping  # noqa: E402
from wmrl.models.hf_import import (  # noqa: E402
    abstract_transformer,
    config_from_hf,
    load_hf_checkpoint,
)
from wmrl.models.sampler import SamplingConfig, generate  # noqa: E402
from wmrl.models.sharding import make_mesh  # noqa: E402
from wmrl.models.transformer import causal_padding_mask, positions_from_mask  # noqa: E402

VOCAB = 300
NEW_TOKENS = 8


def _tiny_qwen3(tmp_dir: str, tied: bool, seed: int) -> "transformers.Qwen3ForCausalLM":
    """A random tiny Qwen3 saved as safetensors in `tmp_dir`.

    A wide init (0.2) makes logit gaps large enough that greedy decoding is not
    decided by float noise; the norm weights are randomised too (HF initialises
    them to ones, which would hide a norm mapped to the wrong tensor).
    """
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        rope_theta=5000.0, rms_norm_eps=1e-5, tie_word_embeddings=tied, initializer_range=0.2,
    )  # fmt: skip
    return _randomise_norms_and_save(transformers.Qwen3ForCausalLM(config), tmp_dir)


def _randomise_norms_and_save(model, tmp_dir: str):
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    model.save_pretrained(tmp_dir, safe_serialization=True)
    return model


def _tiny_llama(tmp_dir: str, seed: int, **config) -> "transformers.LlamaForCausalLM":
    """A random tiny Llama (no QK-norm, untied, rope theta 5e5) saved like `_tiny_qwen3`."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0, rms_norm_eps=1e-5,
        initializer_range=0.2, max_position_embeddings=64, **config,
    )  # fmt: skip
    return _randomise_norms_and_save(transformers.LlamaForCausalLM(config), tmp_dir)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def reference(request, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp(f"qwen3_tied{request.param}"))
    model = _tiny_qwen3(ckpt, tied=request.param, seed=int(request.param))
    return ckpt, model, request.param


def _batch(length: int = 10):
    """Three prompts, the second and third left-padded (pad id 0, masked)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, VOCAB, size=(3, length)).astype(np.int32)
    mask = np.ones((3, length), bool)
    mask[1, :4] = False
    mask[2, :7] = False
    tokens[~mask] = 0
    return tokens, mask


def _ours(cfg, params, tokens, mask):
    graphdef, _ = abstract_transformer(cfg)

    @jax.jit
    def forward(params, tokens, mask):
        model = nnx.merge(graphdef, params)
        logits, _ = model(tokens, positions_from_mask(mask), causal_padding_mask(mask))
        return logits

    return np.asarray(forward(params, jnp.asarray(tokens), jnp.asarray(mask)))


def _reference_logits(model, tokens, mask):
    positions = np.array(positions_from_mask(jnp.asarray(mask)))
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(tokens).long(),
            attention_mask=torch.from_numpy(mask).long(),
            position_ids=torch.from_numpy(positions).long(),
        )
    return out.logits.numpy()


def test_logits_match_reference(reference):
    ckpt, model, tied = reference
    cfg, params = load_hf_checkpoint(ckpt)
    assert cfg.tie_embeddings == tied and cfg.qk_norm and cfg.rope_theta == 5000.0
    assert ("unembed_dv" in params) == (not tied)
    tokens, mask = _batch()
    ours, ref = _ours(cfg, params, tokens, mask), _reference_logits(model, tokens, mask)
    assert np.abs(ref[mask]).max() > 1.0  # logits are not trivially small
    np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-4, rtol=1e-4)


def test_greedy_generation_matches_reference(reference):
    _assert_greedy_matches(*reference[:2], *_batch())


def _assert_greedy_matches(ckpt, model, tokens, mask):
    """Our KV-cache sampler's greedy tokens equal `model.generate(do_sample=False)`."""
    cfg, params = load_hf_checkpoint(ckpt)
    with torch.no_grad():
        ref = model.generate(
            input_ids=torch.from_numpy(tokens).long(),
            attention_mask=torch.from_numpy(mask).long(),
            max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
            pad_token_id=0, eos_token_id=None,
        )  # fmt: skip
    ref_new = ref[:, tokens.shape[1] :].numpy()
    graphdef, _ = abstract_transformer(cfg)
    sc = SamplingConfig(max_new_tokens=NEW_TOKENS, eos_id=-1, greedy=True)
    out = generate(
        graphdef, params, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(0), sc, cfg.max_len
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), ref_new)


def test_sharded_placement_matches_single_device(reference):
    ckpt, model, _ = reference
    mesh = make_mesh((1, 2, 2), jax.devices()[:4])
    cfg, params = load_hf_checkpoint(ckpt, mesh=mesh)
    q = params["blocks"]["attn"]["q_dnh"]
    assert q.sharding == NamedSharding(mesh, PartitionSpec(None, "fsdp", "tensor", None))
    assert params["embed_vd"].sharding == NamedSharding(mesh, PartitionSpec("tensor", "fsdp"))
    assert len(q.addressable_shards) == 4 and q.addressable_shards[0].data.shape == (2, 32, 2, 16)
    tokens, mask = _batch()
    with jax.set_mesh(mesh):
        ours = _ours(cfg, params, tokens, mask)
    ref = _reference_logits(model, tokens, mask)
    np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-4, rtol=1e-4)


def test_bfloat16_params_load(reference):
    ckpt, _, _ = reference
    cfg, params = load_hf_checkpoint(ckpt, param_dtype="bfloat16", dtype="bfloat16")
    assert params["blocks"]["mlp"]["up_df"].dtype == jnp.bfloat16
    assert cfg.param_dtype == "bfloat16"


def test_sharded_bfloat16_checkpoint_reads_exactly(reference, tmp_path):
    """A bf16 checkpoint split over several files (with the index json), as released
    Qwen3 checkpoints are: loaded into fp32 params it must equal the bf16 reference
    upcast to fp32."""
    ckpt_dir = str(tmp_path / "bf16_sharded")
    bf16 = _tiny_qwen3(str(tmp_path / "fp32"), tied=reference[2], seed=3).to(torch.bfloat16)
    bf16.save_pretrained(ckpt_dir, safe_serialization=True, max_shard_size="40KB")
    assert os.path.exists(os.path.join(ckpt_dir, "model.safetensors.index.json"))
    assert len([n for n in os.listdir(ckpt_dir) if n.endswith(".safetensors")]) > 1
    cfg, params = load_hf_checkpoint(ckpt_dir)
    assert params["embed_vd"].dtype == jnp.float32
    tokens, mask = _batch()
    # Reload rather than `bf16.float()`: that would keep the rotary `inv_freq` buffer
    # rounded to bf16, a different (worse) reference than the fp32 one HF computes.
    ref_model = transformers.Qwen3ForCausalLM.from_pretrained(ckpt_dir, dtype=torch.float32)
    ref = _reference_logits(ref_model.eval(), tokens, mask)
    np.testing.assert_allclose(_ours(cfg, params, tokens, mask)[mask], ref[mask], atol=1e-4)


def _copy(ckpt, tmp_path):
    dst = str(tmp_path / "ckpt")
    shutil.copytree(ckpt, dst)
    return dst


def _edit_config(ckpt_dir, **changes):
    path = os.path.join(ckpt_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(changes)
    with open(path, "w") as f:
        json.dump(config, f)


def test_shape_mismatch_names_tensor(reference, tmp_path):
    ckpt = _copy(reference[0], tmp_path)
    _edit_config(ckpt, intermediate_size=96)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight.*\(128, 64\)"):
        load_hf_checkpoint(ckpt)


def test_missing_tensor_names_tensor(reference, tmp_path):
    model = reference[1]
    dst = str(tmp_path / "dropped")
    state = {k: v for k, v in model.state_dict().items() if "layers.1.self_attn.k_norm" not in k}
    model.save_pretrained(dst, state_dict=state, safe_serialization=True)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight.*missing"):
        load_hf_checkpoint(dst)


def test_tokenizer_larger_than_embedding_is_rejected(reference):
    with pytest.raises(ValueError, match="tokenizer vocabulary size 301 exceeds"):
        load_hf_checkpoint(reference[0], tokenizer_vocab_size=VOCAB + 1)


def test_checkpoint_tokenizer_json_is_loaded_and_checked(reference, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    ckpt = _copy(reference[0], tmp_path)
    words = [f"w{i}" for i in range(VOCAB + 5)]  # 306 ids > 300 embedding rows
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", *words])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(os.path.join(ckpt, "tokenizer.json"))
    with open(os.path.join(ckpt, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<eos>", "pad_token": "<pad>"}, f)
    with pytest.raises(ValueError, match="tokenizer vocabulary size 307 exceeds"):
        load_hf_checkpoint(ckpt)

    from wmrl.hf_tokenizer import load_checkpoint_tokenizer

    hf_tok = load_checkpoint_tokenizer(ckpt)
    assert (hf_tok.eos_id, hf_tok.pad_id, hf_tok.vocab_size) == (1, 0, 307)
    ids, mask = hf_tok.batch_encode(["w3 w4", "w5"], add_bos=False, add_eos=True)
    np.testing.assert_array_equal(ids, [[5, 6, 1], [0, 7, 1]])
    np.testing.assert_array_equal(mask, [[True, True, True], [False, True, True]])
    assert hf_tok.decode(ids[1]) == "w5"


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"model_type": "qwen3_moe"}, "model_type"),
        ({"model_type": "gemma3"}, "model_type"),
        ({"num_experts": 8}, "num_experts"),
        ({"use_sliding_window": True}, "sliding_window"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_parameters.*'yarn'"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling.*'dynamic'"),
        ({"rope_scaling": {"type": "longrope", "factor": 2.0}}, "rope_scaling.*'longrope'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3.*low_freq_factor"),
        ({"rope_scaling": {"rope_type": "linear"}}, "linear.*factor"),
    ],
)
def test_unsupported_config_is_rejected(changes, field):
    base = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    ).to_dict()  # fmt: skip
    config_from_hf(base)  # the unchanged config is accepted
    with pytest.raises(ValueError, match=field):
        config_from_hf({**base, **changes})


def test_llama_logits_match_reference(tmp_path):
    """Llama (no QK-norm, untied, rope theta 5e5) through the same import path."""
    model = _tiny_llama(str(tmp_path), seed=7)
    cfg, params = load_hf_checkpoint(str(tmp_path))
    assert not cfg.qk_norm and "q_norm" not in params["blocks"]["attn"]
    assert cfg.rope_scaling == "none"
    tokens, mask = _batch()
    ours, ref = _ours(cfg, params, tokens, mask), _reference_logits(model, tokens, mask)
    np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-4, rtol=1e-4)


# Pretraining context 16, below the 24-token prompts (+8 generated). With head_dim 16 and
# theta 5e5 the llama3 thresholds (wavelengths 16/2 = 8 and 16/0.25 = 64) split the 8
# frequencies into all three cases: wavelength 6.3 kept, 32 interpolated, >= 166 divided.
SCALED_ROPE = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0.25,
               "high_freq_factor": 2.0, "original_max_position_embeddings": 16},
    "linear": {"rope_type": "linear", "factor": 4.0},
}  # fmt: skip
LONG = 24


@pytest.fixture(scope="module", params=sorted(SCALED_ROPE))
def scaled_llama(request, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp(f"llama_{request.param}"))
    rope = {**SCALED_ROPE[request.param], "rope_theta": 500000.0}
    return ckpt, _tiny_llama(ckpt, seed=11, rope_parameters=rope), request.param


def test_scaled_rope_llama_logits_match_reference(scaled_llama):
    """Llama 3.1-style (and linear) rope scaling: our logits equal the reference's, and
    the same weights with the scaling ignored are far off (so the check can fail)."""
    ckpt, model, rope_type = scaled_llama
    cfg, params = load_hf_checkpoint(ckpt)
    assert cfg.rope_scaling == rope_type and cfg.rope_factor == SCALED_ROPE[rope_type]["factor"]
    tokens, mask = _batch(LONG)
    ours, ref = _ours(cfg, params, tokens, mask), _reference_logits(model, tokens, mask)
    np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-4, rtol=1e-4)
    unscaled = _ours(cfg.replace(rope_scaling="none"), params, tokens, mask)
    assert np.abs(unscaled[mask] - ref[mask]).max() > 0.1


def test_scaled_rope_llama_greedy_generation_matches_reference(scaled_llama):
    _assert_greedy_matches(*scaled_llama[:2], *_batch(LONG))


def test_rope_scaling_spellings_map_alike():
    """transformers < 4.56 `rope_theta` + `rope_scaling` (also with the legacy `type` key)
    and the newer `rope_parameters` give the same config."""
    hf = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_parameters={**SCALED_ROPE["llama3"], "rope_theta": 500000.0},
    ).to_dict()  # fmt: skip
    new = config_from_hf(hf)
    assert (new.rope_scaling, new.rope_theta, new.rope_original_max_len) == ("llama3", 5e5, 16)
    assert (new.rope_factor, new.rope_low_freq_factor, new.rope_high_freq_factor) == (8, 0.25, 2)
    legacy = {k: v for k, v in hf.items() if k != "rope_parameters"}
    old = config_from_hf({**legacy, "rope_theta": 500000.0, "rope_scaling": SCALED_ROPE["llama3"]})
    assert old == new
    linear = config_from_hf(
        {**legacy, "rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2}}
    )
    assert (linear.rope_scaling, linear.rope_factor) == ("linear", 2.0)
    both = {**hf, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    with pytest.raises(ValueError, match="rope_parameters and rope_scaling give different"):
        config_from_hf(both)


def test_missing_config_field_is_named():
    with pytest.raises(ValueError, match="intermediate_size"):
        config_from_hf({"model_type": "qwen3", "vocab_size": 8, "hidden_size": 8,
                        "num_hidden_layers": 1, "num_attention_heads": 2})  # fmt: skip


def test_llama_config_maps_without_qk_norm():
    hf = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0, rms_norm_eps=1e-5,
    ).to_dict()  # fmt: skip
    cfg = config_from_hf(hf)
    assert not cfg.qk_norm and cfg.head_dim == 16 and cfg.rope_theta == 500000.0
    assert cfg.norm_eps == 1e-5 and not cfg.tie_embeddings


def _released_qwen3_config(**shape) -> dict:
    """A `config.json` in the format of the released Qwen3 checkpoints (transformers 4.51:
    `rope_theta` + `rope_scaling: null`, sliding-window fields present but off)."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "initializer_range": 0.02, "max_position_embeddings": 40960, "max_window_layers": 36,
        "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936, **shape,
    }  # fmt: skip


@pytest.mark.parametrize(
    "config_file, shape",
    [
        ("qwen3_4b", dict(hidden_size=2560, intermediate_size=9728, tie_word_embeddings=True)),
        ("qwen3_8b", dict(hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False)),
    ],
)
def test_pod_configs_match_released_checkpoints(config_file, shape):
    """The configs' model is what importing the released checkpoint produces."""
    root = str(Path(__file__).resolve().parents[2])
    spec = importlib.util.spec_from_file_location(
        config_file, os.path.join(root, "configs", f"{config_file}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ours = module.get_config().model.to_dict()
    imported = config_from_hf(
        _released_qwen3_config(**shape), dtype=ours["dtype"], param_dtype=ours["param_dtype"]
    )
    assert imported.replace(remat=ours["remat"]) == from_mapping(ours)
