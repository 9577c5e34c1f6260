"""Bandit suite speed: the vmapped JAX suite vs a plain numpy loop over the same work.

    python -m wmrl.benchmarks.bandits [--out=FILE.json] [--num_seeds=1000 --num_steps=3000]

Runs every variant of configs/bandit.py for num_seeds x num_steps (compile and run timed
separately), then the numpy reference on a reduced size, and reports pulls/s of both and their
ratio. Seeds are sharded over one XLA CPU device per core (`--devices`, default: all cores).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

from absl import app, flags

_OUT = flags.DEFINE_string("out", None, "Write the figures as JSON here.")
_SEEDS = flags.DEFINE_integer("num_seeds", 1000, "Seeds of the JAX suite.")
_STEPS = flags.DEFINE_integer("num_steps", 3000, "Steps of the JAX suite.")
_NP_SEEDS = flags.DEFINE_integer("numpy_seeds", 2, "Seeds of the numpy reference.")
_NP_STEPS = flags.DEFINE_integer("numpy_steps", 300, "Steps of the numpy reference.")
_VARIANTS = flags.DEFINE_list("variants", None, "Subset of variants (default: all).")
_DEVICES = flags.DEFINE_integer("devices", os.cpu_count() or 1, "XLA CPU devices (seeds shard).")


def main(argv):
    del argv
    if "jax" not in sys.modules:
        flag = f"--xla_force_host_platform_device_count={_DEVICES.value}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    import jax

    from configs.bandit import get_config
    from wmrl.bandits.experiment import run_variant
    from wmrl.bandits.numpy_reference import run_numpy_variant

    config = get_config()
    config.num_seeds, config.num_steps = _SEEDS.value, _STEPS.value
    if _VARIANTS.value:
        config.variants = tuple(_VARIANTS.value)
    B = config.bandit.batch_size
    rows, compile_s, run_s = {}, 0.0, 0.0
    for v in config.variants:
        _, c, r = run_variant(config, v)
        compile_s, run_s = compile_s + c, run_s + r
        rows[v] = {
            "compile_s": c,
            "run_s": r,
            "pulls_per_s": config.num_seeds * config.num_steps * B / r,
        }
        print(f"  jax   {v:22s} compile {c:6.2f}s  run {r:7.2f}s", flush=True)
    jax_pulls = config.num_seeds * config.num_steps * B * len(config.variants)
    np_pulls, np_s = 0, 0.0
    for v in config.variants:
        t0 = time.perf_counter()
        out = run_numpy_variant(config, v, _NP_SEEDS.value, _NP_STEPS.value)
        np_s += time.perf_counter() - t0
        np_pulls += out["pulls"]
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__} "
        f"on {jax.devices()[0].platform} x{jax.device_count()}",
        "num_seeds": config.num_seeds,
        "num_steps": config.num_steps,
        "variants": list(config.variants),
        "compile_s": compile_s,
        "run_s": run_s,
        "pulls_per_s": jax_pulls / run_s,
        "numpy_pulls_per_s": np_pulls / np_s,
        "numpy_size": {"num_seeds": _NP_SEEDS.value, "num_steps": _NP_STEPS.value},
        "speedup_vs_numpy": (jax_pulls / run_s) / (np_pulls / np_s),
        "per_variant": rows,
    }
    print()
    print(f"{'':24s}{'seeds':>7s}{'steps':>7s}{'compile_s':>11s}{'run_s':>9s}{'pulls/s':>12s}")
    print(
        f"{'JAX suite (all variants)':24s}{config.num_seeds:7d}{config.num_steps:7d}"
        f"{compile_s:11.2f}{run_s:9.2f}{result['pulls_per_s']:12.3g}"
    )
    print(
        f"{'numpy loop':24s}{_NP_SEEDS.value:7d}{_NP_STEPS.value:7d}{'-':>11s}{np_s:9.2f}"
        f"{result['numpy_pulls_per_s']:12.3g}"
    )
    print(f"speedup_vs_numpy: {result['speedup_vs_numpy']:.1f}x   ({result['machine']})")
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    app.run(main)
