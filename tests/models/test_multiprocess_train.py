"""Real multi-process JAX on localhost: 2 CPU processes x 4 devices run the sharded policy train
step on their halves of one global batch, then a few WMRL steps (the trainer's correction +
the update); both equal a single-process reference."""

import numpy as np
import pytest
from flax import traverse_util

from tests.support.multiprocess_helpers import run_local_processes
from tests.support.policy_step_case import single_process_reference, wmrl_reference


# Slow: the suite's multi-process run is tests/autoresearch/test_multiprocess.py (the whole
# trainer over two processes, whose sharded policy and WM updates this test checks in isolation).
@pytest.mark.slow
def test_policy_train_step_across_two_processes_equals_single_process(tmp_path):
    out = tmp_path / "params.npz"
    results = run_local_processes("multiprocess_train_worker.py", [str(out)], 2, devices=4)
    for returncode, text in results:
        assert returncode == 0, text[-3000:]
        assert "RESULT process" in text and "of 2 ok" in text
    ref_loss, ref_params = single_process_reference()
    want = {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(ref_params).items()}
    got = np.load(out)
    np.testing.assert_allclose(float(got["loss"]), float(ref_loss), rtol=1e-5)
    assert set(got.files) - {"loss"} == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, atol=2e-6, rtol=1e-4, err_msg=name)
    # A few WMRL steps (monotone map + anchor weight + GRPO + update) equal a single process's.
    want = {
        "/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(wmrl_reference()).items()
    }
    got = np.load(tmp_path / "params_wmrl.npz")
    assert set(got.files) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, atol=5e-6, rtol=1e-4, err_msg=name)
