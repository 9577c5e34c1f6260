"""The AutoResearch trainer as two real JAX processes on localhost (CPU collectives over gloo),
2 devices each, against one process with the same 4 devices, on the tiny setting (2 RL steps).

What must not depend on the layout: the generated scripts and their rewards (the journals'
script hashes and outcomes), the step metrics, the anchor pairs, the held-out curve, the
counters, the replay buffer and the final parameters. Generation is replicated across the
mesh and the per-row forward passes are partitioned alike in both layouts, so the scripts are
identical; the gradient all-reduce sums in another order across processes (gloo) than within
one, so parameters agree to float tolerance (about 1e-8 here), not bitwise.

All three are in `-m slow` (`make test-slow`): the first launches the two processes once, the
second also stops them after step 1 and resumes across processes, the third builds the stages
with two processes from nothing. Each launch compiles every step in both processes at once on
the 2-core CI machine (~2 min with the one-process reference), so the fast suite keeps the
tiny version: `tests/test_distributed.py::test_two_cpu_processes_on_localhost`, two real JAX
processes joined over localhost, with the host helpers the trainer uses.
"""

import json

import numpy as np
import pytest
from flax import traverse_util

from tests.support.multiprocess_helpers import run_local_processes
from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch.checkpoint import Checkpointer
from wmrl.autoresearch.experiment import run

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

STEP_KEYS = ("step", "real_executions_step", "anchor_fraction", "anchor_outcomes_from_step",
             "anchor_status", "mean_script_tokens", "calibrated", "real_executions")  # fmt: skip
CLOSE_KEYS = ("train_reward", "anchor_weight", "policy_kl", "wm_anchor_mae", "wm_rank_corr")


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def journal(*paths):
    """{(step, row): (script hash, status, reward)}, asserting no execution appears twice."""
    recs = [r for p in paths for r in read_jsonl(p)]
    out = {(r["step"], r["row"]): (r["sha"], r["status"], r["reward"]) for r in recs}
    assert len(out) == len(recs), "an anchor was executed twice"
    return out


def flat(tree):
    return {
        "/".join(map(str, k)): np.asarray(v) for k, v in traverse_util.flatten_dict(tree).items()
    }


def read_checkpoint(wd):
    ckpt = Checkpointer(wd, keep=3)
    try:
        return ckpt.read_raw()
    finally:
        ckpt.close()


def single_process(wd, data_dir, init_dir, mode):
    """The reference: one process, the same 4-device data-parallel mesh."""
    config = tiny_config(data_dir, init_dir, mode=mode)
    config.mesh_shape = (4,)
    return run(config, wd, progress=False)


def two_processes(wd, data_dir, init_dir, mode, steps, logs):
    """2 processes x 2 CPU devices run the pipeline once per entry of `steps` (later ones
    resume); returns each process's view of the summary and the processes' outputs."""
    args = [str(wd), str(data_dir), str(init_dir), mode, *map(str, steps)]
    runs = run_local_processes("multiprocess_rl_worker.py", args, 2, devices=2, timeout=420)
    results = []
    for i, (returncode, text) in enumerate(runs):
        (logs / f"process{i}.log").write_text(text)
        assert returncode == 0, text[-4000:]
        line = next(ln for ln in text.splitlines() if ln.startswith("RESULT "))
        results.append(json.loads(line.removeprefix("RESULT ")))
    # Every process ends with the same summary (wall-clock included: it is agreed per step).
    assert [r.pop("process_index") for r in results] == [0, 1]
    assert results[0] == results[1]
    return results[0], [text for _, text in runs]


def assert_same_run(wd, ref_wd, ref_summary, seen, runs=1, extra_evals=()):
    """`wd` (two processes, `runs` runs; `seen` is what they returned) trained exactly like
    `ref_wd` (one process). Evaluations at `extra_evals` steps exist only in `wd`: they leave
    the training state and its RNG streams alone; `wd` resumed after each of them, so the
    step after one takes the pending anchors (rl.anchor_lag) from the journal."""
    summary = json.loads((wd / "summary.json").read_text())
    for key in ("steps", "real_executions", "wm_calls", "final_heldout_reward"):
        assert summary[key] == seen[key] == ref_summary[key], key
    extra = lambda r: r["step"] in extra_evals and r.get("kind", "eval") == "eval"
    no_clock = lambda curve: [
        {k: v for k, v in c.items() if k != "wall_time_s"} for c in curve if not extra(c)
    ]
    assert no_clock(summary["heldout_curve"]) == no_clock(ref_summary["heldout_curve"])

    # Each anchor executed exactly once across the hosts, spread over both, and the same
    # scripts (hashes) with the same outcomes as in one process.
    assert not (wd / "anchors.jsonl").exists()
    per_process = [wd / f"anchors.p{i}.jsonl" for i in range(2)]
    assert all(read_jsonl(p) for p in per_process)
    got = journal(*per_process)
    assert got == journal(ref_wd / "anchors.jsonl")
    assert len(got) == summary["real_executions"]

    # Only process 0 wrote the logs: one record per step and evaluation, and one TensorBoard
    # event file per run (process 1 would have added its own).
    records = [r for r in read_jsonl(wd / "metrics.jsonl") if not extra(r)]
    ref_records = read_jsonl(ref_wd / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in records] == [
        (r["kind"], r["step"]) for r in ref_records
    ]
    assert len(list((wd / "tb").glob("events.out.tfevents.*"))) == runs
    for r, ref in zip(records, ref_records, strict=True):
        if r["kind"] == "step":
            assert {k: r[k] for k in STEP_KEYS} == {k: ref[k] for k in STEP_KEYS}
            assert ref["reused_from_journal"] == 0  # the uninterrupted run executed them all
            resumed = r["step"] - 1 in extra_evals
            assert r["reused_from_journal"] == (r["real_executions_step"] if resumed else 0)
            for k in CLOSE_KEYS:
                if ref.get(k) is None:
                    assert r.get(k) is None, k
                else:
                    assert r[k] == pytest.approx(ref[k], rel=1e-4, abs=1e-5), k
        else:
            for k in ("heldout_reward", "heldout_per_task", "heldout_status_rates"):
                assert r[k] == ref[k], k
    pairs, ref_pairs = read_jsonl(wd / "pairs.jsonl"), read_jsonl(ref_wd / "pairs.jsonl")
    key = lambda p: (p["step"], p["row"], p["status"], p["r_env"])
    assert [key(p) for p in pairs] == [key(p) for p in ref_pairs]
    for p, ref in zip(pairs, ref_pairs, strict=True):
        assert p["r_wm"] == pytest.approx(ref["r_wm"], rel=1e-4, abs=1e-5)

    # The final checkpoints: same counters, replay buffer and parameters.
    (tree, meta), (ref_tree, ref_meta) = read_checkpoint(wd), read_checkpoint(ref_wd)
    for key in ("step", "real_executions", "wm_calls"):
        assert meta[key] == ref_meta[key]
    for name in ("count", "next", "tokens", "target", "class_label", "valid"):
        np.testing.assert_array_equal(tree["replay"][name], ref_tree["replay"][name])
    for part in ("policy", "wm"):
        got, want = flat(tree[part]["params"]), flat(ref_tree[part]["params"])
        assert set(got) == set(want)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def single_wmrl(rl_shared, tmp_path_factory):
    """The one-process reference run in mode wmrl (2 steps), shared by the tests below."""
    wd = tmp_path_factory.mktemp("single") / "wd"
    return wd, single_process(wd, *rl_shared, "wmrl")


@pytest.mark.slow
def test_two_processes_train_like_one(rl_shared, single_wmrl, tmp_path):
    """Mode wmrl on the shared stages, one launch of the two processes for both steps."""
    ref_wd, ref_summary = single_wmrl
    seen, _ = two_processes(tmp_path / "multi", *rl_shared, "wmrl", [2], tmp_path)
    assert_same_run(tmp_path / "multi", ref_wd, ref_summary, seen)


@pytest.mark.slow
def test_two_processes_train_like_one_and_resume(rl_shared, single_wmrl, tmp_path):
    """As above, but the two processes stop after step 1 and resume from their collective
    checkpoint, so restore across processes is exercised too."""
    ref_wd, ref_summary = single_wmrl
    seen, texts = two_processes(tmp_path / "multi", *rl_shared, "wmrl", [1, 2], tmp_path)
    assert all("resuming from the checkpoint of step 1" in text for text in texts)
    assert_same_run(tmp_path / "multi", ref_wd, ref_summary, seen, runs=2, extra_evals={1})


@pytest.mark.slow
def test_two_processes_build_the_stages_then_train_in_real_mode(tmp_path):
    """From nothing: process 0 builds the data stage first, both train the warm start and the
    WM together and save them collectively; then mode real (every group executed, so every
    step splits 4 anchor rows over the hosts). The reference reuses those stages."""
    data_dir, init_dir = tmp_path / "data", tmp_path / "init"
    seen, _ = two_processes(tmp_path / "multi", data_dir, init_dir, "real", [2], tmp_path)
    for stage in ("warmstart", "wm_pretrain"):
        assert (init_dir / stage / "done.json").exists()
    ref_summary = single_process(tmp_path / "single", data_dir, init_dir, "real")
    assert_same_run(tmp_path / "multi", tmp_path / "single", ref_summary, seen)
