"""Corpus + spm round trip, resumable executed dataset, TFDS array_record, grain batches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.autoresearch_fixtures import make_tiny_task
from wmrl.autoresearch.env import corpus, dataset
from wmrl.autoresearch.env.grader import Status

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    make_tiny_task(root / "tiny-train", split="train")
    make_tiny_task(root / "tiny-heldout", split="heldout", metric="f1_macro")
    return root


def test_corpus_excludes_heldout_and_spm_round_trips(suite, tmp_path):
    path = corpus.write_corpus(suite, tmp_path, scripts_per_task=15)
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    assert {d["task_id"] for d in docs} == {"tiny-train"}
    assert sum(d["kind"] == "script" for d in docs) == 15
    model = corpus.train_spm(path, tmp_path / "spm", vocab_size=600)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    texts = corpus.read_corpus(path)
    assert all(sp.decode(sp.encode(t)) == t for t in texts)
    odd = "def f():\n\tif x:  # café ✓\n        return '\\n'\n\n"
    assert sp.decode(sp.encode(odd)) == odd
    assert len(sp.encode(texts[1])) < len(texts[1].encode()) / 2  # it actually compresses


def test_execute_resume_build_and_pipeline(suite, tmp_path):
    log = dataset.execute_corpus(suite, tmp_path, scripts_per_task=3, workers=2, progress=False)
    lines = log.read_text().splitlines()
    assert len(lines) == 6
    # Simulate an interrupted build: two complete records and a torn third line.
    log.write_text("\n".join(lines[:2]) + "\n" + lines[2][:20])
    dataset.execute_corpus(suite, tmp_path, scripts_per_task=3, workers=2, progress=False)
    recs = []
    for line in log.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    assert len(recs) == 6
    assert {(r["task_id"], r["index"]) for r in recs} == {
        (t, i) for t in ("tiny-train", "tiny-heldout") for i in range(3)
    }
    assert [json.loads(x) for x in lines[:2]] == recs[:2]  # kept, not re-executed
    for r in recs:
        assert r["status_name"] == Status(r["status"]).name
        if r["status_name"] == "VALID":
            assert r["reward"] == pytest.approx(0.5 + 0.5 * r["percentile"])

    # Fewer scripts per held-out task: a fresh build executes only those, and the records read
    # back from the bigger corpus above are exactly the fresh build's (same scripts, outcomes).
    small = dataset.execute_corpus(
        suite, tmp_path / "small", scripts_per_task=3, heldout_scripts_per_task=1, workers=2,
        progress=False,
    )  # fmt: skip
    fresh = dataset.corpus_records(small, 3, 1)
    assert sorted((r["task_id"], r["index"]) for r in fresh) == [
        ("tiny-heldout", 0), ("tiny-train", 0), ("tiny-train", 1), ("tiny-train", 2)
    ]  # fmt: skip
    assert len(small.read_text().splitlines()) == 4
    outcome = lambda r: (r["task_id"], r["index"], r["script"], r["status"], r["score"])
    assert [outcome(r) for r in dataset.corpus_records(log, 3, 1)] == [outcome(r) for r in fresh]
    assert len(dataset.corpus_records(log, 3)) == 6

    dataset.build_dataset(log, tmp_path / "tfds")
    src = dataset.data_source(tmp_path / "tfds", "train")
    held = dataset.data_source(tmp_path / "tfds", "heldout")
    assert len(src) == 3 and len(held) == 3
    ex = src[0]
    assert ex["task_id"] == b"tiny-train"
    assert b"SUBMISSION_PATH" in ex["script"]
    errs = [src[i] for i in range(3) if src[i]["status"] == int(Status.RUNTIME_ERROR)]
    assert all(e["stderr_tail"] for e in errs)

    ds = dataset.make_pipeline(
        tmp_path / "tfds",
        "train",
        batch_size=2,
        seq_len=256,
        max_card_tokens=64,
        drop_remainder=False,
    )
    batches = list(ds)
    assert [b["tokens"].shape for b in batches] == [(2, 256), (1, 256)]
    b = batches[0]
    assert b["tokens"].dtype == np.int32 and b["mask"].shape == (2, 256)
    assert np.all(b["tokens"][b["mask"] == 0] == 0)
    assert np.all(b["mask"].sum(1) == 256)  # card (64) + script > 256 bytes: full
    # the script separator survives the card cut
    first = bytes(int(t) - 4 for t in b["tokens"][0][:256] if t >= 4)
    assert dataset.SEP.encode() in first
    statuses = sorted(int(s) for bb in batches for s in bb["status"])
    assert statuses == sorted(int(src[i]["status"]) for i in range(3))
    bucketed = list(
        dataset.make_pipeline(
            tmp_path / "tfds",
            "train",
            batch_size=3,
            seq_len=4096,
            max_card_tokens=64,
            bucket_lengths=(64, 4096, 1024),
            shuffle=False,
        )
    )
    width = bucketed[0]["tokens"].shape[1]
    assert width in (1024, 4096) and width >= bucketed[0]["mask"].sum(1).max()


def test_trim_to_bucket_hand_numbers():
    mask = np.zeros((3, 16), np.int32)
    mask[0, :5] = 1
    mask[1, :9] = 1
    batch = {
        "tokens": np.arange(48, dtype=np.int32).reshape(3, 16),
        "mask": mask,
        "status": np.zeros(3, np.int32),
    }
    out = dataset.trim_to_bucket(batch, [4, 8, 12])
    assert out["tokens"].shape == (3, 12) and out["mask"].shape == (3, 12)  # longest row 9
    np.testing.assert_array_equal(out["tokens"], batch["tokens"][:, :12])
    assert dataset.trim_to_bucket(batch, [4, 8])["tokens"].shape == (3, 16)  # none fits
    short = {**batch, "mask": np.zeros((3, 16), np.int32)}
    assert dataset.trim_to_bucket(short, [4, 8])["tokens"].shape == (3, 4)


def test_execute_on_episode_tasks_records_observation_fields(suite, tmp_path):
    """With episode_root every script runs on its task's multi-turn episode task: the same
    scripts, a validation score for each VALID one, and a log that is not mixed with the
    single-turn kind."""
    log = dataset.execute_corpus(
        suite, tmp_path, scripts_per_task=3, workers=2, progress=False,
        episode_root=tmp_path / "episodes",
    )  # fmt: skip
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(recs) == 6 and all(r["episode"] for r in recs)
    assert (tmp_path / "episodes" / "tiny-train" / "private" / "validation_labels.csv").is_file()
    for r in recs:
        assert "- Rows: 72 train, 48 test" in r["card"]  # the episode task's card
        assert (r["validation"] is not None) == (r["status_name"] == "VALID")
        assert (r["error_type"] != "none") == (r["status_name"] == "RUNTIME_ERROR")
    with pytest.raises(ValueError, match="episode_root set; use another data_dir"):
        dataset.execute_corpus(suite, tmp_path, scripts_per_task=4, workers=1, progress=False)
