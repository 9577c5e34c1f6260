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

from wmrl.experiment.config import load_config_file
from wmrl.models.config import TransformerConfig

QWEN3_4B = dict(
    vocab_size=151_936, d_model=2560, num_layers=36, num_heads=32, num_kv_heads=8,
    head_dim=128, mlp_dim=9728, max_len=40_960, qk_norm=True, tie_embeddings=True,
    rope_theta=1_000_000.0, norm_eps=1e-6,
)  # fmt: skip

# Qwen3's chat format with thinking switched off (what its chat template renders for
# `enable_thinking=False`): the task card is the user turn, the script the assistant's answer,
# ended by the tokenizer's EOS (<|im_end|>).
QWEN3_CHAT_TEMPLATE = (
    "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
GROUPS_PER_STEP, GROUP_SIZE = 16, 4


def get_config() -> ml_collections.ConfigDict:
    """The tiny job's pipeline (configs/autoresearch_tiny.py) with a pretrained model's
    settings. `model` (the checkpoint's architecture with the run's numerics) is what the AOT
    check compiles and `pretrained.validate` compares with the checkpoint; the policy step's
    shape is (rl.groups_per_step * rl.group_size) x (data.max_prompt_len +
    data.max_new_tokens) in rl.num_micro_batches chunks. `pretrained.checkpoint` is left
    empty: the launch command sets it."""
    from wmrl.autoresearch.env.suite import suite_tasks

    c = load_config_file(Path(__file__).with_name("autoresearch_tiny.py"))
    model = TransformerConfig(**QWEN3_4B, dtype="bfloat16", param_dtype="float32", remat=True)
    c.model = dataclasses.asdict(model)
    c.mesh_shape = (-1, 8, 2)
    p = c.pretrained
    p.dtype, p.param_dtype, p.remat = model.dtype, model.param_dtype, model.remat
    p.wm_trunk = True
    p.prompt_template = QWEN3_CHAT_TEMPLATE
    c.suite.tasks = tuple(t.id for t in suite_tasks())  # every built-in task
    c.suite.workers = 32  # sandbox slots per host (TPU VM hosts have 100+ cores)
    c.suite.time_limit_s = 60.0
    c.data.scripts_per_task = 32  # executed: WM pretraining data
    c.data.sft_scripts_per_task = 64
    c.data.max_prompt_len = 512
    c.data.max_new_tokens = 1536
    c.policy.sft_steps = 200  # teaches the script contract (DATA_DIR, SUBMISSION_PATH)
    c.policy.sft_batch_size = GROUPS_PER_STEP * GROUP_SIZE
    c.policy.sft_learning_rate = 1e-5
    c.wm.num_members = 4
    c.wm.pretrain_steps = 300
    c.wm.batch_size = GROUPS_PER_STEP * GROUP_SIZE
    c.wm.learning_rate = 1e-5
    c.wm.online_learning_rate = 2e-6
    c.wm.replay_size = 4096
    c.rl.steps = 300
    c.rl.groups_per_step = GROUPS_PER_STEP
    c.rl.group_size = GROUP_SIZE
    c.rl.num_micro_batches = 2
    c.rl.learning_rate = 1e-6
    c.rl.kl_coef = 0.01
    c.rl.temperature = 1.0
    c.rl.eval_every = 10
    c.rl.eval_samples = 8
    c.rl.checkpoint_every = 10
    c.correction.min_pairs = 64
    return c
