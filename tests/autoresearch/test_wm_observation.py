"""WM-written observations (`wmrl.autoresearch.wm_observation`): hand numbers for the status mix
and the
leaderboard map, the static check's overrides, and the rendered text of a WM observation
against real ones from sandbox executions of an episode task (same template, same fields in
the same order)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest

from tests.support.autoresearch_fixtures import GOOD_SCRIPT, make_tiny_task
from wmrl.autoresearch.env.episode import make_episode_task
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.grader import reward as status_reward
from wmrl.autoresearch.env.metrics import get_metric, percentile
from wmrl.autoresearch.env.observation import (
    ERROR_TYPES,
    Observation,
    observation_of,
    render_observation,
)
from wmrl.autoresearch.env.pool import SandboxPool
from wmrl.autoresearch.wm_observation import (
    metric_from_percentile,
    predict_observation,
    status_probabilities,
    valid_percentile,
)

C = 6  # the ladder's statuses (UNGRADED is no class)
# The template's grammar, written out here: fields in this order, nothing else on the line.
LINE = re.compile(
    r"status: (?P<status>[A-Z_]+) \| error: (?P<error>[A-Za-z]+) \| "
    r"runtime: (?P<runtime>\d+\.\d)s \| validation (?P<metric>[a-z_0-9]+): "
    r"(?P<validation>n/a|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)"
)


def logits_for(status: Status, strength: float = 8.0) -> np.ndarray:
    z = np.zeros(C)
    z[int(status)] = strength
    return z


def predicted(rows: list[Status], runtime_s=2.5, p_timeout=0.01, score=0.9, errors=None):
    n = len(rows)
    out = {
        "score": np.full(n, score), "score_raw": np.full(n, score),
        "p_timeout": np.full(n, p_timeout), "runtime_s": np.full(n, runtime_s),
        "outputs": {"class_logits": np.stack([logits_for(s) for s in rows])},
    }  # fmt: skip
    if errors is not None:
        e = np.zeros((n, len(ERROR_TYPES)))
        for i, name in enumerate(errors):
            e[i, ERROR_TYPES.index(name)] = 5.0
        out["outputs"]["error_logits"] = e
    return out


def test_status_probabilities_hand_numbers():
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.1, 0.1, 0.2]]))
    p = status_probabilities(logits, np.array([0.5]))
    # TIMEOUT's 0.3 replaced by 0.5; the others keep their odds over the remaining 0.5
    np.testing.assert_allclose(p[0], [0.5 * x / 0.7 for x in (0.1, 0.2)] + [0.5]
                               + [0.5 * x / 0.7 for x in (0.1, 0.1, 0.2)], rtol=1e-9)  # fmt: skip
    q = status_probabilities(logits, None, compiles=np.array([True]))
    np.testing.assert_allclose(q[0], np.array([0, 0.2, 0.3, 0.1, 0.1, 0.2]) / 0.9, rtol=1e-9)


def test_leaderboard_map_inverts_the_graders_percentile(tmp_path):
    task = make_tiny_task(tmp_path / "lb", scores=(0.5, 0.7, 0.9))
    assert metric_from_percentile(task, 0.5) == pytest.approx(0.7)
    assert metric_from_percentile(task, 0.0) == pytest.approx(0.5)
    for pct in (0.2, 0.5, 0.8):  # within one leaderboard step of the grader's own percentile
        got = percentile(metric_from_percentile(task, pct), [0.5, 0.7, 0.9], True)
        assert abs(got - pct) <= 1 / 3 + 1e-9
    # lower is better (rmse): a better position is a smaller error
    rmse = SimpleNamespace(reference_scores=(3.0, 2.0, 1.0), metric=get_metric("rmse"))
    assert metric_from_percentile(rmse, 1.0) == pytest.approx(1.0)
    assert metric_from_percentile(rmse, 0.25) == pytest.approx(2.5)
    got = percentile(metric_from_percentile(rmse, 0.8), [3.0, 2.0, 1.0], False)
    assert abs(got - 0.8) <= 1 / 3 + 1e-9
    assert metric_from_percentile(SimpleNamespace(reference_scores=(), metric=None), 0.5) is None


def test_valid_percentile_backs_the_leaderboard_position_out_of_the_expected_reward():
    probs = np.zeros(C)
    probs[int(Status.RUNTIME_ERROR)], probs[int(Status.VALID)] = 0.25, 0.75
    pct = 0.6  # E[r] = 0.25 * 0.1 + 0.75 * (0.5 + 0.5 * 0.6)
    score = 0.25 * status_reward(Status.RUNTIME_ERROR) + 0.75 * (0.5 + 0.5 * pct)
    assert valid_percentile(score, probs) == pytest.approx(pct)
    assert valid_percentile(0.0, probs) == 0.0 and valid_percentile(5.0, probs) == 1.0


def test_static_check_fixes_what_it_knows(tmp_path):
    task = make_tiny_task(tmp_path / "st")
    scripts = [
        "import os\nprint((1\n",  # does not compile
        "import pandas as pd\nm = LogisticRegression()\n",  # an unbound name
        "print(1)\n",  # compiles: the WM's MALFORMED is impossible with the check on
        "print(2)\n",
    ]
    wm_says = [Status.VALID, Status.VALID, Status.MALFORMED, Status.RUNTIME_ERROR]
    pred = predicted(wm_says, errors=["KeyError"] * 4)
    obs = predict_observation(pred, [task] * 4, scripts, [3.0] * 4, static="names")
    assert (obs[0].status, obs[0].error_type, obs[0].runtime_s, obs[0].validation) == (
        Status.MALFORMED, "none", 0.0, None)  # fmt: skip
    assert (obs[1].status, obs[1].error_type, obs[1].validation) == (
        Status.RUNTIME_ERROR, "NameError", None)  # fmt: skip
    assert obs[2].status not in (Status.MALFORMED,)
    assert (obs[3].status, obs[3].error_type) == (Status.RUNTIME_ERROR, "KeyError")
    # "compile": only the first is fixed; "off": the WM's word for all of them
    comp = predict_observation(pred, [task] * 4, scripts, [3.0] * 4, static="compile")
    assert comp[0].status == Status.MALFORMED and comp[1].status == Status.VALID
    off = predict_observation(pred, [task] * 4, scripts, [3.0] * 4, static="off")
    assert [o.status for o in off] == wm_says
    # without an error-type head a predicted runtime error is "other"
    plain = predict_observation(predicted([Status.RUNTIME_ERROR]), [task], ["print(3)\n"], [3.0])
    assert plain[0].error_type == "other"


def test_bad_input_is_refused_naming_what_is_missing(tmp_path):
    task = make_tiny_task(tmp_path / "bad")
    pred = predicted([Status.VALID])
    with pytest.raises(ValueError, match="static"):
        predict_observation(pred, [task], ["print(1)\n"], [3.0], static="always")
    no_rt = {k: v for k, v in pred.items() if k != "p_timeout"}
    with pytest.raises(ValueError, match="runtime_coef"):
        predict_observation(no_rt, [task], ["print(1)\n"], [3.0])
    with pytest.raises(ValueError, match="validation_coef"):
        predict_observation(pred, [task], ["print(1)\n"], [3.0], validation="head")
    with pytest.raises(ValueError, match="must agree"):
        predict_observation(pred, [task, task], ["print(1)\n"] * 2, [3.0] * 2)


@pytest.fixture(scope="module")
def real_observations(tmp_path_factory):
    """Real observations: an episode task's executions in sandbox processes (VALID with a
    validation metric, a KeyError, a script that never compiles)."""
    source = make_tiny_task(tmp_path_factory.mktemp("tasks") / "tiny", time_limit_s=10.0)
    episode = make_episode_task(source, tmp_path_factory.mktemp("episodes"))
    scripts = [GOOD_SCRIPT, GOOD_SCRIPT.replace('tr["label"]', 'tr["Label"]'), "print((1\n"]
    with SandboxPool(num_workers=1, startup_check=False) as pool:
        results = [pool.run(episode, s) for s in scripts]
    return episode, [observation_of(r) for r in results]


def test_wm_observation_renders_exactly_like_a_real_one(real_observations):
    episode, real = real_observations
    assert [o.status for o in real] == [Status.VALID, Status.RUNTIME_ERROR, Status.MALFORMED]
    rows = [Status.VALID, Status.RUNTIME_ERROR, Status.MALFORMED, Status.TIMEOUT,
            Status.NO_SUBMISSION]  # fmt: skip
    pred = predicted(rows, runtime_s=1.234, score=0.8, errors=["KeyError"] * 5)
    pred["p_timeout"][3] = 0.9
    n = len(rows)
    wm = predict_observation(pred, [episode] * n, ["print(1)\n"] * n, [10.0] * n, static="off")
    assert [o.status for o in wm] == rows
    assert all(isinstance(o, Observation) for o in wm)
    real_text = [render_observation(o, episode.metric_name) for o in real]
    wm_text = [render_observation(o, episode.metric_name) for o in wm]
    for text in real_text + wm_text:
        m = LINE.fullmatch(text)
        assert m is not None, text
        assert m["status"] in Status.__members__ and m["error"] in ERROR_TYPES
        assert m["metric"] == episode.metric_name and text.isascii() and "\n" not in text
    # the same keys in the same order, and the same value forms status by status
    keys = lambda t: re.findall(r"(?:^| \| )([a-z ]+?)(?: [a-z_]+)?: ", t)
    assert {tuple(keys(t)) for t in real_text + wm_text} == {
        ("status", "error", "runtime", "validation")
    }
    real_valid, wm_valid = LINE.fullmatch(real_text[0]), LINE.fullmatch(wm_text[0])
    assert real_valid["validation"] != "n/a" and wm_valid["validation"] != "n/a"
    assert math.isfinite(float(wm_valid["validation"]))
    assert LINE.fullmatch(wm_text[1])["error"] == LINE.fullmatch(real_text[1])["error"]
    assert wm_text[2] == real_text[2]  # MALFORMED: every field is exact
    assert LINE.fullmatch(wm_text[3])["runtime"] == "10.0"  # a time-out reports its limit
    # Observation JSON round trip, as the multi-turn record keeps them
    assert [Observation.from_json(o.to_json()) for o in wm] == wm
