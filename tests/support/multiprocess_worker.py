"""One process of the localhost multi-process smoke test (run by tests/test_distributed.py).

Usage: python tests/support/multiprocess_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID

Joins the run through `wmrl.distributed`, builds a global array from per-process rows, gathers it
and reduces it with a jitted sum across all processes' devices; merges host-side results dealt
round-robin, agrees on a flag, passes a barrier and feeds a host batch that every process holds
as a global array; prints one JSON line.
"""

import json
import sys

import numpy as np

from wmrl import distributed


def main(coordinator: str, num_processes: int, process_id: int) -> None:
    spec = distributed.detect_cluster(
        {}, coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )
    called = distributed.maybe_initialize(spec)

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    rows = distributed.shard_for_process(8)
    global_rows = np.arange(8 * 3, dtype=np.float32).reshape(8, 3) ** 2
    local = global_rows[rows]
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("data")), local)
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(x)
    gathered = distributed.process_allgather_to_numpy({"x": x, "total": total})

    # Host-side work split round-robin, merged bit-exactly (float64 survives without x64).
    me = jax.process_index()
    owner = distributed.round_robin_owners(5)
    value = np.where(owner == me, np.arange(5) + 0.1 * (me + 1) + 1e-12, np.nan)
    merged = distributed.merge_from_owners({"value": value}, owner)["value"]
    distributed.barrier("smoke")
    # A host batch that every process holds in full, fed as each process's rows.
    data = NamedSharding(mesh, PartitionSpec("data"))
    fed = distributed.host_to_global(global_rows, data)
    fed_total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(fed)
    # A process-local device array (as the correction's advantages), placed the same way.
    on_device = jax.jit(lambda a: a + 1.0)(global_rows)
    placed = distributed.host_to_global(on_device, data)
    placed_total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(placed)
    out = {
        "initialize_called": called,
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "fully_addressable": x.is_fully_addressable,
        "rows": [rows.start, rows.stop],
        "main": distributed.is_main_process(),
        "gathered": gathered["x"].tolist(),
        "total": float(gathered["total"]),
        "merged": merged.tolist(),
        "agree": [distributed.all_processes(True), distributed.all_processes(me == 0)],
        "scalars": distributed.allgather_host(np.int64(10 + me)).tolist(),
        "fed_rows": sorted(s.index[0].start for s in fed.addressable_shards),
        "fed_total": float(distributed.process_allgather_to_numpy(fed_total)),
        "placed_rows": sorted(s.index[0].start for s in placed.addressable_shards),
        "placed_total": float(distributed.process_allgather_to_numpy(placed_total)),
    }
    print("RESULT " + json.dumps(out), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
