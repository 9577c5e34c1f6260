"""Cost-aware routing in the single-turn trainer (`routing = cost`), in-process over a
scripted executor: every non-anchor row runs under the cap, each mode's cut rows get the
reward the method gives them, the rows under the cap their real reward, and a step redone
after a kill takes every capped row from the journal, executing and counting none twice.

The real sandbox's cut (slot freed at the cap, nothing graded) is
tests/autoresearch/env/test_sandbox_cut.py; the correction by hand, tests/core/test_cut.py.
"""

import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch import cost_routing
from wmrl.autoresearch.env.fake_executor import FakeExecutor, Outcome, sha
from wmrl.autoresearch.env.grader import Status

CAP = 1.0


def outcome(task, script) -> Outcome:
    """By the script's hash: 1 in 4 a slow VALID script (3 s, past the cap), 1 in 4 a
    TIMEOUT (20 s), the rest VALID in 0.2 s, rewards spread by the hash."""
    h = int(sha(script)[:8], 16)
    reward = 0.5 + 0.5 * ((h >> 2) % 101) / 100.0
    if h % 4 == 0:
        return Outcome(Status.VALID, reward, runtime_s=3.0)
    if h % 4 == 1:
        return Outcome(Status.TIMEOUT, runtime_s=20.0)
    return Outcome(Status.VALID, reward, runtime_s=0.2)


@pytest.fixture(scope="module")
def stages(rl_shared, tmp_path_factory):
    from wmrl.autoresearch.experiment import prepare_stages

    wd = tmp_path_factory.mktemp("cost_stages")
    config = tiny_config(*rl_shared, routing="cost", correction__cheap_limit_s=CAP)
    return prepare_stages(config, wd, progress=False)


def make(stages, rl_shared, wd, pool, **changes):
    from wmrl.autoresearch.trainer import Trainer

    fields = {
        "routing": "cost", "correction__cheap_limit_s": CAP, "rl__static_check": "off",
        "rl__groups_per_step": 4, "rl__anchor_lag": 0, **changes,
    }  # fmt: skip
    config = tiny_config(*rl_shared, **fields)
    s = stages
    tr = Trainer(config, s.prepared, s.policy, s.wm, pool, wd)
    return tr, tr.initial_state(s.policy_params, s.wm_params)


def phases(tr, st):
    """One step through the trainer's phases: (records of each phase, new state, metrics)."""
    clock = tr.clock()
    keys = tr.keys(st)
    s = tr.sample(st, keys.sample, clock)
    r = tr.route(st, s, keys.route, clock)
    x = tr.act(st, s, r, keys.act, clock)
    c = tr.correct(st, r, x, clock)
    u = tr.update(st, r, x, c, clock)
    new, metrics, pairs = tr.finish(st, s, r, x, c, u, clock)
    return (s, r, x, c), new, metrics, pairs


@pytest.mark.parametrize("mode, lag", [("wmrl", 0), ("wmrl", 1), ("static_anchors", 0)])
def test_wm_modes_run_every_other_row_under_the_cap(stages, rl_shared, tmp_path, mode, lag):
    fake = FakeExecutor(default=outcome, workers=2)
    tr, st = make(stages, rl_shared, tmp_path, fake, mode=mode, rl__anchor_lag=lag)
    seen_cut = seen_under = 0
    scripts = {}  # (step, row) -> script, for the anchors trained a step later (lag)
    for step in range(3):
        before = st.correction.cut
        (s, r, x, c), st, m, pairs = phases(tr, st)
        scripts.update({(step, i): text for i, text in enumerate(s.scripts)})
        N, anchors = len(s.scripts), set(r.anchor_idx.tolist())
        calls = {
            int(k.key.split("/")[2]): k for k in fake.calls if k.key.startswith(f"cheap/{step}/")
        }
        assert set(calls) == set(range(N)) - anchors  # every non-anchor row, once, capped
        assert all(k.cut_s == CAP for k in calls.values())
        assert all(k.cut_s is None for k in fake.calls if k.key.startswith(f"anchor/{step}/"))
        rewards = np.asarray(c.result.rewards)
        scripted = {i: outcome(None, s.scripts[i]) for i in range(N)}
        cut = [i for i in calls if scripted[i].runtime_s > CAP]
        under = [i for i in calls if scripted[i].runtime_s <= CAP]
        for i in under:  # a real outcome
            assert rewards[i] == pytest.approx(scripted[i].reward, abs=1e-6)
        if mode == "static_anchors":  # one shared reward: past-cap anchors' mean (or prior)
            norm_ = float(np.asarray(before.mean.norm))
            ema, prior = float(np.asarray(before.mean.ema)), float(np.asarray(before.mean.prior))
            shared = ema / norm_ if norm_ > 0 else prior
            np.testing.assert_allclose(rewards[cut], shared, atol=1e-6)
        else:  # the WM's score given the cut, through the cut map as it was before the step
            from wmrl.core.debias import apply_debias

            want = np.asarray(apply_debias(before.debias, x.r_cut, None, tr.tc.debias))
            np.testing.assert_allclose(rewards[cut], want[cut], atol=1e-6)
        seen_cut, seen_under = seen_cut + len(cut), seen_under + len(under)
        trained = {i: outcome(None, scripts[x.origin[i]]) for i in anchors}
        if x.collected:  # anchors: their real reward, executed in full (lag: step before's)
            for i in sorted(anchors):
                assert rewards[i] == pytest.approx(trained[i].reward or 0.1, abs=1e-6)
        assert m["cut_rows"] == len(cut) and m["capped_rows"] == len(calls)
        assert m["cheap_limit_s"] == CAP
        real = (len(anchors) if x.collected else 0) + len(under)
        assert m["real_row_share"] == pytest.approx(real / N)
        # The anchor rows that ran past the cap: exactly those the script says.
        past = [i for i in anchors if x.collected and trained[i].runtime_s > CAP]
        assert sorted(np.nonzero(x.past_cap)[0].tolist()) == sorted(past)
        assert sum(m["anchor_past_cap_status"].values()) == len(past)
        if x.collected:
            assert [p["past_cap"] for p in pairs] == [i in past for i in sorted(anchors)]
    assert seen_cut and seen_under  # the scripted hashes gave both kinds of capped row
    fake.close()


def test_real_with_the_cap_gives_cut_rows_timeouts_reward(stages, rl_shared, tmp_path):
    fake = FakeExecutor(default=outcome, workers=2)
    tr, st = make(stages, rl_shared, tmp_path, fake, mode="real")
    (s, _, _, c), new, m, _ = phases(tr, st)
    N = len(s.scripts)
    assert all(k.cut_s == CAP for k in fake.calls)  # every row, under the cap
    rewards = np.asarray(c.result.rewards)
    finished = 0
    for i, text in enumerate(s.scripts):
        o = outcome(None, text)
        if o.runtime_s > CAP:  # cut: TIMEOUT's reward, whatever the script would have got
            assert rewards[i] == pytest.approx(0.1, abs=1e-7)
        else:
            finished += 1
            assert rewards[i] == pytest.approx(o.reward, abs=1e-6)
    assert m["real_row_share"] == pytest.approx(finished / N)
    assert new.real_executions == finished  # a cut is no outcome
    journal = [json.loads(line) for line in (tmp_path / "anchors.jsonl").read_text().splitlines()]
    assert sum(bool(j.get("cut")) for j in journal) == N - finished
    assert all(j["reward"] is None for j in journal if j.get("cut"))  # never graded
    fake.close()


def test_a_step_redone_after_a_kill_counts_every_cut_row_once(stages, rl_shared, tmp_path):
    """Step 1 is killed after its executions (journalled) and before its records; the
    rerun from the state after step 0 executes nothing (the executor has no outcome to
    give) and counts what an uninterrupted run counts."""
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    straight_dir.mkdir(), killed_dir.mkdir()
    fake = FakeExecutor(default=outcome, workers=2)
    tr, st = make(stages, rl_shared, straight_dir, fake, mode="wmrl")
    _, st1, _, _ = phases(tr, st)
    _, st2, m2, _ = phases(tr, st1)
    tr.journal.close(), tr.cost.journal.close(), fake.close()

    fake = FakeExecutor(default=outcome, workers=2)
    tr, st = make(stages, rl_shared, killed_dir, fake, mode="wmrl")
    _, k1, _, _ = phases(tr, st)
    clock = tr.clock()
    keys = tr.keys(k1)
    s = tr.sample(k1, keys.sample, clock)
    r = tr.route(k1, s, keys.route, clock)
    tr.act(k1, s, r, keys.act, clock)  # executed and journalled; killed here
    tr.journal.close(), tr.cost.journal.close(), fake.close()

    none = FakeExecutor({}, workers=2)  # any execution would raise
    tr, _ = make(stages, rl_shared, killed_dir, none, mode="wmrl")
    _, r2, rm2, _ = phases(tr, k1)
    assert not none.calls
    for k in ("cut_rows", "capped_rows", "real_row_share", "cheap_limit_s", "train_reward"):
        assert rm2[k] == pytest.approx(m2[k]), k
    assert r2.real_executions == st2.real_executions
    keys = [(j["step"], j["row"]) for j in map(json.loads, (killed_dir / "cheap.jsonl").open())]
    assert len(keys) == len(set(keys))  # each capped row journalled once
    cut = [j for j in map(json.loads, (killed_dir / "cheap.jsonl").open()) if j.get("cut")]
    assert sum(j["step"] == 1 for j in cut) == rm2["cut_rows"]
    tr.journal.close(), tr.cost.journal.close(), none.close()


def test_the_wm_score_given_a_run_past_the_cap_by_hand():
    # log-runtime ~ N(log 2, 1): P(T > 20 | T > 1) = S(20) / S(1).
    out = {
        "score": np.array([0.7], np.float32), "score_raw": np.array([0.8], np.float32),
        "runtime_s": np.array([2.0], np.float32), "runtime_log_var": np.array([0.0], np.float32),
        "p_timeout": np.array([norm.sf(math.log(20) - math.log(2))], np.float32),
    }  # fmt: skip
    r_cut, p_cut = cost_routing.cut_scores(out, np.array([20.0]), np.array([1.0]))
    p = norm.sf(math.log(20) - math.log(2)) / norm.sf(math.log(1) - math.log(2))
    assert float(p_cut[0]) == pytest.approx(p, rel=1e-5)
    assert float(r_cut[0]) == pytest.approx((1 - p) * 0.8 + p * 0.1, rel=1e-5)
    # A cap at the limit cuts nothing: the plain P(timeout).
    _, same = cost_routing.cut_scores(out, np.array([20.0]), np.array([20.0]))
    assert float(same[0]) == pytest.approx(float(out["p_timeout"][0]))


def test_the_adaptive_cap_is_the_quantile_of_recent_anchor_runtimes():
    st = cost_routing.init_cap_state([0.5, None, 30.0, 1.0], time_limit_s=20.0, window=4)
    np.testing.assert_allclose(st.runtimes, [0.5, 20.0, 1.0, 0.5])  # clipped, repeated
    cfg = cost_routing.CheapConfig(quantile=0.5, window=4)
    assert cost_routing.cap_in_force(cfg, st) == pytest.approx(np.quantile([0.5, 20, 1, 0.5], 0.5))
    st = cost_routing.fold_runtimes(st, [2.0, math.nan, 4.0])
    np.testing.assert_allclose(st.runtimes, [2.0, 4.0, 1.0, 0.5])
    assert cost_routing.cap_in_force(cfg, st) == pytest.approx(1.5)
