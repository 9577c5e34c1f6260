"""Tokenizer: exact round-trip of code-like text, special ids, left-padded batches."""

import numpy as np
import pytest

from wmrl.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer

CODE = [
    "import numpy as np\n\n\ndef f(x):\n    if x > 0:\n        return x * 2\n    return -x\n",
    "class A:\n\tdef g(self):\n\t\treturn [i for i in range(10)]  # tab-indented\n",
    "for row in rows:\n    total += row['value']\n\nprint(f\"{total:.3f}\")\n",
    "def main():\n    df = pd.read_csv(DATA_DIR + '/train.csv')\n    df.to_csv(SUBMISSION_PATH)\n",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("spm") / "code"
    return Tokenizer.train(CODE * 20, prefix, vocab_size=400)


def test_round_trip_keeps_indentation_and_newlines(tok):
    for text in [*CODE, "  leading spaces\n\n\n   \ttabs and  double  spaces\n", "naïve → ✓\n"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert len(tok.encode("    return x * 2\n")) < len("    return x * 2\n")  # it learned pieces


def test_special_ids_and_reload(tok, tmp_path):
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (PAD_ID, BOS_ID, EOS_ID) == (0, 2, 3)
    ids = tok.encode("x = 1\n", add_bos=True, add_eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert tok.decode([*ids, PAD_ID, PAD_ID]) == "x = 1\n"
    path = tmp_path / "copy.model"
    path.write_bytes(tok.processor.serialized_model_proto())
    assert Tokenizer.load(path).encode(CODE[0]) == tok.encode(CODE[0])


def test_batch_encode_left_pads(tok):
    ids, mask = tok.batch_encode(["a = 1\n", "def f(x):\n    return x\n"])
    short = tok.encode("a = 1\n", add_bos=True)
    assert ids.shape == mask.shape and ids.dtype == np.int32
    n = len(short)
    assert ids[0, -n:].tolist() == short and (ids[0, :-n] == PAD_ID).all()
    assert mask[0].tolist() == [False] * (ids.shape[1] - n) + [True] * n
    assert mask[1].all() and ids[1, 0] == BOS_ID
    fixed, _ = tok.batch_encode(["a = 1\n"], max_len=40)
    assert fixed.shape == (1, 40)


def test_bad_inputs(tok, tmp_path):
    with pytest.raises(ValueError, match="longer than max_len 2"):
        tok.batch_encode(["def f(x):\n    return x\n"], max_len=2)
    with pytest.raises(ValueError, match="empty batch"):
        tok.batch_encode([])
    with pytest.raises(ValueError, match="does not exist"):
        Tokenizer.load(tmp_path / "missing.model")
