"""The verdict schema as a token program (`wmrl.models.schema_decoding`), for any tokenizer.

`build_verdict_program(tok, vocab_size, caps)` writes the JSON skeleton of
`wmrl.autoresearch.verdict` as ops: the keys and brackets are forced, the status, bucket and
confidence are choices (the bucket is one of the four only after `valid`, the empty one
otherwise; a second prediction's status may not repeat the first's), and the free-text
fields take at most their cap of tokens that hold no quote, backslash or control character,
so the decoded text is always one JSON object under the schema. `error_line` is 1 to 3 digit
tokens with no leading zero (a lone `0` closes it). The confidence is one of five levels.

The same skeleton gives the teacher-forcing path of every (status, bucket) outcome
(`outcome_tokens`): the verdict's head with an empty reason (`prefix`), then the status, an
empty error type, line 0 and the bucket, exactly the tokens the program would emit for it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wmrl.autoresearch import verdict as v
from wmrl.models.schema_decoding import Builder, Program

CONFIDENCES = ("0.1", "0.3", "0.5", "0.7", "0.9")
HEAD = '{"reason": "'
AFTER_REASON = '", "predictions": [{"status": "'
AFTER_STATUS = '", "error_type": "'
AFTER_ERROR_TYPE = '", "error_line": '
AFTER_LINE = ', "quality_bucket": "'
AFTER_BUCKET = '", "env_feedback": "'
AFTER_FEEDBACK = '", "confidence": '
BUCKET_OPTIONS = (*v.BUCKETS, "")  # the empty bucket last
TARGET_CONFIDENCE = "0.9"  # a real outcome's verdict, in the decoder's confidence levels


@dataclasses.dataclass(frozen=True)
class TokenCaps:
    """Most tokens per free-text field of the decoded verdict."""

    reason: int = 64
    error_type: int = 8
    env_feedback: int = 96


@dataclasses.dataclass(frozen=True)
class VerdictProgram:
    program: Program
    max_new_tokens: int  # the longest verdict the program can emit, EOS included
    prefix: tuple[int, ...]  # the verdict's head up to the first status, reason empty
    outcome_tokens: tuple[tuple[int, ...], ...]  # per verdict.OUTCOMES, after `prefix`
    # per verdict.OUTCOMES: the whole one-prediction verdict (`prefix`, the outcome, an
    # empty feedback, confidence TARGET_CONFIDENCE, no hedge) and EOS: a fine-tuning target
    targets: tuple[tuple[int, ...], ...] = ()


def token_texts(tok, vocab_size: int) -> list[str]:
    """Each id's text alone ('' for special ids, SentencePiece's unknown piece, whose text is
    not what it stands for, and ids past the tokenizer's vocabulary)."""
    n = min(tok.vocab_size, vocab_size)
    texts = [tok.decode([i]) for i in range(n)] + [""] * (vocab_size - n)
    processor = getattr(tok, "processor", None)
    if processor is not None and 0 <= processor.unk_id() < n:
        texts[processor.unk_id()] = ""
    return texts


def _masks(texts: list[str]) -> dict[str, np.ndarray]:
    bad = {'"', "\\", "\ufffd"}
    plain = np.array(
        [bool(t) and not any(c in bad or ord(c) < 0x20 or ord(c) == 0x7F for c in t)
         for t in texts]
    )  # fmt: skip
    digits = np.array([bool(t) and t.isascii() and t.isdigit() for t in texts])
    zero = np.array([t == "0" for t in texts])
    first = digits & (np.array([not t.startswith("0") for t in texts]) | zero)
    if not zero.any() or not (digits & ~zero).any():
        raise ValueError("the tokenizer has no token for the digit 0 or for 1-9")
    return {"plain": plain, "digits": digits, "zero": zero, "first": first}


def _prediction(b: Builder, m: dict, caps: TokenCaps, first_status: int) -> int:
    """One prediction's ops (from the status on); returns its status choice."""
    n = len(v.STATUSES)
    hedge = None if first_status < 0 else ~np.eye(n, dtype=bool)
    status = b.choice([s + AFTER_STATUS for s in v.STATUSES], first_status, hedge)
    b.free(m["plain"], caps.error_type)
    b.force(AFTER_ERROR_TYPE)
    b.free(m["digits"], 3, first=m["first"], stop=m["zero"], min_len=1)
    b.force(AFTER_LINE)
    valid = v.STATUSES.index("valid")
    by_status = [[(j == valid) == (k < len(v.BUCKETS)) for k in range(len(BUCKET_OPTIONS))]
                 for j in range(n)]  # fmt: skip
    b.choice([x + AFTER_BUCKET for x in BUCKET_OPTIONS], status, by_status)
    b.free(m["plain"], caps.env_feedback)
    b.force(AFTER_FEEDBACK)
    b.choice([c + "}" for c in CONFIDENCES])
    return status


def build_verdict_program(tok, vocab_size: int, caps: TokenCaps = TokenCaps()) -> VerdictProgram:
    """The verdict program over a model vocabulary of `vocab_size` ids (the tokenizer's, or
    a checkpoint's padded embedding); raises if the tokenizer does not decode concatenated
    tokens to concatenated text (then the schema could not be forced token by token)."""
    texts = token_texts(tok, vocab_size)
    b = Builder(tok.encode, tok.decode, vocab_size, tok.eos_id)
    m = {k: b.mask(x) for k, x in _masks(texts).items()}
    head = b.force(HEAD)
    b.free(m["plain"], caps.reason)
    after_reason = b.force(AFTER_REASON)
    first = _prediction(b, m, caps, -1)
    more = b.choice(["]}", ', {"status": "'])
    _prediction(b, m, caps, first)
    b.force("]}")
    end = b.end()
    b.ops[more]["next"] = [end, more + 1]  # the end, or the hedge
    # The teacher-forcing paths: exactly what the program emits for each outcome.
    ops, zero = b.ops, tok.encode("0")
    zero = zero[0] if len(zero) == 1 else texts.index("0")
    prefix = (*ops[head]["tokens"], *ops[after_reason]["tokens"])
    status_op, bucket_op = first, first + 5
    paths = []
    for status, bucket in v.OUTCOMES:
        paths.append((
            *ops[status_op]["options"][v.STATUSES.index(status)],
            *ops[status_op + 2]["tokens"], zero, *ops[status_op + 4]["tokens"],
            *ops[bucket_op]["options"][BUCKET_OPTIONS.index(bucket)],
        ))  # fmt: skip
    for (status, bucket), path in zip(v.OUTCOMES, paths, strict=True):
        want = f"{HEAD}{AFTER_REASON}{status}{AFTER_STATUS}{AFTER_ERROR_TYPE}0{AFTER_LINE}"
        want += bucket + AFTER_BUCKET
        if tok.decode([*prefix, *path]) != want:
            raise ValueError(
                "the tokenizer does not decode concatenated tokens to the concatenated text "
                f"(got {tok.decode([*prefix, *path])!r}): the verdict schema cannot be forced"
            )
    conf = ops[first + 8]["options"][CONFIDENCES.index(TARGET_CONFIDENCE)]
    targets = []
    for (status, bucket), path in zip(v.OUTCOMES, paths, strict=True):
        target = (*prefix, *path, *ops[first + 7]["tokens"], *conf, *ops[more]["options"][0],
                  tok.eos_id)  # fmt: skip
        pred = v.Prediction(status, "", 0, bucket, "", float(TARGET_CONFIDENCE))
        if tok.decode(target) != v.Verdict("", (pred,)).to_json():
            raise ValueError(f"the verdict target of {status} decodes to {tok.decode(target)!r}")
        targets.append(target)
    return VerdictProgram(b.build(), b.longest(), prefix, tuple(paths), tuple(targets))
