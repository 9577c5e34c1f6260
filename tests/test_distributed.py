"""Multi-host runtime: detection from fake environments, init only when multi-process, and a real
two-process run on localhost over JAX's CPU collectives."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.multiprocess_helpers import run_local_processes
from wmrl import distributed
from wmrl.distributed import ClusterSpec, detect_cluster, expand_nodelist

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "nodelist,hosts",
    [
        ("gpu5", ["gpu5"]),
        ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
        ("a[9-11]", ["a9", "a10", "a11"]),
        ("n[008-010]-ib", ["n008-ib", "n009-ib", "n010-ib"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("x1,y[3],z", ["x1", "y3", "z"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["node[01-03", "node]1[", "node[a-b]", "node[1-]", ""])
def test_expand_nodelist_rejects_malformed(bad):
    with pytest.raises(ValueError, match="nodelist"):
        expand_nodelist(bad)


def test_single_process_when_nothing_detected():
    assert detect_cluster({}) is None
    assert detect_cluster({"HOME": "/root", "SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}) is None
    assert detect_cluster({"TPU_WORKER_HOSTNAMES": "t-0"}) is None


def test_explicit_flags():
    spec = detect_cluster({}, coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3)
    assert spec == ClusterSpec("flags", "10.0.0.1:1234", 4, 3)
    assert spec.initialize_kwargs() == {
        "coordinator_address": "10.0.0.1:1234",
        "num_processes": 4,
        "process_id": 3,
        "cluster_detection_method": "deactivate",
    }


def test_explicit_flags_with_one_process_is_single_process():
    assert detect_cluster({}, coordinator_address="h:1", num_processes=1, process_id=0) is None


@pytest.mark.parametrize(
    "given,missing",
    [
        ({"coordinator_address": "h:1"}, ["--num_processes", "--process_id"]),
        ({"num_processes": 2}, ["--coordinator_address", "--process_id"]),
        ({"process_id": 0}, ["--coordinator_address", "--num_processes"]),
        ({"coordinator_address": "h:1", "num_processes": 2}, ["--process_id"]),
        ({"num_processes": 2, "process_id": 1}, ["--coordinator_address"]),
    ],
)
def test_partial_flags_name_the_missing_ones(given, missing):
    with pytest.raises(ValueError) as err:
        detect_cluster({}, **given)
    text = str(err.value)
    assert f"missing {', '.join(missing)} " in text
    for name in {"--coordinator_address", "--num_processes", "--process_id"} - set(missing):
        assert name not in text.split("(given")[0]


@pytest.mark.parametrize(
    "kwargs,problem",
    [
        ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2}, "process_id"),
        ({"coordinator_address": "h:1", "num_processes": 0, "process_id": 0}, "num_processes"),
        ({"coordinator_address": "h", "num_processes": 2, "process_id": 0}, "HOST:PORT"),
        ({"coordinator_address": "h:x", "num_processes": 2, "process_id": 0}, "HOST:PORT"),
    ],
)
def test_inconsistent_flags_are_rejected(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        detect_cluster({}, **kwargs)


def slurm_env(**extra):
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_NTASKS": "4",
        "SLURM_NNODES": "4",
        "SLURM_PROCID": "2",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "gpu[07-08,11],cpu1",
    }
    env.update(extra)
    return env


def test_slurm_one_task_per_node():
    spec = detect_cluster(slurm_env())
    assert spec == ClusterSpec("slurm", "gpu07:12355", 4, 2, None)
    # All of the node's GPUs stay visible: JAX's own SLURM detection is switched off.
    assert spec.initialize_kwargs()["cluster_detection_method"] == "deactivate"
    assert "local_device_ids" not in spec.initialize_kwargs()


def test_slurm_step_variables_and_port_override():
    env = slurm_env(
        SLURM_STEP_NODELIST="gpu[08-09]",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_NUM_NODES="2",
        SLURM_PROCID="1",
        WMRL_COORDINATOR_PORT="23456",
    )
    assert detect_cluster(env) == ClusterSpec("slurm", "gpu08:23456", 2, 1, None)


def test_slurm_several_tasks_per_node_pick_their_gpu():
    env = slurm_env(SLURM_NTASKS="8", SLURM_NNODES="2", SLURM_PROCID="7", SLURM_LOCALID="3")
    assert detect_cluster(env).local_device_ids == (3,)
    assert detect_cluster(env).initialize_kwargs()["local_device_ids"] == [3]
    # SLURM already bound one GPU to the task: it is device 0 of that process, leave it alone.
    bound = {**env, "CUDA_VISIBLE_DEVICES": "3"}
    assert detect_cluster(bound).local_device_ids is None


def test_slurm_errors_are_named():
    with pytest.raises(ValueError, match="SLURM_PROCID"):
        detect_cluster({k: v for k, v in slurm_env().items() if k != "SLURM_PROCID"})
    with pytest.raises(ValueError, match="SLURM_NTASKS='four'"):
        detect_cluster(slurm_env(SLURM_NTASKS="four"))


def test_flags_take_precedence_over_slurm():
    spec = detect_cluster(slurm_env(), coordinator_address="c:9", num_processes=2, process_id=0)
    assert spec.source == "flags" and spec.coordinator_address == "c:9"


@pytest.mark.parametrize(
    "env",
    [
        {"TPU_WORKER_HOSTNAMES": "t-0,t-1,t-2,t-3", "TPU_WORKER_ID": "1"},
        {"TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.2:8476"},
        {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "0"},
        {"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.1"},
        {"WMRL_TPU_POD": "1", "CLOUD_TPU_TASK_ID": "0"},
    ],
)
def test_tpu_pod_lets_jax_detect_everything(env):
    spec = detect_cluster(env)
    assert spec == ClusterSpec("tpu")
    assert spec.initialize_kwargs() == {}


def test_maybe_initialize_none_never_calls_jax_distributed(monkeypatch):
    import jax

    def fail(**kwargs):
        raise AssertionError(f"jax.distributed.initialize called with {kwargs}")

    monkeypatch.setattr(jax.distributed, "initialize", fail)
    assert distributed.maybe_initialize(None) is False


def test_maybe_initialize_passes_the_spec(monkeypatch):
    import jax

    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(distributed, "backends_initialized", lambda: False)
    spec = ClusterSpec("flags", "h:1", 2, 1)
    assert distributed.maybe_initialize(spec) is True
    assert calls == [spec.initialize_kwargs()]
    assert distributed.maybe_initialize(ClusterSpec("tpu")) is True
    assert calls[-1] == {}


def test_maybe_initialize_refuses_after_backend_start(monkeypatch):
    import jax

    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: None)
    jax.devices()
    assert distributed.backends_initialized() is True
    with pytest.raises(RuntimeError, match="before any JAX"):
        distributed.maybe_initialize(ClusterSpec("flags", "h:1", 2, 0))


def test_writes_outputs_only_on_process_zero():
    assert distributed.writes_outputs(None)
    assert distributed.writes_outputs(ClusterSpec("flags", "h:1", 2, 0))
    assert not distributed.writes_outputs(ClusterSpec("slurm", "h:1", 2, 1))


def test_shard_for_process():
    assert distributed.shard_for_process(12, 0, 3) == slice(0, 4)
    assert distributed.shard_for_process(12, 2, 3) == slice(8, 12)
    assert distributed.shard_for_process(5) == slice(0, 5)  # single process: everything
    with pytest.raises(ValueError, match="does not split evenly"):
        distributed.shard_for_process(10, 0, 3)
    with pytest.raises(ValueError, match="process_index 3"):
        distributed.shard_for_process(12, 3, 3)


def test_allgather_single_process_is_plain_conversion():
    import jax.numpy as jnp

    out = distributed.process_allgather_to_numpy({"a": jnp.arange(6).reshape(2, 3), "b": 2.5})
    assert isinstance(out["a"], np.ndarray)
    np.testing.assert_array_equal(out["a"], [[0, 1, 2], [3, 4, 5]])
    assert out["b"] == 2.5


def test_host_side_helpers_in_one_process():
    """Nothing to exchange in a single process: the helpers return their inputs."""
    np.testing.assert_array_equal(distributed.round_robin_owners(5, 2), [0, 1, 0, 1, 0])
    np.testing.assert_array_equal(distributed.round_robin_owners(3), [0, 0, 0])
    local = {"r": np.array([0.5, 1.5])}
    assert distributed.merge_from_owners(local, np.zeros(2, int)) == local
    assert distributed.allgather_host(np.float64(2.5)).shape == (1,)
    assert distributed.all_processes(True) and not distributed.all_processes(False)
    batch = {"x": np.ones(4)}
    assert distributed.host_to_global(batch, {"x": None}) is batch
    distributed.barrier("nothing to wait for")


def test_two_cpu_processes_on_localhost():
    """Real `jax.distributed` over gloo: 2 processes x 2 CPU devices, one global array."""
    runs = run_local_processes("multiprocess_worker.py", [], 2, devices=2)
    results = []
    for returncode, text in runs:
        assert returncode == 0, text[-3000:]
        line = next(ln for ln in text.splitlines() if ln.startswith("RESULT "))
        results.append(json.loads(line.removeprefix("RESULT ")))
    expected = (np.arange(24, dtype=np.float64).reshape(8, 3) ** 2).tolist()
    for pid, r in enumerate(results):
        assert r["initialize_called"] is True
        assert (r["process_index"], r["process_count"]) == (pid, 2)
        assert (r["device_count"], r["local_device_count"]) == (4, 2)
        assert r["fully_addressable"] is False
        assert r["rows"] == [4 * pid, 4 * pid + 4]
        assert r["main"] is (pid == 0)
        assert r["gathered"] == expected
        assert r["total"] == sum(k * k for k in range(24))
        # Items 0, 2, 4 from process 0 and 1, 3 from process 1, float64 bits intact.
        assert r["merged"] == [k + 0.1 * (k % 2 + 1) + 1e-12 for k in range(5)]
        assert r["agree"] == [True, False]
        assert r["scalars"] == [10, 11]
        assert r["fed_rows"] == [4 * pid, 4 * pid + 2]  # only this process's rows
        assert r["fed_total"] == r["total"]
        assert r["placed_rows"] == r["fed_rows"]
        assert r["placed_total"] == r["total"] + 24  # every one of the 24 values + 1


def test_main_rejects_partial_multiprocess_flags(tmp_path):
    wd = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "wmrl.main",
            "--config=configs/bandit.py",
            f"--workdir={wd}",
            "--num_processes=2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=120,
    )
    assert proc.returncode == 2
    assert "missing --coordinator_address, --process_id" in proc.stderr
    assert not wd.exists()
