"""One accelerator session's measurements in one command, one JSON (docs/gpu.md).

  python -m wmrl.benchmarks.gpu_suite --out_dir=OUT --wheels=W --artefacts=A   # GPU machine
  python -m wmrl.benchmarks.gpu_suite --out_dir=OUT --artefacts=A --dry_run    # CPU, tiny

On a machine without network: the wheels of `wmrl.tools.gpu_wheels` (`--wheels`) are installed
offline into a folder put first on PYTHONPATH, over the machine's own packages (jax 0.11.2 and
its CUDA plugin among them), and every part then runs in a fresh process with a time budget,
so that a part that fails, runs out of memory or hangs leaves the others' results. The parts,
in order of priority (the first ones are what the session exists for):

  env             interpreter, jax and library versions, devices, nvidia-smi
  logits_check    the tiny model's logits on this backend vs the CPU reference (artefacts)
  train_step_*    policy train step (`wmrl.benchmarks.train_step`) of configs/model_1b.py and
                  configs/model_small.py in bf16, MFU against `--peak_flops`; 1B again with
                  cuDNN attention and with a lighter remat policy
  wmrl_steps      WMRL steps of configs/autoresearch_tiny.py (learner on the accelerator,
                  sandboxes on the host CPUs) from the carried data stage, warm start and
                  pretrained WM (`data_dir`, `init_dir`): nothing is rebuilt
  rollout_*       jitted KV-cache sampler (`wmrl.benchmarks.rollout`): tokens/s, time to
                  first token, at a batch an RL step would sample

`OUT/gpu_suite.json` is rewritten after every part: {"suite": what ran where, "install": the
offline install, "unpack": where the packed artefacts were unpacked, "parts": {name: {"ok",
"seconds", "budget_s", "result" | "error"}}}. A part
not started because the total budget ran out is recorded with `"skipped"`. `--dry_run` (same
as `--platform=cpu`) runs every part on CPU with tiny configs and artefacts from
`wmrl.tools.prepare_gpu_artefacts --dry_run`; the fast test suite runs it.

This module imports only the standard library at the top: it installs what the parts import.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JSON_NAME = "gpu_suite.json"
H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s of one H100/H200 SXM
LIGHT_REMAT = "dots_with_no_batch_dims_saveable"  # keeps the weight matmuls' outputs
VERSIONS = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax",
            "orbax-checkpoint", "numpy", "scikit-learn", "pandas", "ml-collections")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    kind: str  # env | logits_check | train_step | wmrl_steps | rollout
    budget_s: int
    args: dict = dataclasses.field(default_factory=dict)


def parts(dry_run: bool) -> list[Part]:
    """The parts in the order they run (what matters most first)."""
    if dry_run:
        tiny = "configs/model_tiny.py"
        return [
            Part("env", "env", 120),
            Part("logits_check", "logits_check", 120),
            Part("train_step_tiny_dpa", "train_step", 120,
                 dict(config=tiny, steps=2, model=dict(attention_impl="dot_product_attention"))),
            Part("wmrl_steps", "wmrl_steps", 300, dict(steps=2, workers=2)),
            Part("rollout_tiny", "rollout", 120,
                 dict(config=tiny, batch=4, prompt_len=8, new_tokens=4, naive=True)),
        ]  # fmt: skip
    one_b, small = "configs/model_1b.py", "configs/model_small.py"
    return [
        Part("env", "env", 30),
        Part("logits_check", "logits_check", 60),
        Part("train_step_1b", "train_step", 120, dict(config=one_b)),
        Part("train_step_small", "train_step", 75, dict(config=small)),
        Part("wmrl_steps", "wmrl_steps", 200, dict(steps=4, workers=12)),
        Part("rollout_small", "rollout", 75,
             dict(config=small, batch=128, prompt_len=128, new_tokens=256, naive=False)),
        Part("train_step_1b_cudnn", "train_step", 100,
             dict(config=one_b, model=dict(attention_impl="cudnn"))),
        Part("train_step_1b_cudnn_dots", "train_step", 100,
             dict(config=one_b, model=dict(attention_impl="cudnn", remat_policy=LIGHT_REMAT))),
        Part("rollout_1b", "rollout", 90,
             dict(config=one_b, batch=64, prompt_len=128, new_tokens=256, naive=False)),
    ]  # fmt: skip


# ---------------------------------------------------------------- the parts (child process)


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for name in VERSIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def run_env(opts, part: Part) -> dict:
    import platform

    import jax

    devices = jax.devices()
    out = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "versions": _versions(),
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{d.device_kind}" for d in devices],
        "cpu_count": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        out["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        out["nvidia_smi"] = f"unavailable: {e}"
    return out


def _model_config(path: str):
    from wmrl.experiment.config import load_config_file

    return load_config_file(ROOT / path)


def run_train_step(opts, part: Part) -> dict:
    from wmrl.benchmarks import train_step

    a = part.args
    return train_step.measure(
        _model_config(a["config"]), peak_flops=opts.peak_flops, steps=a.get("steps", 5),
        model_overrides=a.get("model"),
    )  # fmt: skip


def run_rollout(opts, part: Part) -> dict:
    from wmrl.benchmarks import rollout
    from wmrl.models.model_configs import transformer_config

    a = part.args
    cfg = transformer_config(_model_config(a["config"]))
    return rollout.measure(
        cfg, batch=a["batch"], prompt_len=a["prompt_len"], new_tokens=a["new_tokens"],
        repeats=2, naive=a["naive"],
    )  # fmt: skip


def run_logits_check(opts, part: Part) -> dict:
    from wmrl.tools import prepare_gpu_artefacts as prep

    return prep.compare_logits(Path(opts.artefacts))


def run_wmrl_steps(opts, part: Part) -> dict:
    from wmrl.autoresearch.experiment import run
    from wmrl.jsonl import read_jsonl
    from wmrl.tools import prepare_gpu_artefacts as prep

    art = Path(opts.artefacts)
    missing = prep.missing_stages(art)
    if missing:  # never rebuild them here: that is what the carried artefacts are for
        raise FileNotFoundError(f"{art} lacks {', '.join(missing)}: run prepare_gpu_artefacts")
    config = prep.rl_config(art, opts.dry_run, steps=part.args["steps"])
    config.suite.workers = min(part.args["workers"], max((os.cpu_count() or 2) - 2, 1))
    workdir = Path(opts.out_dir) / "wmrl_run"
    before = prep.stage_files(art)
    summary = run(config, workdir, progress=False)
    reused = prep.stage_files(art) == before  # no stage retrained, no corpus re-executed
    steps = [r for r in read_jsonl(workdir / "metrics.jsonl") if r["kind"] == "step"]
    keys = ("step", "wall_time_s", "generate_s", "execute_s", "wm_score_s", "train_s",
            "train_reward")  # fmt: skip
    return {
        "steps": summary["steps"],
        "device": summary["device"],
        "sandbox_workers": config.suite.workers,
        "stages_reused": reused,
        "stages_s": summary["stages_s"],  # loading the carried stages: no training here
        "compile_s": summary["compile_s"],
        "wall_time_s": summary["wall_time_s"],
        "real_executions": summary["real_executions"],
        "wm_calls": summary["wm_calls"],
        "warmstart_heldout_reward": summary["warmstart_heldout_reward"],
        "final_heldout_reward": summary["final_heldout_reward"],
        "per_step": [{k: r.get(k) for k in keys} for r in steps],
    }


RUNNERS = {
    "env": run_env,
    "logits_check": run_logits_check,
    "train_step": run_train_step,
    "wmrl_steps": run_wmrl_steps,
    "rollout": run_rollout,
}


def run_part(opts) -> None:
    """Child process: run one part and write its result (or its error) to `--part_out`."""
    part = next(p for p in parts(opts.dry_run) if p.name == opts.part)
    try:
        out = {"ok": True, "result": RUNNERS[part.kind](opts, part)}
    except Exception as e:  # the error is the result: the parent records it
        error = f"{type(e).__name__}: {e}"
        out = {"ok": False, "error": error, "traceback": traceback.format_exc()}
    Path(opts.part_out).write_text(json.dumps(out, indent=2, default=str))


# ---------------------------------------------------------------- the driver (parent process)


def install_wheels(wheels: Path, site: Path) -> dict:
    """Every wheel of `wheels` installed offline into `site` without dependency resolution
    (the set was resolved when it was downloaded, `wmrl.tools.gpu_wheels`); the parts run with
    `site` first on PYTHONPATH, over the machine's own packages.

    The sandboxed scripts need only the machine's own scientific stack (numpy, pandas,
    scikit-learn): they run in forks of a template that has it imported, and with namespace
    isolation they see the Python installation, not `site`."""
    t0 = time.monotonic()
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    if not files:
        raise FileNotFoundError(f"no *.whl in {wheels}")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade", "--disable-pip-version-check",
           "--target", str(site), *files]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install failed: {proc.stderr[-2000:]}")
    return {"site": str(site), "wheels": len(files), "seconds": time.monotonic() - t0}


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def run_with_budget(cmd: list[str], env: dict, log: Path, budget: float) -> int | None:
    """Run `cmd` in its own process group, output to `log`; past `budget` seconds the whole
    group (the part and everything it started: sandbox pool, template process) is killed and
    None returned, else the exit code."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            return proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


def drive(opts) -> dict:
    """Run every part in its own process within its budget and the total budget; the JSON is
    rewritten after each, so a kill of the whole command still leaves what finished."""
    out_dir = Path(opts.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    report = {
        "suite": {
            "dry_run": opts.dry_run,
            "peak_flops_per_device": opts.peak_flops,
            "total_budget_s": opts.total_budget_s,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(sys.argv),
        },
        "install": None,
        "unpack": None,
        "parts": {},
    }
    path = out_dir / JSON_NAME

    def save() -> None:
        report["suite"]["wall_s"] = time.monotonic() - t_start
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
        os.replace(tmp, path)

    paths = [str(ROOT)]
    if opts.wheels:
        try:
            site = Path(opts.site or out_dir / "site")
            report["install"] = {"ok": True, **install_wheels(Path(opts.wheels), site)}
            paths.append(str(site))
        except Exception as e:
            report["install"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    artefacts = Path(opts.artefacts)
    try:  # a packed artefacts folder (prepare_gpu_artefacts --pack) is unpacked once, here
        from wmrl.tools.prepare_gpu_artefacts import unpack

        t0 = time.monotonic()
        artefacts = unpack(artefacts, out_dir / "artefacts")
        report["unpack"] = {
            "ok": True,
            "artefacts": str(artefacts),
            "seconds": time.monotonic() - t0,
        }
    except Exception as e:
        report["unpack"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    save()
    python = sys.executable
    pythonpath = os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH", "")]))
    env = {**os.environ, "PYTHONPATH": pythonpath}
    if opts.dry_run:
        env["JAX_PLATFORMS"] = "cpu"
    wanted = set(opts.parts.split(",")) if opts.parts else None
    for part in parts(opts.dry_run):
        if wanted is not None and part.name not in wanted:
            continue
        left = opts.total_budget_s - (time.monotonic() - t_start)
        if left < min(part.budget_s, 20):
            skipped = f"total budget: {left:.0f} s left"
            report["parts"][part.name] = {"ok": False, "skipped": skipped}
            save()
            continue
        budget = min(part.budget_s, int(left))
        part_out = out_dir / f"part_{part.name}.json"
        log = out_dir / f"part_{part.name}.log"
        cmd = [python, "-m", "wmrl.benchmarks.gpu_suite", f"--part={part.name}",
               f"--part_out={part_out}", f"--out_dir={out_dir}", f"--artefacts={artefacts}",
               f"--peak_flops={opts.peak_flops}"]  # fmt: skip
        if opts.dry_run:
            cmd.append("--dry_run")
        print(f"[gpu_suite] {part.name} (budget {budget} s)", flush=True)
        t0 = time.monotonic()
        returncode = run_with_budget(cmd, env, log, budget)
        if returncode is None:
            entry = {"ok": False, "error": f"timed out after {budget} s", "log_tail": _tail(log)}
        elif part_out.exists():
            entry = json.loads(part_out.read_text())
        else:
            entry = {"ok": False, "error": f"exit {returncode}", "log_tail": _tail(log)}
        if not entry["ok"] and "log_tail" not in entry:
            entry["log_tail"] = _tail(log)
        report["parts"][part.name] = {"seconds": time.monotonic() - t0, "budget_s": budget, **entry}
        status = "ok" if entry["ok"] else entry["error"]
        print(f"[gpu_suite] {part.name}: {status} ({time.monotonic() - t0:.1f} s)", flush=True)
        save()
    save()
    return report


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m wmrl.benchmarks.gpu_suite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out_dir", required=True, help="folder for gpu_suite.json and part logs")
    p.add_argument("--artefacts", required=True,
                   help="prepare_gpu_artefacts' folder (data, init, logits)")  # fmt: skip
    p.add_argument("--wheels", default="", help="folder of wheels to install offline first")
    p.add_argument("--site", default="", help="where the wheels are installed (OUT/site)")
    p.add_argument("--peak_flops", type=float, default=H200_BF16_PEAK,
                   help="per-device peak FLOP/s for `mfu` (989e12: H200 dense bf16)")  # fmt: skip
    p.add_argument("--total_budget_s", type=float, default=540.0,
                   help="no part starts once this much wall-clock has passed")  # fmt: skip
    p.add_argument("--parts", default="", help="comma-separated part names (default: all)")
    p.add_argument("--dry_run", action="store_true", help="tiny configs on CPU")
    p.add_argument("--platform", choices=("gpu", "cpu"), default="gpu",
                   help="cpu = --dry_run")  # fmt: skip
    p.add_argument("--part", default="", help=argparse.SUPPRESS)
    p.add_argument("--part_out", default="", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    opts.dry_run = opts.dry_run or opts.platform == "cpu"
    known = {q.name for q in parts(opts.dry_run)}
    for name in filter(None, (opts.parts.split(",") if opts.parts else []) + [opts.part]):
        if name not in known:
            p.error(f"unknown part {name!r}; the parts are {sorted(known)}")
    return opts


def main(argv: list[str] | None = None) -> None:
    opts = parse(sys.argv[1:] if argv is None else argv)
    if opts.part:
        run_part(opts)
        return
    report = drive(opts)
    failed = [n for n, e in report["parts"].items() if not e["ok"]]
    print(f"[gpu_suite] wrote {Path(opts.out_dir) / JSON_NAME}; failed or skipped: {failed}")


if __name__ == "__main__":
    main()
