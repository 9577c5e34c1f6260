"""The verdict WM's schema, reward mapping, real-outcome targets, parser and prompt
(`wmrl.autoresearch.verdict`), against hand-written numbers."""

import json

import pytest

from tests.support.autoresearch_fixtures import GOOD_SCRIPT, make_tiny_task
from wmrl.autoresearch import verdict as v
from wmrl.autoresearch.env.grader import Status


def _text(*preds, reason="r"):
    return json.dumps({"reason": reason, "predictions": list(preds)})


def _pred(status, bucket="", **kw):
    return {"status": status, "error_type": kw.get("error_type", ""), "error_line": 0,
            "quality_bucket": bucket, "env_feedback": "", "confidence": 0.5}  # fmt: skip


# Hand numbers: the ladder, and 0.5 + 0.5 * pos with pos 0.05 / 0.20 / 0.45 / 0.75.
HAND = {
    ("malformed", ""): 0.0, ("syntax_err", ""): 0.0, ("runtime_err", ""): 0.1,
    ("ran_no_sub", ""): 0.2, ("valid", "low"): 0.525, ("valid", "fair"): 0.6,
    ("valid", "mid"): 0.725, ("valid", "high"): 0.875,
}  # fmt: skip


@pytest.mark.parametrize(("status", "bucket"), sorted(HAND))
def test_every_status_and_bucket_gets_its_hand_reward(status, bucket):
    parsed = v.parse_verdict(_text(_pred(status, bucket)))
    assert parsed is not None and parsed.top.status == status
    assert v.verdict_reward(parsed, script_compiles=True) == pytest.approx(HAND[status, bucket])
    assert v.outcome_reward(status, bucket) == pytest.approx(HAND[status, bucket])
    assert set(v.OUTCOMES) == set(HAND)


def test_the_compile_gate_comes_before_the_verdict():
    best = v.parse_verdict(_text(_pred("valid", "high")))
    assert v.compiles(GOOD_SCRIPT) and not v.compiles("def f(:\n") and not v.compiles("  ")
    assert v.verdict_reward(best, script_compiles=v.compiles("def f(:\n")) == 0.0
    assert v.verdict_reward(None, script_compiles=False) == 0.0
    assert v.verdict_reward(best, script_compiles=v.compiles(GOOD_SCRIPT)) == 0.875


@pytest.mark.parametrize(
    "text",
    [
        "", "no json here", '{"reason": "x"', '{"reason": "x", "predictions": []}',
        _text(_pred("valid")),  # valid needs a bucket
        _text(_pred("runtime_err", "mid")),  # only valid has one
        _text(_pred("crashed")), _text(_pred("valid", "top")),
        _text(_pred("valid", "mid"), _pred("runtime_err"), _pred("ran_no_sub")),  # > 2
        '{"reason": "x", "predictions": [{"status": "valid", "quality_bucket": "mid", '
        '"error_line": -3}]}',
        '{"reason": "x", "predictions": [{"status": "valid", "quality_bucket": "mid", '
        '"confidence": "high"}]}',
    ],
)  # fmt: skip
def test_a_verdict_that_does_not_parse_counts_as_a_runtime_error(text):
    assert v.parse_verdict(text) is None
    assert v.verdict_reward(None, script_compiles=True) == 0.1


def test_the_parser_reads_a_models_answer_and_the_hedge_rule():
    hedged = _text(_pred("valid", "mid"), _pred("runtime_err", error_type="KeyError"))
    wrapped = f"<think>hmm {{ }}</think>```json\n{hedged}\n```"
    got = v.parse_verdict(wrapped)
    assert [p.status for p in got.predictions] == ["valid", "runtime_err"]
    assert got.predictions[1].error_type == "KeyError"
    assert v.verdict_reward(got, True) == 0.725  # the top prediction's reward
    # A second prediction naming the same status is no hedge: dropped, the top stands.
    same = v.parse_verdict(_text(_pred("valid", "mid"), _pred("valid", "high")))
    assert [p.quality_bucket for p in same.predictions] == ["mid"]
    long = v.parse_verdict(_text(_pred("ran_no_sub"), reason="x" * 1000))
    assert len(long.reason) == v.REASON_CHARS
    assert v.parse_verdict(got.to_json()) == got  # the canonical layout round-trips


@pytest.mark.parametrize(
    ("pos", "bucket"),
    [(0.0, "low"), (0.0999, "low"), (0.1, "fair"), (0.2999, "fair"), (0.3, "mid"),
     (0.5999, "mid"), (0.6, "high"), (1.0, "high")],
)  # fmt: skip
def test_real_percentiles_map_to_buckets_at_the_reference_edges(pos, bucket):
    assert v.bucket_of(pos) == bucket
    target = v.real_verdict(Status.VALID, 0.5 + 0.5 * pos, GOOD_SCRIPT)
    assert target.top.status == "valid" and target.top.quality_bucket == bucket
    assert target.top.confidence == 1.0 and v.parse_verdict(target.to_json()) == target


def test_real_statuses_map_to_the_schemas():
    cases = {
        (Status.MALFORMED, "def f(:\n"): "syntax_err", (Status.MALFORMED, ""): "malformed",
        (Status.RUNTIME_ERROR, GOOD_SCRIPT): "runtime_err",
        (Status.TIMEOUT, GOOD_SCRIPT): "runtime_err",
        (Status.NO_SUBMISSION, GOOD_SCRIPT): "ran_no_sub",
        (Status.INVALID_SUBMISSION, GOOD_SCRIPT): "ran_no_sub",
    }  # fmt: skip
    for (status, script), name in cases.items():
        target = v.real_verdict(status, None, script, error_type="KeyError")
        assert target.top.status == name and target.top.quality_bucket == ""
        # The target's reward is the real one (the ladder's values per status).
        from wmrl.autoresearch.env.grader import reward

        assert v.verdict_reward(target, True) == pytest.approx(reward(status))
    assert v.real_verdict(Status.UNGRADED, None, GOOD_SCRIPT) is None


def test_the_prompt_reads_only_the_public_files(tmp_path):
    marker = "PRIVATE-MARKER-7f3a9c"
    task = make_tiny_task(tmp_path / "tiny-task")
    private = task.root / "private"
    for path in private.iterdir():  # every private file and a private file's name
        path.write_text(path.read_text() + f"\n{marker}\n")
    (private / f"{marker}.csv").write_text(f"id,{marker}\n1,{marker}\n")
    (task.root / "leaderboard.json").write_text(json.dumps({"scores": [0.5], "x": marker}))
    prompt = v.build_prompt(task, GOOD_SCRIPT, time_limit_s=3.0)
    assert marker not in prompt
    # The sections are there: the instructions, the environment, the card, the inventory of
    # public files (rows and columns) and the numbered script.
    assert "never run" in prompt and "SUBMISSION_PATH" in prompt and "3 s" in prompt
    assert "scikit-learn" in prompt and task.card.strip()[:40] in prompt
    assert "- train.csv:" in prompt and "- test.csv:" in prompt and "colour (text)" in prompt
    assert ' 5 | d = os.environ["DATA_DIR"]' in prompt
    assert "test_labels" not in prompt


def test_each_prompt_section_is_capped(tmp_path):
    task = make_tiny_task(tmp_path / "tiny-task")
    caps = v.PromptCaps(overview_chars=50, inventory_chars=60, script_chars=70)
    prompt = v.build_prompt(task, "x = 1\n" * 500, 3.0, caps)
    assert "[... overview cut at 50 characters]" in prompt
    assert "[... inventory cut at 60 characters]" in prompt
    assert "[... script cut at 70 characters]" in prompt
    assert len(prompt) < len(v.INSTRUCTIONS) + 1200
