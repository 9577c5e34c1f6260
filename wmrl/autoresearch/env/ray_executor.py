"""Sandboxes on a Ray cluster: one actor per node, each wrapping that node's own SandboxPool.

    with RayExecutor(workers_per_node=8, address="ray://head:10001") as pool:
        futures = pool.submit_batch([(task, script), ...])   # same API as SandboxPool

* One ``NodePool`` actor per alive node with a CPU, pinned to it (a hard
  ``NodeAffinitySchedulingStrategy``), running a local ``SandboxPool`` with the node's full
  isolation and ``workers_per_node`` slots. The actor itself reserves no CPU (``num_cpus=0``):
  the sandboxes' CPUs are the node's.
* Executions are queued here, on the driver, and dispatched to the node with the most free
  slots, never more than it has: a node that finishes early takes the next one.
* Task data travel once per node: the task directory is packed into a deterministic tar
  (content-addressed by its SHA-256) and put in the object store once; a node fetches and
  unpacks it on its first execution of that task and keeps it in its cache. Scripts and
  results (``ExecutionResult``) are small and travel with each call.
* Failure model: a node (or its actor) lost mid-batch fails its in-flight calls; those
  executions go back to the queue and run elsewhere, and only a second infrastructure failure
  makes an execution ``UNGRADED`` (as the local pool's retry does). Agent failures are never
  retried. Nodes that join after start-up are not used.
* Isolation: every node reports its level; nodes at different levels are refused unless
  ``allow_mixed_isolation=True``. A node at the ``rlimits`` fallback is always refused: its
  sandboxes would share the node's network with Ray's own ports (its pool refuses to start
  there, ``pool.rlimits_hazards``; docs/ray.md).
* The wmrl code is shipped to the actors with the job (``runtime_env`` ``py_modules``) when
  the executor connects, so nodes need only the same Python environment (requirements.txt).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import io
import os
import queue
import shutil
import socket
import tarfile
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from wmrl.autoresearch.env import linux
from wmrl.autoresearch.env.grader import Status, reward
from wmrl.autoresearch.env.ray_cluster import CONNECT_TIMEOUT_S, auto_address, probe, require_ray
from wmrl.autoresearch.env.result import ExecutionResult, InfrastructureError
from wmrl.autoresearch.env.task import Task, load_task

START_TIMEOUT_S = 300.0  # every node's pool must be up within this
TASK_FILES = ("task.json", "leaderboard.json", "public", "private")


# -- task data: a deterministic tar, content-addressed -----------------------------------------


def pack_task(root: str | os.PathLike) -> tuple[str, bytes]:
    """(sha256 hex, tar bytes) of a task directory: sorted members, fixed owner and times, so
    the key depends on the content (and modes) only."""
    root = Path(root)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = []
        for name in TASK_FILES:
            p = root / name
            if p.is_dir():
                paths.append(p)
                paths.extend(sorted(q for q in p.rglob("*")))
            elif p.exists():
                paths.append(p)
        for p in paths:
            if p.is_symlink():
                continue  # task dirs hold plain files; never ship a link
            info = tar.gettarinfo(str(p), arcname=str(p.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isfile():
                with open(p, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest(), data


def unpack_task(key: str, data: bytes, cache: Path) -> Path:
    """Unpack into ``cache/key`` (atomically; a finished one is reused); check the key."""
    dst = cache / key
    if dst.is_dir():
        return dst
    if hashlib.sha256(data).hexdigest() != key:
        raise InfrastructureError(f"task data {key[:12]} arrived corrupted")
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=cache))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(tmp, filter="data")
    os.chmod(tmp, 0o755)
    try:
        os.rename(tmp, dst)
    except OSError:  # another thread won the race: same content
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


# -- the actor ---------------------------------------------------------------------------------


def listening_tcp_ports() -> list[int]:
    """Every TCP port listening on this host (IPv4 and IPv6), from /proc/net."""
    return sorted({port for port, _, _ in linux.tcp_listeners()})


class NodePool:
    """The body of the per-node actor: a local SandboxPool and the node's task cache."""

    def __init__(self, workers: int, pool_kwargs: dict):
        from wmrl.autoresearch.env.pool import SandboxPool

        self.pool = SandboxPool(workers, **pool_kwargs)
        self.cache = Path(tempfile.mkdtemp(prefix="wmrl-ray-tasks-"))
        os.chmod(self.cache, 0o755)
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()

    def info(self) -> dict:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "isolation": self.pool.isolation,
            "workers": self.pool.num_workers,
        }

    def _task(self, key: str, box: list) -> Task:
        with self._lock:
            task = self._tasks.get(key)
            if task is None:
                import ray

                data = ray.get(box[0])  # fetched to this node once, then cached on disk
                task = load_task(unpack_task(key, data, self.cache))
                self._tasks[key] = task
            return task

    def execute(
        self, key: str, box: list, source: bytes, exec_key: str | None = None
    ) -> ExecutionResult:
        return self.pool.submit(self._task(key, box), source, key=exec_key).result()

    def attack_surface(self) -> dict:
        """What a sandboxed script on this node must not reach (for the containment test)."""
        import ray

        ctx = ray.get_runtime_context()
        node = next(n for n in ray.nodes() if n["NodeID"] == ctx.get_node_id())
        return {
            "pid": os.getpid(),
            "template_pid": self.pool._template.proc.pid,
            "node_ip": node["NodeManagerAddress"],
            "gcs_address": ctx.gcs_address,
            "ports": listening_tcp_ports(),
            "plasma_socket": node.get("ObjectStoreSocketName", ""),
            "raylet_socket": node.get("RayletSocketName", ""),
            "session_dir": ray._private.worker._global_node.get_session_dir_path(),
            "ray_env": sorted(k for k in os.environ if k.startswith("RAY")),
            "uid_base": self.pool.uid_base,
            "cache": str(self.cache),
        }

    def sandbox_leftovers(self) -> dict:
        """Processes under the pool's sandbox uids and entries left in its work root."""
        from wmrl.autoresearch.env import sandbox

        lo = self.pool.uid_base
        return {
            "pids": linux.live_pids_with_uid(lo, lo + sandbox.UID_BLOCK),
            "workroot": os.listdir(self.pool._workroot),
        }

    def close(self) -> None:
        self.pool.close()
        shutil.rmtree(self.cache, ignore_errors=True)


# -- the driver side ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Job:
    task: Task
    key: str
    source: bytes
    future: cf.Future
    exec_key: str | None = None  # the execution's seed key (SandboxPool.submit's `key`)
    nodes: list = dataclasses.field(default_factory=list)  # node ids tried, in order
    errors: list = dataclasses.field(default_factory=list)  # infrastructure failures
    t0: float = dataclasses.field(default_factory=time.monotonic)


@dataclasses.dataclass
class _Node:
    node_id: str
    actor: object
    slots: int
    isolation: str
    busy: int = 0
    alive: bool = True


def connect(address: str, timeout_s: float = CONNECT_TIMEOUT_S, ship_code: bool = True) -> bool:
    """Connect this process to Ray (unless it already is); True when this call did it. With
    ``ship_code`` the job's ``runtime_env`` carries this wmrl package to every worker."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    if address not in ("auto", "local"):
        probe(address, timeout_s)
    elif address == "auto" and auto_address():  # a stale address of a cluster gone
        probe(auto_address(), timeout_s, shown=address)
    kwargs = {"include_dashboard": False} if address == "local" else {}
    if ship_code:
        kwargs["runtime_env"] = {"py_modules": [_wmrl_dir()], "excludes": ["__pycache__"]}
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False, **kwargs)
    except ConnectionError as e:
        raise ConnectionError(f"suite.ray_address={address!r}: {e}") from e
    return True


def _wmrl_dir() -> str:
    return str(Path(__file__).resolve().parents[2])


class RayExecutor:
    """``workers_per_node`` sandbox slots on every alive node of a Ray cluster.

    Args:
      workers_per_node: slots per node (``suite.workers``; default: each node's cores).
      address: ``auto``, ``local`` or ``ray://host:port`` / ``host:port``; ignored when this
        process is already connected (``ray.init`` done by the caller).
      allow_mixed_isolation: accept nodes at different namespaces levels (with and without
        the job cgroup). A node at the rlimits fallback is refused whatever this says.
      isolation: passed to every node's pool ("auto": its strongest), or one level per node
        (in node order) to force a weaker one on some.
      node_resource: only nodes with this custom resource (e.g. ``sandbox``, given to
        ``ray start --resources='{"sandbox": 1}'``) get an actor; "" = every node with a CPU.
      ship_code: send this wmrl package to the actors (the job's ``runtime_env``
        ``py_modules``) when this executor connects; a caller that ran ``ray.init`` itself
        gives its own runtime_env (or the nodes have wmrl on their path).
      **pool_kwargs: every node's ``SandboxPool`` (prefork, time_limit_cap_s, limit overrides).
    """

    def __init__(
        self,
        workers_per_node: int | None = None,
        address: str = "auto",
        allow_mixed_isolation: bool = False,
        isolation: str | Sequence[str] = "auto",
        node_resource: str = "",
        ship_code: bool = True,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        **pool_kwargs,
    ):
        self._owns_ray = connect(address, connect_timeout_s, ship_code)
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray = ray
        self._closed = False
        try:
            nodes = [
                n
                for n in ray.nodes()
                if n["Alive"]
                and n["Resources"].get("CPU", 0) >= 1
                and (not node_resource or n["Resources"].get(node_resource, 0) > 0)
            ]
            if not nodes:
                raise RuntimeError(
                    "no alive Ray node with a CPU"
                    + (f" and the resource {node_resource!r}" if node_resource else "")
                )
            levels = [isolation] * len(nodes) if isinstance(isolation, str) else list(isolation)
            if len(levels) != len(nodes):
                raise ValueError(f"isolation: {len(levels)} levels for {len(nodes)} nodes")
            actor_cls = ray.remote(NodePool)
            actors = []
            for n, level in zip(nodes, levels, strict=True):
                slots = workers_per_node or int(n["Resources"]["CPU"])
                actors.append(
                    actor_cls.options(
                        num_cpus=0,
                        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                        max_concurrency=slots + 4,
                        max_restarts=0,
                        max_task_retries=0,
                    ).remote(slots, {**pool_kwargs, "isolation": level})
                )
            self._actors = actors  # so close() can end them if start-up fails
            try:
                infos = ray.get([a.info.remote() for a in actors], timeout=start_timeout_s)
            except ray.exceptions.ActorDiedError as e:  # a node's pool refused to start
                cause = getattr(e, "cause", None) or e
                raise RuntimeError(
                    f"a Ray node's sandbox pool could not start (its start-up check or "
                    f"isolation; docs/sandbox.md): {cause}"
                ) from e
        except BaseException:
            self._kill_actors()
            self._disconnect()
            raise
        self._nodes: dict[str, _Node] = {
            info["node_id"]: _Node(info["node_id"], a, info["workers"], info["isolation"])
            for a, info in zip(actors, infos, strict=True)
        }
        self.node_info = infos
        self._check_isolation(allow_mixed_isolation)
        self.num_workers = sum(n.slots for n in self._nodes.values())
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._blobs: dict[Path, tuple[str, object]] = {}
        self._jobs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._events: queue.Queue = queue.Queue()
        self._waiting: collections.deque[_Job] = collections.deque()
        self._inflight: dict = {}
        self._dispatcher = threading.Thread(target=self._loop, daemon=True, name="ray-dispatch")
        self._dispatcher.start()

    def _check_isolation(self, allow_mixed: bool) -> None:
        levels = {n.node_id: n.isolation for n in self._nodes.values()}
        weak = sorted(i for i, lv in levels.items() if lv.partition("+")[0] == "rlimits")
        distinct = sorted(set(levels.values()))
        if weak or (not allow_mixed and len(distinct) > 1):
            self._kill_actors()
            self._disconnect()
            if weak:  # (its pool refuses first where it can see the node's Ray ports)
                raise ValueError(
                    f"{len(weak)} Ray node(s) ({', '.join(w[:12] for w in weak)}) can only run "
                    "the rlimits fallback (no namespaces: the node's pool is not root / has no "
                    "CAP_SYS_ADMIN), whose sandboxes would reach the node's Ray ports; "
                    "executor='ray' needs namespaces on every node (docs/ray.md)"
                )
            raise ValueError(
                f"suite.allow_mixed_isolation: nodes run different isolation levels "
                f"{distinct}; executor='ray' refuses this unless "
                "suite.allow_mixed_isolation=True (docs/ray.md)"
            )
        self.isolation = distinct[0] if len(distinct) == 1 else "mixed:" + ",".join(distinct)

    # -- public API (SandboxPool's) ------------------------------------------------------------

    def submit(self, task: Task, script: str | bytes, key: str | None = None) -> cf.Future:
        """Queue one execution; the future resolves to an ExecutionResult (never raises).
        `key` seeds the execution on its node as in `SandboxPool.submit`."""
        if self._closed:
            raise RuntimeError("RayExecutor is closed")
        source = script.encode("utf-8") if isinstance(script, str) else bytes(script)
        fut: cf.Future = cf.Future()
        job = _Job(task, self._blob(task)[0], source, fut, exec_key=key)
        self._jobs[fut] = job
        with self._lock:
            self._pending += 1
        self._events.put(("job", job))
        return fut

    def submit_batch(self, items: Iterable[tuple[Task, str | bytes]]) -> list[cf.Future]:
        return [self.submit(task, script) for task, script in items]

    @staticmethod
    def as_completed(futures: Iterable[cf.Future]) -> Iterator[cf.Future]:
        return cf.as_completed(list(futures))

    def run(self, task: Task, script: str | bytes, key: str | None = None) -> ExecutionResult:
        return self.submit(task, script, key).result()

    def free_slots(self) -> int:
        """The cluster's slots (alive nodes) not taken by running or queued executions."""
        with self._lock:
            alive = sum(n.slots for n in self._nodes.values() if n.alive)
            return max(0, alive - self._pending)

    def nodes_tried(self, fut: cf.Future) -> list[str]:
        """The node ids an execution was sent to, in order (more than one after a loss)."""
        return list(self._jobs[fut].nodes)

    def alive_nodes(self) -> list[str]:
        return [n.node_id for n in self._nodes.values() if n.alive]

    def actor(self, node_id: str):
        return self._nodes[node_id].actor

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._idle:  # like SandboxPool.close: what was submitted finishes first
            while self._pending:
                self._idle.wait()
        self._events.put(("stop",))
        self._dispatcher.join()
        alive = [n.actor for n in self._nodes.values() if n.alive]
        with contextlib.suppress(Exception):  # a node lost while closing: its pool died with it
            self._ray.get([a.close.remote() for a in alive], timeout=120)
        self._kill_actors()
        self._disconnect()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------

    def _blob(self, task: Task) -> tuple[str, object]:
        with self._lock:
            hit = self._blobs.get(task.root)
        if hit is None:
            key, data = pack_task(task.root)
            hit = (key, self._ray.put(data))
            with self._lock:
                hit = self._blobs.setdefault(task.root, hit)
        return hit

    def _kill_actors(self) -> None:
        for a in getattr(self, "_actors", []):
            with contextlib.suppress(Exception):
                self._ray.kill(a, no_restart=True)

    def _disconnect(self) -> None:
        if self._owns_ray:
            self._ray.shutdown()
            self._owns_ray = False

    def _loop(self) -> None:
        while True:
            ev = self._events.get()
            if ev[0] == "stop":
                return
            if ev[0] == "job":
                self._waiting.append(ev[1])
            else:
                self._finished(ev[1], ev[2])
            self._dispatch()

    def _dispatch(self) -> None:
        while self._waiting:
            free = [n for n in self._nodes.values() if n.alive and n.busy < n.slots]
            if not free:
                if not any(n.alive for n in self._nodes.values()):
                    while self._waiting:
                        self._resolve_ungraded(self._waiting.popleft(), "no Ray node left")
                return
            node = max(free, key=lambda n: n.slots - n.busy)
            job = self._waiting.popleft()
            job.nodes.append(node.node_id)
            try:
                ref = node.actor.execute.remote(
                    job.key, [self._blob(job.task)[1]], job.source, job.exec_key
                )
                done = ref.future()
            except Exception as e:  # Ray itself failed us here: this node is of no use now
                node.alive = False
                job.errors.append(f"node {node.node_id[:12]}: {type(e).__name__}: {e}")
                if len(job.errors) >= 2:
                    self._resolve_ungraded(job, "; ".join(job.errors))
                else:
                    self._waiting.appendleft(job)
                continue
            node.busy += 1
            self._inflight[ref] = (job, node)
            done.add_done_callback(lambda f, ref=ref: self._events.put(("done", ref, f)))

    def _finished(self, ref, f: cf.Future) -> None:
        ray = self._ray
        job, node = self._inflight.pop(ref)
        node.busy -= 1
        try:
            res = f.result()
        except ray.exceptions.RayTaskError as e:  # the actor's code failed for this call
            cause = getattr(e, "cause", None) or e
            job.errors.append(f"{node.node_id[:12]}: {type(cause).__name__}: {cause}")
        except Exception as e:  # the actor or its node is gone
            job.errors.append(f"node {node.node_id[:12]} lost: {type(e).__name__}")
            if node.alive:
                node.alive = False
                with contextlib.suppress(Exception):
                    ray.kill(node.actor, no_restart=True)
        else:
            extra = len(job.errors)
            self._resolve(job, dataclasses.replace(res, attempts=res.attempts + extra))
            return
        if len(job.errors) >= 2:
            self._resolve_ungraded(job, "; ".join(job.errors))
        else:
            self._waiting.appendleft(job)  # runs next, on another node if this one is gone

    def _resolve_ungraded(self, job: _Job, detail: str) -> None:
        res = ExecutionResult(
            job.task.id,
            Status.UNGRADED,
            reward(Status.UNGRADED),
            None,
            None,
            time.monotonic() - job.t0,
            "",
            "",
            self.isolation,
            detail,
            attempts=max(1, len(job.errors)),
        )
        self._resolve(job, res)

    def _resolve(self, job: _Job, res: ExecutionResult) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()
        job.future.set_result(res)
