"""The run loop's schedule, on a scripted experiment: which steps are evaluated and
checkpointed, in which order the records are written, and how a wall-clock budget ends a
run (always with an evaluation of its final policy)."""

from wmrl.experiment.loop import run_loop


class Scripted:
    """Each step takes `step_s` training seconds; every call is recorded in `events`."""

    def __init__(self, step_s: float = 10.0):
        self.step_s, self.events = step_s, []

    def step(self, st):
        st = {"step": st["step"] + 1, "wall": st["wall"] + self.step_s}
        return st, {"step": st["step"]}, {"pairs.jsonl": [{"row": 0}]}

    def position(self, st):
        return st["step"], st["wall"]

    def evaluate(self, st, trained_s, settle_s):
        return st, {"step": st["step"], "wall_time_s": trained_s, "settle_s": settle_s}

    def save(self, st):
        self.events.append(("save", st["step"]))

    def log(self, name, records, step):
        for r in records:
            self.events.append((name, r.get("kind"), step))


def test_evaluations_and_checkpoints_every_n_steps_and_at_the_last():
    loop = Scripted()
    st = run_loop(loop, {"step": 0, "wall": 0.0}, steps=5, eval_every=2, checkpoint_every=3)
    assert st == {"step": 5, "wall": 50.0}
    evals = [e[2] for e in loop.events if e[1] == "eval"]
    saves = [e[1] for e in loop.events if e[0] == "save"]
    assert evals == [2, 4, 5] and saves == [3, 5]
    # A step's records, then its evaluation, then its checkpoint (which covers them).
    at5 = [e for e in loop.events if e[-1] == 5]
    assert at5 == [("metrics.jsonl", "step", 5), ("pairs.jsonl", None, 5),
                   ("metrics.jsonl", "eval", 5), ("save", 5)]  # fmt: skip


def test_a_budget_ends_the_run_with_an_evaluation_stamped_before_the_settle():
    loop = Scripted(step_s=10.0)
    waits = []

    def settle(st):  # 7 s of background work finishing, counted as training time
        waits.append(st["step"])
        return {**st, "wall": st["wall"] + 7.0}, 7.0

    due = lambda st: st["step"] == 1  # an evaluation the experiment asks for
    st = run_loop(loop, {"step": 0, "wall": 0.0}, steps=100, eval_every=50,
                  checkpoint_every=50, budget_s=30.0, eval_due=due, settle=settle)  # fmt: skip
    # step 1 at 10 s (due: settled to 17 s), step 2 at 27 s, step 3 at 37 s >= 30: the last.
    assert st == {"step": 3, "wall": 44.0}
    assert waits == [1, 3]
    evals = [e for e in loop.events if e[1] == "eval"]
    assert [e[2] for e in evals] == [1, 3]
    assert ("save", 3) in loop.events and ("save", 1) not in loop.events


def test_a_settle_that_uses_up_the_budget_ends_the_run_with_an_evaluation():
    loop = Scripted(step_s=10.0)
    settle = lambda st: ({**st, "wall": st["wall"] + 100.0}, 100.0)
    st = run_loop(loop, {"step": 0, "wall": 0.0}, steps=100, eval_every=50,
                  checkpoint_every=2, budget_s=30.0, settle=settle)  # fmt: skip
    # Step 2 checkpoints: its settle passes the budget, so step 2 is evaluated and last.
    assert st["step"] == 2
    assert [e[2] for e in loop.events if e[1] == "eval"] == [2]
