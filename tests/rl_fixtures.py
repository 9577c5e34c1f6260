"""A tiny AutoResearch RL setting shared by the trainer tests: 1 train + 1 held-out task,
a few executed scripts, tiny models, 2-3 RL steps. The data stage and the warm-start / WM
checkpoints are built once per session and shared (`data_dir`, `init_dir`)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "suite.tasks": ("iris-species", "heldout-gaussian-quantiles"),
    "suite.workers": 2,
    "data.scripts_per_task": 6,
    "data.sft_scripts_per_task": 10,
    "data.vocab_size": 1500,
    "data.max_prompt_len": 112,
    "data.max_new_tokens": 256,
    "policy.d_model": 32,
    "policy.num_layers": 1,
    "policy.mlp_dim": 64,
    "policy.head_dim": 8,
    "policy.sft_steps": 3,
    "policy.sft_batch_size": 4,
    "wm.d_model": 32,
    "wm.num_layers": 1,
    "wm.mlp_dim": 64,
    "wm.head_dim": 8,
    "wm.num_members": 2,
    "wm.pretrain_steps": 2,
    "wm.batch_size": 4,
    "wm.online_steps": 1,
    "wm.replay_size": 16,
    "rl.steps": 2,
    "rl.tasks_per_step": 2,
    "rl.group_size": 2,
    "rl.eval_every": 2,
    "rl.eval_samples": 2,
    "rl.checkpoint_every": 1,
    "correction.min_pairs": 2,
    "correction.refit_every": 1,
    "correction.denoise_warmup_groups": 1,
}


def load_config():
    spec = importlib.util.spec_from_file_location("cfg", ROOT / "configs" / "autoresearch_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config()


def set_fields(c, items: dict, data_dir, init_dir, changes: dict):
    """Set dotted fields of ConfigDict `c`: `items`, then `changes` (`__` for dots,
    rl__steps=3), then the shared `data_dir` and `init_dir`."""
    items = {**items, **{k.replace("__", "."): v for k, v in changes.items()}}
    items["data_dir"], items["init_dir"] = str(data_dir), str(init_dir)
    for key, value in items.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def tiny_config(data_dir, init_dir, **changes):
    """The tiny setting as a ConfigDict; `changes` use `__` for dots (rl__steps=3)."""
    return set_fields(load_config(), TINY, data_dir, init_dir, changes)


def _flag(key, value) -> str:
    if isinstance(value, tuple):
        value = "(" + ",".join(repr(v) for v in value) + ",)"
    return f"--config.{key}={value}"


def tiny_flags(data_dir, init_dir, **changes) -> list[str]:
    items = {**TINY, **{k.replace("__", "."): v for k, v in changes.items()}}
    items["data_dir"], items["init_dir"] = str(data_dir), str(init_dir)
    return [_flag(k, v) for k, v in items.items()]


def main_cmd(workdir, flags) -> list[str]:
    return [sys.executable, "-m", "wmrl.main", "--config=configs/autoresearch_tiny.py",
            f"--workdir={workdir}", *flags]  # fmt: skip


def run_main(workdir, flags, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        main_cmd(workdir, flags), cwd=ROOT, capture_output=True, text=True, env=env,
        timeout=timeout,
    )  # fmt: skip
