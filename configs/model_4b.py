"""~4.0B-parameter policy transformer (untied, QK-norm), bf16 compute, fp32 master params.

python -m wmrl.tools.aot_check --config=configs/model_4b.py --mesh=1,4,2
python -m wmrl.tools.aot_check --config=configs/model_4b.py --mesh=2,8,2
"""

from wmrl.models.model_configs import model_config


def get_config():
    return model_config(
        "4b", mesh_shape=(1, -1, 2), batch_size=32, seq_len=2048, num_micro_batches=2,
        dtype="bfloat16", remat=True,
    )  # fmt: skip
