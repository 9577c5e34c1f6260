"""The solution author: valid sources, controlled mistake rates, mistakes that bite."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from tests.support.autoresearch_fixtures import make_tiny_task
from wmrl.autoresearch.env import author
from wmrl.autoresearch.env.grader import Status, check_script
from wmrl.autoresearch.env.make_task import task_info
from wmrl.autoresearch.env.pool import SandboxPool

CLF = author.TaskInfo("classification", "accuracy", "label", "id", True, True)
REG = author.TaskInfo("regression", "rmse", "y", "id")


def test_mistake_rate_is_controlled():
    rng = random.Random(0)
    specs = [author.sample_spec(CLF, rng, mistake_rate=0.3) for _ in range(3000)]
    rate = sum(s.mistake is not None for s in specs) / len(specs)
    # binomial sd = sqrt(.3*.7/3000) ~ 0.0084; 4 sd
    assert abs(rate - 0.3) < 0.034
    kinds = Counter(s.mistake for s in specs if s.mistake)
    assert set(kinds) == set(author.MISTAKES)
    assert all(
        s.mistake is None
        for s in (author.sample_spec(CLF, rng, mistake_rate=0.0) for _ in range(300))
    )


def test_sources_compile_unless_syntax_slip():
    for info in (CLF, REG):
        for spec, src in author.write_scripts(info, 200, seed=1, mistake_rate=0.5):
            problem = check_script(src.encode())
            assert (problem is None) == (spec.mistake != "syntax_slip"), (spec, problem)
    assert len({src for _, src in author.write_scripts(CLF, 50, seed=2)}) > 40  # varied


def test_regression_never_gets_classifier_only_models():
    rng = random.Random(3)
    assert {author.sample_spec(REG, rng).model for _ in range(500)} <= set(
        author.models_for("regression")
    )
    assert "naive_bayes" not in author.models_for("regression")


def test_mistakes_produce_their_status(tmp_path):
    """Run one script per mistake on a task with NaNs and strings: each lands on its rung."""
    from tests.support.autoresearch_fixtures import tiny_classification_df

    df = tiny_classification_df()
    df.loc[::5, "a"] = np.nan
    task = make_tiny_task(tmp_path / "t", time_limit_s=4.0)
    from wmrl.autoresearch.env.make_task import write_task
    from wmrl.autoresearch.env.task import load_task

    write_task(
        df,
        task.root,
        task_id="t",
        target="label",
        metric="accuracy",
        time_limit_s=4.0,
        memory_mb=512,
    )
    task = load_task(task.root)
    info = task_info(task)
    assert info.has_missing and info.has_categorical
    base = dict(model="linear", params={"C": 1.0, "alpha": 1.0})
    cases = {
        None: Status.VALID,
        "syntax_slip": Status.MALFORMED,
        "wrong_column": Status.RUNTIME_ERROR,
        "no_imputation": Status.RUNTIME_ERROR,
        "no_encoding": Status.RUNTIME_ERROR,
        "wrong_format": Status.INVALID_SUBMISSION,
        "no_write": Status.NO_SUBMISSION,
    }
    specs = {}
    for mistake in cases:
        spec = author.ScriptSpec(**base, mistake=mistake)
        if mistake == "no_imputation":
            spec = author.ScriptSpec(**base, impute=False, mistake=mistake)
        if mistake == "no_encoding":
            spec = author.ScriptSpec(**base, encode="none", mistake=mistake)
        specs[mistake] = spec
    with SandboxPool(2) as pool:
        futs = {m: pool.submit(task, author.render(info, s)) for m, s in specs.items()}
        got = {m: f.result().status for m, f in futs.items()}
    assert got == cases


@pytest.mark.parametrize("info", [CLF, REG])
def test_baselines_render(info):
    for spec in author.baseline_specs(info):
        assert check_script(author.render(info, spec).encode()) is None
