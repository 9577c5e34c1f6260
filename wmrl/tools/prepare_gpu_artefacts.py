"""Build on CPU what `wmrl.benchmarks.gpu_suite` starts from, so nothing is rebuilt on the GPU.

  python -m wmrl.tools.prepare_gpu_artefacts --out=/tmp/wmrl-gpu-build --pack=.gpu/artefacts
  python -m wmrl.tools.prepare_gpu_artefacts --out=/tmp/wmrl-gpu-dry --dry_run

OUT/data   the data stage of configs/autoresearch_tiny.py (task suite, executed corpus,
           tokenizer): its `data_dir`
OUT/init   the warm-start policy and the pretrained world model (Orbax): its `init_dir`
OUT/reference_logits.npz   the tiny model's parameters, a left- and right-padded batch and its
           logits computed here on CPU in float32 and bfloat16 (`compare_logits`)

`--dry_run` builds the tiny test setting instead (tests/support/rl_fixtures.py's sizes, 2 tasks) for
the suite's own CPU test. Rerunning reuses what is already built (each stage is resumable).
The built folder is too large to carry (the suite's CSVs of the large-n tasks: ~56 MiB of
~62), so `--pack=DIR` writes what travels: DIR/stages.tar.gz (data + init, gzip: ~30 MiB)
and DIR/reference_logits.npz; the suite unpacks the archive on the device machine. The sizes
are printed; with the wheels they must stay under the carry limit (64 MiB in all).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tarfile
from pathlib import Path

from wmrl.autoresearch.presets import TINY_SETTING

ROOT = Path(__file__).resolve().parents[2]
LOGITS_NAME = "reference_logits.npz"
ARCHIVE_NAME = "stages.tar.gz"
# The dry run uses the trainer tests' tiny setting, so it reuses the stages a test session
# already built (`rl_shared`).
DRY_RUN_RL = TINY_SETTING
# Tolerances of the CPU-vs-accelerator logits check, relative to the largest |logit|: bf16
# rounding (8 bits of mantissa, accumulated over the layers); float32 allows TF32 matmuls,
# which XLA uses on recent NVIDIA GPUs at JAX's default precision.
TOLERANCE = {"float32": 1e-2, "bfloat16": 4e-2}


def rl_config(artefacts: Path, dry_run: bool, steps: int | None = None):
    """configs/autoresearch_tiny.py (the dry-run sizes with `dry_run`) starting from the
    artefacts' `data_dir` and `init_dir`, evaluated at its start and end only."""
    from wmrl.autoresearch.config import load_config_file

    c = load_config_file(ROOT / "configs" / "autoresearch_tiny.py")
    items = dict(DRY_RUN_RL) if dry_run else {}
    items["data_dir"] = str(Path(artefacts).resolve() / "data")
    items["init_dir"] = str(Path(artefacts).resolve() / "init")
    if steps is not None:
        items.update({"rl.steps": steps, "rl.eval_every": steps, "rl.checkpoint_every": steps})
    for key, value in items.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def missing_stages(artefacts: Path) -> list[str]:
    artefacts = Path(artefacts)
    need = ["data/suite/suite.json", "data/trajectories", "init/warmstart/done.json",
            "init/wm_pretrain/done.json", LOGITS_NAME]  # fmt: skip
    return [n for n in need if not (artefacts / n).exists()]


def stage_files(artefacts: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime in ns) of every file of the data stage and the checkpoints: equal before
    and after a run that only loaded them."""
    files = [f for d in ("data", "init") for f in sorted((Path(artefacts) / d).rglob("*"))]
    return {str(f): (f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()}


def _tiny_model(dtype: str, attention_impl: str = "xla", params: dict | None = None):
    from flax import nnx

    from wmrl.models.config import named_config
    from wmrl.models.transformer import Transformer

    cfg = named_config("tiny", dtype=dtype, attention_impl=attention_impl)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    if params is not None:
        graphdef, state = nnx.split(model)
        nnx.replace_by_pure_dict(state, params)
        model = nnx.merge(graphdef, state)
    return model


def _batch():
    import numpy as np

    rng = np.random.default_rng(0)
    tokens = rng.integers(4, 256, (4, 48)).astype(np.int32)
    mask = np.ones_like(tokens, bool)
    mask[0, :20] = False  # left-padded prompts
    mask[1, :5] = False
    mask[2, 40:] = False  # a finished completion
    return np.where(mask, tokens, 0), mask


def _logits(model, tokens, mask):
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from wmrl.models.transformer import causal_padding_mask, positions_from_mask

    fwd = nnx.jit(lambda m, t, k: m(t, positions_from_mask(k), causal_padding_mask(k))[0])
    return np.asarray(fwd(model, jnp.asarray(tokens), jnp.asarray(mask)))


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        out.update(_flat(v, key) if isinstance(v, dict) else {key: v})
    return out


def _unflat(flat: dict) -> dict:
    out: dict = {}
    for key, v in flat.items():
        node = out
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(int(p) if p.isdigit() else p, {})
        node[int(leaf) if leaf.isdigit() else leaf] = v
    return out


def write_reference_logits(path: Path) -> None:
    """The tiny model's parameters, a padded batch and its CPU logits in both dtypes."""
    import jax
    import numpy as np
    from flax import nnx

    with jax.default_device(jax.devices("cpu")[0]):
        model = _tiny_model("float32")
        tokens, mask = _batch()
        params = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))
        arrays = {f"param/{k}": v for k, v in _flat(params).items()}
        for dtype in TOLERANCE:
            arrays[f"logits/{dtype}"] = _logits(_tiny_model(dtype, params=params), tokens, mask)
    np.savez(path, tokens=tokens, mask=mask, **arrays)


def compare_logits(artefacts: Path) -> dict:
    """The carried tiny model's logits on this process's default backend vs the CPU reference,
    on the real tokens, per compute dtype (and, in bf16, with the fused attention: cuDNN on a
    GPU, `dot_product_attention` elsewhere); `ok` when every one is within `TOLERANCE`."""
    import jax
    import numpy as np

    ref = np.load(Path(artefacts) / LOGITS_NAME)
    params = _unflat({k[len("param/") :]: ref[k] for k in ref.files if k.startswith("param/")})
    tokens, mask = ref["tokens"], ref["mask"]
    fused = "cudnn" if jax.default_backend() == "gpu" else "dot_product_attention"
    cases = [("float32", "xla"), ("bfloat16", "xla"), ("bfloat16", fused)]
    out = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind}
    ok = True
    for dtype, impl in cases:
        expected = ref[f"logits/{dtype}"][mask]
        try:  # one kernel failing (cuDNN refusing a shape, say) leaves the other cases
            got = _logits(_tiny_model(dtype, impl, params), tokens, mask)[mask]
        except Exception as e:
            out[f"{dtype}_{impl}"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
            ok = False
            continue
        scale = float(np.abs(expected).max())
        err = float(np.abs(got - expected).max())
        vs_fp32 = float(np.abs(got - ref["logits/float32"][mask]).max())
        passed = err <= TOLERANCE[dtype] * scale
        ok = ok and passed
        out[f"{dtype}_{impl}"] = {
            "max_abs_diff": err, "max_abs_diff_vs_cpu_float32": vs_fp32, "max_abs_logit": scale,
            "tolerance": TOLERANCE[dtype] * scale, "ok": passed,
        }  # fmt: skip
    out["ok"] = ok
    return out


def folder_mib(path: Path) -> float:
    total = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    return total / 2**20


def build(out: Path, dry_run: bool, progress: bool = True) -> dict:
    """Data stage, warm start, WM pretraining (each reused if present) and the logits."""
    from wmrl.autoresearch.experiment import prepare_stages

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = rl_config(out, dry_run)
    s = prepare_stages(config, out / "scratch", progress)
    if not (out / LOGITS_NAME).exists():
        write_reference_logits(out / LOGITS_NAME)
    sizes = {p.name: folder_mib(p) for p in sorted(out.iterdir()) if p.is_dir()}
    sizes[LOGITS_NAME] = (out / LOGITS_NAME).stat().st_size / 2**20
    return {"stages_s": s.seconds, "mib": sizes, "total_mib": folder_mib(out)}


def pack(built: Path, dest: Path) -> dict:
    """`dest`/stages.tar.gz (the built data and init folders) and the reference logits: the
    folder to carry. Returns the sizes in MiB."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / (ARCHIVE_NAME + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name in ("data", "init"):
            tar.add(Path(built) / name, arcname=name)
    os.replace(tmp, dest / ARCHIVE_NAME)
    shutil.copy2(Path(built) / LOGITS_NAME, dest / LOGITS_NAME)
    return {n: (dest / n).stat().st_size / 2**20 for n in (ARCHIVE_NAME, LOGITS_NAME)}


def unpack(artefacts: Path, dest: Path) -> Path:
    """Where the parts find data/, init/ and the logits: `artefacts` itself when it holds the
    built folders, else `dest` with the archive extracted into it (done once)."""
    artefacts = Path(artefacts)
    if not (artefacts / ARCHIVE_NAME).exists() or (artefacts / "data").exists():
        return artefacts
    dest = Path(dest)
    if not (dest / LOGITS_NAME).exists():
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(artefacts / ARCHIVE_NAME) as tar:
            tar.extractall(dest, filter="data")
        shutil.copy2(artefacts / LOGITS_NAME, dest / LOGITS_NAME)
    return dest


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m wmrl.tools.prepare_gpu_artefacts")
    p.add_argument("--out", required=True, help="the artefacts folder to build (or complete)")
    p.add_argument("--pack", default="", help="write the folder to carry here (archive + logits)")
    p.add_argument("--dry_run", action="store_true", help="the tiny test setting")
    opts = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    report = build(Path(opts.out), opts.dry_run)
    for name, mib in report["mib"].items():
        print(f"  {name:<24} {mib:8.2f} MiB")
    print(f"  {'total':<24} {report['total_mib']:8.2f} MiB (stages {report['stages_s']:.0f} s)")
    if opts.pack:
        sizes = pack(Path(opts.out), Path(opts.pack))
        shown = ", ".join(f"{n} {m:.2f} MiB" for n, m in sizes.items())
        print(f"carry {opts.pack}: {shown}")


if __name__ == "__main__":
    main()
