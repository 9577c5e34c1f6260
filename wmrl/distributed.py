"""Multi-host runtime: decide whether this run is multi-process, then start JAX's own runtime.

Detection is pure (it reads an environment mapping and three flag values, imports no JAX) so it
can be tested with fake environments and run before anything touches a JAX backend.
`maybe_initialize` calls `jax.distributed.initialize` exactly when a cluster was detected; a
single-process run never calls it.

Sources, in order of precedence:

* ``flags``: explicit ``--coordinator_address/--num_processes/--process_id`` (all three or none).
* ``slurm``: a task of an ``srun`` step with more than one task. The coordinator is the first host
  of the step's nodelist on port ``WMRL_COORDINATOR_PORT`` (default 12355).
* ``tpu``: a Cloud TPU pod slice or multislice. JAX reads the worker list from the TPU metadata
  itself, so the spec carries no addresses and `jax.distributed.initialize()` gets no arguments.
  ``launch/tpu_vm.sh`` exports ``WMRL_TPU_POD=1`` on every worker because a GCE TPU VM exposes its
  worker list only through the metadata server, not through environment variables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np

DEFAULT_COORDINATOR_PORT = 12355

Source = Literal["flags", "slurm", "tpu"]


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """How this process joins a multi-process JAX run.

    Fields left as None are filled in by JAX's own cluster detection (only used for TPU).
    """

    source: Source
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None

    def initialize_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `jax.distributed.initialize`.

        For explicit and SLURM specs, JAX's own auto-detection is switched off: given a SLURM
        environment it would otherwise pin each process to GPU ``SLURM_LOCALID`` even when one
        process per node should drive all of the node's GPUs.
        """
        if self.source == "tpu":
            return {}
        kwargs: dict[str, Any] = {
            "coordinator_address": self.coordinator_address,
            "num_processes": self.num_processes,
            "process_id": self.process_id,
            "cluster_detection_method": "deactivate",
        }
        if self.local_device_ids is not None:
            kwargs["local_device_ids"] = list(self.local_device_ids)
        return kwargs


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM hostlist such as ``node[01-03,07],gpu5`` into host names, in order.

    Zero padding is kept (``n[08-10]`` gives n08 n09 n10) and several bracket groups in one name
    expand as a product (``r[1-2]n[1-2]`` gives r1n1 r1n2 r2n1 r2n2), as `scontrol show hostnames`
    does.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        parts = re.split(r"\[([^\]]*)\]", item)
        choices: list[list[str]] = []
        for i, part in enumerate(parts):
            choices.append(_expand_ranges(part, nodelist) if i % 2 else [part])
        hosts.extend("".join(p) for p in itertools.product(*choices))
    if not hosts:
        raise ValueError(f"empty SLURM nodelist {nodelist!r}")
    return hosts


def _split_top_level(nodelist: str) -> list[str]:
    """Split on commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(nodelist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
        if depth not in (0, 1):
            raise ValueError(f"malformed SLURM nodelist {nodelist!r}")
    if depth != 0:
        raise ValueError(f"unbalanced brackets in SLURM nodelist {nodelist!r}")
    items.append(nodelist[start:])
    return [item for item in items if item]


def _expand_ranges(spec: str, nodelist: str) -> list[str]:
    out = []
    for rng in spec.split(","):
        lo, sep, hi = rng.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {rng!r} in SLURM nodelist {nodelist!r}")
        width = len(lo)
        out.extend(f"{k:0{width}d}" for k in range(int(lo), int(hi if sep else lo) + 1))
    return out


def detect_cluster(
    env: Mapping[str, str] | None = None,
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> ClusterSpec | None:
    """Return how to join a multi-process run, or None for a single-process run.

    Args:
      env: the environment to read (``os.environ`` when None).
      coordinator_address, num_processes, process_id: the absl flag values; all three or none.

    Raises:
      ValueError: a partial flag set (naming the missing flags), or inconsistent values.
    """
    env = os.environ if env is None else env
    flag_values = {
        "--coordinator_address": coordinator_address,
        "--num_processes": num_processes,
        "--process_id": process_id,
    }
    given = [name for name, value in flag_values.items() if value is not None]
    if given:
        missing = [name for name, value in flag_values.items() if value is None]
        if missing:
            raise ValueError(
                f"multi-process launch is missing {', '.join(missing)} "
                f"(given: {', '.join(given)}); pass all three flags or none"
            )
        assert coordinator_address is not None and num_processes is not None
        assert process_id is not None
        return _checked(ClusterSpec("flags", coordinator_address, num_processes, process_id))
    if "SLURM_JOB_ID" in env:
        spec = _detect_slurm(env)
        if spec is not None:
            return spec
    return _detect_tpu(env)


def _checked(spec: ClusterSpec) -> ClusterSpec | None:
    """Validate counts and address; one process means single-process (None)."""
    n, pid, addr = spec.num_processes, spec.process_id, spec.coordinator_address
    assert n is not None and pid is not None and addr is not None
    if n < 1:
        raise ValueError(f"num_processes must be >= 1 ({spec.source}), got {n}")
    if not 0 <= pid < n:
        raise ValueError(f"process_id must be in [0, {n}) ({spec.source}), got {pid}")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator_address must be HOST:PORT ({spec.source}), got {addr!r}")
    return spec if n > 1 else None


def _env_int(env: Mapping[str, str], *names: str) -> int | None:
    """First of `names` present in `env`, as an int (a clear error if it is not one)."""
    for name in names:
        if name in env:
            try:
                return int(env[name])
            except ValueError:
                raise ValueError(f"{name}={env[name]!r} is not an integer") from None
    return None


def _detect_slurm(env: Mapping[str, str]) -> ClusterSpec | None:
    """A task of a multi-task SLURM step.

    Step variables come first: inside ``srun`` they describe the step actually running, while
    the job-level ones describe the allocation.
    """
    ntasks = _env_int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if ntasks is None or ntasks <= 1:
        return None
    procid = _env_int(env, "SLURM_PROCID")
    if procid is None:
        raise ValueError(
            f"SLURM job with {ntasks} tasks but SLURM_PROCID is unset; launch the tasks with srun"
        )
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise ValueError("SLURM job without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST")
    port = _env_int(env, "WMRL_COORDINATOR_PORT") or DEFAULT_COORDINATOR_PORT
    coordinator = f"{expand_nodelist(nodelist)[0]}:{port}"
    nnodes = _env_int(env, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    local_ids = None
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    several_per_node = nnodes is not None and ntasks > nnodes
    if several_per_node and (not visible or "," in visible):
        # Several tasks share a node's GPUs and SLURM did not bind one to each: pick ours.
        local_ids = (_env_int(env, "SLURM_LOCALID") or 0,)
    return _checked(ClusterSpec("slurm", coordinator, ntasks, procid, local_ids))


def _detect_tpu(env: Mapping[str, str]) -> ClusterSpec | None:
    """A TPU pod slice (several workers) or multislice, from the variables TPU runtimes set."""
    hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
    num_slices = _env_int(env, "MEGASCALE_NUM_SLICES") or 1
    if (
        env.get("WMRL_TPU_POD") == "1"
        or len([h for h in hosts.split(",") if h]) > 1
        or num_slices > 1
        or "MEGASCALE_COORDINATOR_ADDRESS" in env
    ):
        return ClusterSpec("tpu")
    return None


def backends_initialized() -> bool | None:
    """Whether a JAX backend already exists (None when this JAX cannot tell cheaply)."""
    try:
        from jax._src import xla_bridge
    except ImportError:
        return None
    check = getattr(xla_bridge, "backends_are_initialized", None)
    return None if check is None else bool(check())


def maybe_initialize(spec: ClusterSpec | None) -> bool:
    """Start JAX's distributed runtime when `spec` says this run is multi-process.

    Must run before any other JAX call: a backend created earlier would only see this host's
    devices. Returns whether `jax.distributed.initialize` was called.
    """
    if spec is None:
        return False
    import jax

    if backends_initialized():
        raise RuntimeError(
            "maybe_initialize must run before any JAX computation or device query; "
            "a JAX backend is already initialised"
        )
    platforms = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or ""
    if platforms.split(",")[0] == "cpu" and jax.config.jax_cpu_collectives_implementation is None:
        # CPU processes need a cross-process collective library; gloo ships with jaxlib.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**spec.initialize_kwargs())
    return True


def writes_outputs(spec: ClusterSpec | None) -> bool:
    """Whether this process owns the run's shared outputs (config, logs, plots).

    Known without touching a JAX backend when the spec names the process (single-process runs
    must not create the backend early: the bandit path sets XLA_FLAGS just before it does).
    """
    if spec is None:
        return True
    if spec.process_id is not None:
        return spec.process_id == 0
    return is_main_process()


def is_main_process() -> bool:
    """True on process 0, the one that writes logs, plots and other shared outputs."""
    import jax

    return jax.process_index() == 0


def process_allgather_to_numpy(x: Any) -> Any:
    """A pytree of arrays as host numpy arrays holding the global values, on every process.

    Arrays that are not fully addressable (sharded across processes) are gathered collectively,
    so every process must call this with the same structure; a fully replicated one is read
    from a local replica (no collective), anything else converts locally.
    """
    import jax
    from jax.experimental import multihost_utils

    def gather(a: Any) -> np.ndarray:
        if isinstance(a, jax.Array) and not a.is_fully_addressable:
            if a.is_fully_replicated:
                return np.asarray(a.addressable_data(0))
            return np.asarray(multihost_utils.process_allgather(a, tiled=True))
        return np.asarray(a)

    return jax.tree.map(gather, x)


def host_to_global(tree: Any, shardings: Any) -> Any:
    """Host arrays that every process holds in full, as global arrays in `shardings`.

    With several processes, jit refuses numpy arguments whose sharding is not replicated: each
    array is built with `jax.make_array_from_callback`, so every process transfers only the
    rows its own devices hold (its shard of the global batch). A global jax.Array passes
    through (already placed); a process-local one (e.g. the advantages, which every process
    computes in full) is placed the same way from device slices, without a trip through the
    host. Single process: unchanged, jit places host and uncommitted arrays itself.
    """
    import jax

    if jax.process_count() == 1:
        return tree

    def one(x: Any, sharding: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x
        if not isinstance(x, jax.Array):
            x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(one, tree, shardings)


def allgather_host(x: Any) -> np.ndarray:
    """Every process's host array `x`, stacked: `[process_count, *x.shape]`, on every process.

    A collective: every process calls it with the same shape and dtype. The bytes are sent,
    so values arrive bit-exact whatever the dtype (JAX without x64 would round float64).
    """
    import jax

    x = np.asarray(x)
    if jax.process_count() == 1:
        return x[None]
    if x.size == 0:
        return np.zeros((jax.process_count(), *x.shape), x.dtype)
    from jax.experimental import multihost_utils

    raw = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    raw = np.asarray(multihost_utils.process_allgather(raw))
    return raw.view(x.dtype).reshape(jax.process_count(), *x.shape)


def round_robin_owners(n_items: int, process_count: int | None = None) -> np.ndarray:
    """The process that handles each of `n_items` host-side jobs: item k goes to process
    k % process_count, so any number of items (even fewer than processes) spreads evenly."""
    if process_count is None:
        import jax

        process_count = jax.process_count()
    return np.arange(n_items) % process_count


def merge_from_owners(local: dict[str, np.ndarray], owner: np.ndarray) -> dict[str, np.ndarray]:
    """Per-item results that each process filled in only for the items it owns (`owner[i]`
    is item i's process), merged: the same arrays on every process (a collective)."""
    import jax

    if jax.process_count() == 1:
        return dict(local)
    items = np.arange(len(owner))
    return {k: allgather_host(v)[owner, items] for k, v in local.items()}


def all_processes(flag: bool) -> bool:
    """Whether `flag` holds on every process (a collective): decisions that change control
    flow (fall back to an older checkpoint) must be the same everywhere."""
    return bool(allgather_host(np.bool_(flag)).all())


_barriers = itertools.count()


def barrier(name: str, timeout_s: int = 600) -> None:
    """Wait until every process gets here (a no-op in a single process).

    Waits on the coordination service, not on a device collective, so a long wait (one process
    building the data stage) honours `timeout_s` instead of a collective library's own
    timeout. Every process passes the same barriers in the same order.
    """
    import jax

    if jax.process_count() == 1:
        return
    from orbax.checkpoint import multihost

    key = f"wmrl:{name}:{next(_barriers)}"  # coordination-service barrier keys must be unique
    multihost.get_barrier_sync_fn()(key=key, timeout_ms=timeout_s * 1000)


@contextlib.contextmanager
def main_process_first(name: str, timeout_s: int) -> Iterator[None]:
    """Run the body on process 0 first, then on the others: for a stage that fills a folder
    the processes may share, so they find its results instead of racing to write them (a
    host-local folder is simply built again, after process 0's)."""
    import jax

    first = jax.process_index() == 0
    if not first:
        barrier(name, timeout_s)
    yield
    if first:
        barrier(name, timeout_s)


def shard_for_process(
    n_items: int, process_index: int | None = None, process_count: int | None = None
) -> slice:
    """This process's contiguous slice of a global batch of `n_items`.

    Equal shards are required: global arrays are assembled from same-shaped per-process pieces.
    """
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if n_items % process_count:
        raise ValueError(
            f"global batch of {n_items} items does not split evenly over {process_count} processes"
        )
    per = n_items // process_count
    return slice(process_index * per, (process_index + 1) * per)
