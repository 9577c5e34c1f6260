"""The WM-quality benchmark's yardstick: policy samples laid out as anchor groups, with the
static check's verdicts, and a scorer's figures on them (hand numbers)."""

from types import SimpleNamespace

import numpy as np
import pytest

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch import stages
from wmrl.autoresearch.env.grader import Status
from wmrl.benchmarks import wm_quality as wq

V, RE, UNG = int(Status.VALID), int(Status.RUNTIME_ERROR), int(Status.UNGRADED)
GOOD = "import os\nprint(os.sep)\n"


def record(task, index, status, reward, script=GOOD):
    return {"task_id": task, "index": index, "status": status, "reward": reward, "script": script}


def test_yardstick_groups_and_static_verdicts(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, tmp_path, rl__group_size=2, rl__static_check="names")
    prepared = SimpleNamespace(train_tasks=[SimpleNamespace(id="a"), SimpleNamespace(id="b")])
    records = [
        record("a", 0, V, 0.9), record("a", 1, RE, 0.1, "x = undefined_y\n"),
        record("a", 2, V, 0.7), record("a", 3, UNG, None),
        record("b", 0, 0, 0.0, "def f(:\n"), record("b", 1, V, 0.6),
        record("b", 2, V, 0.8), record("b", 3, V, 0.5),
    ]  # fmt: skip
    seen = []
    monkeypatch.setattr(stages, "policy_sample_rows", lambda c, p, recs: seen.append(recs) or {})
    _, pairs = wq.yardstick(config, prepared, records)
    assert [r["index"] for r in seen[0]] == [0, 1, 2, 0, 1, 2, 3]  # the ungraded one left out
    # 4 samples per task in groups of 2: task a -> groups 1, 2; task b -> groups 3, 4.
    assert [p["step"] for p in pairs] == [1, 1, 2, 3, 3, 4, 4]
    assert [p["static_status"] for p in pairs] == [
        None, "RUNTIME_ERROR", None, "MALFORMED", None, None, None
    ]  # fmt: skip
    off = tiny_config(tmp_path, tmp_path, rl__group_size=2, rl__static_check="off")
    assert not any(p["static"] for p in wq.yardstick(off, prepared, records)[1])


def pair(step, status, r_env, static=None):
    return {"step": step, "task_id": "t", "status": status, "r_env": r_env,
            "static": static is not None, "static_status": static}  # fmt: skip


def test_figures_of_a_scorer_with_and_without_the_static_check():
    # One group: rewards (.9, .1, .6, .1); the second row is a static RUNTIME_ERROR.
    pairs = [pair(1, V, 0.9), pair(1, RE, 0.1, "RUNTIME_ERROR"), pair(1, V, 0.6),
             pair(1, RE, 0.1)]  # fmt: skip
    scores = [0.2, 0.8, 0.5, 0.3]  # the scorer alone ranks the static row first
    got = wq.yardstick_figures(wq.scored(pairs, scores, p_timeout=[0.0, 0.0, 0.5, 0.5]))
    # + static: (.2, .1, .5, .3) vs (.9, .1, .6, .1): ranks (2, 1, 4, 3) vs (4, 1.5, 3, 1.5).
    x, y = np.array([2, 1, 4, 3.0]), np.array([4, 1.5, 3, 1.5])
    want = np.corrcoef(x, y)[0, 1]
    assert got["stream_spearman"] == pytest.approx(want)
    # alone: (.2, .8, .5, .3): ranks (1, 4, 3, 2) vs (4, 1.5, 3, 1.5).
    want_alone = np.corrcoef([1, 4, 3, 2.0], y)[0, 1]
    assert got["raw_spearman"] == pytest.approx(want_alone)
    # learned rows (.2, .5, .3) vs (.9, .6, .1): ranks (1, 3, 2) vs (3, 2, 1) -> -0.5.
    assert got["learned_spearman"] == pytest.approx(-0.5)
    # VALID .2, .5 against the failure .3: 1 of 2.
    assert got["failure_auc"] == pytest.approx(0.5)
    assert got["valid_spearman"] == pytest.approx(-1.0)
    assert got["timeout_rate"] == 0.0 and got["timeout_mean_p"] == pytest.approx(1 / 3)
    # The static check alone: flat 0.5 elsewhere, so its learned rows say nothing (0).
    alone = wq.yardstick_figures(wq.scored(pairs, np.full(4, 0.5)))
    assert alone["learned_spearman"] == 0.0 and alone["timeout_brier"] is None


def test_the_verdict_scorer_on_the_yardstick(tmp_path, monkeypatch):
    """`--verdict=expected`: the frozen verdict WM's scores of the yardstick scripts give
    the anchor figures of those scores and the fidelity figures of its top outcomes."""
    from tests.autoresearch.test_verdict_wm import _tiny_verdict_wm
    from tests.support.autoresearch_fixtures import GOOD_SCRIPT
    from wmrl.autoresearch import verdict as v
    from wmrl.autoresearch import verdict_wm as vw
    from wmrl.tokenizer import Tokenizer

    tok = Tokenizer.train([GOOD_SCRIPT, v.INSTRUCTIONS, v.environment_section(3.0)] * 30,
                          tmp_path / "tok", vocab_size=1000, code_pieces=True)  # fmt: skip
    wm, task = _tiny_verdict_wm(tok, tmp_path)
    prepared = SimpleNamespace(tokenizer=tok, train_tasks=[task], heldout_tasks=[], executions=[])
    params = wm.params
    monkeypatch.setattr(wq, "warm_started", lambda c, p, d: (None, params))
    scripts = [GOOD_SCRIPT, "def f(:\n", GOOD_SCRIPT, "print(1)\n"]
    statuses = [(V, 0.8), (0, 0.0), (V, 0.6), (int(Status.NO_SUBMISSION), 0.2)]
    yard = [record(task.id, i, st, r, sc) for i, ((st, r), sc) in
            enumerate(zip(statuses, scripts, strict=True))]  # fmt: skip
    pairs = [pair(1 + i // 2, st, r) for i, (st, r) in enumerate(statuses)]
    config = wm.config
    got = wq.verdict_figures(config, prepared, tmp_path, yard, pairs, "expected")
    want = wm.predict(scripts, [task] * 4)
    assert got == pytest.approx({
        **wq.yardstick_figures(wq.scored(pairs, want["score"])),
        **vw.fidelity(want["top_outcome"], yard), "score_s": got["score_s"], "finetune": None,
    })  # fmt: skip
    assert got["status_accuracy"] is not None
