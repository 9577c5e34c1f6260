"""Rollout speed: jitted KV-cache sampler vs a naive per-token full-recompute loop.

  python -m wmrl.benchmarks.rollout --config=configs/model_tiny.py --out=rollout.json

Same model, same batch (`--batch` prompts of `--prompt_len` tokens), greedy,
`--new_tokens` per row with EOS disabled so both paths generate every token.
The naive loop calls one compiled full forward over a fixed `[B, P+N]` buffer
per token (compiled once, so it is not penalised for recompilation).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

from wmrl.benchmarks.common import machine, report
from wmrl.models.config import TransformerConfig
from wmrl.models.model_configs import transformer_config
from wmrl.models.sampler import SamplingConfig, decode, naive_greedy, prefill
from wmrl.models.transformer import Transformer

config_flags.DEFINE_config_file("config", "configs/model_tiny.py", "model config file")
flags.DEFINE_integer("batch", 64, "prompts per batch")
flags.DEFINE_integer("prompt_len", 32, "prompt length (left padded)")
flags.DEFINE_integer("new_tokens", 128, "tokens generated per row")
flags.DEFINE_integer("repeats", 3, "timed repetitions of the jitted sampler (best is kept)")
flags.DEFINE_string("out", None, "write the figures to this JSON file")
FLAGS = flags.FLAGS


def _block(x):
    return jax.block_until_ready(x)


def measure(
    cfg: TransformerConfig,
    *,
    batch: int = 64,
    prompt_len: int = 32,
    new_tokens: int = 128,
    repeats: int = 3,
    naive: bool = True,
) -> dict:
    """Tokens/s and time to first token of the jitted sampler for `cfg`; with `naive`, also
    the full-recompute loop (tokens/s, speedup, whether the greedy outputs match)."""
    B, P, N = batch, prompt_len, new_tokens
    if cfg.max_len < P + N:
        cfg = cfg.replace(max_len=P + N)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    params = nnx.to_pure_dict(params)
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(4, cfg.vocab_size, (B, P)), jnp.int32)
    lengths = rng.integers(P // 2, P + 1, B)
    mask = jnp.asarray(np.arange(P)[None] >= (P - lengths)[:, None])
    prompts = jnp.where(mask, prompts, 0)
    sc = SamplingConfig(max_new_tokens=N, eos_id=cfg.vocab_size, greedy=True)
    kw = dict(max_new_tokens=N, num_samples=1)

    t0 = time.perf_counter()
    prefill_c = prefill.lower(graphdef, params, prompts, mask, **kw).compile()
    cache, key_mask, logits, pos = prefill_c(params, prompts, mask)
    decode_c = decode.lower(
        graphdef, params, cache, key_mask, logits, pos, jax.random.key(0), sc=sc, prompt_len=P
    ).compile()
    compile_s = time.perf_counter() - t0

    best, ttft = float("inf"), float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        cache, key_mask, logits, pos = _block(prefill_c(params, prompts, mask))
        t1 = time.perf_counter()
        out, _ = _block(decode_c(params, cache, key_mask, logits, pos, jax.random.key(0)))
        t2 = time.perf_counter()
        best, ttft = min(best, t2 - t0), min(ttft, t1 - t0)
    jitted_tps = B * N / best
    rows = {
        "jitted_tokens_per_s": jitted_tps,
        "compile_s": compile_s,
        "time_to_first_token_s": ttft,
        "jitted_s": best,
    }
    if naive:
        naive_greedy(model, prompts, mask, 1)  # compile the naive forward outside the timing
        t0 = time.perf_counter()
        naive_tokens = _block(naive_greedy(model, prompts, mask, N))
        naive_s = time.perf_counter() - t0
        rows.update(
            naive_tokens_per_s=B * N / naive_s,
            speedup=jitted_tps / (B * N / naive_s),
            naive_s=naive_s,
            outputs_match=bool(np.array_equal(np.asarray(out.tokens), np.asarray(naive_tokens))),
        )
    return {
        **rows,
        "batch": B,
        "prompt_len": P,
        "new_tokens": N,
        "dtype": cfg.dtype,
        "attention_impl": cfg.attention_impl,
        "num_params": sum(x.size for x in jax.tree.leaves(params)),
        "machine": machine(),
    }


def run() -> dict:
    return measure(
        transformer_config(FLAGS.config), batch=FLAGS.batch, prompt_len=FLAGS.prompt_len,
        new_tokens=FLAGS.new_tokens, repeats=FLAGS.repeats,
    )  # fmt: skip


def main(_):
    report("rollout: jitted KV-cache sampler vs naive full recompute", run(), FLAGS.out)


if __name__ == "__main__":
    app.run(main)
