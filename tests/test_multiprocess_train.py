"""Real multi-process JAX on localhost: 2 CPU processes x 4 devices run the sharded policy train
step on their halves of one global batch; the update equals a single-process reference."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util

from tests.multiprocess_train_case import LR, factory, global_batch
from wmrl.core.grpo import token_policy_loss
from wmrl.models.transformer import token_logprobs

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _single_process_reference():
    """Plain full-batch loss and SGD update: no jit, no mesh, no processes."""
    model = factory()
    b = jax.tree.map(jnp.asarray, global_batch())

    def loss(m):
        logp = token_logprobs(m, b["tokens"], b["input_mask"])
        s, _ = token_policy_loss(
            logp,
            b["old_logp"],
            b["ref_logp"],
            b["advantages"],
            b["loss_mask"],
            clip_eps=0.2,
            kl_coef=0.05,
        )
        return s / b["loss_mask"].sum()

    value, grads = nnx.value_and_grad(loss)(model)
    params = nnx.to_pure_dict(nnx.state(model))
    new = jax.tree.map(lambda p, g: p - LR * g, params, nnx.to_pure_dict(grads))
    return float(value), {
        "/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(new).items()
    }


def test_policy_train_step_across_two_processes_equals_single_process(tmp_path):
    out = tmp_path / "params.npz"
    coordinator = f"127.0.0.1:{_free_port()}"
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "PYTHONPATH": str(ROOT),
    }
    worker = str(ROOT / "tests" / "multiprocess_train_worker.py")
    procs = [
        subprocess.Popen(
            [sys.executable, worker, coordinator, "2", str(pid), str(out)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pid in range(2)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            p.kill()
    for p, text in zip(procs, outputs, strict=True):
        assert p.returncode == 0, text[-3000:]
        assert "RESULT process" in text and "of 2 ok" in text
    ref_loss, ref_params = _single_process_reference()
    got = np.load(out)
    np.testing.assert_allclose(float(got["loss"]), ref_loss, rtol=1e-5)
    assert set(got.files) - {"loss"} == set(ref_params)
    for name, want in ref_params.items():
        np.testing.assert_allclose(got[name], want, atol=2e-6, rtol=1e-4, err_msg=name)
