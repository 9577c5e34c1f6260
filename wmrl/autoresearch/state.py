"""Everything that changes during RL, as one pytree that Orbax saves and restores directly.

`RunState` holds the policy and WM train states (params + optimiser states), the frozen
reference policy, the correction state, the WM's replay buffer of real outcomes, the pending
anchors (`rl.anchor_lag`, fixed shape with a validity flag, so one restore template fits
every checkpoint of a run) and the base RNG key. The counters (step, wall-clock, real
executions, WM calls) and the evaluation history are static fields: they are written as the
checkpoint's JSON meta (`wmrl.autoresearch.checkpoint`), readable without restoring any array.

The on-disk layout (`policy`, `ref_params`, `wm`, `correction`, `replay`, `pending`, `rng`
and the array names inside `replay` and `pending`) is the one checkpoints had before these
types were pytrees, so such workdirs resume unchanged. `adaptive_rho` (the fidelity-driven
anchor fraction's state) is there only in runs with `correction.adaptive_rho`. Arrays added
since (the replay's observation targets, the WM's observation heads and their optimiser
moments: `NEW_LEAVES`) may be missing from an older checkpoint: it resumes with those taken
from the new run's template (unknown targets, freshly initialised heads), see
`wmrl.autoresearch.checkpoint`.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
from flax import struct

from wmrl.autoresearch.cost_routing import CapState
from wmrl.autoresearch.env.grader import Status
from wmrl.core.fidelity import AdaptiveRhoState
from wmrl.core.state import CorrectionState
from wmrl.models.train_steps import TrainState

TOKEN_ARRAYS = ("tokens", "input_mask", "loss_mask", "old_logp")  # per-token rows of a batch

# Checkpoint paths (`a/b/c`) an older checkpoint may lack: the replay's observation targets,
# the pending anchors' P(timeout) and the world model's observation heads (params, and their
# optimiser moments anywhere under `wm/`).
NEW_LEAVES = re.compile(
    r"^replay/(runtime|error_type|validation)$"
    r"|^pending/p_timeout$"
    r"|^wm/.*/(runtime_|error_|validation_)[^/]*$"
)


@struct.dataclass
class Replay:
    """Fixed-capacity ring buffer of real outcomes (the WM's online training data).

    The observation targets (`runtime`, `error_type`, `validation`) are unknown (NaN / -1)
    where the outcome did not carry them: rows of an older checkpoint, a journal record
    written before they were recorded, a single-turn execution (no validation split)."""

    tokens: np.ndarray  # [C, L] int32
    input_mask: np.ndarray  # [C, L] bool
    target: np.ndarray  # [C] float32 real reward
    class_label: np.ndarray  # [C] int32 status
    valid: np.ndarray  # [C] bool
    count: np.ndarray  # int64 scalar: filled rows
    next: np.ndarray  # int64 scalar: write position
    runtime: np.ndarray  # [C] float32 seconds, NaN = unknown
    error_type: np.ndarray  # [C] int32 index into ERROR_TYPES, -1 = unknown
    validation: np.ndarray  # [C] float32 raw validation metric, NaN = unknown

    @classmethod
    def empty(cls, capacity: int, width: int) -> Replay:
        return cls(
            tokens=np.zeros((capacity, width), np.int32),
            input_mask=np.zeros((capacity, width), bool),
            target=np.zeros(capacity, np.float32),
            class_label=np.full(capacity, -1, np.int32),
            valid=np.zeros(capacity, bool),
            count=np.int64(0),
            next=np.int64(0),
            runtime=np.full(capacity, np.nan, np.float32),
            error_type=np.full(capacity, -1, np.int32),
            validation=np.full(capacity, np.nan, np.float32),
        )

    def add(
        self, rows: dict, target: np.ndarray, status: np.ndarray, runtime=None, error_type=None,
        validation=None,
    ) -> Replay:  # fmt: skip
        """A new buffer with the graded rows appended (UNGRADED ones are no outcome);
        `runtime` [n] seconds, `error_type` [n] int and `validation` [n] float where known
        (None, NaN or -1: unknown)."""
        n = len(status)
        runtime = np.full(n, np.nan, np.float32) if runtime is None else runtime
        error_type = np.full(n, -1, np.int32) if error_type is None else error_type
        validation = np.full(n, np.nan, np.float32) if validation is None else validation
        arrays = {k: np.array(v) for k, v in self.arrays().items()}
        capacity = len(self.target)
        j, count = int(self.next), int(self.count)
        for i in np.nonzero(status != int(Status.UNGRADED))[0]:
            arrays["tokens"][j] = rows["tokens"][i]
            arrays["input_mask"][j] = rows["input_mask"][i]
            arrays["target"][j] = target[i]
            arrays["class_label"][j] = status[i]
            arrays["valid"][j] = True
            arrays["runtime"][j] = runtime[i]
            arrays["error_type"][j] = error_type[i]
            arrays["validation"][j] = validation[i]
            j, count = (j + 1) % capacity, min(count + 1, capacity)
        return dataclasses.replace(self, **arrays, count=np.int64(count), next=np.int64(j))

    def arrays(self) -> dict:
        return {k: getattr(self, k) for k in ("tokens", "input_mask", "target", "class_label",
                                              "valid", "runtime", "error_type",
                                              "validation")}  # fmt: skip


# Pending's per-row arrays
PENDING_ROW_ARRAYS = ("rows", *TOKEN_ARRAYS, "ref_logp", "r_wm", "p_timeout")


@struct.dataclass
class Pending:
    """The anchor rows of step `step` (0-based), submitted for execution and not yet trained
    on (`rl.anchor_lag = 1`): what the next step needs to train on them once their outcomes
    are in. `step` is -1 when nothing is pending (`valid` is False; the arrays are zeros).
    `rows` are their row indices in step `step`'s batch (the journal's keys); the tasks are a
    pure function of the step and the scripts decode from the tokens, so a resumed run
    resubmits them (journal hits are not executed again)."""

    step: np.ndarray  # int64 scalar, -1 = nothing pending
    rows: np.ndarray  # [A*G] int64
    tokens: np.ndarray  # [A*G, L] and the other per-token arrays of the step's batch
    input_mask: np.ndarray
    loss_mask: np.ndarray
    old_logp: np.ndarray
    ref_logp: np.ndarray
    r_wm: np.ndarray  # [A*G] raw WM scores at generation time (the pairs' r_wm)
    # [A*G] the WM's P(timeout) at generation time (the pairs' p_timeout), NaN = unknown (no
    # runtime head; a checkpoint written before it was kept)
    p_timeout: np.ndarray
    # Cost-aware routing only (None otherwise, so other runs keep their layout): [A*G] the
    # WM's score given a run past the cap and its P(timeout | past the cap), at generation
    # time, padded like the rows; the cap (s) in force at that step (`cost_routing`).
    r_cut: np.ndarray | None = None
    p_cut: np.ndarray | None = None
    cap_s: np.ndarray | None = None

    @property
    def valid(self) -> bool:
        return int(self.step) >= 0

    def live(self) -> Pending:
        """Without the padding rows (`rows == -1`): a record is sized to the most anchor rows
        a step can have (`correction.adaptive_rho` changes how many a step has)."""
        keep = np.asarray(self.rows) >= 0
        if not self.valid or keep.all():
            return self
        cut = lambda a: np.asarray(a)[keep]
        return self.replace(**{k: cut(getattr(self, k)) for k in PENDING_ROW_ARRAYS})

    def padded(self, n: int) -> Pending:
        """These rows followed by padding rows (`rows == -1`, zeros) up to `n` rows."""
        extra = n - len(self.rows)
        if extra <= 0:
            return self

        def pad(name):
            a = np.asarray(getattr(self, name))
            fill = -1 if name == "rows" else np.nan if name == "p_timeout" else 0
            return np.concatenate([a, np.full((extra, *a.shape[1:]), fill, a.dtype)])

        return self.replace(**{k: pad(k) for k in PENDING_ROW_ARRAYS})

    @classmethod
    def empty(cls, n: int, width: int) -> Pending:
        f = lambda dtype: np.zeros((n, width), dtype)
        return cls(step=np.int64(-1), rows=np.zeros(n, np.int64), tokens=f(np.int32),
                   input_mask=f(bool), loss_mask=f(np.float32), old_logp=f(np.float32),
                   ref_logp=f(np.float32), r_wm=np.zeros(n, np.float32),
                   p_timeout=np.full(n, np.nan, np.float32))  # fmt: skip


@struct.dataclass
class RunState:
    """Everything that changes during RL (checkpointed as one unit)."""

    policy: TrainState
    ref_params: dict
    wm: TrainState
    correction: CorrectionState
    replay: Replay
    # With `rl.anchor_lag = 1`: the anchor rows of the last step, executing while the next
    # step generates; that step trains on them. `pending.valid` is False when none are.
    pending: Pending
    rng: np.ndarray  # key data of the run's base key (jax.random.key_data)
    # The fidelity-driven anchor fraction's EMA of the WM stream's measured within-group
    # agreement (`correction.adaptive_rho`); None when the rule is off, so such a run keeps
    # the checkpoint layout it always had (and checkpoints written before it resume).
    adaptive_rho: AdaptiveRhoState | None = None
    # Cost-aware routing's adaptive cap: its window of recent anchor execution times
    # (`wmrl.autoresearch.cost_routing.CapState`); None otherwise.
    cap: CapState | None = None
    step: int = struct.field(pytree_node=False, default=0)
    wall_time_s: float = struct.field(pytree_node=False, default=0.0)
    real_executions: int = struct.field(pytree_node=False, default=0)
    wm_calls: int = struct.field(pytree_node=False, default=0)
    # [{"step", "wall_time_s", ...}] one per evaluation
    evals: list = struct.field(pytree_node=False, default_factory=list)

    def counters(self) -> dict:
        """The static fields, as the checkpoint's JSON meta holds them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not f.metadata.get("pytree_node", True)}  # fmt: skip
