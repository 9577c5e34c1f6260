"""A training run preempted at a chosen point (tests/autoresearch/test_resume_records.py).

Usage: python -m tests.support.kill_worker STEP WMRL_MAIN_ARGS...

Runs `wmrl.main` with the given arguments and SIGKILLs its whole process group (the trainer,
its sandbox pool, everything it started: what a preempted machine loses) the moment the RL
loop is about to start step STEP + 1. Every record step STEP writes is then on disk, and
nothing after it: no later step, and no checkpoint of step STEP unless the loop saved one
before moving on. Both trainers are covered: the AutoResearch ones (single- and multi-turn,
through `wmrl.autoresearch.experiment.make_trainer`) and the embodied one
(`wmrl.embodied.rl.Trainer`).
The process never exits by itself: its status is always -SIGKILL, or the hook was not reached.
"""

import os
import signal
import sys


def preempt() -> None:
    """SIGKILL this process's group: no handler, no `finally`, no flush runs."""
    os.killpg(os.getpgrp(), signal.SIGKILL)


def kill_before_step(step: int) -> None:
    """Patch the trainers so that the process group dies as step `step` + 1 starts."""
    from wmrl.autoresearch import experiment
    from wmrl.embodied import rl as embodied_rl

    make_trainer = experiment.make_trainer

    def killing_trainer(*args, **kwargs):
        trainer = make_trainer(*args, **kwargs)
        run_step = trainer.run_step

        def step_or_die(st):
            if st.step == step:
                preempt()
            return run_step(st)

        trainer.run_step = step_or_die
        return trainer

    experiment.make_trainer = killing_trainer
    embodied_step = embodied_rl.Trainer.step

    def embodied_step_or_die(self, state, replay):
        if int(state["step"]) == step:
            preempt()
        return embodied_step(self, state, replay)

    embodied_rl.Trainer.step = embodied_step_or_die


if __name__ == "__main__":
    kill_before_step(int(sys.argv[1]))
    from absl import app

    from wmrl import main

    app.run(main.main, argv=[sys.argv[0], *sys.argv[2:]])
