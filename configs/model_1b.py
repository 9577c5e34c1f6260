"""~1.0B-parameter policy transformer, bf16 compute, fp32 master params, remat.

python -m wmrl.benchmarks.train_step --config=configs/model_1b.py --peak_flops=989e12
python -m wmrl.tools.aot_check --config=configs/model_1b.py --mesh=1,8,1
"""

from wmrl.models.model_configs import model_config


def get_config():
    return model_config(
        "1b", mesh_shape=(1, -1, 1), batch_size=8, seq_len=2048, dtype="bfloat16", remat=True
    )
