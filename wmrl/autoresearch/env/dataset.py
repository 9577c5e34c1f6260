"""Executed-trajectory dataset (TFDS, array_record) and its grain input pipeline.

    python -m wmrl.autoresearch.env.dataset --suite=DIR --data_dir=DIR \\
        [--scripts_per_task=40] [--workers=N]

Building executes authored scripts (``author.write_scripts``) for every suite
task through the sandbox pool and appends each result to
``<data_dir>/executions.jsonl`` as it finishes (flushed and fsynced), with a
progress bar. A rerun skips what is already there, so an interrupted build
keeps all it executed. The TFDS builder then writes array_record shards
with ``train`` and ``heldout`` splits by task (no TensorFlow needed).

``make_pipeline`` reads a split with ``tfds.data_source`` through grain,
tokenizes the (card, script) pair with a pluggable callable (bytes by
default; ``spm_tokenizer`` wraps a sentencepiece model), truncates, pads and
batches.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds
from absl import app, flags

from wmrl.autoresearch.env import author
from wmrl.autoresearch.env.corpus import task_seed
from wmrl.autoresearch.env.make_task import task_info
from wmrl.autoresearch.env.task import load_suite

NAME = "autoresearch_trajectories"
VERSION = "1.0.0"


def execute_corpus(
    suite_dir: str | os.PathLike,
    data_dir: str | os.PathLike,
    scripts_per_task: int = 40,
    seed: int = 0,
    mistake_rate: float = 0.3,
    workers: int | None = None,
    progress: bool = True,
    executor_config=None,
    episode_root: str | os.PathLike | None = None,
    heldout_scripts_per_task: int | None = None,
) -> Path:
    """Execute the authored corpus, resumably; return the executions.jsonl path.

    Held-out tasks get ``heldout_scripts_per_task`` scripts (default: ``scripts_per_task``),
    the first ones of the same authored sequence, so a corpus executed with more scripts per
    held-out task holds these ones too (`corpus_records` reads back exactly these).

    Each record also holds the observation fields a multi-turn world model predicts
    (``error_type``; ``validation``, None unless on an episode task). With ``episode_root``
    every task is executed as its multi-turn episode task (``episode.make_episode_task``,
    built there): same scripts, reward from the test rows, ``validation`` from the validation
    rows. A data_dir holds one kind of log (``"episode"`` in every record): resuming one
    with the other kind is an error naming it."""
    from tqdm import tqdm

    from wmrl.autoresearch.env.executor import make_executor

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "executions.jsonl"
    done: set[tuple[str, int]] = set()
    for rec in journal_records(log_path):
        if bool(rec.get("episode", False)) != (episode_root is not None):
            raise ValueError(
                f"{log_path} was executed with episode_root "
                f"{'set' if rec.get('episode') else 'unset'}; use another data_dir"
            )
        done.add((rec["task_id"], rec["index"]))
    plan = []
    for task in load_suite(suite_dir):
        info = task_info(task)
        if episode_root is not None:
            from wmrl.autoresearch.env.episode import make_episode_task

            task = make_episode_task(task, episode_root)
        n = scripts_per_task
        if task.split == "heldout" and heldout_scripts_per_task is not None:
            n = heldout_scripts_per_task
        scripts = author.write_scripts(info, n, task_seed(task.id, seed), mistake_rate)
        for i, (spec, source) in enumerate(scripts):
            if (task.id, i) not in done:
                plan.append((task, i, spec, source))
    if not plan:
        return log_path
    # Keyed by (task, index): a resumed build executes the rest with the seeds they would
    # have had in one go.
    pool = make_executor(executor_config, workers=workers, time_limit_cap_s=0, seed=seed)
    with pool, open(log_path, "a") as log:
        futures = {
            pool.submit(task, source, key=f"{task.id}/{i}"): (task, i, spec, source)
            for task, i, spec, source in plan
        }
        bar = tqdm(total=len(plan), desc="executing", disable=not progress)
        for fut in pool.as_completed(futures):
            task, i, spec, source = futures[fut]
            r = fut.result()
            rec = {
                "task_id": task.id,
                "index": i,
                "split": task.split,
                "card": task.card,
                "script": source,
                "status": int(r.status),
                "status_name": r.status.name,
                "score": r.score,
                "percentile": r.percentile,
                "reward": None if math.isnan(r.reward) else r.reward,
                "runtime_s": r.runtime_s,
                "stderr_tail": r.stderr_tail[-1000:],
                "model": spec.model,
                "mistake": spec.mistake or "",
                "error_type": r.error_type,
                "validation": r.validation,
                "episode": episode_root is not None,
            }
            log.write(json.dumps(rec) + "\n")
            log.flush()
            os.fsync(log.fileno())
            bar.update(1)
        bar.close()
    return log_path


def corpus_records(
    log_path: str | os.PathLike, scripts_per_task: int, heldout_scripts_per_task: int | None = None
) -> list[dict]:
    """The executed corpus as one build with these counts would have it: the records of the
    first `scripts_per_task` scripts of every training task and `heldout_scripts_per_task`
    (default: as many) of every held-out task, sorted by (task, index). A log made with more
    scripts per task (e.g. a shared single-turn corpus) yields the same records as a fresh
    build with these counts."""
    held = scripts_per_task if heldout_scripts_per_task is None else heldout_scripts_per_task
    recs = [
        r for r in journal_records(Path(log_path))
        if r["index"] < (held if r["split"] == "heldout" else scripts_per_task)
    ]  # fmt: skip
    return sorted(recs, key=lambda r: (r["task_id"], r["index"]))


def journal_records(path: Path):
    """The complete records of a resumable execution journal (none if it does not exist yet),
    after dropping a tail torn by an interruption; a line cut by it is executed again."""
    if not path.exists():
        return
    _drop_torn_tail(path)
    with open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def _drop_torn_tail(path: Path) -> None:
    """Cut a record left half-written by an interruption, so appends start on a fresh line."""
    with open(path, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            f.truncate(keep)


def _nan_if_none(x) -> float:
    return float("nan") if x is None else float(x)


class AutoresearchTrajectories(tfds.core.GeneratorBasedBuilder):
    """Executed (card, script) -> (status, score, percentile, reward, runtime)."""

    VERSION = tfds.core.Version(VERSION)

    def __init__(self, *, executions_path: str | os.PathLike | None = None, **kwargs):
        self._executions_path = executions_path
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        text = tfds.features.Text()
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "task_id": text,
                    "card": text,
                    "script": text,
                    "status": np.int32,
                    "status_name": text,
                    "score": np.float32,  # NaN where there is no valid submission
                    "percentile": np.float32,  # NaN likewise
                    "reward": np.float32,  # NaN for UNGRADED (masked)
                    "runtime_s": np.float32,
                    "stderr_tail": text,  # last 1000 chars: what a multi-turn agent would see
                    "model": text,
                    "mistake": text,  # "" for none
                }
            ),
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        if self._executions_path is None:
            raise ValueError("pass executions_path= to build the dataset")
        return {
            "train": self._generate_examples("train"),
            "heldout": self._generate_examples("heldout"),
        }

    def _generate_examples(self, split: str):
        with open(self._executions_path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec["split"] != split:
                    continue
                yield (
                    f"{rec['task_id']}/{rec['index']}",
                    {
                        "task_id": rec["task_id"],
                        "card": rec["card"],
                        "script": rec["script"],
                        "status": rec["status"],
                        "status_name": rec["status_name"],
                        "score": _nan_if_none(rec["score"]),
                        "percentile": _nan_if_none(rec["percentile"]),
                        "reward": _nan_if_none(rec["reward"]),
                        "runtime_s": rec["runtime_s"],
                        "stderr_tail": rec.get("stderr_tail", ""),
                        "model": rec["model"],
                        "mistake": rec["mistake"],
                    },
                )


def build_dataset(executions_path, data_dir) -> Path:
    """Write the array_record TFDS dataset from an executions log; return its directory."""
    builder = AutoresearchTrajectories(
        executions_path=executions_path, data_dir=str(data_dir), file_format="array_record"
    )
    builder.download_and_prepare()
    return Path(builder.data_dir)


def data_source(data_dir: str | os.PathLike, split: str):
    """Random-access source for a split (reads the files; no builder code needed)."""
    return tfds.data_source(NAME, split=split, data_dir=str(data_dir))


Tokenize = Callable[[str], Sequence[int]]


def byte_tokenizer(text: str) -> list[int]:
    """Default tokenizer: UTF-8 bytes shifted by 4 (ids 0-3 = pad, unk, bos, eos)."""
    return [b + 4 for b in text.encode("utf-8")]


def spm_tokenizer(model_path: str | os.PathLike) -> Tokenize:
    """The project tokenizer (``wmrl.tokenizer``; see ``corpus.train_spm``) as a callable."""
    from wmrl.tokenizer import Tokenizer

    return Tokenizer.load(model_path).encode


SEP = "\n### SCRIPT\n"


def encode_example(
    ex: dict, tokenize: Tokenize, seq_len: int, max_card_tokens: int, pad_id: int = 0
) -> dict:
    """One record -> fixed-length arrays. The card is cut first so the script survives.

    Returns tokens/mask [seq_len] int32, status int32, reward/score/percentile
    float32 (NaN -> 0 with a *_mask), runtime_s float32.
    """

    def text(v) -> str:
        return v.decode("utf-8") if isinstance(v, bytes) else str(v)

    card = list(tokenize(text(ex["card"])))[:max_card_tokens]
    body = list(tokenize(SEP + text(ex["script"])))
    ids = (card + body)[:seq_len]
    tokens = np.full(seq_len, pad_id, np.int32)
    tokens[: len(ids)] = ids
    out = {
        "tokens": tokens,
        "mask": (np.arange(seq_len) < len(ids)).astype(np.int32),
        "status": np.int32(ex["status"]),
        "runtime_s": np.float32(ex["runtime_s"]),
    }
    for key in ("reward", "score", "percentile"):
        v = float(ex[key])
        out[key] = np.float32(0.0 if math.isnan(v) else v)
        out[f"{key}_mask"] = np.int32(not math.isnan(v))
    return out


def make_pipeline(
    data_dir: str | os.PathLike,
    split: str,
    batch_size: int,
    seq_len: int = 1024,
    tokenize: Tokenize = byte_tokenizer,
    max_card_tokens: int = 384,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = 1,
    drop_remainder: bool = True,
    bucket_lengths: Sequence[int] | None = None,
):
    """A grain MapDataset of padded batches: dict of [batch, ...] numpy arrays.

    With `bucket_lengths` (ascending, the last one >= the longest sequence you keep), every
    batch's `tokens`/`mask` are cut to the smallest bucket that holds its longest example:
    short batches stop paying for `seq_len` of padding, while the set of shapes a jitted
    consumer sees stays small.
    """
    import grain.python as grain

    ds = grain.MapDataset.source(data_source(data_dir, split))
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)
    ds = ds.map(lambda ex: encode_example(ex, tokenize, seq_len, max_card_tokens))
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if bucket_lengths:
        buckets = sorted(int(b) for b in bucket_lengths)
        if buckets[0] < 1:
            raise ValueError(f"bucket_lengths must be positive, got {bucket_lengths}")
        ds = ds.map(lambda batch: trim_to_bucket(batch, buckets))
    return ds


def trim_to_bucket(batch: dict, buckets: Sequence[int]) -> dict:
    """Cut a padded batch's token axis to the smallest bucket >= its longest row."""
    longest = int(batch["mask"].sum(axis=1).max(initial=0))
    fits = [b for b in buckets if b >= longest]
    width = min(fits[0] if fits else batch["tokens"].shape[1], batch["tokens"].shape[1])
    return {**batch, "tokens": batch["tokens"][:, :width], "mask": batch["mask"][:, :width]}


FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program."""
    flags.DEFINE_string("suite", None, "built suite directory")
    flags.DEFINE_string("data_dir", None, "where executions.jsonl and the TFDS files go")
    flags.DEFINE_integer("scripts_per_task", 40, "authored scripts per task")
    flags.DEFINE_float("mistake_rate", 0.3, "probability that a script carries a mistake")
    flags.DEFINE_integer("seed", 0, "author seed")
    flags.DEFINE_integer("workers", None, "sandbox slots (default: cores)")


def main(argv) -> None:
    del argv
    if not FLAGS.suite or not FLAGS.data_dir:
        raise app.UsageError("--suite and --data_dir are required")
    log = execute_corpus(
        FLAGS.suite,
        FLAGS.data_dir,
        FLAGS.scripts_per_task,
        FLAGS.seed,
        FLAGS.mistake_rate,
        FLAGS.workers,
    )
    path = build_dataset(log, FLAGS.data_dir)
    counts = {s: len(data_source(FLAGS.data_dir, s)) for s in ("train", "heldout")}
    print(json.dumps({"dataset": str(path), "examples": counts}))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
