"""AOT-compile the policy train step of a model config on fake CPU devices.

  python -m wmrl.tools.aot_check --config=configs/model_4b.py --mesh=1,4,2
  python -m wmrl.tools.aot_check --config=configs/model_4b.py --mesh=2,8,2
  python -m wmrl.tools.aot_check --config=configs/qwen3_4b.py --mesh=2,8,2 \
      --config.wm.kind=verdict

With a WMRL config whose `wm.kind` is `verdict`, the verdict WM's teacher-forced scoring of
the step's rows (`wm.verdict_prompt_len` prompt tokens each, the policy's parameters and
shardings) is compiled too.

`--mesh` is `data,fsdp,tensor` (missing trailing axes are 1). The fake CPU
device count is set from the mesh size *before* jax is imported, which is why
jax and everything that imports it are imported inside `main`.
"""

from __future__ import annotations

import math
import os
import sys


def _mesh_from_argv(argv: list[str]) -> tuple[int, ...] | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--mesh="):
            text = arg.split("=", 1)[1]
        elif arg == "--mesh" and i + 1 < len(argv):
            text = argv[i + 1]
        else:
            continue
        try:
            shape = tuple(int(s) for s in text.split(","))
        except ValueError:
            raise SystemExit(
                f"--mesh must be comma-separated ints like 2,2,2, got {text!r}"
            ) from None
        if any(s < 1 for s in shape):
            raise SystemExit(f"--mesh {text!r}: give every axis size explicitly (no -1 or 0)")
        return shape
    return None


def step_shape(config) -> tuple[int, int, int]:
    """(batch, seq_len, micro-batches) of the policy train step: a model config's own fields,
    or, for a WMRL trainer config (configs/qwen3_*.py), the RL step's trajectories per step,
    prompt + script length and `rl.num_micro_batches`."""
    if "rl" in config:
        from wmrl.autoresearch.config import parse_config

        seq = config.data.max_prompt_len + config.data.max_new_tokens
        batch = parse_config(config).rl.groups() * config.rl.group_size
        return batch, seq, config.rl.get("num_micro_batches", 1)
    return config.batch_size, config.seq_len, config.num_micro_batches


def _set_fake_devices(argv: list[str]) -> None:
    shape = _mesh_from_argv(argv)
    if shape is not None:
        flag = f"--xla_force_host_platform_device_count={math.prod(shape)}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
        os.environ["JAX_PLATFORMS"] = "cpu"


def main() -> None:
    _set_fake_devices(sys.argv)

    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file(
        "config", None, "configs/model_*.py, or a WMRL config with config.model", lock_config=True
    )
    flags.DEFINE_string("mesh", None, "data,fsdp,tensor sizes (default: the config's mesh_shape)")
    flags.DEFINE_integer("batch_size", None, "override the config's batch_size")
    flags.DEFINE_integer("seq_len", None, "override the config's seq_len")

    def run(_):
        from wmrl.models.model_configs import transformer_config
        from wmrl.models.sharding import make_mesh
        from wmrl.tools.aot import aot_policy_step

        FLAGS = flags.FLAGS
        config = FLAGS.config
        cfg = transformer_config(config)
        shape = _mesh_from_argv(sys.argv) or tuple(config.mesh_shape)
        mesh = make_mesh(shape)
        batch, seq, micro = step_shape(config)
        r = aot_policy_step(cfg, mesh, FLAGS.batch_size or batch, FLAGS.seq_len or seq, micro)

        def size(n: int) -> str:
            return f"{n / (1 << 30):.3f} GiB ({n / (1 << 20):,.1f} MiB)"

        rows = [
            ("mesh", f"{r['mesh']} ({r['num_devices']} devices)"),
            ("parameters", f"{r['num_params']:,}"),
            ("per-device params", size(r["per_device_param_bytes"])),
            ("per-device optimiser", size(r["per_device_opt_bytes"])),
        ]
        for k in ("argument", "output", "alias", "temp", "generated_code"):
            rows.append((f"compiled {k}_size", size(r[k + "_size_in_bytes"])))
        rows.append(("lower / compile", f"{r['lower_s']:.1f} s / {r['compile_s']:.1f} s"))
        if "wm" in config and config.wm.get("kind") == "verdict":  # its scorer, the same LM
            from wmrl.autoresearch.verdict import OUTCOMES
            from wmrl.tools.aot import aot_verdict_scorer

            prompt = config.wm.verdict_prompt_len
            v = aot_verdict_scorer(cfg, mesh, FLAGS.batch_size or batch, prompt, len(OUTCOMES))
            rows.append(("verdict scorer", f"{v['rows']} rows x {prompt} prompt tokens"))
            for k in ("argument", "output", "temp"):
                rows.append((f"verdict {k}_size", size(v[k + "_size_in_bytes"])))
            rows.append(
                ("verdict lower / compile", f"{v['lower_s']:.1f} s / {v['compile_s']:.1f} s")
            )
        for name, value in rows:
            print(f"{name:<30} {value}")

    from wmrl.experiment.renamed import parse_flags

    app.run(run, flags_parser=parse_flags)


if __name__ == "__main__":
    main()
