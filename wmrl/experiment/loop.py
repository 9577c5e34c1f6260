"""The RL run loop every trainer runs: step, log, evaluate, checkpoint.

    while steps done < rl.steps and the wall-clock budget is not used up:
        step -> log the step's records -> [settle] -> [evaluate] -> [checkpoint]

An experiment hands `run_loop` its `Loop`: what one step is (the trainer's `run_step`, timed
into the state's training wall-clock), where the state stands (steps done, training seconds),
how to evaluate the policy and checkpoint the state, and how to write records. The loop
decides *when*:

* an evaluation after every `eval_every`-th step, at the last step (the step limit, or the
  step that used up `budget_s`), and wherever the experiment's `eval_due` says so (e.g. at
  wall-clock points, so that modes whose steps take different times are evaluated at the
  same training seconds);
* a checkpoint after every `checkpoint_every`-th step and at the last one, after the
  evaluation, whose record the checkpoint then covers: a resume never redoes an evaluation
  nor loses one;
* before either, `settle`: work still running in the background that the state must hold
  before anything untimed reads it (AutoResearch's anchors executing under `rl.anchor_lag`),
  timed into the training seconds; if that wait uses up the budget the run ends there, and
  always with an evaluation of its final policy.

An evaluation is stamped with the training seconds at which its policy existed (before the
settle), so the wait for the background work does not make the policy look later than it
was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Loop(Protocol):
    """An experiment's side of the run loop; `st` is its own state."""

    def step(self, st) -> tuple[Any, dict, dict[str, list[dict]]]:
        """One RL step: (new state, the step's metrics, {file name: more records})."""

    def position(self, st) -> tuple[int, float]:
        """(steps done, training wall-clock seconds so far)."""

    def evaluate(self, st, trained_s: float, settle_s: float) -> tuple[Any, dict]:
        """Evaluate the policy of `st` (existing since `trained_s`): (state, eval record)."""

    def save(self, st) -> None:
        """Checkpoint `st` (after every record up to it is written)."""

    def log(self, name: str, records: list[dict], step: int) -> None:
        """Append `records` to file `name`, written by step `step`."""


def run_loop(
    loop: Loop,
    st,
    steps: int,
    eval_every: int,
    checkpoint_every: int,
    budget_s: float = 0.0,
    eval_due: Callable[[Any], bool] | None = None,
    settle: Callable[[Any], tuple[Any, float]] | None = None,
    on_step: Callable[[Any, dict], None] | None = None,
):
    """Run `loop` from `st` to `steps` steps, or until `budget_s` training seconds (0: no
    budget); returns the final state. `on_step(st, metrics)` after each step's records,
    evaluation and checkpoint (progress output)."""

    def out_of_time() -> bool:
        return bool(budget_s) and loop.position(st)[1] >= budget_s

    while loop.position(st)[0] < steps and not out_of_time():
        st, metrics, records = loop.step(st)
        t, trained_s = loop.position(st)  # the policy this step made exists from here on
        loop.log("metrics.jsonl", [{"kind": "step", **metrics}], t)
        for name, recs in records.items():
            loop.log(name, recs, t)
        last = t == steps or out_of_time()
        do_eval = t % eval_every == 0 or last or (eval_due is not None and eval_due(st))
        do_save = t % checkpoint_every == 0 or last
        settle_s = 0.0
        if (do_eval or do_save) and settle is not None:
            st, settle_s = settle(st)
            # The wait counts as training time and can use up the budget: the loop ends
            # here then, and a run always ends with an evaluation of its final policy.
            do_eval = do_eval or out_of_time()
        if do_eval:
            st, ev = loop.evaluate(st, trained_s, settle_s)
            loop.log("metrics.jsonl", [{"kind": "eval", **ev}], t)
        if do_save:
            loop.save(st)
        if on_step is not None:
            on_step(st, metrics)
    return st
