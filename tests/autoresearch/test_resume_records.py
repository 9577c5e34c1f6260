"""Preemption for real, judged by every file of the workdir: a run SIGKILLed after the records
of a step it has no checkpoint for, then rerun, holds exactly the records an uninterrupted run
of the same config writes. No record twice, none lost, in any file the run writes
(`tests/support/run_records.py` finds them by listing the workdir).

The kill lands as step 4 starts (tests/support/kill_worker.py), with checkpoints at steps 2
and 4: step 3 wrote its records (metrics, pairs, an evaluation, journal entries, TensorBoard
scalars) and the resumed run redoes it from the checkpoint of step 2. With `rl.anchor_lag = 1`
the pairs step 3 writes are those of step 2's anchors, labelled step 2: only the step that
wrote a record tells whether a resume keeps it.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.support.rl_fixtures import ROOT, main_cmd, tiny_flags
from tests.support.run_records import differences, read_run, tensorboard_scalars
from wmrl.autoresearch.presets import TINY_MULTITURN_SETTING
from wmrl.jsonl import StepLog, read_jsonl

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

STEPS, CHECKPOINT_EVERY, KILLED_AFTER = 4, 2, 3


# -- the step log, on real files: the records a lagged RL loop writes ---------------------


def log_steps(log, steps) -> None:
    """What the RL loop logs at `rl.anchor_lag = 1` for each step t: its metrics (labelled
    t), the pairs of step t-1's anchors (labelled t-1, none at step 1), an evaluation at
    even steps; `log.write(name, records, t)`: written by step t."""
    for t in steps:
        log.write("metrics.jsonl", [{"kind": "step", "step": t, "train_reward": t / 10}], t)
        log.write("pairs.jsonl", [{"step": t - 1, "row": r} for r in (0, 1) if t > 1], t)
        if t % 2 == 0:
            log.write("metrics.jsonl", [{"kind": "eval", "step": t, "heldout_reward": t}], t)


def next_second() -> None:
    """TensorBoard names an event file by the second it opens: a second writer in the same
    second of the same folder would replace the first's file."""
    time.sleep(1.02 - time.time() % 1)


def test_a_resume_cuts_every_record_the_lost_steps_wrote(tmp_path):
    """Killed after step 3's records, resumed from the checkpoint of step 2: the pairs step 3
    wrote (labelled step 2) go with step 3's other records, and every file, TensorBoard's
    too, ends as the uninterrupted run's."""
    from wmrl.autoresearch.experiment import _Log

    straight = _Log(tmp_path / "straight", enabled=True)
    (tmp_path / "straight").mkdir()
    straight.restart_at(None)
    log_steps(straight, [1, 2, 3, 4])
    straight.close()

    wd = tmp_path / "killed"
    wd.mkdir()
    killed = _Log(wd, enabled=True)
    killed.restart_at(None)
    log_steps(killed, [1, 2, 3])  # then killed: nothing closed
    next_second()
    resumed = _Log(wd, enabled=True)
    resumed.restart_at(2)
    log_steps(resumed, [3, 4])
    resumed.close()

    assert [r["step"] for r in read_jsonl(wd / "pairs.jsonl")] == [1, 1, 2, 2, 3, 3]
    assert [r["written_at_step"] for r in read_jsonl(wd / "pairs.jsonl")] == [2, 2, 3, 3, 4, 4]
    for name in ("metrics.jsonl", "pairs.jsonl"):
        assert read_jsonl(wd / name) == read_jsonl(tmp_path / "straight" / name), name
    assert len(list((wd / "tb").iterdir())) == 2
    scalars = tensorboard_scalars(wd / "tb")
    assert scalars == tensorboard_scalars(tmp_path / "straight" / "tb")
    assert sorted(step for tag, step, _ in scalars if tag == "step/train_reward") == [1, 2, 3, 4]


def test_records_of_runs_logged_before_the_stamp_are_cut_by_their_step(tmp_path):
    """A workdir written before records carried their writing step resumes as it did: its
    records are cut by `step` (and the stamped ones written since by their stamp)."""
    path = tmp_path / "metrics.jsonl"
    old = [{"kind": "eval", "step": 0}, {"kind": "step", "step": 1}, {"kind": "step", "step": 2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    log = StepLog(tmp_path, ("metrics.jsonl",))
    log.restart_at(1)
    log.write("metrics.jsonl", [{"kind": "step", "step": 1}], 2)
    log.restart_at(1)
    assert read_jsonl(path) == old[:2]
    log.close()


# -- kill and resume for real -------------------------------------------------------------


def _env() -> dict:
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def killed_run(cmd: list[str], after_step: int) -> subprocess.CompletedProcess:
    """`wmrl.main` (`cmd`) SIGKILLed, its whole process group, as step `after_step` + 1
    starts (tests/support/kill_worker.py)."""
    worker = [sys.executable, "-m", "tests.support.kill_worker", str(after_step), *cmd[3:]]
    return subprocess.run(
        worker, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900,
        start_new_session=True,
    )  # fmt: skip


def started(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finished(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    return out


def step_records(workdir) -> list[int]:
    return [r["step"] for r in read_jsonl(workdir / "metrics.jsonl") if r["kind"] == "step"]


def checkpoint_steps(workdir) -> set[int]:
    """The steps checkpointed: Orbax's complete step folders `<step>` (both trainers)."""
    return {int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()}


SCHEDULE = {"rl__steps": STEPS, "rl__checkpoint_every": CHECKPOINT_EVERY, "rl__eval_every": 1}
MULTITURN = {k.replace(".", "__"): v for k, v in TINY_MULTITURN_SETTING.items()}


def case_command(case: str, rl_shared, tmp_path_factory):
    """The command of a run of `case` in a given workdir."""
    data_dir, init_dir = rl_shared
    changes = {"anchor_lag1": {"rl__anchor_lag": 1}, "anchor_lag0": {"rl__anchor_lag": 0},
               "two_turns": MULTITURN}.get(case)  # fmt: skip
    if case == "two_turns":  # its own warm start and WM (the data stage is shared)
        init_dir = tmp_path_factory.mktemp("mt_init")
    if case == "embodied":
        init_dir = tmp_path_factory.mktemp("embodied_init")
        flags = [f"--config.{k.replace('__', '.')}={v}" for k, v in SCHEDULE.items()]
        return lambda wd: [
            sys.executable, "-m", "wmrl.main", "--config=configs/embodied_push.py:tiny",
            f"--workdir={wd}", f"--config.init_dir={init_dir}", *flags,
        ]  # fmt: skip
    keep = {"rl__keep_checkpoints": STEPS + 1}
    flags = tiny_flags(data_dir, init_dir, **SCHEDULE, **keep, **changes)
    return lambda wd: main_cmd(wd, flags)


# ~1 min each on the idle 2-core machine (three tiny runs, two of them side by side); the
# fast suite keeps the step log's own test above.
@pytest.mark.slow
@pytest.mark.parametrize("case", ["anchor_lag1", "anchor_lag0", "two_turns", "embodied"])
def test_killed_then_resumed_run_has_every_record_once(case, rl_shared, tmp_path_factory):
    """AutoResearch at `rl.anchor_lag` 1 and 0 and with two-turn episodes, and the embodied
    run. Two-turn episodes read a script's measured runtime in the next turn's prompt, so two
    independent runs diverge: that case's reference runs first, and the killed run starts
    from its journals (what a resumed run reads back) and then executes nothing anew."""
    cmd = case_command(case, rl_shared, tmp_path_factory)
    root = tmp_path_factory.mktemp(case)
    wd, straight = root / "killed", root / "straight"
    if case == "two_turns":
        finished(started(cmd(straight)))
        wd.mkdir()
        for name in ("anchors.jsonl", "heldout.jsonl"):
            shutil.copy(straight / name, wd / name)
    # Otherwise the killed run first: it builds the stages if no earlier test did, so that
    # the runs after it never build the same files at once.
    killed = killed_run(cmd(wd), KILLED_AFTER)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # Killed where intended: step 3's records written, no checkpoint after step 2's.
    assert step_records(wd) == [1, 2, 3]
    assert max(checkpoint_steps(wd)) == 2

    resumed = started(cmd(wd))
    reference = started(cmd(straight)) if case != "two_turns" else None  # side by side
    out = finished(resumed)
    if reference is not None:
        finished(reference)
    if case != "embodied":  # the embodied run says nothing on resuming
        assert "resuming from the checkpoint of step 2" in out
    assert differences(read_run(wd), read_run(straight)) == []
