"""The anchor figures of what the static check cannot see, on hand-made pairs (hand numbers)."""

import json

import pytest

from wmrl.autoresearch import anchor_metrics as am
from wmrl.autoresearch.env.grader import Status

V, RE, TO, MAL = (int(s) for s in (Status.VALID, Status.RUNTIME_ERROR, Status.TIMEOUT,
                                    Status.MALFORMED))  # fmt: skip


def pair(step, task, status, r_env, r_wm, static=None, p_timeout=None):
    p = {"step": step, "task_id": task, "status": status, "r_env": r_env, "r_wm": r_wm,
         "r_cal": r_wm, "static": static is not None, "static_status": static}  # fmt: skip
    if p_timeout is not None:
        p["p_timeout"] = p_timeout
    return p


# Group A (step 1, t1): one MALFORMED row the static check decides, three learned rows.
# Group B (step 1, t2): two learned rows the WM scores alike, one static RUNTIME_ERROR.
# Group C (step 3, t1): two VALID rows of equal reward (says nothing within the group).
PAIRS = [
    pair(1, "t1", MAL, 0.0, 0.6, static="MALFORMED"),
    pair(1, "t1", V, 0.9, 0.8, p_timeout=0.0),
    pair(1, "t1", V, 0.7, 0.5, p_timeout=0.1),
    pair(1, "t1", RE, 0.1, 0.6, p_timeout=0.2),
    pair(1, "t2", V, 0.6, 0.4, p_timeout=0.3),
    pair(1, "t2", TO, 0.1, 0.4, p_timeout=0.9),
    pair(1, "t2", RE, 0.1, 0.9, static="RUNTIME_ERROR"),
    pair(3, "t1", V, 0.8, 0.7),
    pair(3, "t1", V, 0.8, 0.3),
]


def test_spearman_and_agreement_by_hand():
    assert am.spearman([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    assert am.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ranks (1, 2.5, 2.5, 4) vs (1, 2, 3, 4): 4.5 / sqrt(4.5 * 5)
    assert am.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / 22.5**0.5)
    assert am.spearman([1, 1], [1, 2]) is None
    assert am.agreement([0.5, 0.5], [0.1, 0.9]) == 0.0  # flat scores: no order
    assert am.agreement([0.1, 0.9], [0.7, 0.7]) is None  # the real rewards say nothing
    assert am.agreement([0.3], [0.7]) is None


def test_static_reward_and_learned_rows():
    assert am.static_reward(PAIRS[0]) == 0.0
    assert am.static_reward(PAIRS[6]) == pytest.approx(0.1)
    assert am.static_reward({"static": True}) == 0.0  # older records: MALFORMED only
    assert am.static_reward(PAIRS[1]) is None
    assert [am.is_learned(p) for p in PAIRS].count(True) == 7


def test_learned_spearman_counts_a_flat_group_as_zero():
    # A learned: scores (.8, .5, .6) vs (.9, .7, .1): ranks (3,1,2) vs (3,2,1) -> 0.5;
    # B learned: scores (.4, .4) flat, real differ -> 0; C: real equal -> skipped.
    got = am.learned_spearman(PAIRS)
    assert got == {"mean": pytest.approx(0.25), "groups": 2, "flat": 1}


def test_stream_spearman_uses_the_static_reward_where_it_decides():
    # A: (0, .8, .5, .6) vs (0, .9, .7, .1) -> 4 / 5; B: (.4, .4, .1) vs (.6, .1, .1) -> 0.5.
    got = am.stream_spearman(PAIRS)
    assert got["mean"] == pytest.approx((0.8 + 0.5) / 2)
    assert got["groups"] == 2 and got["flat"] == 0


def test_valid_spearman_among_valid_rows_only():
    got = am.valid_spearman(PAIRS)  # A: (.8, .5) vs (.9, .7) -> 1; B one VALID; C equal
    assert got == {"mean": pytest.approx(1.0), "groups": 1, "flat": 0}


def test_failure_auc_over_the_learned_rows():
    # VALID scores .8 .5 .4 .7 .3 vs failures .6 .4: 5 wins + one tie of 10 pairs.
    got = am.failure_auc(PAIRS)
    assert got == {"auc": pytest.approx(0.55), "valid": 5, "failures": 2}
    assert am.auc([0.2, 0.2], [True, False]) == 0.5
    assert am.auc([0.2, 0.3], [True, True]) is None


def test_timeout_calibration_by_hand():
    got = am.timeout_calibration(PAIRS)
    assert got["rows"] == 5 and got["timeouts"] == 1
    assert got["mean_p"] == pytest.approx(0.3)
    assert got["rate"] == pytest.approx(0.2)
    assert got["brier"] == pytest.approx((0.01 + 0.04 + 0.09 + 0.01) / 5)
    assert got["auc"] == 1.0
    assert got["bins"] == [
        pytest.approx([0.0, 0.2, 2, 0.05, 0.0]),
        pytest.approx([0.2, 0.4, 2, 0.25, 0.0]),
        pytest.approx([0.8, 1.0, 1, 0.9, 1.0]),
    ]
    assert am.timeout_calibration([PAIRS[7]]) is None  # no P(timeout) recorded


def test_timeout_calibration_of_episodes_is_per_learned_turn():
    """An episode's record (multi-turn) is calibrated per turn: its executed turns the static
    check does not decide, each with the WM's P(timeout) under the turn's limit; a
    single-turn pair beside them counts as before."""
    UG = int(Status.UNGRADED)
    ep1 = pair(1, "t1", V, 0.9, 0.8)  # turns: VALID, TIMEOUT, a RUNTIME_ERROR the check fixed
    ep1.update(turn_p_timeout=[0.1, 0.8, 0.9], turn_status=[V, TO, RE],
               turn_static=[False, False, True])  # fmt: skip
    ep2 = pair(1, "t1", V, 0.1, 0.5)  # turn 1 ungraded (infrastructure): left out
    ep2.update(turn_p_timeout=[0.5, 0.2], turn_status=[UG, TO], turn_static=[False, False])
    single = pair(2, "t2", V, 0.7, 0.6, p_timeout=0.4)
    assert am.timeout_rows([ep1, ep2, single]) == [(0.1, False), (0.8, True), (0.2, True),
                                                  (0.4, False)]  # fmt: skip
    got = am.timeout_calibration([ep1, ep2, single])
    assert got["rows"] == 4 and got["timeouts"] == 2
    assert got["mean_p"] == pytest.approx(0.375) and got["rate"] == pytest.approx(0.5)
    assert got["brier"] == pytest.approx((0.01 + 0.04 + 0.64 + 0.16) / 4)
    assert got["auc"] == pytest.approx(0.75)  # 0.8 and 0.2 against 0.1 and 0.4: 3 of 4 pairs
    no_head = {k: v for k, v in ep1.items() if k != "turn_p_timeout"}  # no runtime head
    assert am.timeout_calibration([no_head]) is None


def test_variance_shares_by_hand():
    # Group A rewards (0, .9, .7, .1), mean .425: SS = .5875. Status means: MALFORMED 0,
    # VALID .8 (x2), RUNTIME_ERROR .1: between = .180625 + 2 * .140625 + .105625 = .5675.
    # Its learned rows (.9, .7, .1) keep their own spread; the static check explains the
    # rest. Group B (.6, .1, .1): one row per status, so between = SS = 1/6; its learned
    # rows (.6, .1) keep .125. Group C: equal rewards, SS 0.
    got = am.variance_shares(PAIRS)
    ss_a, ss_b = 0.5875, 1 / 6
    learned_a = sum((x - 1.7 / 3) ** 2 for x in (0.9, 0.7, 0.1))
    assert got["total"] == pytest.approx(ss_a + ss_b)
    assert got["status"] == pytest.approx((0.5675 + ss_b) / (ss_a + ss_b))
    assert got["static"] == pytest.approx(1 - (learned_a + 0.125) / (ss_a + ss_b))
    assert am.variance_shares([PAIRS[7], PAIRS[8]])["status"] is None


def test_quarters_of_the_run():
    qs = am.quarters(PAIRS, steps=4)
    assert [len(q) for q in qs] == [7, 0, 2, 0]
    qs = am.quarters([pair(s, "t", V, 0.5, 0.5) for s in range(1, 9)], steps=8)
    assert [[p["step"] for p in q] for q in qs] == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert am.quarters([]) == [[], [], [], []]


def test_anchor_report_and_command_line(tmp_path, capsys):
    report = am.anchor_report(PAIRS, steps=4)
    assert report["all"]["learned_spearman"]["mean"] == pytest.approx(0.25)
    assert report["quarters"][0]["learned_spearman"]["mean"] == pytest.approx(0.25)
    assert report["quarters"][2]["learned_spearman"]["mean"] is None
    assert report["quarters"][1]["pairs"] == 0
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    (tmp_path / "config.json").write_text(json.dumps({"rl": {"steps": 4}}))
    am.main(["anchor_metrics", str(tmp_path)])
    printed = json.loads(capsys.readouterr().out)
    assert printed["all"]["failure_auc"]["auc"] == pytest.approx(0.55)
    assert [q["pairs"] for q in printed["quarters"]] == [7, 0, 2, 0]
