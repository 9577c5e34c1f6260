"""The built-in tasks' hidden labels cannot be looked up in what a sandboxed script can import.

Every built-in task comes from a dataset that ships with an installed package or from a
scikit-learn generator, and the sandbox mounts the site-packages its scripts import from.
`label_lookup` is the attacker: it matches every public row to the packaged copies (exactly,
rounded, by nearest neighbour, within blocks of unchanged columns, one-to-one, by row order)
and re-runs the generators with plausible seeds. These tests build each task's files as the
suite does (no leaderboard), run every one of the attacker's ways, and compare each way's
test score with the best baseline, whose scripts (``author.baseline_specs``) run here in
the test process, graded by the real grader.

A way *beats* the baselines when its score is better than the best baseline's by more than
two standard errors of that difference (a paired bootstrap over the task's test rows): a
lookup that recovers labels scores far above every model, while a copy used as plain extra
training rows (a nearest-neighbour classifier on the copy) scores about as well as a model,
within that noise, which no rewriting of the rows can remove.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn import datasets

from tests.support import label_lookup
from wmrl.autoresearch.env import author, suite
from wmrl.autoresearch.env.grader import Status, grade_submission
from wmrl.autoresearch.env.make_task import task_info
from wmrl.autoresearch.env.task import Task, load_task

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox"),
]

GENERATORS = [name for name in dir(datasets) if name.startswith("make_")]
BOOTSTRAPS = 200
SIGNIFICANT = 2.0  # an advantage over the best baseline beyond this many standard errors
LARGE = 10_000  # rows above which the slower baselines are left out of the reference


@contextlib.contextmanager
def recorded_generator_calls(calls: list):
    """Record every scikit-learn generator call (all but its ``random_state``): what the
    builder's code tells an attacker about a generated task."""
    real = {name: getattr(datasets, name) for name in GENERATORS}

    def recorder(name):
        def call(*args, random_state=None, **kwargs):
            calls.append({"maker": name, "kwargs": kwargs})
            return real[name](*args, random_state=random_state, **kwargs)

        return call

    for name in GENERATORS:
        setattr(datasets, name, recorder(name))
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(datasets, name, fn)


def build(spec: suite.SuiteTask, root: Path) -> tuple[Task, dict | None]:
    """The task's files as the suite writes them, and its generator call (None if packaged)."""
    calls: list = []
    with recorded_generator_calls(calls):
        task = load_task(suite.write_suite_task(spec, root / spec.id, seed=0))
    call = {**calls[0], "target": spec.target} if calls else None
    return task, call


def attacker_copies(task: Task, call: dict | None) -> dict[str, pd.DataFrame]:
    """What the attacker matches against: the packaged copies, or for a generated task the
    generator re-run with the plausible seed that fits the train rows best."""
    if call is None:
        return label_lookup.packaged_copies()
    train = pd.read_csv(task.public_dir / "train.csv")
    seed, frame = label_lookup.regenerated_copy(call, train, label_lookup.plausible_seeds())
    return {f"regenerated(seed={seed})": frame}


def run_in_process(task: Task, source: str, path: Path) -> pd.DataFrame:
    """Run a script as the sandbox would (DATA_DIR, SUBMISSION_PATH), here; its submission."""
    env = {"DATA_DIR": str(task.public_dir), "SUBMISSION_PATH": str(path)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(source, "<baseline>", "exec"), {"__name__": "__main__"})
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return pd.read_csv(path)


def graded(task: Task, submission: pd.DataFrame, path: Path) -> float:
    submission.to_csv(path, index=False)
    grade = grade_submission(task, path)
    assert grade.status == Status.VALID, grade.detail
    return grade.score


def best_baseline(task: Task, tmp: Path) -> tuple[str, float, pd.DataFrame]:
    """The best of the baselines, run here (on large tasks without the two slowest, the
    random forest and k-NN: the reference is then at most the leaderboard's best)."""
    info = task_info(task)
    skip = {"forest", "knn"} if info.n_rows > LARGE else set()
    best = None
    for spec in author.baseline_specs(info):
        if spec.model in skip:
            continue
        sub = run_in_process(task, author.render(info, spec), tmp / "baseline.csv")
        score = graded(task, sub, tmp / "graded.csv")
        if best is None or better(task, score, best[1]):
            best = (spec.model, score, sub)
    return best


def better(task: Task, a: float, b: float) -> bool:
    return a > b if task.metric.higher_is_better else a < b


def aligned(task: Task, ids, pred) -> tuple[np.ndarray, np.ndarray]:
    """Hidden labels and predictions in the same row order (class labels as text)."""
    labels = pd.read_csv(task.labels_path)
    pred = pd.Series(np.asarray(pred), index=np.asarray(ids)).loc[labels[task.id_column]]
    y_true, y_pred = labels[task.target].to_numpy(), pred.to_numpy()
    if task.metric.task_type == "classification" and not task.metric.needs_scores:
        y_true, y_pred = y_true.astype(str), y_pred.astype(str)
    return y_true, y_pred


def advantage_se(task: Task, y_true, attack, baseline) -> float:
    """Standard error of (attack's score - baseline's score), signed so that positive
    means the attack is better: a paired bootstrap over the test rows."""
    sign = 1.0 if task.metric.higher_is_better else -1.0
    rng = np.random.default_rng(0)
    diffs = []
    for _ in range(BOOTSTRAPS):
        rows = rng.integers(0, len(y_true), len(y_true))
        with contextlib.suppress(ValueError):  # a resample holding one class: no AUC
            a, b = (
                task.metric.fn(y_true[rows], attack[rows]),
                task.metric.fn(y_true[rows], baseline[rows]),
            )
            diffs.append(sign * (a - b))
    return float(np.std(diffs))


def lookup_report(spec: suite.SuiteTask, tmp: Path) -> dict:
    """Every way's test score, its advantage over the best baseline and that advantage's
    standard error."""
    task, call = build(spec, tmp)
    train = pd.read_csv(task.public_dir / "train.csv")
    test = pd.read_csv(task.public_dir / "test.csv")
    ways = label_lookup.lookups(
        train, test, task.target, task.id_column, task.metric_name, attacker_copies(task, call)
    )
    name, best, sub = best_baseline(task, tmp)
    y_true, base = aligned(task, sub[task.id_column], sub[task.target])
    sign = 1.0 if task.metric.higher_is_better else -1.0
    rows = {}
    for way, (_, pred) in ways.items():
        score = graded(
            task,
            pd.DataFrame({task.id_column: test[task.id_column], task.target: pred}),
            tmp / "w.csv",
        )
        _, attack = aligned(task, test[task.id_column], pred)
        rows[way] = (score, sign * (score - best), advantage_se(task, y_true, attack, base))
    return {"task": task, "baseline": (name, best), "ways": rows}


def assert_no_lookup_beats_the_baselines(spec: suite.SuiteTask, tmp: Path) -> None:
    report = lookup_report(spec, tmp)
    name, best = report["baseline"]
    assert report["ways"], f"{spec.id}: the attacker found nothing to match"
    beating = {
        way: f"score {score:.4f}, advantage {adv:+.4f} (se {se:.4f})"
        for way, (score, adv, se) in report["ways"].items()
        if adv > SIGNIFICANT * se
    }
    assert not beating, f"{spec.id}: beats the best baseline ({name} {best:.4f}): {beating}"


FAST = ("penguins-body-mass", "moons")


@pytest.mark.parametrize("task_id", FAST)
def test_lookups_do_not_beat_the_baselines_on_two_tasks(task_id, tmp_path):
    """One packaged and one generated task (every task: the slow test below)."""
    assert_no_lookup_beats_the_baselines(_spec(task_id), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("task_id", [t.id for t in suite.suite_tasks()])
def test_lookups_do_not_beat_the_baselines_on_any_built_in_task(task_id, tmp_path):
    assert_no_lookup_beats_the_baselines(_spec(task_id), tmp_path)


def _spec(task_id: str) -> suite.SuiteTask:
    return next(t for t in suite.suite_tasks() if t.id == task_id)


def test_integer_seeds_do_not_regenerate_a_generated_task(tmp_path):
    """No train row agrees with a row of the generator re-run with the plausible seed that
    fits best, on as much as half of its cells (to 6 decimals)."""
    task, call = build(_spec("synth-easy"), tmp_path)
    train = pd.read_csv(task.public_dir / "train.csv")
    seed, frame = label_lookup.regenerated_copy(call, train, label_lookup.plausible_seeds())
    cols = [c for c in train.columns if c.startswith("f")]
    matched = label_lookup.hash_match(train, frame, cols, 6)
    assert (matched >= 0).sum() == 0, (seed, (matched >= 0).sum())


# -- the real sandbox: the copies are readable there, and the lookup still loses ------------


SANDBOX_TASKS = ("cars-mpg", "moons")


@pytest.fixture(scope="module")
def built_suite(tmp_path_factory):
    """Two tasks built with their real leaderboards (the baselines run in the sandbox)."""
    root = tmp_path_factory.mktemp("suite")
    calls: list = []
    with recorded_generator_calls(calls):
        suite.build_suite(root, only=list(SANDBOX_TASKS), workers=2)
    return root, calls


@pytest.mark.parametrize("isolation", ["auto", "rlimits"])
def test_the_lookup_script_reads_the_copies_in_the_sandbox_and_loses(built_suite, isolation):
    """Run for real: the script tries to read the packaged copies (hidden in the namespace
    view; all their rows in the rlimits fallback) and re-runs the generator inside the
    sandbox, submits its best lookup, and scores no better than the best baseline of the
    task's real leaderboard."""
    from tests.support.sandbox_checks import rlimits_pool
    from wmrl.autoresearch.env.pool import SandboxPool

    root, calls = built_suite
    if isolation == "rlimits":
        pool, usable = rlimits_pool(num_workers=2)
        if not usable:
            pool.close()
            pytest.skip("the rlimits sandbox uid cannot read this host's Python installation")
    else:
        pool = SandboxPool(num_workers=2)
    with pool:
        for task_id in SANDBOX_TASKS:
            task = load_task(root / task_id)
            spec = _spec(task_id)
            call = None if spec.packaged else {**calls[0], "target": task.target}
            config = {
                "task_id": task_id,
                "target": task.target,
                "id_column": task.id_column,
                "metric": task.metric_name,
                "call": call,
            }
            r = pool.run(task, label_lookup.script_source(config))
            assert r.status == Status.VALID, (task_id, r.status, r.detail, r.stderr_tail)
            if pool.isolation.startswith("namespaces"):  # the checkout is not in its view
                assert "builder importable: False" in r.stdout_tail, r.stdout_tail
            readable = json.loads(r.stdout_tail.split("readable copies:")[1].splitlines()[0])
            if pool.isolation.startswith("namespaces"):  # the packaged data are covered
                assert readable == {}, readable
            else:  # the rlimits fallback sees the host's files: the copies, all their rows
                assert readable["cars"] == 406 and readable["penguins"] == 344, readable
            pick = max if task.metric.higher_is_better else min
            best = pick(task.reference_scores)
            assert not better(task, r.score, best), (task_id, r.score, task.reference_scores)
