"""The AutoResearch trainer started from a Hugging Face checkpoint (`wmrl.autoresearch.pretrained`).

A tiny random Qwen3 (the reference implementation, `transformers`) is saved as safetensors
with a byte-level BPE `tokenizer.json` (its 1,000 ids padded to 1,024 embedding rows, as
Qwen3 pads its vocabulary) and Qwen3's special tokens. The pod configs' pipeline
(`pretrained.pod_config`, what configs/qwen3_4b.py builds) then runs warm start, WM
pretraining and 2 WMRL steps on a (1, 2, 2) mesh with 2 micro-batches; the test checks the
weights both models started from against the torch tensors and decodes the prompts the RL
step trained on with the checkpoint's own tokenizer.

Needs the test extra (`requirements-test.txt`); skipped without it.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from tests.support.rl_fixtures import ROOT, TINY, load_config, set_fields  # noqa: E402
from wmrl.autoresearch import pretrained  # noqa: E402
from wmrl.autoresearch.config import load_config_file, validate_autoresearch_config  # noqa: E402
from wmrl.autoresearch.env import author  # noqa: E402
from wmrl.config_errors import ConfigError  # noqa: E402
from wmrl.models.hf_import import config_from_hf  # noqa: E402

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EMBED_ROWS = 1024
P, N = 224, 384  # the authored scripts are 317-511 tokens with this tokenizer: some fit


def _train_tokenizer(path: str) -> int:
    """Byte-level BPE (any text encodes) trained on authored scripts; returns its size."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    texts = []
    for seed, info in enumerate(
        [
            author.TaskInfo("classification", "accuracy", "species", "id"),
            author.TaskInfo("regression", "rmse", "target", "id", True, True),
        ]
    ):
        texts += [source for _, source in author.write_scripts(info, 200, seed, 0.3)]
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(texts, trainer)
    tok.save(path)
    return tok.get_vocab_size()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, torch state dict as numpy) of a tiny random tied-embedding Qwen3."""
    ckpt = str(tmp_path_factory.mktemp("qwen3_tiny"))
    vocab = _train_tokenizer(os.path.join(ckpt, "tokenizer.json"))
    assert vocab < EMBED_ROWS
    with open(os.path.join(ckpt, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=EMBED_ROWS, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
        rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.2,
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(config).float().eval()
    model.save_pretrained(ckpt, safe_serialization=True)
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return ckpt, weights


def pod_tiny_config(ckpt: str, data_dir, init_dir, **changes):
    """`pretrained.pod_config` for the tiny checkpoint, shrunk to the tiny RL setting."""
    with open(os.path.join(ckpt, "config.json")) as f:
        model = config_from_hf(json.load(f))
    c = pretrained.pod_config(
        load_config(), dataclasses.asdict(model), mesh_shape=(1, 2, 2), tasks_per_step=2,
        group_size=2, max_prompt_len=P, max_new_tokens=N, num_micro_batches=2,
        learning_rate=1e-5,
    )  # fmt: skip
    keep = ("policy.", "data.max_prompt_len", "data.max_new_tokens", "rl.tasks_per_step")
    items = {k: v for k, v in TINY.items() if not k.startswith(keep)}
    items.update({"policy.sft_steps": 2, "policy.sft_batch_size": 4, "wm.pretrain_steps": 0,
                  "suite.time_limit_s": 20.0, "pretrained.checkpoint": ckpt})  # fmt: skip
    return set_fields(c, items, data_dir, init_dir, changes)


def _ours_from_hf(weights: dict, name: str, layer: int) -> np.ndarray:
    """Our layout of one torch tensor (the mapping of docs/checkpoints.md, by hand)."""
    D, H, K, Dh = 32, 4, 2, 8
    w = weights[f"model.layers.{layer}.{name}.weight"]
    return {
        "self_attn.q_proj": lambda: w.T.reshape(D, H, Dh),
        "self_attn.v_proj": lambda: w.T.reshape(D, K, Dh),
        "mlp.down_proj": lambda: w.T,
    }[name]()


# Slow (35 s): the HF import is checked in the fast suite by tests/models/test_hf_import.py (parity
# with transformers) and by the bad-settings tests below; this runs the whole pod pipeline.
@pytest.mark.slow
def test_pod_pipeline_from_hf_checkpoint(checkpoint, rl_shared, tmp_path):
    from wmrl.autoresearch.checkpoint import Checkpointer
    from wmrl.autoresearch.experiment import run

    ckpt, weights = checkpoint
    data_dir, _ = rl_shared
    config = pod_tiny_config(ckpt, data_dir, tmp_path / "init")
    summary = run(config, tmp_path / "wd", progress=False)
    assert summary["steps"] == 2
    assert summary["real_executions"] == 2 * 1 * 2  # 2 steps x 1 anchor group x G = 2
    assert summary["warm_start"]["sft_steps"] == 2 and summary["warm_start"]["sft_examples"] > 0

    import orbax.checkpoint as ocp

    restore = lambda stage: ocp.StandardCheckpointer().restore(tmp_path / "init" / stage / "params")
    # The WM trunk is the checkpoint's weights (0 pretraining steps), heads new.
    wm = restore("wm_pretrain")
    np.testing.assert_array_equal(wm["trunk"]["embed_vd"], weights["model.embed_tokens.weight"])
    for name, ours in (("self_attn.q_proj", "q_dnh"), ("self_attn.v_proj", "v_dkh")):
        np.testing.assert_array_equal(
            wm["trunk"]["blocks"]["attn"][ours][1], _ours_from_hf(weights, name, 1)
        )
    np.testing.assert_array_equal(
        wm["trunk"]["blocks"]["mlp"]["down_fd"][0], _ours_from_hf(weights, "mlp.down_proj", 0)
    )
    # The policy: the checkpoint after 2 SFT steps at lr 1e-5 (Adam moves each weight by
    # ~1e-5 a step; a random init would be ~0.2 away).
    policy = restore("warmstart")
    delta = np.abs(policy["embed_vd"] - weights["model.embed_tokens.weight"])
    assert 0 < delta.max() < 1e-3

    # What RL trained on: the anchors' rows in the WM replay, their prompts tokenized by the
    # checkpoint's tokenizer (decoded here by the reference `tokenizers`) in Qwen3's chat
    # format.
    ck = Checkpointer(tmp_path / "wd", keep=3)
    tree, _ = ck.read_raw()
    ck.close()
    replay = tree["replay"]
    n = int(replay["count"])
    assert n > 0
    ref = tokenizers.Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json"))
    tokens, mask = np.asarray(replay["tokens"])[:n], np.asarray(replay["input_mask"])[:n]
    for row, m in zip(tokens, mask, strict=True):
        prompt = ref.decode(row[:P][m[:P]].tolist(), skip_special_tokens=False)
        assert prompt.startswith("<|im_start|>user\n- ") and "### SCRIPT" in prompt
        assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert row[P:][m[P:]].max() < EMBED_ROWS


def test_qwen3_configs_policy_step_shapes():
    """The AOT check compiles the RL step's shape (16 tasks x 4 samples, prompt + script)."""
    from wmrl.tools.aot_check import step_shape

    for name, shape in (("qwen3_4b", (64, 512 + 1536, 2)), ("qwen3_8b", (64, 512 + 3584, 4))):
        config = load_config_file(os.path.join(ROOT, "configs", f"{name}.py"))
        assert step_shape(config) == shape
        assert config.experiment == "autoresearch" and config.pretrained.wm_trunk


def _main(*flags: str, workdir) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "wmrl.main", f"--workdir={workdir}", *flags],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


def test_qwen3_config_launch_errors(checkpoint, tmp_path):
    """`wmrl.main --config=configs/qwen3_4b.py` without a checkpoint, or with one of another
    architecture: exit 2 naming the field, nothing written."""
    ckpt, _ = checkpoint
    proc = _main("--config=configs/qwen3_4b.py", workdir=tmp_path / "a")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "config.pretrained.checkpoint" in proc.stderr and "no checkpoint" in proc.stderr
    proc = _main(
        "--config=configs/qwen3_4b.py", f"--config.pretrained.checkpoint={ckpt}",
        workdir=tmp_path / "b",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "config.model: does not match the checkpoint" in proc.stderr
    assert "d_model: config 2560 vs checkpoint 32" in proc.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _edited_copy(ckpt: str, dst, **config_changes) -> str:
    dst = str(dst)
    shutil.copytree(ckpt, dst)
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        hf = json.load(f)
    with open(path, "w") as f:
        json.dump({**hf, **config_changes}, f)
    return dst


def test_bad_pretrained_settings_name_the_field(checkpoint, rl_shared, tmp_path):
    ckpt, _ = checkpoint
    data_dir, init_dir = rl_shared

    def check(match: str, field: str, **changes):
        config = pod_tiny_config(ckpt, data_dir, init_dir, **changes)
        del config["model"]  # compare only what each case breaks
        with pytest.raises(ConfigError, match=match) as e:
            validate_autoresearch_config(config)
        assert e.value.field == field

    check("is not a directory", "config.pretrained.checkpoint",
          pretrained__checkpoint=str(tmp_path / "nowhere"))  # fmt: skip
    (tmp_path / "empty").mkdir()
    check("has no config.json", "config.pretrained.checkpoint",
          pretrained__checkpoint=str(tmp_path / "empty"))  # fmt: skip
    check("not a local directory", "config.pretrained.checkpoint",
          pretrained__checkpoint="gs://bucket/Qwen3-4B")  # fmt: skip
    small = _edited_copy(ckpt, tmp_path / "small", vocab_size=900)
    check("tokenizer vocabulary size 1000 exceeds the embedding's vocab_size 900",
          "config.pretrained.checkpoint", pretrained__checkpoint=small)  # fmt: skip
    gemma = _edited_copy(ckpt, tmp_path / "gemma", model_type="gemma3")
    check("model_type 'gemma3' is not supported", "config.pretrained.checkpoint",
          pretrained__checkpoint=gemma)  # fmt: skip
    check("must contain '{prompt}'", "config.pretrained.prompt_template",
          pretrained__prompt_template="<|im_start|>user\n")  # fmt: skip
    check("unknown dtype", "config.pretrained.dtype", pretrained__dtype="fp8")
    check("positive divisor of the 4 trajectories", "config.rl.num_micro_batches",
          rl__num_micro_batches=3)  # fmt: skip


def test_checkpoint_with_other_tensor_shapes_fails_before_training(checkpoint, tmp_path):
    """config.json and the tensors disagree: the import names the tensor before placing any."""
    from wmrl.autoresearch import model_setup

    ckpt, _ = checkpoint
    bad = _edited_copy(ckpt, tmp_path / "bad", intermediate_size=48)
    config = pod_tiny_config(bad, tmp_path / "data", tmp_path / "init")
    del config["model"]
    config.suite.tasks = TINY["suite.tasks"]
    with pytest.raises(ConfigError, match=r"mlp\.gate_proj\.weight.*\(64, 32\), expected"):
        model_setup.build_policy(
            config, 0, model_setup.adam(1e-5), model_setup.make_rl_mesh(config), 0
        )
