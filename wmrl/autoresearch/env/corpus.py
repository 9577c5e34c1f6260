"""Text corpus of task cards and authored scripts, and the sentencepiece model on it.

    python -m wmrl.autoresearch.env.corpus --suite=DIR --out=DIR [--vocab_size=4000]

Writes ``corpus.jsonl`` (one {"kind", "task_id", "text"} per line; texts keep
their newlines and indentation) and ``spm.model``/``spm.vocab``. Only
training-split tasks are used: held-out tasks are never trained on, not even
by the tokenizer. The spm settings keep code intact: identity normalisation,
no whitespace squashing, no dummy prefix, byte fallback, newline as a symbol;
so ``decode(encode(text)) == text`` for any UTF-8 text.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from absl import app, flags

from wmrl.autoresearch.env import author
from wmrl.autoresearch.env.make_task import task_info
from wmrl.autoresearch.env.task import load_suite


def task_seed(task_id: str, seed: int) -> int:
    """A stable per-task seed (Python's hash() is salted per process)."""
    return zlib.crc32(f"{task_id}:{seed}".encode())


def corpus_documents(
    suite_dir: str | os.PathLike, scripts_per_task: int = 20, seed: int = 0
) -> Iterator[dict]:
    """Cards and authored scripts of the training-split tasks, reproducibly."""
    for task in load_suite(suite_dir, split="train"):
        yield {"kind": "card", "task_id": task.id, "text": task.card}
        info = task_info(task)
        for _, source in author.write_scripts(info, scripts_per_task, task_seed(task.id, seed)):
            yield {"kind": "script", "task_id": task.id, "text": source}


def write_corpus(suite_dir, out_dir, scripts_per_task: int = 20, seed: int = 0) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "corpus.jsonl"
    with open(path, "w") as f:
        for doc in corpus_documents(suite_dir, scripts_per_task, seed):
            f.write(json.dumps(doc) + "\n")
    return path


def read_corpus(path: str | os.PathLike) -> list[str]:
    with open(path) as f:
        return [json.loads(line)["text"] for line in f]


def train_spm(corpus_path, model_prefix, vocab_size: int = 4000) -> Path:
    """Train the project tokenizer (BPE, exact code round trip) on the corpus."""
    from wmrl.tokenizer import Tokenizer

    Tokenizer.train(read_corpus(corpus_path), model_prefix, vocab_size=vocab_size)
    return Path(f"{model_prefix}.model")


FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program."""
    flags.DEFINE_string("suite", None, "built suite directory")
    flags.DEFINE_string("out", None, "output directory")
    flags.DEFINE_integer("scripts_per_task", 20, "authored scripts per training task")
    flags.DEFINE_integer("vocab_size", 4000, "sentencepiece vocabulary size (soft limit)")
    flags.DEFINE_integer("seed", 0, "author seed")


def main(argv) -> None:
    del argv
    if not FLAGS.suite or not FLAGS.out:
        raise app.UsageError("--suite and --out are required")
    path = write_corpus(FLAGS.suite, FLAGS.out, FLAGS.scripts_per_task, FLAGS.seed)
    model = train_spm(path, Path(FLAGS.out) / "spm", FLAGS.vocab_size)
    print(json.dumps({"corpus": str(path), "documents": len(read_corpus(path)), "spm": str(model)}))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
