"""World Model RL on Mini AutoResearch from the released Qwen3-4B, on a pod.

Policy and world-model trunk start from the checkpoint's weights, with its own tokenizer
(`tokenizer.json`) and Qwen3's chat format (thinking off); the pipeline is the one of
configs/autoresearch_tiny.py (warm start, WM pretraining, RL with Online Debiasing and
Inverse-Variance Denoising), sized for a pod: 16 tasks x 4 samples per step, prompt 512 +
script 1536 tokens, 2 micro-batches; bf16 compute, fp32 master params, remat; mesh data x
fsdp=8 x tensor=2, data taking the rest (32 devices: 2,8,2).

Put the checkpoint on every host, then launch (TPU v5p-64 = 32 chips; or launch/slurm_gpu.sh):

    huggingface-cli download Qwen/Qwen3-4B --local-dir /ckpt/Qwen3-4B   # on every worker
    launch/tpu_vm.sh --name=wmrl-qwen3-4b --zone=us-east5-a --accelerator_type=v5p-64 \
      --copy --config=configs/qwen3_4b.py --workdir=gs://BUCKET/runs/qwen3-4b \
      --extra='--config.pretrained.checkpoint=/ckpt/Qwen3-4B'

AOT-compile the policy train step on fake devices and print per-device memory:

    python -m wmrl.tools.aot_check --config=configs/qwen3_4b.py --mesh=2,8,2
    python -m wmrl.tools.aot_check --config=configs/qwen3_4b.py --mesh=4,8,2
"""

import dataclasses
from pathlib import Path

import ml_collections

from wmrl.autoresearch.config import load_config_file
from wmrl.autoresearch.pretrained import pod_config
from wmrl.models.config import TransformerConfig

QWEN3_4B = dict(
    vocab_size=151_936, d_model=2560, num_layers=36, num_heads=32, num_kv_heads=8,
    head_dim=128, mlp_dim=9728, max_len=40_960, qk_norm=True, tie_embeddings=True,
    rope_theta=1_000_000.0, norm_eps=1e-6,
)  # fmt: skip


def get_config() -> ml_collections.ConfigDict:
    model = TransformerConfig(**QWEN3_4B, dtype="bfloat16", param_dtype="float32", remat=True)
    return pod_config(
        load_config_file(Path(__file__).with_name("autoresearch_tiny.py")),
        dataclasses.asdict(model),
        mesh_shape=(-1, 8, 2),
        tasks_per_step=16,
        group_size=4,
        max_prompt_len=512,
        max_new_tokens=1536,
        num_micro_batches=2,
        learning_rate=1e-6,
    )
