"""Orbax checkpoints of the whole RL state, with fallback past a corrupt or partial latest one.

One checkpoint (a step directory of `<workdir>/checkpoints`) holds, as one Orbax composite:

* `state`: policy and WM train states (params + optimiser states), the frozen reference
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

import logging
import os
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from wmrl import distributed, storage
from wmrl.core.state import CorrectionState
from wmrl.rl.models import abstract_like
from wmrl.rl.trainer import Pending, Replay, RunState

log = logging.getLogger(__name__)


def _tree(st: RunState, key) -> dict:
    tree = {
        "policy": st.policy,
        "ref_params": st.ref_params,
        "wm": st.wm,
        "correction": st.correction,
        "replay": st.replay.to_tree(),
        "pending": _pending_tree(st),
        "rng": jax.random.key_data(key),
    }
    if jax.process_count() > 1:
        # Orbax refuses a process-local jax.Array with several processes: the correction
        # state and the key (computed identically on every process) are saved as numpy.
        local = lambda x: isinstance(x, jax.Array) and x.is_fully_addressable
        tree = jax.tree.map(lambda x: np.asarray(x) if local(x) else x, tree)
    return tree


def _pending_tree(st: RunState) -> dict:
    """The anchors pending at the save (`rl.anchor_lag`), in a layout that does not depend
    on whether any are: one restore template fits every checkpoint of a run."""
    if st.pending is not None:
        return st.pending.to_tree()
    n_rows, width = st.pending_shape
    return Pending.empty_tree(n_rows, width)


def _meta(st: RunState, seed: int) -> dict:
    return {
        "step": st.step,
        "wall_time_s": st.wall_time_s,
        "real_executions": st.real_executions,
        "wm_calls": st.wm_calls,
        "evals": st.evals,
        "data_iterator": {"seed": seed, "next_step": st.step},
    }


class Checkpointer:
    def __init__(self, workdir: str | os.PathLike, keep: int):
        self.directory = storage.absolute(epath.Path(workdir) / "checkpoints")
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def save(self, st: RunState, key, seed: int) -> None:
        self.manager.save(
            st.step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(_tree(st, key)),
                meta=ocp.args.JsonSave(_meta(st, seed)),
            ),
            force=True,
        )
        self.manager.wait_until_finished()

    def restore_latest(self, like: RunState, key) -> RunState | None:
        """The newest checkpoint that restores; None if there is none. Corrupt ones are
        reported (with the reason) and skipped."""
        template = _tree(like, key)
        abstract = abstract_like(template)
        for step in sorted(self.manager.all_steps(), reverse=True):
            error = None
            try:
                out = self.manager.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
                    ),
                )
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
            tree, meta = out["state"], out["meta"]
            return RunState(
                step=int(meta["step"]),
                policy=tree["policy"],
                ref_params=tree["ref_params"],
                wm=tree["wm"],
                correction=_as_correction(tree["correction"], like.correction),
                replay=Replay.from_tree(jax.tree.map(np.asarray, tree["replay"])),
                pending=Pending.from_tree(jax.tree.map(np.asarray, tree["pending"])),
                pending_shape=like.pending_shape,
                wall_time_s=float(meta["wall_time_s"]),
                real_executions=int(meta["real_executions"]),
                wm_calls=int(meta["wm_calls"]),
                evals=list(meta["evals"]),
            )
        return None

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


def _as_correction(tree, like: CorrectionState) -> CorrectionState:
    return (
        tree
        if isinstance(tree, CorrectionState)
        else jax.tree.unflatten(jax.tree.structure(like), jax.tree.leaves(tree))
    )
