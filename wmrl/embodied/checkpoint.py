"""Pytrees on disk as flat `.npz` files, written atomically (temp file + rename), and the
stage folders' `done.json` with the config fields the stage depends on.

Embodied runs are local-only (a plain folder): the MuJoCo rollouts and the stages are small.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np


def save_tree(path: str | os.PathLike, tree) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    leaves = [np.asarray(x) for x in jax.tree.leaves(tree)]
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, *leaves)
    os.replace(tmp, path)


def load_tree(path: str | os.PathLike, like):
    with np.load(path) as f:
        leaves = [f[f"arr_{i}"] for i in range(len(f.files))]
    treedef = jax.tree.structure(like)
    if treedef.num_leaves != len(leaves):
        raise ValueError(f"{path}: {len(leaves)} arrays, expected {treedef.num_leaves}")
    for a, b in zip(leaves, jax.tree.leaves(like), strict=False):
        if a.shape != np.shape(b):
            raise ValueError(f"{path}: array of shape {a.shape}, expected {np.shape(b)}")
    return jax.tree.unflatten(treedef, [jax.numpy.asarray(x) for x in leaves])


def write_json(path: str | os.PathLike, obj) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)
