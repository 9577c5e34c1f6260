"""The verdict WM's score with a variance (`wmrl.autoresearch.verdict_wm`): the teacher-forced
log-probs of every outcome against an independent computation, the expected reward and its
variance by hand, and the sampled score's hedge variance."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.autoresearch.test_verdict_decoding import CORPUS, _model
from wmrl.autoresearch import verdict as v
from wmrl.autoresearch import verdict_decoding as vd
from wmrl.autoresearch import verdict_wm as vw
from wmrl.models.transformer import Transformer, token_logprobs


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from wmrl.tokenizer import Tokenizer

    return Tokenizer.train(CORPUS * 30, tmp_path_factory.mktemp("sp") / "tok", vocab_size=320,
                           code_pieces=True)  # fmt: skip


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _sequence_logprobs(graphdef, params, ids):
    """`[T]` log p(ids[t] | ids[<t]) of one unpadded sequence, no cache."""
    model = nnx.merge(graphdef, params)
    return token_logprobs(model, ids[None], jnp.ones_like(ids[None], bool))[0]


def test_outcome_logprobs_equal_each_completion_scored_on_its_own(tok):
    """Two left-padded prompts of different lengths, the eight outcome completions of
    different lengths: the cached, batched teacher forcing gives, for every (row, outcome),
    the sum of the log-probs one full forward of that prompt + completion alone gives."""
    prog = vd.build_verdict_program(tok, tok.vocab_size + 3)
    texts = ["X = pd.read_csv", 'print(X["id"].mean())\nerror KeyError']
    rows = [[tok.bos_id, *tok.encode(t), *prog.prefix] for t in texts]
    P = max(map(len, rows)) + 2
    ids = np.zeros((2, P), np.int32)
    mask = np.zeros((2, P), bool)
    for i, r in enumerate(rows):
        ids[i, P - len(r) :], mask[i, P - len(r) :] = r, True
    paths = prog.outcome_tokens
    assert len({len(p) for p in paths}) > 1  # right padding is exercised
    L = max(map(len, paths))
    comp = np.zeros((len(paths), L), np.int32)
    cmask = np.zeros((len(paths), L), bool)
    for i, p in enumerate(paths):
        comp[i, : len(p)], cmask[i, : len(p)] = p, True
    graphdef, params = _model(tok.vocab_size + 3, P + L, seed=3)
    got = np.asarray(vw.outcome_logprobs(graphdef, params, ids, mask, comp, cmask))
    assert got.shape == (2, len(v.OUTCOMES))
    for b, row in enumerate(rows):
        for c, path in enumerate(paths):
            lp = np.asarray(_sequence_logprobs(graphdef, params, jnp.asarray([*row, *path])))
            np.testing.assert_allclose(got[b, c], lp[len(row) :].sum(), rtol=2e-5, atol=2e-4)
    assert np.ptp(got[0]) > 0  # the outcomes are not all equally likely


def test_expected_reward_and_variance_by_hand():
    """log-probs -> probabilities -> E[r] and Var[r] over the hand rewards of the outcomes."""
    rewards = {("valid", "low"): 0.525, ("valid", "fair"): 0.6, ("valid", "mid"): 0.725,
               ("valid", "high"): 0.875, ("malformed", ""): 0.0, ("syntax_err", ""): 0.0,
               ("runtime_err", ""): 0.1, ("ran_no_sub", ""): 0.2}  # fmt: skip
    r = np.array([rewards[o] for o in v.OUTCOMES])
    np.testing.assert_allclose(vw.OUTCOME_REWARDS, r)
    # Row 0: all mass on valid/mid. Row 1: half runtime_err, half valid/high (log 0.5 + const).
    big = -1e4
    lp = np.full((3, len(v.OUTCOMES)), big)
    lp[0, v.OUTCOMES.index(("valid", "mid"))] = -2.0
    lp[1, v.OUTCOMES.index(("runtime_err", ""))] = -7.0
    lp[1, v.OUTCOMES.index(("valid", "high"))] = -7.0
    lp[2] = np.log(np.arange(1, 9) / 36.0)  # probabilities 1/36 .. 8/36
    probs, mean, var = vw.outcome_distribution(lp)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert mean[0] == pytest.approx(0.725) and var[0] == pytest.approx(0.0, abs=1e-12)
    assert mean[1] == pytest.approx(0.4875)  # (0.1 + 0.875) / 2
    assert var[1] == pytest.approx(0.3875**2)  # both half a spread of 0.775 from the mean
    p = np.arange(1, 9) / 36.0
    m = float(p @ r)
    assert mean[2] == pytest.approx(m) and var[2] == pytest.approx(float(p @ (r - m) ** 2))


def test_sampled_score_reads_the_top_prediction_and_weights_the_hedge():
    top = v.Prediction("valid", quality_bucket="high", confidence=0.75)
    hedge = v.Prediction("runtime_err", confidence=0.25)
    assert vw.sampled_score(v.Verdict("", (top,)), True) == (0.875, 0.0)
    score, var = vw.sampled_score(v.Verdict("", (top, hedge)), True)
    # weights 0.75 / 0.25 on rewards 0.875 / 0.1: mean 0.68125, variance 0.1126...
    assert score == 0.875
    assert var == pytest.approx(0.75 * (0.875 - 0.68125) ** 2 + 0.25 * (0.1 - 0.68125) ** 2)
    assert vw.sampled_score(None, True) == (0.1, 0.0)  # a verdict that does not parse
    assert vw.sampled_score(v.Verdict("", (top, hedge)), False) == (0.0, 0.0)  # compile gate


def _tiny_verdict_wm(tok, tmp_path, score="expected"):
    from types import SimpleNamespace

    from tests.support.autoresearch_fixtures import make_tiny_task
    from tests.support.rl_fixtures import TINY, load_config, set_fields
    from wmrl.autoresearch.model_setup import policy_config

    config = set_fields(load_config(), TINY, "", "", {
        "wm__kind": "verdict", "wm__verdict_score": score, "wm__verdict_prompt_len": 2048,
        "wm__verdict_overview_chars": 200, "wm__verdict_inventory_chars": 200,
        "wm__verdict_script_chars": 300, "wm__verdict_reason_tokens": 3,
        "wm__verdict_error_type_tokens": 2, "wm__verdict_feedback_tokens": 3,
    })  # fmt: skip
    task = make_tiny_task(tmp_path / "tiny-task")
    prepared = SimpleNamespace(tokenizer=tok, train_tasks=[task], heldout_tasks=[],
                               executions=[])  # fmt: skip
    cfg = policy_config(config, tok.vocab_size)
    params = nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(1))))
    return vw.VerdictWM(config, prepared, params, tok.vocab_size), task


@pytest.fixture(scope="module")
def prompt_tok(tmp_path_factory):
    """A tokenizer that has seen the prompt's instructions (a short prompt for the test)."""
    from tests.support.autoresearch_fixtures import GOOD_SCRIPT
    from wmrl.tokenizer import Tokenizer

    docs = [*CORPUS, v.INSTRUCTIONS, v.environment_section(3.0), GOOD_SCRIPT]
    return Tokenizer.train(docs * 30, tmp_path_factory.mktemp("sp") / "tok", vocab_size=1200,
                           code_pieces=True)  # fmt: skip


@pytest.mark.parametrize("score", ["expected", "sampled"])
def test_the_verdict_wm_predicts_in_chunks_as_at_once(prompt_tok, tmp_path, score):
    """Five rows (one that does not compile) scored at once and in chunks of two (the last
    padded): expected scores, variances and top outcomes the same; the same batch scored
    again the same (sampled too); the compile gate gives 0 and 0; an expected score is its
    distribution's mean, a sampled one its top outcome's reward."""
    from tests.support.autoresearch_fixtures import GOOD_SCRIPT

    wm, task = _tiny_verdict_wm(prompt_tok, tmp_path, score)
    scripts = [GOOD_SCRIPT, "def f(:\n", GOOD_SCRIPT.replace("label", "colour"), "print(1)\n",
               GOOD_SCRIPT[:80]]  # fmt: skip
    tasks = [task] * len(scripts)
    whole = wm.predict(scripts, tasks)
    chunks = wm.predict_in_chunks(scripts, tasks, 2)
    assert set(whole) == set(chunks)
    # A sampled verdict is one draw of the batch it is in (a pure function of its rows):
    # chunks draw other verdicts; only the teacher-forced scores are the rows' own.
    for k in whole if score == "expected" else ():
        np.testing.assert_allclose(chunks[k], whole[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(wm.predict(scripts, tasks)["score"], whole["score"])
    assert whole["score"][1] == 0.0 and whole["predictive_var"][1] == 0.0
    gate = np.array([v.compiles(x) for x in scripts])
    if score == "expected":
        p = whole["outcome_probs"].astype(np.float64)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
        np.testing.assert_allclose(whole["score"], np.where(gate, p @ vw.OUTCOME_REWARDS, 0),
                                   rtol=1e-5)  # fmt: skip
        np.testing.assert_array_equal(whole["top_outcome"], p.argmax(axis=1))
    else:
        top = [vw.OUTCOME_REWARDS[i] for i in whole["top_outcome"]]
        np.testing.assert_allclose(whole["score"], np.where(gate, top, 0.0), rtol=1e-6)


def test_fidelity_counts_status_and_bucket_hits_by_hand():
    from wmrl.autoresearch.env.grader import Status

    idx = {o: i for i, o in enumerate(v.OUTCOMES)}
    records = [
        {"status": int(Status.VALID), "reward": 0.5 + 0.5 * 0.4, "script": "x = 1\n"},  # mid
        {"status": int(Status.VALID), "reward": 0.5 + 0.5 * 0.9, "script": "x = 1\n"},  # high
        {"status": int(Status.TIMEOUT), "reward": 0.1, "script": "x = 1\n"},
        {"status": int(Status.NO_SUBMISSION), "reward": 0.2, "script": "x = 1\n"},
        {"status": int(Status.UNGRADED), "reward": None, "script": "x = 1\n"},  # not counted
    ]
    top = [idx["valid", "mid"], idx["valid", "low"], idx["runtime_err", ""],
           idx["valid", "high"], idx["valid", "high"]]  # fmt: skip
    got = vw.fidelity(np.array(top), records)
    assert got == {"status_accuracy": 0.75, "bucket_accuracy": 0.5}
    assert vw.top_outcome(None) == idx["runtime_err", ""]


def test_fine_tuning_rows_hold_the_verdict_a_real_outcome_deserves(prompt_tok, tmp_path):
    """`target_rows`: the prompt left-padded, then the real outcome's one-prediction verdict
    (confidence 0.9) and EOS, the loss on those tokens only; an ungraded row is left out."""
    from tests.support.autoresearch_fixtures import GOOD_SCRIPT
    from wmrl.autoresearch.env.grader import Status

    wm, task = _tiny_verdict_wm(prompt_tok, tmp_path)
    cases = [(Status.VALID, 0.5 + 0.5 * 0.7, "high"), (Status.TIMEOUT, 0.1, ""),
             (Status.UNGRADED, None, None), (Status.MALFORMED, 0.0, "")]  # fmt: skip
    scripts = [GOOD_SCRIPT, GOOD_SCRIPT, GOOD_SCRIPT, "def f(:\n"]
    rows = wm.target_rows(scripts, [task] * 4, [c[0] for c in cases], [c[1] for c in cases])
    assert len(rows["tokens"]) == 3
    P = wm.prompt_len
    want = ["valid", "runtime_err", "syntax_err"]
    for i, (status, bucket) in enumerate(zip(want, ["high", "", ""], strict=True)):
        loss = rows["loss_mask"][i].astype(bool)
        assert not loss[:P].any() and loss[P:].sum() > 0
        target = rows["tokens"][i][loss]
        assert target[-1] == prompt_tok.eos_id
        pred = v.Prediction(status, "", 0, bucket, "", 0.9)
        assert prompt_tok.decode(target) == v.Verdict("", (pred,)).to_json()
        np.testing.assert_array_equal(rows["input_mask"][i][P:], loss[P:])
        assert rows["input_mask"][i][P - 1]  # the prompt ends where the verdict starts
