"""One process of the multi-process policy-train-step test
(tests/models/test_multiprocess_train.py).

Usage:
    python tests/support/multiprocess_train_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT.npz

Joins the run, builds the sharded train state on a (2 data, 2 fsdp, 2 tensor) mesh spanning every
process's CPU devices, feeds only this process's rows of the global batch, runs one policy train
step, gathers the updated parameters and (process 0) saves them with the loss; then runs a few
WMRL steps (correction + policy update, `policy_step_case.wmrl_*`) and saves those parameters.
"""

import sys

import numpy as np

from wmrl import distributed


def main(coordinator: str, num_processes: int, process_id: int, out_path: str) -> None:
    spec = distributed.detect_cluster(
        {}, coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )
    distributed.maybe_initialize(spec)

    import jax
    import optax
    from flax import traverse_util

    from tests.support.policy_step_case import LOSS, LR, factory, global_batch
    from wmrl.models.sharding import make_mesh
    from wmrl.models.train_steps import (
        batch_shardings,
        init_train_state,
        make_policy_train_step,
    )

    mesh = make_mesh((2, 2, 2), jax.devices())
    tx = optax.sgd(LR)
    graphdef, state = init_train_state(factory, tx, mesh)
    batch = global_batch()
    rows = distributed.shard_for_process(len(batch["tokens"]))
    shardings = batch_shardings(batch, mesh)
    local = {
        k: jax.make_array_from_process_local_data(shardings[k], v[rows], v.shape)
        for k, v in batch.items()
    }
    step = make_policy_train_step(
        graphdef, tx, jax.tree.map(lambda x: x.sharding, state), batch, mesh, LOSS,
        num_micro_batches=2,
    )  # fmt: skip
    state, metrics = step(state, local)
    params = distributed.process_allgather_to_numpy(state.params)
    loss_sum, count = distributed.process_allgather_to_numpy(metrics["loss"])
    if distributed.is_main_process():
        flat = {"/".join(k): v for k, v in traverse_util.flatten_dict(params).items()}
        np.savez(out_path, loss=loss_sum / count, **flat)

    # A few WMRL steps: per step, the correction (replicated: every process computes the same
    # advantages from the same rewards) and the sharded policy update on this process's rows.
    from tests.support.policy_step_case import WMRL_STEPS, wmrl_advantages, wmrl_configs
    from wmrl.core.state import init_correction_state

    graphdef, state = init_train_state(factory, tx, mesh)
    correction = init_correction_state(wmrl_configs()[0])
    for s in range(WMRL_STEPS):
        correction, adv = wmrl_advantages(correction, s)
        b = {**batch, "advantages": adv}
        local = {
            k: jax.make_array_from_process_local_data(shardings[k], v[rows], v.shape)
            for k, v in b.items()
        }
        state, _ = step(state, local)
    params = distributed.process_allgather_to_numpy(state.params)
    if distributed.is_main_process():
        flat = {"/".join(k): v for k, v in traverse_util.flatten_dict(params).items()}
        np.savez(out_path.replace(".npz", "_wmrl.npz"), **flat)
    print(f"RESULT process {jax.process_index()} of {jax.process_count()} ok", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
