"""Decoding under a token program: the sampler's logits masked so the output always parses.

A `Program` is a short list of ops, built once on the host from a tokenizer and run inside
the jitted decode loop (`wmrl.models.sampler.decode(..., constraint=program)`), one state per
row:

* `force(text)`: the tokens of `text`, one per step (a JSON skeleton's keys and brackets);
* `choice(texts, ...)`: one of a few texts (an enum value with the skeleton after it); the
  tokens still consistent with some option are allowed, until one option is complete. An
  option's allowed set may depend on the option an earlier choice took (`depends_on`,
  `allowed[j][k]`: option k allowed when that choice took option j), and each option may jump
  to its own next op (an optional second element, the end);
* `free(mask, cap)`: up to `cap` tokens of an allowed vocabulary subset (free text without
  a quote or backslash, digits), then the first token of the `force` op that must follow.

Texts are tokenized whole, and decoding concatenates tokens into text (SentencePiece without
a dummy prefix, byte-level BPE), so no option's tokens are a prefix of another's as long as
no option's text is a prefix of another's (each ends with the skeleton's next quote); the
builder checks both. The model's probabilities are untouched: the mask only removes what the
schema forbids, and the sampler still reports the policy's own log-probs.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

FORCE, CHOICE, FREE, END = 0, 1, 2, 3


class Program(NamedTuple):
    """The ops as arrays (O ops, K options at most, L tokens per text at most, M masks,
    V the model's vocabulary). Token pads are -1."""

    kind: jax.Array  # [O] int32
    force_tokens: jax.Array  # [O, L] int32
    force_len: jax.Array  # [O] int32
    option_tokens: jax.Array  # [O, K, L] int32
    option_len: jax.Array  # [O, K] int32 (0 = no such option)
    option_next: jax.Array  # [O, K] int32: the op after each option
    depends_on: jax.Array  # [O] int32: the earlier choice op, -1 = none
    allowed: jax.Array  # [O, K, K] bool: option k allowed if depends_on took j
    free_mask: jax.Array  # [O] int32: mask of a free op's later tokens
    free_first: jax.Array  # [O] int32: mask of its first token
    free_stop: jax.Array  # [O] int32: first tokens after which it must close (-1: none)
    free_cap: jax.Array  # [O] int32
    free_min: jax.Array  # [O] int32
    masks: jax.Array  # [M, V] bool
    eos_id: jax.Array  # [] int32

    def init(self, rows: int) -> State:
        n_ops, K = self.option_len.shape
        return State(
            jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), jnp.int32),
            jnp.zeros((rows, K), bool), jnp.full((rows, n_ops), -1, jnp.int32),
            jnp.zeros((rows,), bool),
        )  # fmt: skip

    def allowed_tokens(self, s: State) -> jax.Array:
        """`[R, V]` bool: the tokens the schema allows next in each row."""
        R, V = s.op.shape[0], self.masks.shape[1]
        kind = self.kind[s.op]
        pos = s.pos
        onehot = lambda t: jax.nn.one_hot(jnp.maximum(t, 0), V, dtype=bool) & (t >= 0)[:, None]
        forced = onehot(self.force_tokens[s.op, jnp.minimum(pos, self.force_tokens.shape[1] - 1)])
        L = self.option_tokens.shape[2]
        opt = self.option_tokens[s.op, :, jnp.minimum(pos, L - 1)]  # [R, K]
        live = s.alive & (pos[:, None] < self.option_len[s.op])
        rows = jnp.arange(R)[:, None]
        choice = jnp.zeros((R, V), bool).at[rows, jnp.maximum(opt, 0)].max(live & (opt >= 0))
        first = pos == 0
        vocab = self.masks[jnp.where(first, self.free_first[s.op], self.free_mask[s.op])]
        more = (pos < self.free_cap[s.op]) & ~s.must_close
        close_tok = self.force_tokens[jnp.minimum(s.op + 1, self.kind.shape[0] - 1), 0]
        can_close = pos >= self.free_min[s.op]
        free = (vocab & more[:, None]) | (onehot(close_tok) & can_close[:, None])
        end = onehot(jnp.broadcast_to(self.eos_id, (R,)))
        k = kind[:, None]
        return jnp.where(k == FORCE, forced, jnp.where(k == CHOICE, choice,
                         jnp.where(k == FREE, free, end)))  # fmt: skip

    def _enter(self, s: State, op: jax.Array, pos: jax.Array, enter: jax.Array) -> State:
        """Rows where `enter`: move to `op` at `pos`, a choice op's options reset."""
        dep = self.depends_on[op]
        took = jnp.take_along_axis(s.choice, jnp.maximum(dep, 0)[:, None], axis=1)[:, 0]
        by_dep = self.allowed[op, jnp.maximum(took, 0)]  # [R, K]
        alive = (self.option_len[op] > 0) & jnp.where((dep >= 0)[:, None], by_dep, True)
        return State(
            jnp.where(enter, op, s.op), jnp.where(enter, pos, s.pos),
            jnp.where(enter[:, None], alive, s.alive), s.choice,
            jnp.where(enter, False, s.must_close),
        )  # fmt: skip

    def advance(self, s: State, token: jax.Array) -> State:
        """The state after each row emitted `token` `[R]` (an allowed one)."""
        R = s.op.shape[0]
        kind, pos, op = self.kind[s.op], s.pos, s.op
        nxt = pos + 1
        # force: the next token, then the next op
        f_done = (kind == FORCE) & (nxt >= self.force_len[op])
        # choice: keep the options that emitted `token`; complete when one has ended
        L = self.option_tokens.shape[2]
        opt = self.option_tokens[op, :, jnp.minimum(pos, L - 1)]
        alive = s.alive & (opt == token[:, None])
        ended = alive & (self.option_len[op] == nxt[:, None])
        c_done = (kind == CHOICE) & ended.any(axis=1)
        k_took = jnp.argmax(ended, axis=1).astype(jnp.int32)
        choice = s.choice.at[jnp.arange(R), op].set(
            jnp.where(c_done, k_took, s.choice[jnp.arange(R), op])
        )
        # free: a token of its vocabulary, or the close (the next force op's first token)
        close_tok = self.force_tokens[jnp.minimum(op + 1, self.kind.shape[0] - 1), 0]
        closed = (kind == FREE) & (token == close_tok)
        stop = self.masks[jnp.maximum(self.free_stop[op], 0), token] & (self.free_stop[op] >= 0)
        must_close = jnp.where((kind == FREE) & (pos == 0), stop, s.must_close)
        s = State(
            s.op, jnp.where(kind == END, pos, nxt), jnp.where((kind == CHOICE)[:, None], alive,
            s.alive), choice, must_close,
        )  # fmt: skip
        next_op = jnp.where(
            kind == CHOICE, self.option_next[op, k_took], op + 1
        )  # fmt: skip
        s = self._enter(s, next_op, jnp.where(closed, 1, 0), f_done | c_done | closed)
        # a close that completed a one-token force op: on to the op after it
        short = closed & (self.force_len[s.op] <= 1)
        return self._enter(s, s.op + 1, jnp.zeros_like(pos), short)

    def finished(self, s: State) -> jax.Array:
        return self.kind[s.op] == END


class State(NamedTuple):
    """One row's place in the program."""

    op: jax.Array  # [R] int32
    pos: jax.Array  # [R] int32: tokens emitted in this op
    alive: jax.Array  # [R, K] bool: the choice op's options still consistent
    choice: jax.Array  # [R, O] int32: the option each choice op took (-1 = not yet)
    must_close: jax.Array  # [R] bool: a free op whose first token ends it


@dataclasses.dataclass
class Builder:
    """Ops on the host, turned into a `Program` by `build`."""

    encode: object  # text -> list of token ids (no BOS/EOS)
    decode: object  # ids -> text
    vocab_size: int  # the model's (logits) vocabulary
    eos_id: int
    ops: list = dataclasses.field(default_factory=list)
    mask_list: list = dataclasses.field(default_factory=list)

    def _tokens(self, text: str) -> list[int]:
        ids = list(self.encode(text))
        if not ids or self.decode(ids) != text:
            raise ValueError(f"the tokenizer does not round-trip {text!r}: {ids}")
        return ids

    def mask(self, bools: np.ndarray) -> int:
        m = np.zeros(self.vocab_size, bool)
        m[: len(bools)] = bools[: self.vocab_size]
        self.mask_list.append(m)
        return len(self.mask_list) - 1

    def force(self, text: str) -> int:
        self.ops.append({"kind": FORCE, "tokens": self._tokens(text)})
        return len(self.ops) - 1

    def choice(self, texts, depends_on: int = -1, allowed=None, next_ops=None) -> int:
        for a in texts:
            for b in texts:
                if a != b and b.startswith(a):
                    raise ValueError(f"option {a!r} is a prefix of {b!r}")
        options = [self._tokens(t) for t in texts]
        self.ops.append({"kind": CHOICE, "options": options, "depends_on": depends_on,
                         "allowed": allowed, "next": next_ops})  # fmt: skip
        return len(self.ops) - 1

    def free(self, mask: int, cap: int, first: int | None = None, stop: int = -1,
             min_len: int = 0) -> int:  # fmt: skip
        self.ops.append({"kind": FREE, "mask": mask, "first": mask if first is None else first,
                         "stop": stop, "cap": cap, "min": min_len})  # fmt: skip
        return len(self.ops) - 1

    def end(self) -> int:
        self.ops.append({"kind": END})
        return len(self.ops) - 1

    def build(self) -> Program:
        ops = self.ops
        n_ops = len(ops)
        K = max([len(o["options"]) for o in ops if o["kind"] == CHOICE] or [1])
        lens = [len(o["tokens"]) for o in ops if o["kind"] == FORCE]
        lens += [len(t) for o in ops if o["kind"] == CHOICE for t in o["options"]]
        L = max(lens or [1])
        a = {
            "kind": np.array([o["kind"] for o in ops], np.int32),
            "force_tokens": np.full((n_ops, L), -1, np.int32),
            "force_len": np.zeros(n_ops, np.int32),
            "option_tokens": np.full((n_ops, K, L), -1, np.int32),
            "option_len": np.zeros((n_ops, K), np.int32),
            "option_next": np.zeros((n_ops, K), np.int32),
            "depends_on": np.full(n_ops, -1, np.int32), "allowed": np.ones((n_ops, K, K), bool),
            "free_mask": np.zeros(n_ops, np.int32), "free_first": np.zeros(n_ops, np.int32),
            "free_stop": np.full(n_ops, -1, np.int32), "free_cap": np.zeros(n_ops, np.int32),
            "free_min": np.zeros(n_ops, np.int32),
        }  # fmt: skip
        for i, o in enumerate(ops):
            if o["kind"] == FORCE:
                a["force_tokens"][i, : len(o["tokens"])] = o["tokens"]
                a["force_len"][i] = len(o["tokens"])
            elif o["kind"] == CHOICE:
                for k, t in enumerate(o["options"]):
                    a["option_tokens"][i, k, : len(t)] = t
                    a["option_len"][i, k] = len(t)
                    a["option_next"][i, k] = i + 1 if o["next"] is None else o["next"][k]
                    if a["option_next"][i, k] <= i:
                        raise ValueError(f"choice op {i} jumps back to op {a['option_next'][i, k]}")
                a["depends_on"][i] = o["depends_on"]
                if o["allowed"] is not None:
                    al = np.asarray(o["allowed"], bool)
                    a["allowed"][i, : al.shape[0], : al.shape[1]] = al
            elif o["kind"] == FREE:
                if i + 1 >= n_ops or ops[i + 1]["kind"] != FORCE:
                    raise ValueError(f"free op {i} must be followed by a force op")
                close = ops[i + 1]["tokens"][0]
                for m in (o["mask"], o["first"]):
                    if self.mask_list[m][close]:
                        raise ValueError(f"free op {i}'s vocabulary holds its close token")
                a["free_mask"][i], a["free_first"][i], a["free_stop"][i] = (
                    o["mask"], o["first"], o["stop"])  # fmt: skip
                a["free_cap"][i], a["free_min"][i] = o["cap"], o["min"]
        masks = np.stack(self.mask_list) if self.mask_list else np.zeros((1, self.vocab_size), bool)
        return Program(**{k: jnp.asarray(v) for k, v in a.items()}, masks=jnp.asarray(masks),
                       eos_id=jnp.int32(self.eos_id))  # fmt: skip

    def longest(self) -> int:
        """The most tokens any path through the ops emits, the final EOS included (a bound
        for `max_new_tokens`): every op once, each choice's longest option, each free op's
        cap plus nothing (its close is the next force op's first token)."""
        n = 1
        for o in self.ops:
            if o["kind"] == FORCE:
                n += len(o["tokens"])
            elif o["kind"] == CHOICE:
                n += max(len(t) for t in o["options"])
            elif o["kind"] == FREE:
                n += o["cap"]
        return n
