"""~100M-parameter policy transformer, bf16 compute with fp32 master params.

python -m wmrl.benchmarks.train_step --config=configs/model_small.py --peak_flops=989e12
python -m wmrl.tools.aot_check --config=configs/model_small.py --mesh=2,2,2
"""

from wmrl.models.model_configs import model_config


def get_config():
    return model_config(
        "small", mesh_shape=(-1, 1, 1), batch_size=16, seq_len=1024, dtype="bfloat16"
    )
