"""Sandbox throughput and per-execution overhead.

    python -m wmrl.benchmarks.sandbox [--out=FILE.json] [--max_workers=N] [--batch=16]
    python -m wmrl.benchmarks.sandbox --executor=ray [--nodes=N] [--out=FILE.json]

Measures, on a small generated task:
  * ``overhead_s``: end-to-end seconds per execution of an empty script
    (submit -> graded result: work dir, isolation set-up, fork, teardown,
    grading), with the pre-imported template (the default) and with a fresh
    interpreter per execution (``prefork=False``) for comparison;
  * the start-up vs script-work split: importing numpy+pandas+scikit-learn
    in a fresh interpreter vs in the template, and a real training script;
  * ``executions_per_s`` on a fixed batch of real scripts with 1..N workers.

With ``--executor=ray`` (the Ray extra, docs/ray.md) it measures instead, on a simulated
cluster of ``--nodes`` one-CPU nodes on this machine (``ray.cluster_utils``; or the cluster at
``--ray_address``, all its nodes): ``ray_overhead_added_s``, the end-to-end seconds per empty
script through a one-node RayExecutor minus the same through a local one-slot pool, and
``executions_per_s_by_nodes``, the batch of real scripts with one slot per node on 1..N nodes.
The machine's load average is recorded with the numbers (``load_avg_1_5_15``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from absl import app, flags

EMPTY = "pass\n"
IMPORTS = "import numpy, pandas, sklearn.ensemble, sklearn.linear_model\n"
REAL = """
import os
import pandas as pd
from sklearn.ensemble import RandomForestClassifier
d = os.environ["DATA_DIR"]
tr = pd.read_csv(os.path.join(d, "train.csv"))
te = pd.read_csv(os.path.join(d, "test.csv"))
X = tr.drop(columns=["id", "target"])
m = RandomForestClassifier(n_estimators=30, random_state=0).fit(X, tr["target"])
pd.DataFrame({"id": te["id"], "target": m.predict(te.drop(columns=["id"]))}).to_csv(
    os.environ["SUBMISSION_PATH"], index=False)
"""


def _task(root: Path):
    """A 2000 x 20 generated classification task (no leaderboard: not needed here)."""
    import pandas as pd
    from sklearn.datasets import make_classification

    from wmrl.autoresearch.env.make_task import write_task
    from wmrl.autoresearch.env.task import load_task

    X, y = make_classification(n_samples=2000, n_features=20, random_state=0)
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(20)]).assign(target=y)
    return load_task(
        write_task(
            df, root / "bench", task_id="bench", target="target", metric="accuracy", time_limit_s=60
        )
    )


def _timed_runs(pool, task, script: str, n: int) -> tuple[float, float]:
    """(median end-to-end wall s, median in-sandbox runtime s) over n sequential runs."""
    walls, inside = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        r = pool.run(task, script)
        walls.append(time.perf_counter() - t0)
        inside.append(r.runtime_s)
        assert r.status.name in ("NO_SUBMISSION", "VALID"), r
    return statistics.median(walls), statistics.median(inside)


# Output a script writes, for the supervisor's cost per byte: one byte per write for
# ``seconds`` (the worst case for a loop that wakes per read), or the same stream in 64 KiB
# writes. Each prints how many bytes it wrote to stderr.
BYTE_WRITES = """
import os, sys, time
t, n = time.monotonic(), 0
while time.monotonic() - t < {seconds}:
    for _ in range(1000):
        os.write(1, b"x")
    n += 1000
print("bytes", n, file=sys.stderr)
"""
BULK_WRITES = """
import os, sys
chunk = b"x" * 65536
for _ in range({chunks}):
    os.write(1, chunk)
print("bytes", {chunks} * 65536, file=sys.stderr)
"""


def _cpu_s(pid: int) -> float | None:
    """utime + stime of a process, from /proc (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def supervisor_cpu(pool, task, script: str, every_s: float = 0.02) -> tuple[float, int, object]:
    """Run one execution alone on ``pool`` and sample, from /proc, the CPU seconds of its
    supervisor (the template's child that runs and watches it; the script is that process's
    child, counted apart). Returns (CPU seconds, bytes the script says it wrote, result).
    Read from outside the sandbox code, so it measures any version of it alike; the last
    sample comes at most ``every_s`` before the supervisor reports."""
    template = pool._template.proc.pid
    before = set(_children(template))
    fut = pool.submit(task, script)
    last: dict[int, float] = {}
    while not fut.done():
        for pid in _children(template):
            if pid not in before and (cpu := _cpu_s(pid)) is not None:
                last[pid] = cpu
        time.sleep(every_s)
    result = fut.result()
    written = [w for w in result.stderr_tail.split() if w.isdigit()]
    return sum(last.values()), int(written[-1]) if written else 0, result


def output_cost(pool, task, seconds: float = 4.0) -> dict:
    """The supervisor's CPU seconds per MB of a script's output, one-byte writes and 64 KiB
    writes (the same amount of bytes or more), with the script's own run time."""
    out = {}
    cpu, n, r = supervisor_cpu(pool, task, BYTE_WRITES.format(seconds=seconds))
    out["byte_writes"] = {"mb": n / 1e6, "supervisor_cpu_s": cpu, "runtime_s": r.runtime_s,
                          "supervisor_cpu_s_per_mb": cpu / max(n / 1e6, 1e-9)}  # fmt: skip
    chunks = max(16, -(-n // 65536))
    cpu, n, r = supervisor_cpu(pool, task, BULK_WRITES.format(chunks=chunks))
    out["bulk_writes"] = {"mb": n / 1e6, "supervisor_cpu_s": cpu, "runtime_s": r.runtime_s,
                          "supervisor_cpu_s_per_mb": cpu / max(n / 1e6, 1e-9)}  # fmt: skip
    return out


def run_benchmark(max_workers: int, batch: int, repeats: int = 10) -> dict:
    from wmrl.autoresearch.env.pool import SandboxPool

    with tempfile.TemporaryDirectory() as tmp:
        task = _task(Path(tmp))
        res: dict = {
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        }
        with SandboxPool(1, prefork=False) as pool:
            exec_empty, _ = _timed_runs(pool, task, EMPTY, repeats)
            exec_imports, _ = _timed_runs(pool, task, IMPORTS, max(3, repeats // 3))
        with SandboxPool(1) as pool:
            res["isolation"] = pool.isolation
            empty, empty_inside = _timed_runs(pool, task, EMPTY, repeats)
            imports, _ = _timed_runs(pool, task, IMPORTS, repeats)
            real, _ = _timed_runs(pool, task, REAL, max(3, repeats // 3))
            res["output_cost"] = output_cost(pool, task)
        res["overhead_s"] = empty
        res["overhead_in_sandbox_s"] = empty_inside
        res["overhead_fresh_interpreter_s"] = exec_empty
        res["startup_split"] = {
            "template_empty_s": empty,
            "template_import_stack_s": imports - empty,
            "fresh_interpreter_empty_s": exec_empty,
            "fresh_interpreter_import_stack_s": exec_imports - exec_empty,
            "real_script_total_s": real,
            "real_script_work_s": real - empty,
        }
        res["batch"] = batch
        res["executions_per_s"] = {}
        for n in range(1, max_workers + 1):
            with SandboxPool(n) as pool:
                pool.run(task, EMPTY)
                t0 = time.perf_counter()
                futures = pool.submit_batch([(task, REAL)] * batch)
                statuses = {f.result().status.name for f in futures}
                elapsed = time.perf_counter() - t0
            assert statuses == {"VALID"}, statuses
            res["executions_per_s"][str(n)] = batch / elapsed
    return res


def run_ray_benchmark(nodes: int, batch: int, repeats: int = 10, address: str = "") -> dict:
    from ray.cluster_utils import Cluster

    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.env.ray_executor import RayExecutor

    res: dict = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "executor": "ray",
        "batch": batch,
        "load_avg_1_5_15": list(os.getloadavg()),
    }
    with tempfile.TemporaryDirectory() as tmp:
        task = _task(Path(tmp))
        with SandboxPool(1) as pool:
            pool.run(task, EMPTY)
            local_empty, _ = _timed_runs(pool, task, EMPTY, repeats)
        res["local_overhead_s"] = local_empty
        # The same batch through the local pool with 1..N workers, side by side (same load).
        res["local_executions_per_s_by_workers"] = {}
        for n in range(1, (1 if address else nodes) + 1):
            with SandboxPool(n) as pool:
                pool.run(task, EMPTY)
                t0 = time.perf_counter()
                statuses = {
                    f.result().status.name for f in pool.submit_batch([(task, REAL)] * batch)
                }
                res["local_executions_per_s_by_workers"][str(n)] = batch / (
                    time.perf_counter() - t0
                )
            assert statuses == {"VALID"}, statuses
        res["executions_per_s_by_nodes"] = {}
        cluster = None
        if not address:
            cluster = Cluster(
                initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
            )
        try:
            for n in range(1, (1 if address else nodes) + 1):
                if cluster is not None and n > 1:
                    cluster.add_node(num_cpus=1)
                if cluster is not None:
                    cluster.wait_for_nodes()
                with RayExecutor(1, address=address or cluster.address) as ex:
                    ex.run(task, EMPTY)  # every node has the task data from here on
                    for _ in range(len(ex.alive_nodes())):
                        ex.run(task, EMPTY)
                    n_nodes = len(ex.alive_nodes())
                    if n == 1:
                        res["isolation"] = ex.isolation
                        empty, _ = _timed_runs(ex, task, EMPTY, repeats)
                        res["ray_overhead_s"] = empty
                        res["ray_overhead_added_s"] = empty - local_empty
                    warm = ex.submit_batch([(task, EMPTY)] * n_nodes)
                    [f.result() for f in warm]
                    t0 = time.perf_counter()
                    futures = ex.submit_batch([(task, REAL)] * batch)
                    statuses = {f.result().status.name for f in futures}
                    elapsed = time.perf_counter() - t0
                assert statuses == {"VALID"}, statuses
                res["executions_per_s_by_nodes"][str(n_nodes)] = batch / elapsed
        finally:
            if cluster is not None:
                cluster.shutdown()
    by = res["executions_per_s_by_nodes"]
    if "1" in by and "2" in by:
        res["speedup_1_to_2_nodes"] = by["2"] / by["1"]
    res["load_avg_1_5_15_after"] = list(os.getloadavg())
    return res


def _ray_table(res: dict) -> str:
    rows = [
        ("isolation (every node)", res.get("isolation", "?")),
        ("overhead, empty script, local pool", f"{res['local_overhead_s']:.3f} s"),
        (
            "overhead, empty script, Ray (1 node)",
            f"{res.get('ray_overhead_s', float('nan')):.3f} s",
        ),
        ("added by Ray per execution", f"{res.get('ray_overhead_added_s', float('nan')):.3f} s"),
    ]
    by = res["executions_per_s_by_nodes"]
    base = next(iter(by.values()))
    for n, eps in by.items():
        rows.append((f"executions/s, {n} node(s) x 1 slot", f"{eps:.2f}  (x{eps / base:.2f})"))
    local = res["local_executions_per_s_by_workers"]
    for n, eps in local.items():
        rows.append(
            (f"executions/s, local pool, {n} worker(s)", f"{eps:.2f}  (x{eps / local['1']:.2f})")
        )
    rows.append(("load average before / after", f"{res['load_avg_1_5_15']} / "
                 f"{res['load_avg_1_5_15_after']}"))  # fmt: skip
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _table(res: dict) -> str:
    s = res["startup_split"]
    rows = [
        ("isolation", res["isolation"]),
        ("overhead, empty script (template)", f"{res['overhead_s']:.3f} s"),
        ("overhead, empty script (fresh python)", f"{res['overhead_fresh_interpreter_s']:.3f} s"),
        ("import numpy+pandas+sklearn (template)", f"{s['template_import_stack_s']:.3f} s"),
        ("import numpy+pandas+sklearn (fresh)", f"{s['fresh_interpreter_import_stack_s']:.3f} s"),
        (
            "real script: total / own work",
            f"{s['real_script_total_s']:.3f} / {s['real_script_work_s']:.3f} s",
        ),
    ]
    for kind, c in res.get("output_cost", {}).items():
        rows.append((
            f"supervisor CPU per MB of output, {kind.replace('_', ' ')}",
            f"{c['supervisor_cpu_s_per_mb']:.4f} s  ({c['supervisor_cpu_s']:.2f} s for "
            f"{c['mb']:.1f} MB in {c['runtime_s']:.1f} s)",
        ))  # fmt: skip
    base = res["executions_per_s"]["1"]
    for n, eps in res["executions_per_s"].items():
        rows.append((f"executions/s, {n} worker(s)", f"{eps:.2f}  (x{eps / base:.2f})"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program."""
    flags.DEFINE_string("out", None, "write the JSON here")
    flags.DEFINE_integer("max_workers", None, "largest pool size (default: cores)")
    flags.DEFINE_integer("batch", 16, "real scripts per throughput measurement")
    flags.DEFINE_integer("repeats", 10, "sequential runs per latency measurement")
    flags.DEFINE_enum("executor", "local", ["local", "ray"], "which executor to measure")
    flags.DEFINE_integer("nodes", 2, "executor=ray: simulated one-CPU nodes (1..N measured)")
    flags.DEFINE_string("ray_address", "", "executor=ray: a real cluster instead of simulated")


def main(argv) -> None:
    del argv
    if FLAGS.executor == "ray":
        from wmrl.autoresearch.env.executor import require_ray

        require_ray()
        res = run_ray_benchmark(FLAGS.nodes, FLAGS.batch, FLAGS.repeats, FLAGS.ray_address)
        print(_ray_table(res))
        if FLAGS.out:
            Path(FLAGS.out).write_text(json.dumps(res, indent=2))
        return
    res = run_benchmark(FLAGS.max_workers or os.cpu_count() or 1, FLAGS.batch, FLAGS.repeats)
    print(_table(res))
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
