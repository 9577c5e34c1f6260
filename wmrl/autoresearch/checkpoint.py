"""Orbax checkpoints of the whole RL state, with fallback past a corrupt or partial latest one.

One checkpoint (a step directory of `<workdir>/checkpoints`) holds, as one Orbax composite:

* `state`: the `wmrl.autoresearch.state.RunState` pytree, saved and restored as it is: policy and WM
  train states (params + optimiser states), the frozen reference
  policy, the correction state (pair window, fitted map, disagreement EMA, frozen scale),
  the WM replay buffer of real outcomes, the pending anchors (`rl.anchor_lag`: the last
  step's anchor rows, not yet trained on; resubmitted on resume, journal hits reused), and
  the base RNG key;
* `meta` (JSON): step, wall-clock so far, counters of real executions and WM calls, the
  evaluation history, and the data iterator's position (tasks of step s are a pure
  function of `(seed, s)`, so the position is the step).

Orbax writes a step to a temporary directory and renames it when complete (on Cloud Storage,
which has no atomic rename, it writes the step in place and marks it complete with a commit
file last), so a kill mid-save leaves no half checkpoint that looks finished. A checkpoint
that still fails to restore (disk corruption, a truncated file) is reported, moved to
`checkpoints_corrupt/` (kept, not deleted) and the previous one is used.

The workdir may be a local folder or an epath URL such as gs://BUCKET/PATH (`wmrl.storage`).

With several JAX processes every process saves and restores together (Orbax is collective):
each writes the shards of the sharded arrays its devices hold, and process 0 alone writes
the numpy items (replay buffer, correction state, RNG key) and the JSON meta, which are
identical on every process. A restore that fails on any process falls back on all of them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from wmrl import distributed, storage
from wmrl.autoresearch.model_setup import abstract_like
from wmrl.autoresearch.state import NEW_LEAVES, RunState
from wmrl.config_errors import ConfigError

log = logging.getLogger(__name__)


def _saveable(st: RunState) -> RunState:
    if jax.process_count() > 1:
        # Orbax refuses a process-local jax.Array with several processes: the correction
        # state and the key (computed identically on every process) are saved as numpy.
        local = lambda x: isinstance(x, jax.Array) and x.is_fully_addressable
        st = jax.tree.map(lambda x: np.asarray(x) if local(x) else x, st)
    return st


def _meta(st: RunState, seed: int) -> dict:
    return {**st.counters(), "data_iterator": {"seed": seed, "next_step": st.step}}


def _key(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _paths(tree) -> set[str]:
    return {_key(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _partial_target(saved_meta, abstract):
    """A restore target in the saved checkpoint's own structure (nested dicts) whose leaves
    are `abstract`'s at the same paths: restores an older layout that lacks some arrays."""
    by_path = {_key(p): x for p, x in jax.tree_util.tree_flatten_with_path(abstract)[0]}
    leaves, treedef = jax.tree_util.tree_flatten_with_path(saved_meta)
    return jax.tree_util.tree_unflatten(treedef, [by_path[_key(p)] for p, _ in leaves])


def _fill_missing(restored, like):
    """`like` with every leaf the restored (older, partial) tree has replaced by it."""
    got = {_key(p): x for p, x in jax.tree_util.tree_flatten_with_path(restored)[0]}
    leaves, treedef = jax.tree_util.tree_flatten_with_path(like)
    return jax.tree_util.tree_unflatten(treedef, [got.get(_key(p), x) for p, x in leaves])


class Checkpointer:
    def __init__(self, workdir: str | os.PathLike, keep: int):
        self.directory = storage.absolute(epath.Path(workdir) / "checkpoints")
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def save(self, st: RunState, seed: int) -> None:
        self.manager.save(
            st.step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(_saveable(st)),
                meta=ocp.args.JsonSave(_meta(st, seed)),
            ),
            force=True,
        )
        self.manager.wait_until_finished()

    def restore_latest(self, like: RunState) -> RunState | None:
        """The newest checkpoint that restores; None if there is none. Corrupt ones are
        reported (with the reason) and skipped. A checkpoint whose layout is not `like`'s
        (written by another version of wmrl) is refused with a ConfigError naming the
        differences: it is neither corrupt nor a reason to restart silently."""
        abstract = abstract_like(_saveable(like))
        for step in sorted(self.manager.all_steps(), reverse=True):
            saved_meta = self._check_layout(step, like)
            error = None
            try:
                target = (
                    self._target(step, abstract)
                    if saved_meta is None
                    else _partial_target(saved_meta, abstract)
                )
                out = self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
                    ),
                )
                if saved_meta is not None:  # an older layout: new arrays from the template
                    out = {**out, "state": _fill_missing(out["state"], like)}
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
            st, meta = out["state"], out["meta"]
            if isinstance(st, dict):  # restored by field (see `_target`)
                st = like.replace(**st)
            host = lambda tree: jax.tree.map(np.asarray, tree)  # host-side parts as numpy
            return st.replace(
                replay=host(st.replay), pending=host(st.pending), rng=np.asarray(st.rng),
                **{k: meta[k] for k in like.counters()},
            )  # fmt: skip
        return None

    def _target(self, step: int, abstract: RunState):
        """The restore target: `abstract`, or, for a checkpoint written before
        `RunState.adaptive_rho` existed (no such entry; the rule is off in this run, its
        template None), its other fields by name (Orbax refuses a template entry the
        checkpoint does not have, even an empty one)."""
        if abstract.adaptive_rho is not None:
            return abstract
        try:
            meta = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state")
            if "adaptive_rho" in meta.tree:
                return abstract
        except Exception:  # unreadable metadata: a corrupt checkpoint, handled by restore
            return abstract
        return {f.name: getattr(abstract, f.name) for f in dataclasses.fields(abstract)
                if f.metadata.get("pytree_node", True) and f.name != "adaptive_rho"}  # fmt: skip

    def _check_layout(self, step: int, like: RunState):
        """Refuse a checkpoint whose arrays are not those of `like` (by name), except one of
        an older layout that lacks only arrays added since (`wmrl.autoresearch.state.NEW_LEAVES`):
        returns its metadata tree then (None when the layouts are equal)."""
        try:
            meta = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state")
            meta = getattr(meta, "tree", meta)
            saved = _paths(meta)
        except Exception:  # unreadable metadata: a corrupt checkpoint, handled by restore
            return None
        want = _paths(like)
        if saved == want:
            return None
        missing, extra = sorted(want - saved), sorted(saved - want)
        if not extra and all(NEW_LEAVES.search(p) for p in missing):
            log.info("checkpoint %s: older layout, new arrays %s from the template", step,
                     ", ".join(missing[:8]))  # fmt: skip
            return meta
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

    def read_raw(self, step: int | None = None) -> tuple[dict, dict]:
        """(state tree as saved, meta) of a step (default: the latest), without a template:
        for inspecting a run (tests, notebooks), not for resuming it. Arrays saved on devices
        this process does not have (another process layout) come back on its first device."""
        step = self.manager.latest_step() if step is None else step
        here = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        out = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(fallback_sharding=here),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return out["state"], out["meta"]

    def close(self) -> None:
        self.manager.close()
