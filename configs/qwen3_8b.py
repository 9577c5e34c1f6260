"""Qwen3-8B policy (shapes of the released Qwen/Qwen3-8B config.json) for WMRL on pods.

bf16 compute, fp32 master params, remat; the mesh is data x fsdp=8 x tensor=4
with data taking the rest (64 devices: 2,8,4). Untied embeddings, QK-norm,
rope theta 1e6, vocab 151,936.

AOT-compile the policy train step on fake devices and print per-device memory:

python -m wmrl.tools.aot_check --config=configs/qwen3_8b.py --mesh=2,8,4
python -m wmrl.tools.aot_check --config=configs/qwen3_8b.py --mesh=1,8,4

Load the released weights onto the mesh (see docs/checkpoints.md):

    cfg, params = load_hf_checkpoint("/ckpt/Qwen3-8B", mesh, dtype="bfloat16")
"""

import dataclasses

import ml_collections

from wmrl.models.config import TransformerConfig

QWEN3_8B = dict(
    vocab_size=151_936, d_model=4096, num_layers=36, num_heads=32, num_kv_heads=8,
    head_dim=128, mlp_dim=12_288, max_len=40_960, qk_norm=True, tie_embeddings=False,
    rope_theta=1_000_000.0, norm_eps=1e-6,
)  # fmt: skip


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    model = TransformerConfig(**QWEN3_8B, dtype="bfloat16", param_dtype="float32", remat=True)
    c.model = dataclasses.asdict(model)
    c.mesh_shape = (-1, 8, 4)
    c.batch_size = 64
    c.seq_len = 4096
    c.num_micro_batches = 4
    c.learning_rate = 1e-6
    c.weight_decay = 0.0
    return c
