"""A task copied by git or by hand: its private/ is 0755 and its labels 0644.

Under the rlimits fallback the only thing between a script and the hidden labels is the mode
of private/ (the script runs as an unprivileged uid and knows where tasks live). These tests
copy a task with a readable private/ and run a label-reading script through the real pool at
the rlimits level: loaded as it is, the script scores a perfect 1.0; ``load_task`` makes
private/ 0700 (and its files 0600), saying so, after which the same script cannot open them.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from tests.support.autoresearch_fixtures import make_tiny_task
from tests.support.sandbox_checks import rlimits_pool
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.task import TaskError, load_task

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="rlimits as non-root shares our uid: the labels are readable"
)

# Copies the hidden labels (columns id, label: the submission's) to the submission.
LOOKUP = """
import os

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs
with open({labels!r}) as f:
    labels = f.read()
with open(os.environ["SUBMISSION_PATH"], "w") as f:
    f.write(labels)
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def as_git_checks_out(task_dir: Path) -> None:
    """The modes a clone or a `cp -r` under umask 022 gives: everyone may read."""
    os.chmod(task_dir / "private", 0o755)
    for f in (task_dir / "private").iterdir():
        os.chmod(f, 0o644)


@pytest.fixture
def open_dir():
    """A directory every uid may enter (pytest's tmp_path is under a 0700 directory, where
    the sandbox uid could not reach the task whatever private/'s mode)."""
    d = Path(tempfile.mkdtemp(prefix="wmrl-copied-task-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


@as_root
def test_a_readable_private_dir_is_made_private_before_any_script_runs(open_dir, caplog):
    task_dir = make_tiny_task(open_dir / "copied").root
    script = LOOKUP.format(labels=str(task_dir / "private" / "test_labels.csv"))
    loaded_private = load_task(task_dir)  # the Task as it was loaded while private
    as_git_checks_out(task_dir)
    p, _ = rlimits_pool(num_workers=1)
    with p:
        assert p.isolation.startswith("rlimits")
        # The control: with the labels readable the lookup is a perfect score.
        leak = p.run(loaded_private, script)
        assert (leak.status, leak.score, leak.percentile) == (Status.VALID, 1.0, 1.0), leak
        with caplog.at_level(logging.WARNING, logger="wmrl.autoresearch.env.task"):
            task = load_task(task_dir)
        assert mode(task_dir / "private") == 0o700
        assert mode(task_dir / "private" / "test_labels.csv") == 0o600
        warned = " ".join(r.getMessage() for r in caplog.records)
        assert "had mode 0755" in warned and "made it 0700" in warned, warned
        assert "had mode 0644" in warned and "made it 0600" in warned, warned
        blocked = p.run(task, script)
    assert blocked.status == Status.RUNTIME_ERROR, blocked
    assert "PermissionError" in blocked.stderr_tail, blocked.stderr_tail[-1000:]
    assert blocked.score is None


@as_root
def test_a_readable_private_dir_that_is_not_ours_is_refused(tmp_path):
    task_dir = make_tiny_task(tmp_path / "theirs").root
    as_git_checks_out(task_dir)
    os.chown(task_dir / "private", 4242, 4242)
    with pytest.raises(TaskError) as e:
        load_task(task_dir)
    msg = str(e.value)
    assert str(task_dir / "private") in msg and "mode 0755" in msg and "uid 4242" in msg, msg
    assert mode(task_dir / "private") == 0o755  # not ours: left as it was


def test_private_files_are_repaired_whatever_their_directory(tmp_path, caplog):
    """A 0700 private/ holding a 0644 label file (one copied in later) is repaired too: a
    hard or symbolic link to it elsewhere would otherwise let the sandbox read it."""
    task = make_tiny_task(tmp_path / "t")
    os.chmod(task.labels_path, 0o644)
    with caplog.at_level(logging.WARNING, logger="wmrl.autoresearch.env.task"):
        again = load_task(task.root)
    assert mode(again.labels_path) == 0o600 and mode(task.root / "private") == 0o700
    assert "test_labels.csv had mode 0644" in caplog.text
    caplog.clear()
    load_task(task.root)
    assert caplog.text == ""  # private as written by make_task: nothing to say
