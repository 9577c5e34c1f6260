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

from pathlib import Path

import ml_collections

from wmrl.experiment.config import load_config_file


def get_config() -> ml_collections.ConfigDict:
    """configs/qwen3_4b.py (the model, the pod's sizes and numerics) with the suite of
    configs/autoresearch_mle.py (the imported competitions replace the built-in tasks)."""
    c = load_config_file(Path(__file__).with_name("qwen3_4b.py"))
    mle = load_config_file(Path(__file__).with_name("autoresearch_mle.py"))
    c.suite.dir = mle.suite.dir
    c.suite.time_limit_s = 600.0  # real competitions' scripts: the import's default limit
    return c
