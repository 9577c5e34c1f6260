"""World Model RL on Mini AutoResearch from the released Qwen3-8B, on a pod.

As configs/qwen3_4b.py (policy and WM trunk from the checkpoint, its tokenizer, Qwen3's chat
format with thinking off), with room for longer scripts: 16 tasks x 4 samples per step,
prompt 512 + script 3584 tokens, 4 micro-batches; bf16 compute, fp32 master params, remat;
mesh data x fsdp=8 x tensor=4, data taking the rest (64 devices: 2,8,4). Untied embeddings.

Put the checkpoint on every host, then launch (TPU v5p-128 = 64 chips; or launch/slurm_gpu.sh):

    huggingface-cli download Qwen/Qwen3-8B --local-dir /ckpt/Qwen3-8B   # on every worker
    launch/tpu_vm.sh --name=wmrl-qwen3-8b --zone=us-east5-a --accelerator_type=v5p-128 \
      --copy --config=configs/qwen3_8b.py --workdir=gs://BUCKET/runs/qwen3-8b \
      --extra='--config.pretrained.checkpoint=/ckpt/Qwen3-8B'

AOT-compile the policy train step on fake devices and print per-device memory:

    python -m wmrl.tools.aot_check --config=configs/qwen3_8b.py --mesh=2,8,4
    python -m wmrl.tools.aot_check --config=configs/qwen3_8b.py --mesh=1,8,4
"""

import dataclasses
from pathlib import Path

import ml_collections

from wmrl.autoresearch.config import load_config_file
from wmrl.autoresearch.pretrained import pod_config
from wmrl.models.config import TransformerConfig

QWEN3_8B = dict(
    vocab_size=151_936, d_model=4096, num_layers=36, num_heads=32, num_kv_heads=8,
    head_dim=128, mlp_dim=12_288, max_len=40_960, qk_norm=True, tie_embeddings=False,
    rope_theta=1_000_000.0, norm_eps=1e-6,
)  # fmt: skip


def get_config() -> ml_collections.ConfigDict:
    model = TransformerConfig(**QWEN3_8B, dtype="bfloat16", param_dtype="float32", remat=True)
    return pod_config(
        load_config_file(Path(__file__).with_name("autoresearch_tiny.py")),
        dataclasses.asdict(model),
        mesh_shape=(-1, 8, 4),
        tasks_per_step=16,
        group_size=4,
        max_prompt_len=512,
        max_new_tokens=3584,
        num_micro_batches=4,
        learning_rate=1e-6,
    )
