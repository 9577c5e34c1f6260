"""A deterministic fingerprint of tiny runs, to show that a refactor changed no number.

    python -m wmrl.tools.fingerprint --out=/tmp/fp/before.json      # before the change
    python -m wmrl.tools.fingerprint --out=/tmp/fp/after.json --compare=/tmp/fp/before.json

Runs every experiment tiny, with fixed seeds: (1) a few bandit variants for a few hundred
steps and a few seeds; (2) three single-turn AutoResearch RL steps of the tiny setting
(`wmrl.autoresearch.presets.TINY_SETTING`) in modes `wmrl`, `real` and `static_anchors`;
(3) two steps of two-turn episodes (`wmrl`); (4) two embodied steps
(`configs/embodied_push.py:tiny`) in modes `wmrl`, `real` and `static_anchors`. It records
every number that does not measure time: the bandit curves and summaries; per RL step the
metrics (keys ending in `_s` and the wall clock dropped), the anchor pairs, the journal and
the summary; and a SHA-1 of every array of the final checkpoint (policy, reference, WM,
optimiser and correction states, replay; embodied: of the kept checkpoints).
`--only=rl,embodied` runs some parts. The shared data stage and warm-start/WM checkpoints
are built once under `<out dir>/shared` and reused, so a second invocation compares RL and
bandits only. `--compare` prints every difference and
exits 1 if there is any. Compare two trees on the same shared stages (copy `shared/`): stages
built twice differ whatever the code, since the data stage journals executions in the order
they finish and records measured runtimes, and the WM pretrained on them differs.

Not part of the test suite (it takes minutes); `tests/autoresearch/test_e2e.py` and
`tests/bandits/test_bandits.py` check the invariants.
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
RL_MODES = ("wmrl", "real", "static_anchors")
MULTITURN_MODES = ("wmrl",)
EMBODIED_MODES = ("wmrl", "real", "static_anchors")


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


CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def tiny_autoresearch_config(shared: Path, **fields):
    """`configs/autoresearch_tiny.py` at the tests' tiny setting (`presets.TINY_SETTING`),
    then `fields` (dotted names), with its data and init stages under `shared`."""
    from wmrl.autoresearch.presets import TINY_SETTING
    from wmrl.experiment.config import load_config_file, set_fields

    config = load_config_file(CONFIGS / "autoresearch_tiny.py")
    return set_fields(config, {**TINY_SETTING, **fields, "data_dir": str(shared / "data"),
                               "init_dir": str(shared / "init")})  # fmt: skip


def bandit_fingerprint() -> dict:
    from wmrl.bandits.experiment import run_suite
    from wmrl.experiment.config import load_config_file

    config = load_config_file(CONFIGS / "bandit.py")
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


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _autoresearch_run(wd: Path, config) -> dict:
    from wmrl.autoresearch.checkpoint import Checkpointer
    from wmrl.autoresearch.experiment import run

    if wd.exists():
        shutil.rmtree(wd)
    summary = run(config, wd, progress=False)
    ckpt = Checkpointer(wd, keep=3)
    tree, meta = ckpt.read_raw()
    ckpt.close()
    return _clean({
        "summary": summary,
        "metrics": _read_jsonl(wd / "metrics.jsonl"),
        "pairs": _read_jsonl(wd / "pairs.jsonl"),
        "journal": _read_jsonl(wd / "anchors.jsonl"),
        "checkpoint_meta": meta,
        "checkpoint_arrays": _array_hashes(tree),
    })  # fmt: skip


def rl_fingerprint(root: Path, shared: Path) -> dict:
    """Three single-turn AutoResearch steps per mode of `RL_MODES`."""
    steps = {"rl.steps": 3, "rl.eval_every": 3}
    return {
        mode: _autoresearch_run(root / f"rl_{mode}", tiny_autoresearch_config(shared, mode=mode,
                                                                              **steps))
        for mode in RL_MODES
    }  # fmt: skip


def multiturn_fingerprint(root: Path, shared: Path) -> dict:
    """Two steps of two-turn AutoResearch episodes per mode of `MULTITURN_MODES`."""
    from wmrl.autoresearch.presets import TINY_MULTITURN_SETTING

    out = {}
    for mode in MULTITURN_MODES:
        config = tiny_autoresearch_config(
            shared / "multiturn", mode=mode, **TINY_MULTITURN_SETTING, **{"rl.steps": 2}
        )
        out[mode] = _autoresearch_run(root / f"multiturn_{mode}", config)
    return out


def embodied_fingerprint(root: Path, shared: Path) -> dict:
    """Two embodied RL steps (configs/embodied_push.py:tiny) per mode of `EMBODIED_MODES`."""
    from wmrl.embodied.experiment import run
    from wmrl.experiment.config import load_config_file

    out = {}
    for mode in EMBODIED_MODES:
        wd = root / f"embodied_{mode}"
        if wd.exists():
            shutil.rmtree(wd)
        config = load_config_file(CONFIGS / "embodied_push.py", "tiny")
        config.init_dir, config.mode, config.rl.steps = str(shared / "embodied_init"), mode, 2
        summary = run(config, wd)
        out[mode] = _clean({
            "summary": summary,
            "metrics": _read_jsonl(wd / "metrics.jsonl"),
            "checkpoint_arrays": _embodied_checkpoint_hashes(wd),
        })  # fmt: skip
    return out


def _embodied_checkpoint_hashes(wd: Path) -> list[str]:
    """Sorted SHA-1s of every array (scalars too) of every kept checkpoint: the RL state and
    the replay. An empty replay (mode `real`) counts as the zero-length placeholder array the
    `.npz` checkpoints before Orbax's held, so fingerprints of either layout compare."""
    import jax

    from wmrl.experiment.checkpoint import RunCheckpointer

    sha = lambda a: hashlib.sha1(np.asarray(a).tobytes()).hexdigest()[:16]
    ckpt = RunCheckpointer(wd, keep=2)
    hashes = []
    for step in ckpt.all_steps():
        raw = ckpt.read_raw(step)
        hashes += [sha(x) for x in jax.tree.leaves(raw.state)]
        replay = jax.tree.leaves(raw.host) if raw.host is not None else []
        hashes += [sha(x) for x in replay] or [sha(np.zeros(0))]
    ckpt.close()
    return sorted(hashes)


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


PARTS = {
    "bandit": None,
    "rl": rl_fingerprint,
    "multiturn": multiturn_fingerprint,
    "embodied": embodied_fingerprint,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="the fingerprint JSON to write")
    p.add_argument("--compare", default="", help="a fingerprint JSON to compare against")
    p.add_argument("--only", default="", help="comma-separated parts: " + ",".join(PARTS))
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = args.only.split(",") if args.only else list(PARTS)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"--only: unknown part(s) {unknown}; parts: {PARTS}")
    runs, shared = out.parent / (out.stem + "_runs"), out.parent / "shared"
    fp = {}
    for part in parts:
        print(f"fingerprint: {part}", flush=True)
        fp[part] = bandit_fingerprint() if part == "bandit" else PARTS[part](runs, shared)
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
