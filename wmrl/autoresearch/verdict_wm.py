"""The verdict world model in the trainer (`wm.kind = "verdict"`): the policy's own backbone
reads a simulator's prompt and gives a schema-bound verdict per script.

Its language model is the policy's transformer with the warm-started policy's parameters
(`wm.verdict_from = "warm_start"`) or the ones the warm start began from, a pretrained
checkpoint's in the pod configs (`"checkpoint"`). Frozen (`wm.verdict_train = "frozen"`, the
reference's design), it is a pure function of those parameters: nothing to train, save or
restore, and a resumed run scores exactly as the uninterrupted one. Fine-tuned
(`"finetune"`), it learns the verdicts real outcomes deserve (`verdict.real_verdict`, as the
teacher-forced path of their outcome): before RL on the executed corpus of the training tasks
and the fit part of the policy samples (`finetune`), then online on the replay of the anchors'
real outcomes (`online`, `wm.online_steps` per step); its train state is then the trainer's WM
state, checkpointed with the run.

Two scores (`wm.verdict_score`):

* `expected` (ours): every (status, bucket) outcome of `verdict.OUTCOMES` is scored under the
  model by teacher forcing after the verdict's head (an empty reason): the prompt runs once
  per row into a KV cache, the eight completions run on copies of it in one batched forward
  (`outcome_logprobs`). Normalised, their probabilities give the WM score as the expected
  reward and its variance from the same distribution: `predictive_var`, read by uncertainty
  routing and the correction as the ensemble's is.
* `sampled` (the reference's): one verdict decoded under the schema in the jitted sampler
  (`verdict_decoding`, it always parses; the parse-failure rule is kept anyway), rewarded by
  its top prediction; its variance is that of the rewards of its predictions weighted by their
  confidences (0 without a hedge).

Either way a script that does not compile gets 0 with variance 0 (the compile gate).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wmrl import distributed
from wmrl.autoresearch import data as rldata
from wmrl.autoresearch import pretrained
from wmrl.autoresearch import verdict as v
from wmrl.autoresearch import verdict_decoding as vd
from wmrl.config_errors import ConfigError
from wmrl.models.sampler import SamplingConfig, generate
from wmrl.models.transformer import (
    Transformer,
    causal_padding_mask,
    init_cache,
    positions_from_mask,
)

OUTCOME_REWARDS = np.array([v.outcome_reward(s, b) for s, b in v.OUTCOMES], np.float64)
# The reference's sampling of a verdict (its temperature is `wm.verdict_temperature`).
TOP_K, TOP_P = 20, 0.8


@functools.partial(jax.jit, static_argnames=("graphdef",))
def outcome_logprobs(graphdef, params, prompts, prompt_mask, completions, completion_mask):
    """`[B, C]` log-probability of each completion after each prompt, summed over its tokens.

    prompts, prompt_mask: `[B, P]` (left-padded). completions, completion_mask: `[C, Lc]`
    (right-padded). Each prompt runs once into a cache; its C copies then run the
    completions as one `[B*C, Lc]` chunk (row `b * C + c`).
    """
    model: Transformer = nnx.merge(graphdef, params)
    B, P = prompts.shape
    C, Lc = completions.shape
    prompt_mask = prompt_mask.astype(bool)
    cache = init_cache(model.cfg, B, P + Lc)
    attn = jnp.pad(causal_padding_mask(prompt_mask), ((0, 0), (0, 0), (0, Lc)))
    logits, cache = model(prompts, positions_from_mask(prompt_mask), attn, cache, 0)
    cache = jax.tree.map(lambda c: jnp.repeat(c, C, axis=1), cache)  # batch is axis 1
    comp = jnp.tile(completions, (B, 1))
    cmask = jnp.tile(completion_mask.astype(bool), (B, 1))
    pmask = jnp.repeat(prompt_mask, C, axis=0)
    causal = jnp.tril(jnp.ones((Lc, Lc), bool))[None] & cmask[:, None, :]
    mask = jnp.concatenate([jnp.broadcast_to(pmask[:, None, :], (B * C, Lc, P)), causal], axis=2)
    start = jnp.sum(pmask, axis=1, dtype=jnp.int32)
    positions = start[:, None] + jnp.arange(Lc, dtype=jnp.int32)[None]
    chunk, _ = model(comp, positions, mask, cache, P)  # [B*C, Lc, V]
    first = jnp.repeat(logits[:, -1], C, axis=0)[:, None]  # predicts each completion's first
    logp = jax.nn.log_softmax(jnp.concatenate([first, chunk[:, :-1]], axis=1), axis=-1)
    picked = jnp.take_along_axis(logp, comp[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(cmask, picked, 0.0), axis=1).reshape(B, C)


def outcome_distribution(logp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From `[n, C]` log-probs of `verdict.OUTCOMES`: (probabilities `[n, C]`, expected reward
    `[n]`, its variance `[n]`)."""
    logp = np.asarray(logp, np.float64)
    p = np.exp(logp - logp.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    mean = p @ OUTCOME_REWARDS
    var = np.einsum("nc,nc->n", p, (OUTCOME_REWARDS[None] - mean[:, None]) ** 2)
    return p, mean, var


def sampled_score(verdict: v.Verdict | None, compiles: bool) -> tuple[float, float]:
    """(reward of the top prediction, confidence-weighted variance over the predictions)."""
    score = v.verdict_reward(verdict, compiles)
    if not compiles or verdict is None or len(verdict.predictions) < 2:
        return score, 0.0
    w = np.array([max(p.confidence, 1e-6) for p in verdict.predictions])
    r = np.array([p.reward for p in verdict.predictions])
    w /= w.sum()
    return score, float(w @ (r - w @ r) ** 2)


def verdict_model_config(config, vocab_size: int, max_len: int):
    """The policy's architecture with the verdict's context length (`max_len` only sizes the
    caches and the sampler's check: the parameters are the policy's)."""
    from wmrl.autoresearch.model_setup import policy_config

    if pretrained.enabled(config):
        return pretrained.model_config(config, max_len)
    return dataclasses.replace(policy_config(config, vocab_size), max_len=max_len)


class VerdictWM:
    """The verdict scorer of one run: `predict(scripts, tasks)` as `FeatureWM`'s."""

    def __init__(self, config, prepared, params, vocab_size: int):
        w = config.wm
        t0 = time.monotonic()
        self.config, self.tok, self.mode = config, prepared.tokenizer, w.verdict_score
        self.prompt_len, self.cap_s = int(w.verdict_prompt_len), config.suite.time_limit_s
        self.caps = v.PromptCaps(w.verdict_overview_chars, w.verdict_inventory_chars,
                                 w.verdict_script_chars)  # fmt: skip
        token_caps = vd.TokenCaps(w.verdict_reason_tokens, w.verdict_error_type_tokens,
                                  w.verdict_feedback_tokens)  # fmt: skip
        self.program = vd.build_verdict_program(self.tok, vocab_size, token_caps)
        L = len(max(self.program.outcome_tokens, key=len))
        self.completions = np.zeros((len(v.OUTCOMES), L), np.int32)
        self.completion_mask = np.zeros((len(v.OUTCOMES), L), bool)
        for i, path in enumerate(self.program.outcome_tokens):
            self.completions[i, : len(path)], self.completion_mask[i, : len(path)] = path, True
        self.max_len = self.prompt_len + max(self.program.max_new_tokens, L)
        cfg = verdict_model_config(config, vocab_size, self.max_len)
        self.graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
        self.params = params
        self.sc = SamplingConfig(
            self.program.max_new_tokens, self.tok.eos_id, self.tok.pad_id,
            temperature=float(w.verdict_temperature), top_k=TOP_K, top_p=TOP_P,
        )  # fmt: skip
        self.seed = int(config.seed)
        self._shared: dict[str, str] = {}
        self.heldout = [r for r in prepared.executions if r["split"] == "heldout"
                        and r.get("reward") is not None]  # fmt: skip
        self._tasks = {t.id: t for t in prepared.train_tasks + prepared.heldout_tasks}
        self.cfg = cfg
        self.trains = w.verdict_train == "finetune"  # the trainer's WM state is this LM's
        self.finetune_report: dict | None = None
        self.P = config.data.max_prompt_len  # the policy rows' prompt width (replay rows)
        self._task_of_prompt: dict | None = None  # a replay row's prompt -> its task
        self.setup_s = time.monotonic() - t0

    # -- prompts -------------------------------------------------------------------------

    def _prompt_ids(self, task, script: str, tail: tuple[int, ...]) -> list[int]:
        """The row's token ids: the prompt in the checkpoint's template, then `tail`; the
        script section is cut shorter until the row fits `wm.verdict_prompt_len`."""
        if task.id not in self._shared:
            limit = rldata.time_limit(task, self.cap_s)
            self._shared[task.id] = v.task_sections(task, limit, self.caps)
        caps = self.caps
        for _ in range(12):
            text = v.build_prompt(task, script, 0.0, caps, shared=self._shared[task.id])
            ids = [*self.tok.encode(pretrained.prompt(self.config, text), add_bos=True), *tail]
            if len(ids) <= self.prompt_len:
                return ids
            caps = dataclasses.replace(caps, script_chars=caps.script_chars // 2)
        raise ConfigError(
            "wm.verdict_prompt_len",
            f"{self.prompt_len} tokens cannot hold task {task.id}'s verdict prompt even with "
            f"its script cut to {caps.script_chars} characters ({len(ids)} tokens)",
        )

    def _rows(self, scripts, tasks, tail=()) -> tuple[np.ndarray, np.ndarray]:
        rows = [self._prompt_ids(t, s, tail) for s, t in zip(scripts, tasks, strict=True)]
        ids = np.full((len(rows), self.prompt_len), self.tok.pad_id, np.int32)
        mask = np.zeros((len(rows), self.prompt_len), bool)
        for i, r in enumerate(rows):
            ids[i, self.prompt_len - len(r) :], mask[i, self.prompt_len - len(r) :] = r, True
        return ids, mask

    # -- scoring -------------------------------------------------------------------------

    def outcome_logprobs(self, scripts, tasks) -> np.ndarray:
        """`[n, C]` log-probs of `verdict.OUTCOMES` for each row (teacher forcing)."""
        ids, mask = self._rows(scripts, tasks, self.program.prefix)
        out = outcome_logprobs(
            self.graphdef, self.params, jnp.asarray(ids), jnp.asarray(mask),
            jnp.asarray(self.completions), jnp.asarray(self.completion_mask),
        )  # fmt: skip
        return distributed.process_allgather_to_numpy(out)

    def sample_verdicts(self, scripts, tasks) -> list[str]:
        """One verdict's text per row, decoded under the schema; the key is a pure function
        of the run's seed and the rows' scripts (a resumed run draws the same)."""
        ids, mask = self._rows(scripts, tasks)
        digest = zlib.crc32("\0".join(scripts).encode("utf-8", "surrogatepass"))
        key = jax.random.fold_in(jax.random.key(self.seed), digest & 0x7FFFFFFF)
        out = generate(self.graphdef, self.params, jnp.asarray(ids), jnp.asarray(mask), key,
                       self.sc, self.max_len, constraint=self.program.program)  # fmt: skip
        toks, m = distributed.process_allgather_to_numpy((out.tokens, out.mask))
        return [self.tok.decode(toks[i][m[i]]) for i in range(len(toks))]

    def fit_to(self, replay) -> None:
        """The replay of real outcomes changes nothing here: a fine-tuned verdict LM learns
        from it in `online`, and the trainer hands its parameters over with `use`."""

    def use(self, params) -> None:
        """Score with these parameters from now on (the fine-tuned LM's, as RL trains it)."""
        self.params = params

    # -- fine-tuning on verdicts written from real outcomes ------------------------------

    def target_rows(self, scripts, tasks, statuses, rewards) -> dict | None:
        """SFT rows `[n, prompt_len + T]`: the verdict prompt (left-padded), then the verdict
        the real outcome deserves (`verdict.real_verdict`: its status and bucket, empty
        reason, feedback and error type, line 0, the decoder's confidence 0.9) and EOS, the
        loss on the verdict only. Ungraded rows are left out; None when none is left."""
        keep = []
        for script, task, status, reward in zip(scripts, tasks, statuses, rewards, strict=True):
            real = v.real_verdict(status, reward, script)
            if real is not None:
                outcome = (real.top.status, real.top.quality_bucket)
                keep.append((script, task, v.OUTCOMES.index(outcome)))
        if not keep:
            return None
        ids, mask = self._rows([k[0] for k in keep], [k[1] for k in keep])
        T = max(len(t) for t in self.program.targets)
        n, P = len(keep), self.prompt_len
        tokens = np.concatenate([ids, np.full((n, T), self.tok.pad_id, np.int32)], axis=1)
        input_mask = np.concatenate([mask, np.zeros((n, T), bool)], axis=1)
        for i, (_, _, c) in enumerate(keep):
            target = self.program.targets[c]
            tokens[i, P : P + len(target)], input_mask[i, P : P + len(target)] = target, True
        loss_mask = input_mask.astype(np.float32)
        loss_mask[:, :P] = 0.0
        return {"tokens": tokens, "input_mask": input_mask, "loss_mask": loss_mask}

    def lm_model(self, mesh, tx):
        """The verdict LM as a trainable `Model` (its current parameters, optimiser `tx`)."""
        from wmrl.autoresearch.model_setup import _from_params

        cfg = self.cfg
        return _from_params(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), self.params, tx, mesh)

    def _sft(self, model, state, rows: dict, idx: np.ndarray):
        from wmrl.autoresearch.model_setup import sft_step

        batch = {k: a[idx] for k, a in rows.items()}
        if getattr(self, "_step", None) is None or self._step[0] is not model:
            self._step = (model, sft_step(model, batch, prompt_width=self.prompt_len))
        return self._step[1](state, batch)

    def finetune(self, records: list[dict], mesh) -> dict:
        """Before RL: `wm.verdict_finetune_steps` SFT steps of `wm.batch_size` rows drawn
        (seeded) from `records` (executed scripts: `script`, `task_id`, `status`, `reward`),
        at `wm.learning_rate`; the LM then scores with the result. Returns its parameters."""
        from wmrl.autoresearch.model_setup import adam

        w = self.config.wm
        t0 = time.monotonic()
        recs = [r for r in records if r["task_id"] in self._tasks]
        col = lambda k: [r[k] for r in recs]
        rows = self.target_rows(col("script"), [self._tasks[t] for t in col("task_id")],
                                col("status"), col("reward"))  # fmt: skip
        model = self.lm_model(mesh, adam(w.learning_rate))
        state, nll = model.state, []
        if rows is not None:
            rng = np.random.default_rng([self.seed, 11])
            for _ in range(w.verdict_finetune_steps):
                idx = rng.integers(0, len(rows["tokens"]), w.batch_size)
                state, m = self._sft(model, state, rows, idx)
                total, count = distributed.process_allgather_to_numpy(m["nll"])
                nll.append(float(total / max(count, 1)))
        self.use(state.params)
        self.finetune_report = {
            "rows": 0 if rows is None else len(rows["tokens"]), "steps": len(nll),
            "nll_first": nll[0] if nll else None, "nll_last": nll[-1] if nll else None,
            "time_s": time.monotonic() - t0,
        }  # fmt: skip
        return state.params

    def online(self, model, state, replay, step: int):
        """RL's online step: `wm.online_steps` SFT steps on verdicts written from the
        replay's real outcomes (rows read back from their tokens as `FeatureWM` reads them),
        `model` the trainer's WM (its optimiser), `state` its train state (donated); the new
        state, whose parameters the trainer hands to `use` before the next scoring."""
        n = int(replay.count)
        w = self.config.wm
        if n == 0 or w.online_steps == 0:
            return state
        if self._task_of_prompt is None:
            tasks = list(self._tasks.values())
            prompts = [rldata.task_prompt(self.config, t) for t in tasks]
            ids, pm = rldata.encode_prompts(self.tok, prompts, self.P)
            self._task_of_prompt = {ids[i][pm[i]].tobytes(): t for i, t in enumerate(tasks)}
        tokens, mask = np.asarray(replay.tokens[:n]), np.asarray(replay.input_mask[:n]).astype(bool)
        scripts, tasks, statuses, rewards = [], [], [], []
        for i in range(n):
            task = self._task_of_prompt.get(tokens[i, : self.P][mask[i, : self.P]].tobytes())
            if task is None or int(replay.class_label[i]) < 0:
                continue
            scripts.append(self.tok.decode(tokens[i, self.P :][mask[i, self.P :]]))
            tasks.append(task)
            statuses.append(int(replay.class_label[i]))
            rewards.append(float(replay.target[i]))
        rows = self.target_rows(scripts, tasks, statuses, rewards) if scripts else None
        if rows is None:
            return state
        rng = np.random.default_rng([self.seed, step, 7])
        for _ in range(w.online_steps):
            state, _ = self._sft(model, state, rows, rng.integers(0, len(rows["tokens"]),
                                                                  w.batch_size))  # fmt: skip
        return state

    def predict(self, scripts: list[str], tasks: list) -> dict:
        """`score` (the WM score), `predictive_var` and `top_outcome` (the index in
        `verdict.OUTCOMES` of the most likely or the sampled top outcome) `[n]`; in `expected`
        mode also `outcome_probs` `[n, C]` over `verdict.OUTCOMES`."""
        gate = np.array([v.compiles(s) for s in scripts])
        if self.mode == "expected":
            probs, mean, var = outcome_distribution(self.outcome_logprobs(scripts, tasks))
            out = {"outcome_probs": probs.astype(np.float32),
                   "top_outcome": np.argmax(probs, axis=1).astype(np.int32)}  # fmt: skip
        else:
            verdicts = [v.parse_verdict(t) for t in self.sample_verdicts(scripts, tasks)]
            pairs = [sampled_score(x, g) for x, g in zip(verdicts, gate, strict=True)]
            mean, var = np.array(pairs).T
            out = {"top_outcome": np.array([top_outcome(x) for x in verdicts], np.int32)}
        return {**out, "score": np.where(gate, mean, 0.0).astype(np.float32),
                "predictive_var": np.where(gate, var, 0.0).astype(np.float32)}  # fmt: skip

    def predict_in_chunks(self, scripts: list[str], tasks: list, rows: int) -> dict:
        """`predict` over chunks of `rows` rows (the last padded with its own last row, so
        every call has one shape and compiles once): a yardstick of any size in bounded
        memory."""
        parts = []
        for i in range(0, len(scripts), rows):
            s, t = scripts[i : i + rows], tasks[i : i + rows]
            n = len(s)
            got = self.predict(s + s[-1:] * (rows - n), t + t[-1:] * (rows - n))
            parts.append({k: a[:n] for k, a in got.items()})
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    # -- report --------------------------------------------------------------------------

    def report(self) -> dict:
        """What the summary reports of a WM before RL: the setting and, on the held-out tasks'
        executed corpus, the within-task Spearman and RMSE of the score and the reference's
        fidelity figures (status and bucket accuracy of the top outcome)."""
        from wmrl.autoresearch.anchor_metrics import spearman
        from wmrl.autoresearch.wm_metrics import within_task_spearman

        t0 = time.monotonic()
        held: dict = {"n": len(self.heldout)}
        if self.heldout:
            tasks = [self._tasks[r["task_id"]] for r in self.heldout]
            scripts = [r["script"] for r in self.heldout]
            got = self.predict(scripts, tasks)
            s, y = got["score"].astype(np.float64), np.array([r["reward"] for r in self.heldout])
            group = np.array([r["task_id"] for r in self.heldout])
            rmse = float(np.sqrt(np.mean((s - y) ** 2)))
            held.update(within_task_spearman=within_task_spearman(s, y, group),
                        spearman=spearman(s, y), rmse=rmse)  # fmt: skip
            held.update(fidelity(got["top_outcome"], self.heldout))
        return {
            "kind": "verdict", "train": self.config.wm.verdict_train, "score": self.mode,
            "finetune": self.finetune_report,
            "from": self.config.wm.verdict_from, "prompt_len": self.prompt_len,
            "max_new_tokens": self.program.max_new_tokens, "heldout": held,
            "time_s": self.setup_s + time.monotonic() - t0,
        }  # fmt: skip


def top_outcome(verdict: v.Verdict | None) -> int:
    """The index in `verdict.OUTCOMES` of a verdict's top prediction (a verdict that does not
    parse counts as runtime_err, as its reward does)."""
    if verdict is None:
        return v.OUTCOMES.index((v.PARSE_FAILURE_STATUS, ""))
    return v.OUTCOMES.index((verdict.top.status, verdict.top.quality_bucket))


def fidelity(top: np.ndarray, records: list[dict]) -> dict:
    """The reference's fidelity figures of the top outcomes (`[n]` indices into
    `verdict.OUTCOMES`) against each record's real outcome (`verdict.real_verdict`): status
    accuracy over graded records, bucket accuracy over the real VALID ones."""
    from wmrl.autoresearch.env.grader import Status

    status_hits, bucket_hits = [], []
    for i, r in zip(top, records, strict=True):
        status, bucket = v.OUTCOMES[int(i)]
        real = v.real_verdict(Status(r["status"]), r.get("reward"), r.get("script"))
        if real is None:
            continue
        status_hits.append(status == real.top.status)
        if real.top.status == "valid":
            bucket_hits.append(bucket == real.top.quality_bucket)
    mean = lambda x: float(np.mean(x)) if x else None
    return {"status_accuracy": mean(status_hits), "bucket_accuracy": mean(bucket_hits)}
