"""Readers of what embodied runs wrote before their checkpoints and stages were Orbax's, so
those workdirs and stage folders still resume and load.

Before: a pytree was a flat `.npz` of its leaves in `jax.tree.leaves` order (`arr_0`,
`arr_1`, ...); a run checkpointed step n as `checkpoints/step_<n>.npz` (the RL state) +
`replay_<n>.npz` (the WM's replay, a zero-length `none` array when empty) + `meta_<n>.json`
(step, wall clock); a parameter stage held `params.npz`. Nothing here writes that layout: a
run resumed from it checkpoints with Orbax from then on (the `.npz` files are left as they
were), and a stage loaded from it stays as it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np

PARAMS = "params.npz"
_EMPTY_REPLAY = "none"


def load_npz_tree(path: str | os.PathLike, like):
    """A pytree of `like`'s structure from a legacy `.npz` of its leaves (shapes checked)."""
    with np.load(path) as f:
        leaves = [f[f"arr_{i}"] for i in range(len(f.files))]
    treedef = jax.tree.structure(like)
    if treedef.num_leaves != len(leaves):
        raise ValueError(f"{path}: {len(leaves)} arrays, expected {treedef.num_leaves}")
    for a, b in zip(leaves, jax.tree.leaves(like), strict=True):
        if a.shape != np.shape(b):
            raise ValueError(f"{path}: array of shape {a.shape}, expected {np.shape(b)}")
    return jax.tree.unflatten(treedef, [jax.numpy.asarray(x) for x in leaves])


def checkpoint_steps(ck_dir: str | os.PathLike) -> list[int]:
    """The steps of the legacy checkpoints in `ck_dir` (those with their meta), newest last."""
    return sorted(int(p.stem.split("_")[1]) for p in Path(ck_dir).glob("meta_*.json"))


def read_checkpoint(ck_dir: str | os.PathLike, step: int, like) -> tuple[dict, dict, dict]:
    """(RL state in `like`'s structure, replay, meta) of legacy checkpoint `step`."""
    ck_dir = Path(ck_dir)
    state = load_npz_tree(ck_dir / f"step_{step}.npz", like)
    with np.load(ck_dir / f"replay_{step}.npz") as f:
        replay = {k: f[k] for k in f.files if k != _EMPTY_REPLAY}
    meta = json.loads((ck_dir / f"meta_{step}.json").read_text())
    return state, replay, meta
