"""Stage folders: what a pipeline computes once before RL (a warm start, a pretrained world
model, expert demos) and reuses, shared by the experiments.

A stage folder holds the stage's outputs and, written last, `done.json`: its report and the
config fields the stage depends on (its fingerprint). So

* a folder with `done.json` is a finished stage: loaded, not redone; one made with another
  config is refused with a `ConfigError` naming the fields (`done`, through the experiment's
  `ConfigHistory`: fields added since compare at the values that reproduce the old stage);
* a folder without it is a half-written earlier attempt: `begin` clears it before the stage
  writes again, so an interrupted pipeline redoes at most the stage it was in.

Parameters are saved and loaded with Orbax (`save_params`, `load_params`: `<stage>/params`),
sharded as their template. The folder may be a local folder or an epath URL such as
gs://BUCKET/PATH. With several JAX processes every process saves together (Orbax is
collective); process 0 alone clears the folder and writes `done.json`, between barriers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping

import orbax.checkpoint as ocp
from etils import epath

from wmrl import distributed, storage
from wmrl.experiment.checkpoint import abstract_like
from wmrl.experiment.config import ConfigHistory, check_stage, get_field, plain

DONE = "done.json"
PARAMS = "params"


def config_fields(config, fields: Iterable[str]) -> dict:
    """`{dotted field: its plain value}`: a stage's fingerprint (a section means all of it)."""
    return {f: plain(get_field(config, f)) for f in fields}


def done(
    stage_dir, history: ConfigHistory, want: Mapping, upgrade: Callable[[dict], dict] | None = None
) -> dict | None:
    """The stage's report if it completed with fingerprint `want`, else None (not finished).
    A stage made with another config is refused, naming the fields (loading it would fail on
    shapes, or silently differ). `upgrade`: reads a report written under older key names
    under today's."""
    path = epath.Path(stage_dir) / DONE
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    if upgrade is not None:
        report = upgrade(report)
    check_stage(history, stage_dir, report.get("config", {}), want)
    return report


def begin(stage_dir) -> epath.Path:
    """Before a stage writes its outputs: a half-written earlier attempt (a folder without
    `done.json`) is cleared and the folder created (process 0; every process waits)."""
    stage_dir = epath.Path(stage_dir)
    if distributed.is_main_process():
        if stage_dir.exists():
            stage_dir.rmtree()
        stage_dir.mkdir(parents=True, exist_ok=True)
    distributed.barrier(f"{stage_dir.name} cleared")
    return stage_dir


def finish(stage_dir, report: dict, fingerprint: Mapping) -> dict:
    """Mark the stage finished: `done.json` (the report and the fingerprint), written last
    (process 0; every process waits). Returns the report as written."""
    stage_dir = epath.Path(stage_dir)
    report = {**report, "config": dict(fingerprint)}
    if distributed.is_main_process():
        storage.write_json(stage_dir / DONE, report)
    distributed.barrier(f"{stage_dir.name} done")
    return report


def save_params(stage_dir, params, name: str = PARAMS) -> None:
    """`params` with Orbax under `<stage_dir>/<name>` (collective; after `begin`)."""
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(storage.absolute(epath.Path(stage_dir) / name), params)
    ckpt.wait_until_finished()


def has_params(stage_dir, name: str = PARAMS) -> bool:
    return (epath.Path(stage_dir) / name).exists()


def params_digest(stage_dir, name: str = PARAMS) -> str:
    """sha256 of a stage's saved params, bit for bit: every leaf in path order, its path,
    dtype and shape, then its bytes. Restored without a template (host numpy arrays), so it
    names the same params on any machine; two runs of a stage agree only if they trained to
    the same bits."""
    import hashlib

    import jax
    import numpy as np

    path = storage.absolute(epath.Path(stage_dir) / name)
    tree = ocp.StandardCheckpointer().restore(path)
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    h = hashlib.sha256()
    for key, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        a = np.asarray(leaf)
        h.update(f"{jax.tree_util.keystr(key)}:{a.dtype}:{a.shape};".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def load_params(stage_dir, like, name: str = PARAMS):
    """Restore params into the shapes, dtypes and shardings of `like` (an abstract or
    concrete params tree)."""
    path = storage.absolute(epath.Path(stage_dir) / name)
    return ocp.StandardCheckpointer().restore(path, abstract_like(like))
