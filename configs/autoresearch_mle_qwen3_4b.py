"""World Model RL on benchmark competitions (configs/autoresearch_mle.py) from the released
Qwen3-4B, on a pod: the pod sizing of configs/qwen3_4b.py (16 competitions x 4 samples per
step, prompt 512 + script 1536 tokens, 2 micro-batches, bf16 compute, fp32 master params,
remat, mesh data x fsdp=8 x tensor=2) on the competition suite, each script given up to
10 minutes (the import's default `--time_limit`).

    launch/tpu_vm.sh --name=wmrl-mle-qwen3-4b --zone=us-east5-a --accelerator_type=v5p-64 \\
      --copy --config=configs/autoresearch_mle_qwen3_4b.py --workdir=gs://BUCKET/runs/mle-s0 \\
      --extra='--config.pretrained.checkpoint=/ckpt/Qwen3-4B --config.suite.dir=/data/competitions'

The suite directory must be on every host's local disk (docs/competitions.md). AOT-compile
the policy train step on fake devices:

    python -m wmrl.tools.aot_check --config=configs/autoresearch_mle_qwen3_4b.py --mesh=2,8,2
"""

import dataclasses
import importlib.util
from pathlib import Path

import ml_collections

from wmrl.autoresearch.config import load_config_file
from wmrl.autoresearch.pretrained import pod_config
from wmrl.models.config import TransformerConfig


def _qwen3_4b() -> dict:
    path = Path(__file__).with_name("qwen3_4b.py")
    spec = importlib.util.spec_from_file_location("wmrl_config_qwen3_4b", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.QWEN3_4B


def get_config() -> ml_collections.ConfigDict:
    model = TransformerConfig(**_qwen3_4b(), dtype="bfloat16", param_dtype="float32", remat=True)
    c = pod_config(
        load_config_file(Path(__file__).with_name("autoresearch_mle.py")),
        dataclasses.asdict(model),
        mesh_shape=(-1, 8, 2),
        tasks_per_step=16,
        group_size=4,
        max_prompt_len=512,
        max_new_tokens=1536,
        num_micro_batches=2,
        learning_rate=1e-6,
    )
    c.suite.time_limit_s = 600.0  # pod_config's 60 s is for the built-in tasks
    return c
