"""One WMRL step, the same driver for every trainer.

    sample -> route -> act -> correct -> update -> finish

* **sample**: what exists before routing (AutoResearch: G scripts per task, or the first
  turn of K-turn episodes; embodied: the step's start states).
* **route**: which whole groups are anchors (`wmrl.core.routing`): a seeded draw of (seed,
  step, rho in force), the sandbox's capacity never deciding which.
* **act**: the anchor groups run for real (the sandbox, the simulator) and every group is
  scored by the world model meanwhile (or, for embodied, imagined by it); the record it
  returns carries the correction's input, `wmrl.core.correct.StepInputs`.
* **correct**: the shared jitted correction (`wmrl.core.correct.correct_rewards`): Online
  Debiasing, real rewards in the anchor groups, group advantages, the anchor weight.
* **update**: the policy's step on the batch, the world model's online step on the real
  outcomes.
* **finish**: the new state, the step's metrics and its records (anchor pairs).

Each experiment supplies a `StepAdapter` with these phases; the adapters of the AutoResearch
trainers (`wmrl.autoresearch.trainer`, `.multiturn`) and of embodied (`wmrl.embodied.rl`)
run through `run_step`. The bandits keep their fully jitted scan (`wmrl.bandits.train`) on
the same mode table and correction records. Every phase is timed by one `PhaseClock`, the
phases naming their own timers.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, NamedTuple, Protocol


class PhaseClock:
    """Seconds per named phase, accumulated: `with clock("train_s"): ...` (a name may be
    timed several times in a step, and timers may nest)."""

    def __init__(self, names: tuple[str, ...] = ()):
        self.start = time.monotonic()
        self.seconds: dict[str, float] = dict.fromkeys(names, 0.0)

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - t0

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class StepKeys(NamedTuple):
    """The step's random keys, one per phase that draws (None where a phase draws none)."""

    sample: Any
    route: Any
    act: Any


class StepAdapter(Protocol):
    """An experiment's phases of one step (see the module docstring). `State` is the
    adapter's own checkpointed state; the records between phases are the adapter's own typed
    records, of which the driver reads nothing."""

    def clock(self) -> PhaseClock: ...

    def keys(self, st) -> StepKeys: ...

    def sample(self, st, key, clock: PhaseClock): ...

    def route(self, st, sampled, key, clock: PhaseClock): ...

    def act(self, st, sampled, routed, key, clock: PhaseClock): ...

    def correct(self, st, routed, acted, clock: PhaseClock): ...

    def update(self, st, routed, acted, corrected, clock: PhaseClock): ...

    def finish(self, st, sampled, routed, acted, corrected, updated, clock: PhaseClock): ...


def run_step(adapter: StepAdapter, st):
    """One step of `adapter` from state `st`: whatever its `finish` returns (the new state,
    the step's metrics and its records)."""
    clock = adapter.clock()
    keys = adapter.keys(st)
    sampled = adapter.sample(st, keys.sample, clock)
    routed = adapter.route(st, sampled, keys.route, clock)
    acted = adapter.act(st, sampled, routed, keys.act, clock)
    corrected = adapter.correct(st, routed, acted, clock)
    updated = adapter.update(st, routed, acted, corrected, clock)
    return adapter.finish(st, sampled, routed, acted, corrected, updated, clock)
