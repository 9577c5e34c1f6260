"""A script in the real sandbox cannot reach an imported competition's answers or its private
leaderboard, in either benchmark's layout, at either isolation level.

The competitions are prepared as a download under umask 022 leaves them (everything
readable by every user) in a directory every uid may enter, then imported through the CLI.
A probe script, run through the real pool, tries to open every file that holds an answer or
a leaderboard: the task's own ``private/`` and the benchmark's prepared answers, leaderboards,
raw download and (MLE-bench) the Kaggle zip. It prints what it could open. A process of a
sandbox uid (forked, ``setuid``) tries the same files directly. The controls show the probe
can open what is open to it: the public data through DATA_DIR at both levels, and at the
rlimits level a world-readable file next to the answers.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.support.competition_fixtures import MLEBENCH, MLEDOJO, import_both
from tests.support.sandbox_checks import rlimits_pool
from wmrl.autoresearch.env import sandbox
from wmrl.autoresearch.env.grader import Status, task_to_json
from wmrl.autoresearch.env.pool import SandboxPool
from wmrl.autoresearch.env.task import load_suite

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-slot uids need root")

PROBE = """
import json, os

found = {}
for path in json.loads(%r):
    try:
        with open(path, "rb") as f:
            found[path] = len(f.read())
    except OSError as e:
        pass
public = os.path.join(os.environ["DATA_DIR"], "sample_submission.csv")
print("PROBE" + json.dumps({"opened": sorted(found), "public": os.path.isfile(public)}))
"""


def secret_files(root: Path, suite: Path) -> dict[str, list[str]]:
    """Per competition, every file that holds its answers or a leaderboard."""
    out = {}
    for name in MLEBENCH:
        data = root / "mlebench-data" / name
        out[name] = [
            str(data / "prepared" / "private" / "test.csv"),
            str(data / "raw" / "train.csv"),
            str(data / f"{name}.zip"),  # mlebench prepare keeps the Kaggle download
        ]
    for name in MLEDOJO:
        private = root / "mledojo-data" / name / "data" / "private"
        out[name] = [
            str(private / "test_answer.csv"),
            str(private / "private_leaderboard.csv"),
            str(private / "public_leaderboard.csv"),
            str(root / "mledojo-data" / name / "raw" / "train.csv"),
        ]
    for name in out:
        out[name] += [str(p) for p in sorted((suite / name / "private").iterdir())]
    return out


@pytest.fixture(scope="module")
def world():
    """Competitions imported in a directory every uid may traverse (pytest's tmp_path sits
    under a 0700 directory, which alone would keep the sandbox uid out)."""
    root = Path(tempfile.mkdtemp(prefix="wmrl-competitions-"))
    os.chmod(root, 0o755)
    suite = import_both(root)
    control = root / "open_control.csv"
    control.write_text("id,x\n1,2\n")
    os.chmod(control, 0o644)
    yield root, suite, control
    shutil.rmtree(root)


def probe(pool, task, paths: list[str]) -> dict:
    r = pool.run(task, PROBE % json.dumps(paths))
    assert r.status == Status.NO_SUBMISSION, (r.status, r.detail, r.stderr_tail[-800:])
    line = next(x for x in r.stdout_tail.splitlines() if x.startswith("PROBE"))
    return json.loads(line[len("PROBE") :])


def test_the_probe_paths_exist_and_hold_the_secrets(world):
    root, suite, _ = world
    for name, paths in secret_files(root, suite).items():
        assert len(paths) >= 4, name
        for p in paths:
            assert Path(p).is_file() and Path(p).stat().st_size > 0, p


def opened_as(uid: int, paths: list[str]) -> list[str]:
    """The paths a forked child running as ``uid`` (no groups) could open for reading."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the uid, try each file, report, exit
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            found = []
            for path in paths:
                try:
                    with open(path, "rb") as f:
                        f.read(1)
                    found.append(path)
                except OSError:
                    pass
            os.write(write, json.dumps(found).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return json.loads(text)


@as_root
def test_a_sandbox_uid_cannot_read_any_answer_file_of_the_downloads(world):
    """Every file of either benchmark's download that holds answers (the prepared answers and
    leaderboards, the raw train.csv, MLE-bench's Kaggle zip), tried by a process of a uid in
    the pool's sandbox range; the controls (a world-readable file beside them, the task's
    public data) show that uid can read what is open to it."""
    root, suite, control = world
    uid = sandbox.UID_BASE + sandbox.UID_BLOCK * (sandbox.UID_BLOCKS - 1)  # the last block
    secrets = [p for paths in secret_files(root, suite).values() for p in paths]
    zips = [p for p in secrets if p.endswith(".zip")]
    assert len(zips) == len(MLEBENCH)
    public = [str(suite / name / "public" / "train.csv") for name in [*MLEBENCH, *MLEDOJO]]
    assert opened_as(uid, [*secrets, str(control), *public]) == [str(control), *public]


def test_no_leaderboard_travels_with_the_job(world):
    """The task sent to the supervisor (whose memory a prefork script inherits) names files,
    never a leaderboard's scores."""
    suite = world[1]
    for task in load_suite(suite):
        sent = task_to_json(task)
        assert sent["reference_scores"] == []
        assert set(sent["competition"]["leaderboards"].values()) <= {
            "leaderboard.csv", "private_leaderboard.csv", "public_leaderboard.csv",
        }  # fmt: skip


def test_namespaces_sandbox_sees_public_data_only(world):
    root, suite, control = world
    tasks = {t.id: t for t in load_suite(suite)}
    secrets = secret_files(root, suite)
    with SandboxPool(num_workers=1) as pool:
        if not pool.isolation.startswith("namespaces"):
            pytest.skip(f"namespaces unavailable here ({pool.isolation})")
        for name, task in tasks.items():
            seen = probe(pool, task, [*secrets[name], str(control)])
            assert seen == {"opened": [], "public": True}, (name, seen)


@as_root
def test_rlimits_sandbox_cannot_open_the_answers_or_leaderboards(world):
    root, suite, control = world
    tasks = {t.id: t for t in load_suite(suite)}
    secrets = secret_files(root, suite)
    pool, _ = rlimits_pool(num_workers=1)
    with pool:
        assert pool.isolation.startswith("rlimits")
        for name, task in tasks.items():
            seen = probe(pool, task, [*secrets[name], str(control)])
            # The control: a world-readable file beside them is readable at this level.
            assert seen == {"opened": [str(control)], "public": True}, (name, seen)


@as_root
def test_without_the_import_the_rlimits_sandbox_could_read_the_raw_answers(world):
    """What the import's protection prevents: the same raw download left 0755 / 0644 is
    readable by the sandbox uid."""
    root, suite, _ = world
    task = next(t for t in load_suite(suite) if t.id == "md-flower-kind")
    raw = root / "mledojo-data" / "md-flower-kind" / "raw"
    os.chmod(raw, 0o755)
    try:
        pool, _ = rlimits_pool(num_workers=1)
        with pool:
            seen = probe(pool, task, [str(raw / "train.csv")])
    finally:
        os.chmod(raw, 0o700)
    assert seen["opened"] == [str(raw / "train.csv")], textwrap.shorten(str(seen), 300)
