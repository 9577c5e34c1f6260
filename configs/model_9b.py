"""~9.2B-parameter policy transformer (Gemma-2-9B-like shapes), bf16 compute, remat.

python -m wmrl.tools.aot_check --config=configs/model_9b.py --mesh=2,8,4
"""

from wmrl.models.model_configs import model_config


def get_config():
    return model_config(
        "9b", mesh_shape=(-1, 8, 4), batch_size=64, seq_len=4096, num_micro_batches=4,
        dtype="bfloat16", remat=True,
    )  # fmt: skip
