"""Orbax run checkpoints shared by the trainers, with fallback past a corrupt or partial latest one.

A run checkpoints under `<workdir>/checkpoints`: one step directory per checkpointed step,
holding one Orbax composite of

* `state`: the run's pytree (train states, correction state, ...), restored into a template's
  shapes, dtypes and shardings (`abstract_like`);
* `host` (optional): a pytree of numpy arrays restored in the shapes it was saved with (a
  replay buffer that grows from step to step); left out when it has no arrays;
* `meta` (JSON): counters and whatever the trainer needs besides arrays.

The newest `keep` checkpoints are kept. Orbax writes a step to a temporary directory and
renames it when complete (on Cloud Storage, which has no atomic rename, it writes the step in
place and marks it complete with a commit file last), so a kill mid-save leaves no half
checkpoint that looks finished. A checkpoint that still fails to restore (disk corruption, a
truncated file) is reported, moved to `checkpoints_corrupt/` (kept, not deleted) and the
previous one is used. A checkpoint whose arrays are not the template's (by name) was written
by another version: it is refused with a `ConfigError` naming the differences, except one that
lacks only arrays added since (`new_leaves`), restored with those taken from the template.

The workdir may be a local folder or an epath URL such as gs://BUCKET/PATH (`wmrl.storage`).

With several JAX processes every process saves and restores together (Orbax is collective):
each writes the shards of the sharded arrays its devices hold, and process 0 alone writes
the numpy items and the JSON meta, which are identical on every process (`saveable`). A
restore that fails on any process falls back on all of them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from wmrl import distributed, storage
from wmrl.config_errors import ConfigError

log = logging.getLogger(__name__)


class _QuietOrbax(logging.Filter):
    """Orbax logs every save step at INFO through absl; keep its warnings and errors only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or "orbax" not in record.pathname


def quiet_orbax() -> None:
    logger = logging.getLogger("absl")
    if not any(isinstance(f, _QuietOrbax) for f in logger.filters):
        logger.addFilter(_QuietOrbax())


def abstract_like(tree):
    """Shape/dtype(/sharding) stand-ins of a tree of arrays: an Orbax restore target that
    puts every restored array where its counterpart in `tree` lives."""

    def one(x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        x = np.asarray(x)
        return jax.ShapeDtypeStruct(x.shape, x.dtype)

    return jax.tree.map(one, tree)


def saveable(tree):
    """`tree` as Orbax may save it: with several processes, process-local jax arrays (computed
    identically on every process: a correction state, a key) as numpy, which Orbax refuses
    otherwise."""
    if jax.process_count() > 1:
        local = lambda x: isinstance(x, jax.Array) and x.is_fully_addressable
        tree = jax.tree.map(lambda x: np.asarray(x) if local(x) else x, tree)
    return tree


def path_key(path) -> str:
    """A leaf's checkpoint path, `a/b/c`."""
    return jax.tree_util.keystr(path, simple=True, separator="/")


def tree_paths(tree) -> set[str]:
    return {path_key(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _partial_target(saved_meta, abstract):
    """A restore target in the saved checkpoint's own structure (nested dicts) whose leaves
    are `abstract`'s at the same paths: restores an older layout that lacks some arrays."""
    by_path = {path_key(p): x for p, x in jax.tree_util.tree_flatten_with_path(abstract)[0]}
    leaves, treedef = jax.tree_util.tree_flatten_with_path(saved_meta)
    return jax.tree_util.tree_unflatten(treedef, [by_path[path_key(p)] for p, _ in leaves])


def _fill_missing(restored, like):
    """`like` with every leaf the restored (older, partial) tree has replaced by it."""
    got = {path_key(p): x for p, x in jax.tree_util.tree_flatten_with_path(restored)[0]}
    leaves, treedef = jax.tree_util.tree_flatten_with_path(like)
    return jax.tree_util.tree_unflatten(treedef, [got.get(path_key(p), x) for p, x in leaves])


@dataclasses.dataclass
class Restored:
    step: int
    state: Any  # in `like`'s structure (or what a `target` hook asked for)
    meta: dict
    host: Any = None  # the numpy `host` tree, None when the checkpoint has none


# target(saved metadata tree, abstract template) -> the Orbax restore target
TargetHook = Callable[[Any, Any], Any]


class RunCheckpointer:
    """The checkpoints of one run (`<workdir>/checkpoints`, the newest `keep` kept).

    `new_leaves`: checkpoint paths (`a/b/c`) an older checkpoint may lack; it then resumes
    with those arrays taken from the template."""

    def __init__(self, workdir: str | os.PathLike, keep: int, new_leaves: re.Pattern | None = None):
        self.directory = storage.absolute(epath.Path(workdir) / "checkpoints")
        self.new_leaves = new_leaves
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state, meta: dict, host=None) -> None:
        """Save step `step` (collective) and wait until it is complete."""
        items = {"state": ocp.args.StandardSave(saveable(state)), "meta": ocp.args.JsonSave(meta)}
        if host is not None and jax.tree.leaves(host):
            items["host"] = ocp.args.StandardSave(host)
        self.manager.save(int(step), args=ocp.args.Composite(**items), force=True)
        self.manager.wait_until_finished()

    def restore_latest(self, like, target: TargetHook | None = None) -> Restored | None:
        """The newest checkpoint that restores into `like`'s shapes and shardings; None if
        there is none. Corrupt ones are reported (with the reason), quarantined and skipped.
        A checkpoint whose layout is not `like`'s is refused (`_check_layout`).

        `target`: for a checkpoint of `like`'s layout, the restore target from its metadata
        tree and the abstract template (default: the template), for a trainer whose older
        checkpoints lack an entry its template has (Orbax refuses a template entry the
        checkpoint does not have, even an empty one)."""
        abstract = abstract_like(saveable(like))
        for step in sorted(self.manager.all_steps(), reverse=True):
            saved = self._metadata(step)
            partial = self._check_layout(step, saved, like)
            error = None
            try:
                if partial:
                    tgt = _partial_target(saved, abstract)
                else:
                    tgt = target(saved, abstract) if target and saved is not None else abstract
                items = {"state": ocp.args.StandardRestore(tgt), "meta": ocp.args.JsonRestore()}
                if (self.directory / str(step) / "host").exists():
                    items["host"] = ocp.args.StandardRestore()
                out = self.manager.restore(step, args=ocp.args.Composite(**items))
                state = out["state"]
                if partial:  # an older layout: new arrays from the template
                    state = _fill_missing(state, like)
                host = out["host"] if "host" in items else None
            except Exception as e:  # any failure means: use the previous one
                error = e
            if not distributed.all_processes(error is None):  # on every process alike
                kept = self._quarantine(step)
                reason = (
                    f"{type(error).__name__}: {str(error)[:300]}"
                    if error is not None
                    else "it failed on another process"
                )
                msg = (
                    f"checkpoint {self.directory / str(step)} could not be restored "
                    f"({reason}); falling back to the previous one (the bad one is kept in {kept})"
                )
                log.warning(msg)
                print(f"warning: {msg}", flush=True)
                continue
            if host is not None:
                host = jax.tree.map(np.asarray, host)
            return Restored(step=step, state=state, meta=out["meta"], host=host)
        return None

    def _metadata(self, step: int):
        """The saved state's metadata tree; None when unreadable (a corrupt checkpoint, which
        the restore then reports)."""
        try:
            meta = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state")
            return getattr(meta, "tree", meta)
        except Exception:
            return None

    def _check_layout(self, step: int, saved, like) -> bool:
        """Refuse a checkpoint whose arrays are not those of `like` (by name), except one of
        an older layout that lacks only arrays added since (`new_leaves`): True then."""
        if saved is None:
            return False
        have, want = tree_paths(saved), tree_paths(like)
        if have == want:
            return False
        missing, extra = sorted(want - have), sorted(have - want)
        new = self.new_leaves
        if not extra and new is not None and all(new.search(p) for p in missing):
            log.info("checkpoint %s: older layout, new arrays %s from the template", step,
                     ", ".join(missing[:8]))  # fmt: skip
            return True
        raise ConfigError(
            "--workdir",
            f"checkpoint {self.directory / str(step)} has another layout than this version of "
            f"wmrl writes (missing: {', '.join(missing[:8]) or 'none'}; unexpected: "
            f"{', '.join(extra[:8]) or 'none'}): it was written by another version. Resume "
            "it with that version or start a new --workdir (nothing was changed)",
        )

    def _quarantine(self, step: int) -> epath.Path:
        """Move a checkpoint that failed to restore out of the manager's directory (kept for
        inspection, never deleted), so the redone step can be saved again. Process 0 moves
        it (the name is process 0's clock); the others wait for the move."""
        stamp = int(distributed.allgather_host(np.int64(time.time()))[0])
        dest = self.directory.parent / "checkpoints_corrupt" / f"{step}-{stamp}"
        if distributed.is_main_process():
            storage.move_tree(self.directory / str(step), dest)
        distributed.barrier("checkpoint quarantined")
        self.manager.reload()
        return dest

    def read_raw(self, step: int | None = None) -> Restored:
        """A step (default: the latest) as saved, without a template: for inspecting a run
        (tests, notebooks, `wmrl.tools.fingerprint`), not for resuming it. Arrays saved on
        devices this process does not have (another process layout) come back on its first
        device."""
        step = self.manager.latest_step() if step is None else step
        here = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        items = {
            "state": ocp.args.StandardRestore(fallback_sharding=here),
            "meta": ocp.args.JsonRestore(),
        }
        if (self.directory / str(step) / "host").exists():
            items["host"] = ocp.args.StandardRestore()
        out = self.manager.restore(step, args=ocp.args.Composite(**items))
        host = out["host"] if "host" in items else None
        return Restored(step=step, state=out["state"], meta=out["meta"], host=host)

    def close(self) -> None:
        self.manager.close()
