"""Tokenizer of a Hugging Face checkpoint, from its own files, with our `Tokenizer` API.

A checkpoint ships either a SentencePiece `tokenizer.model` (loaded with our
`wmrl.tokenizer.Tokenizer`) or a `tokenizer.json` (Qwen3, Llama 3), which the
`tokenizers` package (a main requirement) reads.
`HFTokenizer` adapts the latter to the same encode/decode/pad/bos/eos/
`batch_encode` surface, so the sampler and the RL loop need not know which.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from wmrl.tokenizer import Tokenizer


def _special_id(tok: Any, value: Any) -> int | None:
    """An id from a tokenizer_config entry: a token string, an AddedToken dict, or None."""
    if isinstance(value, dict):
        value = value.get("content")
    if not value:
        return None
    return tok.token_to_id(value)


class HFTokenizer(Tokenizer):
    """`tokenizers.Tokenizer` behind our `Tokenizer` interface.

    Subclassing reuses `batch_encode` (left padding, mask) unchanged; only the
    id-level methods differ. Special ids come from `tokenizer_config.json`
    (falling back to `config.json`); a model without a pad token pads with EOS,
    the usual choice for decoder-only models (padding is masked anyway).
    """

    def __init__(self, tokenizer: Any, bos_id: int | None, eos_id: int | None, pad_id: int | None):
        self.tokenizer = tokenizer
        self._bos, self._eos = bos_id, eos_id
        self._pad = pad_id if pad_id is not None else eos_id

    @classmethod
    def from_dir(cls, ckpt_dir: str) -> HFTokenizer:
        from tokenizers import Tokenizer as RustTokenizer

        tok = RustTokenizer.from_file(os.path.join(ckpt_dir, "tokenizer.json"))
        settings = _read_json(os.path.join(ckpt_dir, "tokenizer_config.json"))
        model = _read_json(os.path.join(ckpt_dir, "config.json"))
        ids = {}
        for key in ("bos", "eos", "pad"):
            found = _special_id(tok, settings.get(f"{key}_token"))
            ids[key] = found if found is not None else model.get(f"{key}_token_id")
        return cls(tok, ids["bos"], ids["eos"], ids["pad"])

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return -1 if self._pad is None else self._pad

    @property
    def bos_id(self) -> int:
        return -1 if self._bos is None else self._bos

    @property
    def eos_id(self) -> int:
        return -1 if self._eos is None else self._eos

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        bos = [self._bos] if add_bos and self._bos is not None else []
        eos = [self._eos] if add_eos and self._eos is not None else []
        return bos + ids + eos

    def decode(self, ids: Sequence[int]) -> str:
        """Decode, dropping PAD/BOS/EOS ids like `Tokenizer.decode`, and ids past the
        vocabulary: embedding padding rows (Qwen3 pads 151,669 ids to 151,936) have no text."""
        special = {i for i in (self._pad, self._bos, self._eos) if i is not None}
        keep = [int(i) for i in ids if int(i) not in special and int(i) < self.vocab_size]
        return self.tokenizer.decode(keep)


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def load_checkpoint_tokenizer(ckpt_dir: str, required: bool = True) -> Tokenizer | None:
    """The checkpoint's tokenizer: `tokenizer.json` first, else `tokenizer.model`.

    With `required=False` a checkpoint without tokenizer files gives None.
    """
    if os.path.exists(os.path.join(ckpt_dir, "tokenizer.json")):
        return HFTokenizer.from_dir(ckpt_dir)
    if os.path.exists(os.path.join(ckpt_dir, "tokenizer.model")):
        return Tokenizer.load(os.path.join(ckpt_dir, "tokenizer.model"))
    if required:
        raise ValueError(f"checkpoint {ckpt_dir!r} has neither tokenizer.json nor tokenizer.model")
    return None
