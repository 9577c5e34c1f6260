"""Decoding that always parses: the verdict schema forced in the jitted sampler
(`wmrl.autoresearch.verdict_decoding`, `wmrl.models.schema_decoding`), for a SentencePiece
and a byte-level BPE tokenizer, with a random tiny model, batched over rows."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wmrl.autoresearch import verdict as v
from wmrl.autoresearch import verdict_decoding as vd
from wmrl.models.config import named_config
from wmrl.models.sampler import SamplingConfig, generate
from wmrl.models.transformer import Transformer

CORPUS = [
    'import pandas as pd\nX = pd.read_csv("train.csv")\nprint(X["id"].mean())\n',
    '{"reason": "the model is fine", "predictions": [{"status": "valid", "confidence": 0.7}]}',
    "error KeyError on line 12: column 'target' is missing, ValueError 0 1 2 3 45 678 9\n",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
    from wmrl.tokenizer import Tokenizer

    prefix = tmp_path_factory.mktemp("sp") / "tok"
    return Tokenizer.train(CORPUS * 30, prefix, vocab_size=320, code_pieces=True)


@pytest.fixture(scope="module")
def hf_tok():
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from wmrl.hf_tokenizer import HFTokenizer

    raw = tokenizers.Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    raw.train_from_iterator(CORPUS * 30, trainer)
    return HFTokenizer(raw, None, raw.token_to_id("<|im_end|>"), raw.token_to_id("<|endoftext|>"))


def _model(vocab: int, max_len: int, seed: int = 0):
    cfg = named_config("tiny", vocab_size=vocab, max_len=max_len, d_model=32, num_layers=1,
                       mlp_dim=64, head_dim=8)  # fmt: skip
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)))
    return graphdef, nnx.to_pure_dict(state)


def _sample(tok, vocab, caps, seed, temperature=1.0, prompts=("a prompt", "b", "c c c")):
    prog = vd.build_verdict_program(tok, vocab, caps)
    ids, mask = tok.batch_encode(list(prompts))
    graphdef, params = _model(vocab, ids.shape[1] + prog.max_new_tokens, seed)
    sc = SamplingConfig(prog.max_new_tokens, tok.eos_id, tok.pad_id, num_samples=4,
                        temperature=temperature)  # fmt: skip
    out = generate(graphdef, params, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(seed),
                   sc, ids.shape[1] + prog.max_new_tokens, constraint=prog.program)  # fmt: skip
    toks, m = np.asarray(out.tokens), np.asarray(out.mask)
    return prog, [toks[i][m[i]] for i in range(len(toks))]


@pytest.mark.parametrize("which", ["sp", "hf"])
def test_random_weights_always_decode_a_verdict_that_parses(which, sp_tok, hf_tok):
    """12 rows (3 prompts x 4 samples) of a random tiny model, three seeds and two
    temperatures: every row ends with EOS, decodes to one JSON object under the schema that
    `parse_verdict` reads and that round-trips to the same text, the hedge names another
    status, a bucket appears exactly for valid, and no free field is longer than its token
    cap allows."""
    tok = sp_tok if which == "sp" else hf_tok
    vocab = tok.vocab_size + 7  # embedding rows past the tokenizer, never emitted
    caps = vd.TokenCaps(reason=6, error_type=3, env_feedback=5)
    texts = vd.token_texts(tok, vocab)
    widest = max(len(t) for t in texts if t and '"' not in t)  # a free token's most characters
    statuses, hedges = set(), 0
    for seed, temperature in [(0, 1.0), (1, 3.0), (2, 1.0)]:
        _, rows = _sample(tok, vocab, caps, seed, temperature)
        assert len(rows) == 12
        for row in rows:
            assert row[-1] == tok.eos_id and (row < tok.vocab_size).all()
            text = tok.decode(row)
            obj = json.loads(text)
            got = v.parse_verdict(text)
            assert got is not None, text
            assert got.to_json() == text
            assert len(obj["predictions"]) == len(got.predictions)  # nothing dropped
            if len(got.predictions) == 2:
                hedges += 1
                assert got.predictions[0].status != got.predictions[1].status
            for p in got.predictions:
                assert (p.quality_bucket != "") == (p.status == "valid")
                assert f"{p.confidence:g}" in vd.CONFIDENCES
                assert len(p.error_type) <= caps.error_type * widest
                assert len(p.env_feedback) <= caps.env_feedback * widest
                assert p.error_line == 0 or len(str(p.error_line)) <= 3 * widest
            assert len(got.reason) <= caps.reason * widest
            statuses.add(got.top.status)
            assert v.verdict_reward(got, True) == pytest.approx(got.top.reward)
    assert len(statuses) >= 2 and hedges >= 1  # the rows are not one forced constant


def _walk(prog, forced):
    """Emit `forced` through the program on the host (each must be allowed), then the
    smallest allowed token until the end; returns the emitted ids."""
    p = prog.program
    s = p.init(1)
    out = []
    allowed_fn = jax.jit(lambda p, s: (p.allowed_tokens(s)[0], p.finished(s)[0]))
    advance = jax.jit(lambda p, s, t: p.advance(s, t))
    for step in range(prog.max_new_tokens):
        allowed, finished = map(np.asarray, allowed_fn(p, s))
        if finished:
            assert allowed.sum() == 1 and allowed[int(p.eos_id)]
            return out
        t = forced[step] if step < len(forced) else int(np.nonzero(allowed)[0][0])
        assert allowed[t], (step, t)
        out.append(t)
        s = advance(p, s, jnp.asarray([t], jnp.int32))
    raise AssertionError("the program did not end within max_new_tokens")


@pytest.mark.parametrize("which", ["sp", "hf"])
def test_each_outcome_path_is_admissible_and_parses_to_its_reward(which, sp_tok, hf_tok):
    """The teacher-forcing path of every (status, bucket) outcome is a path of the program:
    forced through it and completed, the text parses to that outcome and its hand reward."""
    tok = sp_tok if which == "sp" else hf_tok
    prog = vd.build_verdict_program(tok, tok.vocab_size, vd.TokenCaps(2, 1, 2))
    hand = {("valid", "low"): 0.525, ("valid", "fair"): 0.6, ("valid", "mid"): 0.725,
            ("valid", "high"): 0.875, ("malformed", ""): 0.0, ("syntax_err", ""): 0.0,
            ("runtime_err", ""): 0.1, ("ran_no_sub", ""): 0.2}  # fmt: skip
    for (status, bucket), path in zip(v.OUTCOMES, prog.outcome_tokens, strict=True):
        emitted = _walk(prog, [*prog.prefix, *path])
        got = v.parse_verdict(tok.decode(emitted))
        assert got.top.status == status and got.top.quality_bucket == bucket
        assert got.top.error_type == "" and got.top.error_line == 0 and got.reason == ""
        assert v.verdict_reward(got, True) == pytest.approx(hand[status, bucket])
        assert v.verdict_reward(got, False) == 0.0  # the compile gate


def test_a_tokenizer_that_inserts_spaces_between_pieces_is_refused(sp_tok):
    class Spaced:
        vocab_size, eos_id, pad_id = sp_tok.vocab_size, sp_tok.eos_id, sp_tok.pad_id
        encode = staticmethod(sp_tok.encode)

        @staticmethod
        def decode(ids):
            return " ".join(sp_tok.decode([i]) for i in ids) if len(ids) > 1 else sp_tok.decode(ids)

    with pytest.raises(ValueError, match=r"round-trip|concatenated"):
        vd.build_verdict_program(Spaced(), sp_tok.vocab_size)
