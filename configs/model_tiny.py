"""Tiny policy transformer (~90K params): unit tests, CPU benchmarks, smoke runs.

python -m wmrl.tools.aot_check --config=configs/model_tiny.py --mesh=2,2,2
python -m wmrl.benchmarks.rollout --config=configs/model_tiny.py --out=rollout.json
"""

from wmrl.models.model_configs import model_config


def get_config():
    return model_config("tiny", mesh_shape=(-1, 1, 1), batch_size=16, seq_len=64)
