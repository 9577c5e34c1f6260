"""Workdirs on Cloud Storage (`--workdir=gs://...`), without a network: `gs://` is served by an
in-memory object store with GCS's semantics (tests/support/fake_gcs.py, fixture `fake_gcs`), through
fsspec for epath and through the GCS JSON API for Orbax's TensorStore. Each test checks that
the artefacts landed in the store (not in a local `gs:` folder) with the right content."""

import json
import sys

import numpy as np
import pytest
from absl import flags
from etils import epath

from tests.support.bandit_cli import TINY
from tests.support.rl_fixtures import ROOT, load_config, tiny_config
from wmrl import storage
from wmrl.autoresearch import stages
from wmrl.autoresearch.anchors import AnchorJournal
from wmrl.experiment import stages as xstages
from wmrl.jsonl import JsonlWriter, read_jsonl

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs


def main_in_process(monkeypatch, workdir, *overrides):
    """`python -m wmrl.main --config=configs/bandit.py --workdir=...` in this process (the
    fake store lives here). The config flag reads its `--config.*` overrides from sys.argv."""
    from wmrl import main as wmain

    argv = ["wmrl.main", f"--config={ROOT / 'configs' / 'bandit.py'}", f"--workdir={workdir}",
            *overrides]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    flags.FLAGS(argv)
    try:
        wmain.main([])
    finally:
        flags.FLAGS.unparse_flags()
        for name in [n for n in flags.FLAGS if n.startswith("config.")]:
            delattr(flags.FLAGS, name)  # the overrides' flags, defined by that parse


def test_bandit_main_writes_every_artefact_to_gs(fake_gcs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a gs:// path taken for a local one would land here
    wd = f"{fake_gcs.root}/runs/bandit"
    main_in_process(monkeypatch, wd, *TINY)
    assert list(tmp_path.iterdir()) == []
    plots = ["plots/suboptimality_vs_cost.png", "plots/suboptimality_vs_steps.png"]
    assert fake_gcs.listing(wd) == ["config.json", "metrics.jsonl", *plots, "summary.json"]
    printed = json.loads(capsys.readouterr().out)
    assert printed["workdir"] == wd

    cfg = json.loads(fake_gcs.text(f"{wd}/config.json"))
    assert cfg["num_steps"] == 40 and cfg["variants"] == ["real", "wmrl"]
    rows = [json.loads(line) for line in fake_gcs.text(f"{wd}/metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows] == [10, 20, 30, 40]
    assert set(rows[0]["variants"]) == {"real", "wmrl"}
    summary = json.loads(fake_gcs.text(f"{wd}/summary.json"))
    assert {v: s["final_suboptimality"] for v, s in summary["variants"].items()} == (
        printed["final_suboptimality"]
    )
    for name in plots:
        png = fake_gcs.read(f"{wd}/{name}")
        assert png.startswith(b"\x89PNG") and len(png) > 1000
    # Read back through epath, as a user would.
    assert json.loads((epath.Path(wd) / "summary.json").read_text()) == summary

    before = fake_gcs.read(f"{wd}/summary.json")
    with pytest.raises(SystemExit) as exit_:
        main_in_process(monkeypatch, wd, *TINY)
    assert exit_.value.code == 2
    assert "already holds a finished run" in capsys.readouterr().err
    assert fake_gcs.read(f"{wd}/summary.json") == before


def test_jsonl_writer_rewrites_whole_objects_and_appends_locally(fake_gcs, tmp_path):
    url = f"{fake_gcs.root}/run/metrics.jsonl"
    with pytest.raises(NotImplementedError):  # the store, like GCS, cannot append
        epath.Path(url).open("a")
    w = JsonlWriter(url)
    w.write([{"step": 1}, {"step": 2}])
    assert not epath.Path(url).exists()  # nothing is uploaded before a flush
    w.flush()
    assert read_jsonl(url) == [{"step": 1}, {"step": 2}]
    w.write([{"step": 3}])
    w.close()
    assert fake_gcs.text(url) == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'
    # A resumed run keeps the records its checkpoint covers, then continues the file.
    w = JsonlWriter(url)
    w.keep_only(lambda r: r["step"] <= 2)
    assert read_jsonl(url) == [{"step": 1}, {"step": 2}]
    w.write([{"step": 3, "again": True}])
    w.close()
    assert read_jsonl(url)[-1] == {"step": 3, "again": True}
    w.delete()
    assert not epath.Path(url).exists()

    # Locally every write is in the file at once, as before.
    local = tmp_path / "metrics.jsonl"
    w = JsonlWriter(local)
    w.write([{"step": 1}, {"step": 2}])
    assert read_jsonl(local) == [{"step": 1}, {"step": 2}]
    w.keep_only(lambda r: r["step"] <= 1)
    w.write([{"step": 2, "again": True}])
    assert read_jsonl(local) == [{"step": 1}, {"step": 2, "again": True}]
    w.close()


def test_anchor_journal_on_gs_is_uploaded_at_each_flush(fake_gcs, monkeypatch):
    path = epath.Path(f"{fake_gcs.root}/run/anchors.jsonl")
    journal = AnchorJournal(path)
    rec = journal.record(0, 1, "print(1)", "iris-species", 5, 0.75)  # VALID
    assert not path.exists()  # no append, no fsync on an object store: buffered
    journal.flush()  # what the RL loop does at the end of every step
    assert read_jsonl(path) == [rec]
    journal.close()
    # A resumed run reads the journal back; past FLUSH_EVERY_S a record uploads at once.
    monkeypatch.setattr(AnchorJournal, "FLUSH_EVERY_S", 0.0)
    resumed = AnchorJournal(path)
    assert resumed.lookup(0, 1, "print(1)") == rec
    assert resumed.lookup(0, 1, "print(2)") is None  # another script: not a hit
    rec2 = resumed.record(1, 0, "x = 1", "iris-species", 6, None)  # UNGRADED
    assert read_jsonl(path) == [rec, rec2]
    resumed.close()


def test_stage_params_round_trip_through_orbax_on_gs(fake_gcs):
    config = load_config()
    stage_dir = epath.Path(f"{fake_gcs.root}/init/warmstart")
    params = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float32)}
    stages.save_params(stage_dir, params, {"final_nll": 1.5}, config)
    names = fake_gcs.listing(stage_dir)
    assert "done.json" in names and "params/commit_success.txt" in names
    assert ("tensorstore", "put") in fake_gcs.requests  # the arrays went by the JSON API
    assert stages.stage_done(stage_dir, config)["final_nll"] == 1.5
    restored = xstages.load_params(stage_dir, params)
    for k, v in params.items():
        np.testing.assert_array_equal(np.asarray(restored[k]), v)


def test_missing_client_library_is_named_before_the_run():
    pytest.importorskip("etils.epath")
    try:
        import s3fs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("s3fs is installed")
    with pytest.raises(ValueError, match="s3fs"):
        storage.check_backend(epath.Path("s3://bucket/run"))
    storage.check_backend(epath.Path("runs/local"))  # local: nothing to check


# Slow: the fast suite keeps the bandit pipeline on gs://, the journal and orbax round trips on
# it, and the local corrupt-checkpoint fallback (tests/autoresearch/test_resume.py).
@pytest.mark.slow
def test_autoresearch_on_gs_resumes_past_a_corrupt_checkpoint(
    fake_gcs, rl_shared, tmp_path, monkeypatch, capsys
):
    """The whole RL pipeline with its workdir and init_dir on gs:// (the data stage stays
    local): artefacts, checkpoints through TensorStore; then a corrupt latest checkpoint is
    set aside on the store, the run resumes from the previous one, and the redone step takes
    its executions from the journal uploaded at the end of that step."""
    from wmrl.autoresearch.experiment import run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(AnchorJournal, "FLUSH_EVERY_S", 1e9)  # uploads at step ends only
    data_dir, _ = rl_shared
    wd, init = f"{fake_gcs.root}/runs/ar", f"{fake_gcs.root}/init"
    first = run(tiny_config(data_dir, init, mode="wmrl"), wd, progress=False)
    assert list(tmp_path.iterdir()) == []
    # The journal is uploaded at the end of each of the 2 steps, the logs before each of the
    # 3 checkpoints (steps 0, 1, 2); closing uploads nothing more.
    assert fake_gcs.uploads["runs/ar/anchors.jsonl"] == 2
    assert fake_gcs.uploads["runs/ar/metrics.jsonl"] == 3
    names = fake_gcs.listing(wd)
    files = ["metrics.jsonl", "pairs.jsonl", "anchors.jsonl", "summary.json"]
    for name in [*files, "checkpoints/1/commit_success.txt", "checkpoints/2/commit_success.txt"]:
        assert name in names, name
    for name in ("heldout_reward.png", "wm_calibration.png", "corrections.png"):
        assert fake_gcs.read(f"{wd}/plots/{name}").startswith(b"\x89PNG")
    events = [n for n in names if n.startswith("tb/events.out.tfevents.")]
    assert len(events) == 1 and len(fake_gcs.read(f"{wd}/{events[0]}")) > 100
    assert {"warmstart/done.json", "wm_pretrain/done.json"} <= set(fake_gcs.listing(init))
    assert json.loads(fake_gcs.text(f"{wd}/summary.json")) == json.loads(json.dumps(first))
    metrics = read_jsonl(f"{wd}/metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in metrics] == [
        ("eval", 0), ("step", 1), ("step", 2), ("eval", 2)
    ]  # fmt: skip
    journal = read_jsonl(f"{wd}/anchors.jsonl")
    assert len(journal) == first["real_executions"]
    # Pairs: every journalled outcome the run trained on (rl.anchor_lag: the last step's
    # anchors, step index 1, were executed but not trained on).
    real = {(j["step"] + 1, j["row"]): j["reward"] for j in journal
            if j["reward"] is not None and j["step"] < 1}  # fmt: skip
    pairs = read_jsonl(f"{wd}/pairs.jsonl")
    assert {(p["step"], p["row"]): p["r_env"] for p in pairs} == pytest.approx(real)

    # Corrupt the latest checkpoint's data, then run one step further.
    for name in fake_gcs.listing(f"{wd}/checkpoints/2"):
        if name.startswith("state/") and fake_gcs.read(f"{wd}/checkpoints/2/{name}"):
            fake_gcs.overwrite(f"{wd}/checkpoints/2/{name}", b"\0" * 8)
    capsys.readouterr()
    second = run(tiny_config(data_dir, init, mode="wmrl", rl__steps=3), wd, progress=False)
    out = capsys.readouterr().out
    assert "could not be restored" in out and "resuming from the checkpoint of step 1" in out
    names = fake_gcs.listing(wd)
    assert any(n.startswith("checkpoints_corrupt/2-") for n in names)
    assert "checkpoints/3/commit_success.txt" in names
    steps = [r for r in read_jsonl(f"{wd}/metrics.jsonl") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    redone = steps[1]
    assert redone["reused_from_journal"] == redone["real_executions_step"] > 0
    journal = read_jsonl(f"{wd}/anchors.jsonl")
    keys = [(j["step"], j["row"]) for j in journal]
    assert len(keys) == len(set(keys)) == second["real_executions"]
    assert second["steps"] == 3
