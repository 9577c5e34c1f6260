"""One process of the multi-process AutoResearch test (tests/autoresearch/test_multiprocess.py).

Usage: python tests/support/multiprocess_rl_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID WORKDIR
           DATA_DIR INIT_DIR MODE STEPS [STEPS ...]

Joins the run as `wmrl.main` does, then runs the tiny AutoResearch pipeline in MODE with the
given data and init dirs (built collectively if missing), once per STEPS value on the same
workdir (a later value resumes from the checkpoint of the earlier run). The mesh is the
multi-process default: every device of every process, data-parallel. Prints one
`RESULT {json}` line with what this process saw.
"""

import json
import sys

from wmrl import distributed


def main(argv: list[str]) -> None:
    coordinator, num_processes, process_id, workdir, data_dir, init_dir, mode, *steps = argv
    spec = distributed.detect_cluster(
        {}, coordinator_address=coordinator, num_processes=int(num_processes),
        process_id=int(process_id),
    )  # fmt: skip
    distributed.maybe_initialize(spec)

    import jax

    from tests.support.rl_fixtures import tiny_config
    from wmrl.autoresearch.experiment import run

    for n in steps:
        config = tiny_config(data_dir, init_dir, mode=mode, rl__steps=int(n))
        summary = run(
            config, workdir, write_outputs=distributed.writes_outputs(spec), progress=False
        )
    keys = ("steps", "real_executions", "wm_calls", "final_heldout_reward", "heldout_curve")
    out = {"process_index": jax.process_index(), **{k: summary[k] for k in keys}}
    print("RESULT " + json.dumps(out), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
