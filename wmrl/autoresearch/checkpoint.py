"""The AutoResearch run's checkpoints: the whole RL state, in the shared Orbax run checkpoints
(`wmrl.experiment.checkpoint`: atomic steps, the newest `rl.keep_checkpoints` kept, fallback
past a corrupt or partial latest one to `checkpoints_corrupt/`, multi-process rules).

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

What is AutoResearch's own: the arrays an older checkpoint may lack (`NEW_LEAVES`, restored
from the template), checkpoints written before `RunState.adaptive_rho` existed (`_target`),
the meta, and the host-side parts restored as numpy. With several JAX processes process 0
alone writes the numpy items (replay buffer, correction state, RNG key) and the JSON meta,
which are identical on every process.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from wmrl.autoresearch.state import NEW_LEAVES, RunState
from wmrl.experiment.checkpoint import RunCheckpointer


def _meta(st: RunState, seed: int) -> dict:
    return {**st.counters(), "data_iterator": {"seed": seed, "next_step": st.step}}


def _target(saved_tree, abstract: RunState):
    """The restore target: `abstract`, or, for a checkpoint written before
    `RunState.adaptive_rho` existed (no such entry; the rule is off in this run, its
    template None), its other fields by name (Orbax refuses a template entry the
    checkpoint does not have, even an empty one)."""
    # Optional entries (None in this run) a checkpoint may predate: the adaptive rule's
    # state, and cost-aware routing's cap window (`RunState.cap`).
    absent = {n for n in ("adaptive_rho", "cap")
              if getattr(abstract, n) is None and n not in saved_tree}  # fmt: skip
    if not absent:
        return abstract
    return {f.name: getattr(abstract, f.name) for f in dataclasses.fields(abstract)
            if f.metadata.get("pytree_node", True) and f.name not in absent}  # fmt: skip


class Checkpointer:
    def __init__(self, workdir: str | os.PathLike, keep: int):
        self.run = RunCheckpointer(workdir, keep, new_leaves=NEW_LEAVES)
        self.directory = self.run.directory

    def save(self, st: RunState, seed: int) -> None:
        self.run.save(st.step, st, _meta(st, seed))

    def restore_latest(self, like: RunState) -> RunState | None:
        """The newest checkpoint that restores; None if there is none. Corrupt ones are
        reported (with the reason) and skipped. A checkpoint whose layout is not `like`'s
        (written by another version of wmrl) is refused with a ConfigError naming the
        differences: it is neither corrupt nor a reason to restart silently."""
        out = self.run.restore_latest(like, target=_target)
        if out is None:
            return None
        st, meta = out.state, out.meta
        if isinstance(st, dict):  # restored by field (see `_target`)
            st = like.replace(**st)
        host = lambda tree: jax.tree.map(np.asarray, tree)  # host-side parts as numpy
        return st.replace(
            replay=host(st.replay), pending=host(st.pending), rng=np.asarray(st.rng),
            **{k: meta[k] for k in like.counters()},
        )  # fmt: skip

    def read_raw(self, step: int | None = None) -> tuple[dict, dict]:
        """(state tree as saved, meta) of a step (default: the latest), without a template:
        for inspecting a run (tests, notebooks), not for resuming it. Arrays saved on devices
        this process does not have (another process layout) come back on its first device."""
        out = self.run.read_raw(step)
        return out.state, out.meta

    def close(self) -> None:
        self.run.close()
