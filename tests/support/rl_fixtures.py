"""A tiny AutoResearch RL setting shared by the trainer tests: 1 train + 1 held-out task,
a few executed scripts, tiny models, 2-3 RL steps. The data stage and the warm-start / WM
checkpoints are built once per session and shared (`data_dir`, `init_dir`)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from wmrl.autoresearch.presets import TINY_SETTING

ROOT = Path(__file__).resolve().parents[2]

TINY = TINY_SETTING


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
