"""A deterministic fingerprint of tiny runs, to show that a refactor changed no number.

    python -m tests.fingerprint_run --out=/tmp/fp/before.json      # before the change
    python -m tests.fingerprint_run --out=/tmp/fp/after.json --compare=/tmp/fp/before.json

Runs (1) a few bandit variants for a few hundred steps and a few seeds, and (2) three
AutoResearch RL steps of the tiny setting (tests/rl_fixtures.py) with a fixed seed in modes
`wmrl` and `real`, and records every number that does not measure time: the bandit curves
and summaries; per RL step the metrics (keys ending in `_s` and the wall clock dropped),
the anchor pairs, the journal and the summary; and a SHA-1 of every array of the final
checkpoint (policy, reference, WM, optimiser and correction states, replay). The shared data
stage and warm-start/WM checkpoints are built once under `<out dir>/shared` and reused, so a
second invocation compares RL and bandits only. `--compare` prints every difference and
exits 1 if there is any.

Not part of the test suite (it takes minutes); `tests/test_rl_e2e.py` and
`tests/test_bandits.py` check the invariants.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np

BANDIT_VARIANTS = ("real", "wm_only", "debias_only", "denoise_only", "wmrl", "cross_arm_iv")
RL_MODES = ("wmrl", "real")


def _timing(key: str) -> bool:
    return key.endswith("_s") or key in ("compile_s", "stages_s", "device", "timings")


def _clean(obj):
    """JSON-able copy without timing fields (they measure the machine, not the maths)."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items() if not _timing(k)}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and math.isnan(obj):
        return "nan"
    return obj


def bandit_fingerprint() -> dict:
    from wmrl.bandits.experiment import run_suite
    from wmrl.rl.config import load_config_file

    config = load_config_file(Path(__file__).resolve().parents[1] / "configs" / "bandit.py")
    config.num_seeds, config.num_steps, config.log_points = 4, 300, 10
    config.variants = BANDIT_VARIANTS
    summary = run_suite(config)
    curves = summary.pop("_curves")
    return _clean({"summary": summary, "curves": curves["results"]})


def _array_hashes(tree) -> list[str]:
    """Sorted SHA-1s of every array leaf (names and nesting may change in a refactor, the
    arrays may not)."""
    import jax

    out = []
    for leaf in jax.tree.leaves(tree):
        a = np.asarray(leaf)
        if a.dtype == object or a.size <= 1:
            continue
        if str(a.dtype).startswith("key"):
            a = np.asarray(jax.random.key_data(leaf))
        out.append(f"{a.dtype}{list(a.shape)}:{hashlib.sha1(a.tobytes()).hexdigest()[:16]}")
    return sorted(out)


def rl_fingerprint(root: Path, shared: Path) -> dict:
    from tests.rl_fixtures import tiny_config
    from wmrl.rl.checkpoint import Checkpointer
    from wmrl.rl.experiment import run

    out = {}
    for mode in RL_MODES:
        wd = root / f"rl_{mode}"
        if wd.exists():
            shutil.rmtree(wd)
        config = tiny_config(shared / "data", shared / "init", mode=mode, rl__steps=3)
        config.rl.eval_every = 3
        summary = run(config, wd, progress=False)
        read = lambda name, wd=wd: [
            json.loads(x) for x in (wd / name).read_text().splitlines() if x.strip()
        ]
        ckpt = Checkpointer(wd, keep=3)
        tree, meta = ckpt.read_raw()
        ckpt.close()
        out[mode] = _clean({
            "summary": summary,
            "metrics": read("metrics.jsonl"),
            "pairs": read("pairs.jsonl"),
            "journal": read("anchors.jsonl"),
            "checkpoint_meta": meta,
            "checkpoint_arrays": _array_hashes(tree),
        })  # fmt: skip
    return out


def differences(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'after' if k not in a else 'before'}")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="the fingerprint JSON to write")
    p.add_argument("--compare", default="", help="a fingerprint JSON to compare against")
    p.add_argument("--only", default="", choices=("", "bandit", "rl"))
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    fp = {}
    if args.only in ("", "bandit"):
        fp["bandit"] = bandit_fingerprint()
    if args.only in ("", "rl"):
        fp["rl"] = rl_fingerprint(out.parent / (out.stem + "_runs"), out.parent / "shared")
    out.write_text(json.dumps(fp, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")
    if not args.compare:
        return 0
    before = json.loads(Path(args.compare).read_text())
    diff = differences({k: before.get(k) for k in fp}, fp)
    for d in diff:
        print("DIFF", d)
    print(f"{len(diff)} differences" if diff else "identical (every non-timing number)")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
