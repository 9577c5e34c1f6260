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
from wmrl.models.transformer import token_logprobs


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
