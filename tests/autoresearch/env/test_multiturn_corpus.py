"""Multi-turn SFT episodes: the author's plans (pure) and their real execution (a tiny suite
through a real sandbox pool, resumed)."""

from __future__ import annotations

import json
import random

import pytest

from tests.support.autoresearch_fixtures import make_tiny_task
from wmrl.autoresearch.env import author
from wmrl.autoresearch.env.grader import Status, reward
from wmrl.autoresearch.env.multiturn_corpus import execute_episodes, read_episodes
from wmrl.autoresearch.env.observation import ERROR_TYPES, Observation, render_observation

INFO = author.TaskInfo("classification", "accuracy", "label", "id", has_missing=True)


def test_fix_episodes_correct_the_first_scripts_mistake():
    eps = author.write_episodes(INFO, 40, seed=3, turns=3)
    assert eps == author.write_episodes(INFO, 40, seed=3, turns=3)  # reproducible
    fixes = [(p, s) for p, s in eps if p.kind == "fix"]
    improves = [(p, s) for p, s in eps if p.kind == "improve"]
    assert fixes and improves
    for plan, sources in fixes:
        assert len(plan.specs) == len(sources) == 3
        first, second = plan.specs[:2]
        assert first.mistake in author.fixable_mistakes(INFO)
        assert second.mistake is None and second == author.corrected(first)
        assert sources[1] == author.render(INFO, second) != sources[0]
    # the data-dependent mistakes are offered only where they fail
    assert "no_encoding" not in author.fixable_mistakes(INFO)
    assert "no_imputation" in {p.mistake for p, _ in fixes}
    for plan, _ in improves:
        assert plan.specs[0].mistake is None and plan.specs[0].model in author.WEAK_MODELS
    for plan, _ in eps:
        assert all(s.mistake is None and s.model in author.STRONG_MODELS for s in plan.specs[2:])
    with pytest.raises(ValueError, match="turns >= 2"):
        author.plan_episode(INFO, random.Random(0), turns=1)


def test_corrected_scripts_compile_and_name_everything():
    from wmrl.autoresearch.env.grader import static_outcome

    for plan, sources in author.write_episodes(INFO, 30, seed=1, turns=2):
        assert static_outcome(sources[1].encode()) is None, plan
        if plan.mistake == "syntax_slip":
            assert static_outcome(sources[0].encode())[0] == Status.MALFORMED


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt")
    make_tiny_task(root / "suite" / "tiny", time_limit_s=20.0)
    path = execute_episodes(
        root / "suite", root / "data", episodes_per_task=4, turns=2, workers=2, progress=False
    )
    return root, path


def test_executed_episodes_record_real_observations(built):
    root, path = built
    recs = read_episodes(path)
    assert [(r["task_id"], r["index"]) for r in recs] == [("tiny", i) for i in range(4)]
    assert (root / "data" / "tasks" / "tiny" / "private" / "validation_labels.csv").is_file()
    kinds = {r["kind"] for r in recs}
    assert kinds == {"fix", "improve"}, kinds
    for r in recs:
        assert len(r["turns"]) == 2 and r["metric"] == "accuracy"
        for t in r["turns"]:
            obs = Observation.from_json(t["observation"])
            assert t["observation_text"] == render_observation(obs, "accuracy")
            assert obs.status == Status(t["status"]) and obs.error_type in ERROR_TYPES
            assert (obs.validation is not None) == (obs.status == Status.VALID)
            if obs.status == Status.VALID:
                assert 0.0 <= obs.validation <= 1.0
                assert 0.5 <= t["reward"] <= 1.0
            else:
                assert t["reward"] == reward(obs.status)
        first = r["turns"][0]
        if r["mistake"] == "wrong_column":
            assert (first["status_name"], first["observation"]["error_type"]) == (
                "RUNTIME_ERROR",
                "KeyError",
            )
        if r["mistake"] == "syntax_slip":
            assert first["status_name"] == "MALFORMED"
        if r["mistake"] in ("wrong_format", "no_write"):
            assert first["status_name"] in ("INVALID_SUBMISSION", "NO_SUBMISSION")
        if r["kind"] == "fix":
            assert r["turns"][1]["action"] == "fix" and r["turns"][1]["status_name"] == "VALID"
        else:  # keep or improve the good first script, judged on validation only
            second = r["turns"][1]
            v1, v2 = (t["observation"]["validation"] for t in r["turns"])
            if second["action"] == "keep":
                assert not second["executed"] and second["script"] == first["script"]
            else:
                assert second["action"] == "improve" and v2 > v1


def test_a_rerun_reuses_and_an_interrupted_build_resumes(built):
    root, path = built
    before = path.read_text()
    args = dict(episodes_per_task=4, turns=2, workers=1, progress=False)
    assert execute_episodes(root / "suite", root / "data", **args) == path
    assert path.read_text() == before  # nothing executed again
    lines = before.splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # a torn record
    execute_episodes(root / "suite", root / "data", **args)
    again = read_episodes(path)
    old = sorted((json.loads(line) for line in lines), key=lambda r: r["index"])
    assert len(again) == 4

    def stable(rec):  # runtimes vary between executions; everything else is seeded
        return [
            (t["script"], t["status"], t["reward"], t["observation"]["validation"])
            for t in rec["turns"]
        ]

    assert [stable(r) for r in again] == [stable(r) for r in old]
