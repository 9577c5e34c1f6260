"""Launch scripts: the commands their dry runs print, and their real paths against fake
gcloud/sbatch/srun/scontrol binaries that record how they were called."""

import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
RECORD = 'printf "%s\\n" "$(basename "$0") $*" >> "$CALLS"\n'


def write_exe(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def fake_bin(tmp_path):
    """A PATH directory whose gcloud/sbatch/srun/scontrol/tar only record their arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("gcloud", "sbatch", "srun", "scontrol", "tar"):
        write_exe(bin_dir / name, RECORD)
    return bin_dir


def run_script(name, *args, bin_dir, extra_env=None, timeout=60):
    calls = bin_dir.parent / "calls.txt"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        **(extra_env or {}),
    }
    for key in [k for k in env if k.startswith("SLURM_")]:
        if not (extra_env and key in extra_env):
            del env[key]
    proc = subprocess.run(
        ["bash", str(LAUNCH / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    recorded = calls.read_text().splitlines() if calls.exists() else []
    return proc, recorded


def printed_commands(stdout: str) -> list[list[str]]:
    """The `+ ...` lines of a dry run, parsed back into argv lists as a shell would."""
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


TPU_ARGS = (
    "--name=wmrl-pod",
    "--zone=us-west4-a",
    "--accelerator_type=v5litepod-16",
    "--spot",
    "--config=configs/bandit.py",
    "--workdir=gs://bucket/run1",
    "--extra=--config.num_steps=40",
)


def test_tpu_vm_dry_run_copy(fake_bin):
    proc, recorded = run_script("tpu_vm.sh", *TPU_ARGS, "--copy", "--dry_run", bin_dir=fake_bin)
    assert proc.returncode == 0, proc.stderr
    assert recorded == []  # nothing executed
    cmds = printed_commands(proc.stdout)
    tpu = ["gcloud", "compute", "tpus", "tpu-vm"]
    assert [c[:5] for c in cmds if c[0] == "gcloud"] == [
        [*tpu, "describe"],
        [*tpu, "create"],
        [*tpu, "scp"],
        [*tpu, "ssh"],
        [*tpu, "ssh"],
        [*tpu, "ssh"],
    ]
    create = cmds[1]
    assert create[5:] == [
        "wmrl-pod",
        "--zone=us-west4-a",
        "--accelerator-type=v5litepod-16",
        "--version=v2-alpha-tpuv5-lite",
        "--spot",
    ]
    assert cmds[2][0] == "tar" and "--exclude=.venv" in cmds[2]
    for c in cmds[3:]:
        assert "--worker=all" in c and "--zone=us-west4-a" in c
    assert cmds[3][5] == f"{cmds[2][-2]}"  # scp copies the tarball that tar wrote
    install, run = (c[-1].removeprefix("--command=") for c in cmds[-2:])
    assert "pip install -q -r requirements.txt" in install and "jax[tpu]" in install
    assert "-r requirements-gcs.txt" in install  # a gs:// workdir needs the GCS clients
    assert run == (
        "cd wmrl && WMRL_TPU_POD=1 python3 -m wmrl.main --config=configs/bandit.py "
        "--workdir=gs://bucket/run1 --config.num_steps=40"
    )


def test_tpu_vm_dry_run_repo_url_preemptible_and_runtime(fake_bin):
    proc, recorded = run_script(
        "tpu_vm.sh",
        "--name=x",
        "--zone=europe-west4-a",
        "--project=my-proj",
        "--accelerator_type=v4-32",
        "--preemptible",
        "--repo_url=https://github.com/o/wmrl.git",
        "--branch=v1",
        "--config=configs/bandit.py",
        "--workdir=gs://b/r",
        "--dry_run",
        bin_dir=fake_bin,
    )
    assert proc.returncode == 0, proc.stderr
    assert recorded == []
    cmds = printed_commands(proc.stdout)
    create = next(c for c in cmds if c[4] == "create")
    assert "--preemptible" in create and "--spot" not in create
    assert "--version=tpu-ubuntu2204-base" in create and "--accelerator-type=v4-32" in create
    assert all("--project=my-proj" in c for c in cmds)
    clone = cmds[2][-1]
    assert clone == (
        "--command=rm -rf wmrl && git clone --depth=1 --branch=v1 "
        "https://github.com/o/wmrl.git wmrl"
    )
    assert not any(c[0] == "tar" or c[4] == "scp" for c in cmds)


@pytest.mark.parametrize(
    "args,message",
    [
        (("--zone=z", "--config=c", "--copy"), "missing --name --workdir"),
        (("--name=n", "--zone=z", "--config=c", "--workdir=gs://w"), "--repo_url=URL or --copy"),
        (
            ("--name=n", "--zone=z", "--config=c", "--workdir=gs://w", "--copy", "--repo_url=u"),
            "not both",
        ),
        (
            ("--name=n", "--zone=z", "--config=c", "--workdir=gs://w", "--spot", "--preemptible"),
            "exclusive",
        ),
        (("--bogus",), "unknown argument '--bogus'"),
    ],
)
def test_tpu_vm_bad_arguments(fake_bin, args, message):
    proc, recorded = run_script("tpu_vm.sh", *args, "--dry_run", bin_dir=fake_bin)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == "" and recorded == []


def test_tpu_vm_help_lists_every_option(fake_bin):
    proc, _ = run_script("tpu_vm.sh", "--help", bin_dir=fake_bin)
    assert proc.returncode == 0
    for option in (
        "--name",
        "--zone",
        "--accelerator_type",
        "--runtime_version",
        "--project",
        "--spot",
        "--preemptible",
        "--repo_url",
        "--branch",
        "--copy",
        "--config",
        "--workdir",
        "--extra",
        "--dry_run",
    ):
        assert f"  {option}" in proc.stdout, option


@pytest.mark.parametrize("exists", [False, True])
def test_tpu_vm_creates_only_a_missing_vm(fake_bin, exists):
    """Real mode against a fake gcloud whose describe fails when the VM does not exist."""
    describe = "echo READY" if exists else "exit 1"
    body = f'[[ "$4" == describe ]] && {{ {describe}; }}\nexit 0\n'
    write_exe(fake_bin / "gcloud", RECORD + body)
    args = (*TPU_ARGS[:-1], "--repo_url=https://example.com/wmrl.git")
    proc, recorded = run_script("tpu_vm.sh", *args, bin_dir=fake_bin)
    assert proc.returncode == 0, proc.stderr
    verbs = [line.split()[4] for line in recorded]
    assert verbs == ["describe", *([] if exists else ["create"]), "ssh", "ssh", "ssh"]
    assert ("reusing TPU VM wmrl-pod (state READY)" in proc.stdout) is exists
    assert recorded[-1].endswith(
        "--worker=all --command=cd wmrl && WMRL_TPU_POD=1 python3 -m wmrl.main "
        "--config=configs/bandit.py --workdir=gs://bucket/run1"
    )


def test_slurm_dry_run_derives_coordinator_from_nodelist(fake_bin):
    proc, recorded = run_script(
        "slurm_gpu.sh",
        "--dry_run",
        "--nodes=3",
        "--gpus_per_node=4",
        "--nodelist=gpu[07-09]",
        "--port=23456",
        "--partition=a100",
        "--config=configs/bandit.py",
        "--workdir=/shared/runs/r1",
        "--extra=--config.num_steps=40 --config.num_seeds=2",
        bin_dir=fake_bin,
    )
    assert proc.returncode == 0, proc.stderr
    assert recorded == []
    sbatch, scontrol, srun = printed_commands(proc.stdout)
    assert sbatch[:5] == [
        "sbatch",
        "--nodes=3",
        "--gpus-per-node=4",
        "--ntasks-per-node=1",
        f"--chdir={ROOT}",
    ]
    assert "--partition=a100" in sbatch
    assert sbatch[sbatch.index(str(LAUNCH / "slurm_gpu.sh")) + 1 :][:3] == [
        "--config=configs/bandit.py",
        "--workdir=/shared/runs/r1",
        "--port=23456",
    ]
    assert scontrol[:4] == ["scontrol", "show", "hostnames", "gpu[07-09]"]
    assert srun[:3] == ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert srun[3:5] == ["bash", "-c"] and '--process_id="$SLURM_PROCID"' in srun[5]
    assert srun[6:] == [
        "python",
        "--config=configs/bandit.py",
        "--workdir=/shared/runs/r1",
        "--coordinator_address=gpu07:23456",
        "--num_processes=3",
        "--config.num_steps=40",
        "--config.num_seeds=2",
    ]


@pytest.mark.parametrize(
    "nodelist,coordinator",
    [("n[008-010]-ib", "n008-ib"), ("cpu1,gpu[2-3]", "cpu1"), (None, "node001")],
)
def test_slurm_dry_run_first_host_forms(fake_bin, nodelist, coordinator):
    args = ["--dry_run", "--config=c", "--workdir=w"]
    if nodelist is not None:
        args.append(f"--nodelist={nodelist}")
    proc, _ = run_script("slurm_gpu.sh", *args, bin_dir=fake_bin)
    assert proc.returncode == 0, proc.stderr
    assert f"--coordinator_address={coordinator}:12355" in printed_commands(proc.stdout)[-1]


def test_slurm_inside_job_runs_every_task_with_its_process_id(fake_bin, tmp_path):
    """Batch mode with fake scontrol/srun: srun's command really runs once per task."""
    write_exe(fake_bin / "scontrol", RECORD + 'printf "gpu03\\ngpu04\\n"\n')
    write_exe(
        fake_bin / "srun",
        RECORD + 'while [[ "$1" == --* ]]; do shift; done\n'
        'for ((t = 0; t < SLURM_NTASKS; t++)); do SLURM_PROCID=$t "$@" || exit; done\n',
    )
    write_exe(tmp_path / "python", 'printf "%s\\n" "$*" >> "$CALLS.python"\n')
    proc, recorded = run_script(
        "slurm_gpu.sh",
        "--config=configs/bandit.py",
        "--workdir=/shared/r",
        bin_dir=fake_bin,
        extra_env={
            "SLURM_JOB_ID": "77",
            "SLURM_JOB_NODELIST": "gpu[03-04]",
            "SLURM_NTASKS": "2",
            "PYTHON": str(tmp_path / "python"),
            "WMRL_COORDINATOR_PORT": "31000",
        },
    )
    assert proc.returncode == 0, proc.stderr
    assert recorded[0] == "scontrol show hostnames gpu[03-04]"
    assert recorded[1].startswith("srun --ntasks-per-node=1")
    runs = (tmp_path / "calls.txt.python").read_text().splitlines()
    base = (
        "-m wmrl.main --config=configs/bandit.py --workdir=/shared/r "
        "--coordinator_address=gpu03:31000 --num_processes=2"
    )
    assert runs == [f"{base} --process_id=0", f"{base} --process_id=1"]


def test_slurm_outside_job_submits_itself(fake_bin):
    proc, recorded = run_script(
        "slurm_gpu.sh", "--nodes=4", "--config=c", "--workdir=w", bin_dir=fake_bin
    )
    assert proc.returncode == 0, proc.stderr
    assert len(recorded) == 1
    assert recorded[0].startswith("sbatch --nodes=4 --gpus-per-node=8 --ntasks-per-node=1")
    assert "slurm_gpu.sh --config=c --workdir=w --port=12355" in recorded[0]


def test_slurm_missing_config(fake_bin):
    proc, recorded = run_script("slurm_gpu.sh", "--dry_run", "--workdir=w", bin_dir=fake_bin)
    assert proc.returncode == 2 and "missing --config" in proc.stderr and recorded == []


def test_local_dry_run(fake_bin):
    proc, _ = run_script("local.sh", "--dry_run", bin_dir=fake_bin)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith(f"+ cd {ROOT} && ")
    assert " -m wmrl.main --config=configs/bandit.py --workdir=runs/bandit-20" in line
    proc, _ = run_script(
        "local.sh",
        "--dry_run",
        "configs/bandit.py",
        "/tmp/r",
        "--",
        "--config.num_steps=40",
        bin_dir=fake_bin,
    )
    assert proc.stdout.strip().endswith(
        "-m wmrl.main --config=configs/bandit.py --workdir=/tmp/r --config.num_steps=40"
    )


def test_local_multiprocess_dry_run(fake_bin):
    proc, _ = run_script(
        "local_multiprocess.sh",
        "--dry_run",
        "--num_processes=3",
        "--devices_per_process=2",
        "--port=23000",
        "--config=configs/bandit.py",
        "--workdir=/tmp/mp",
        bin_dir=fake_bin,
        extra_env={"PYTHON": "py"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        "+ env JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2 py -m "
        "wmrl.main --config=configs/bandit.py --workdir=/tmp/mp "
        f"--coordinator_address=127.0.0.1:23000 --num_processes=3 --process_id={i} "
        f"> /tmp/mp.logs/process_{i}.log 2>&1 &"
        for i in range(3)
    ]


def test_local_multiprocess_failure_stops_the_others(fake_bin, tmp_path):
    """One process failing must end the run at once, not after the peers time out."""
    write_exe(
        tmp_path / "python",
        'for a in "$@"; do [[ "$a" == --process_id=1 ]] && exit 3; done\nsleep 60\n',
    )
    start = time.monotonic()
    proc, _ = run_script(
        "local_multiprocess.sh",
        "--num_processes=3",
        "--config=c",
        f"--workdir={tmp_path / 'w'}",
        bin_dir=fake_bin,
        extra_env={"PYTHON": str(tmp_path / "python")},
    )
    assert time.monotonic() - start < 20
    assert proc.returncode == 1
    assert "process 1 failed (exit 3)" in proc.stderr


def test_local_multiprocess_success(fake_bin, tmp_path):
    write_exe(tmp_path / "python", 'echo "ran $*"\n')
    proc, _ = run_script(
        "local_multiprocess.sh",
        "--num_processes=2",
        "--config=c",
        f"--workdir={tmp_path / 'w'}",
        bin_dir=fake_bin,
        extra_env={"PYTHON": str(tmp_path / "python")},
    )
    assert proc.returncode == 0, proc.stderr
    for i in range(2):
        log = (tmp_path / "w.logs" / f"process_{i}.log").read_text()
        assert log.startswith("ran -m wmrl.main --config=c") and f"--process_id={i}" in log
