"""Where sandboxed executions run: one interface, a local pool or actors on a Ray cluster.

    with make_executor(config.suite) as pool:          # or make_executor(executor="ray", ...)
        futures = pool.submit_batch([(task, script), ...])
        for fut in pool.as_completed(futures):
            result = fut.result()                       # ExecutionResult, never raises
        pool.free_slots()                               # anchor routing caps its budget by this

``local`` is ``pool.SandboxPool`` on this host (``suite.workers`` slots). ``ray``
(``ray_executor.RayExecutor``) puts one actor on every node of a Ray cluster, each wrapping its
own ``SandboxPool`` (``suite.workers`` slots per node, the node's full isolation); see
docs/ray.md. Both offer the same API: ``submit``, ``submit_batch``, ``as_completed``, ``run``,
``free_slots``, ``close``, the context manager, ``num_workers`` (total slots) and
``isolation`` (the level every execution runs at).
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

from wmrl.autoresearch.env.ray_cluster import (
    auto_address,
    probe,
    require_ray,
    validate_ray_address,
)
from wmrl.config_errors import ConfigError

EXECUTORS = ("local", "ray")


@runtime_checkable
class Executor(Protocol):
    """What the trainer, the held-out evaluation and the corpus stage use."""

    num_workers: int
    isolation: str

    def submit(self, task, script: str | bytes, key: str | None = None) -> cf.Future:
        """(A local pool and the fake also take ``cut_s=``, a cap below the time limit:
        ``pool.SandboxPool.submit``; cost-aware routing needs it.)"""

    def submit_batch(self, items: Iterable[tuple]) -> list[cf.Future]: ...

    def as_completed(self, futures: Iterable[cf.Future]) -> Iterator[cf.Future]: ...

    def run(self, task, script: str | bytes, key: str | None = None): ...

    def free_slots(self) -> int: ...

    def close(self) -> None: ...

    def __enter__(self): ...

    def __exit__(self, *exc) -> None: ...


def _get(cfg, name: str, default):
    if cfg is None:
        return default
    if hasattr(cfg, "get"):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def validate_suite_executor(suite, prefix: str = "config.suite", reachable: bool = False) -> None:
    """Field checks for ``suite.executor``, ``suite.ray_address``, ``suite.allow_mixed_isolation``
    (nothing is imported or contacted). Missing fields mean the defaults. With ``reachable``
    (a run about to start), executor=ray also checks that the extra is installed and that the
    address answers (at most ``CONNECT_TIMEOUT_S``), so a bad one fails before anything is
    written."""
    name = _get(suite, "executor", "local")
    if name not in EXECUTORS:
        raise ConfigError(f"{prefix}.executor", f"unknown executor {name!r}; one of {EXECUTORS}")
    mixed = _get(suite, "allow_mixed_isolation", False)
    if not isinstance(mixed, bool):
        raise ConfigError(f"{prefix}.allow_mixed_isolation", f"must be a bool, got {mixed!r}")
    if name == "ray":
        address = validate_ray_address(_get(suite, "ray_address", "auto"), f"{prefix}.ray_address")
        if reachable and importlib.util.find_spec("ray") is None:
            try:
                require_ray()
            except ImportError as e:
                raise ConfigError(f"{prefix}.executor", str(e)) from e
        if reachable and address != "local" and (address != "auto" or auto_address()):
            try:
                probe(auto_address() if address == "auto" else address, shown=address)
            except ConnectionError as e:
                raise ConfigError(f"{prefix}.ray_address", str(e)) from e


def make_executor(
    suite=None,
    *,
    executor: str | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
    allow_mixed_isolation: bool | None = None,
    time_limit_cap_s: float | None = None,
    **pool_kwargs,
) -> Executor:
    """The executor a config asks for.

    ``suite`` is a config section with (some of) ``executor``, ``workers``, ``ray_address``,
    ``allow_mixed_isolation``, ``time_limit_s`` (``config.suite``); keyword arguments override
    it (``time_limit_cap_s=0``: the tasks' own limits, whatever ``suite.time_limit_s`` says).
    ``workers`` is slots per host (local) or per node (ray); ``pool_kwargs`` go to every
    ``SandboxPool`` (isolation, prefork, workroot, limit overrides).
    """
    name = executor if executor is not None else _get(suite, "executor", "local")
    workers = workers if workers is not None else _get(suite, "workers", None)
    address = ray_address if ray_address is not None else _get(suite, "ray_address", "auto")
    mixed = (
        allow_mixed_isolation
        if allow_mixed_isolation is not None
        else _get(suite, "allow_mixed_isolation", False)
    )
    if time_limit_cap_s is None:
        time_limit_cap_s = _get(suite, "time_limit_s", 0.0)
    time_limit_cap_s = time_limit_cap_s or None  # 0 = the tasks' own limits
    validate_suite_executor(
        {"executor": name, "ray_address": address, "allow_mixed_isolation": mixed}
    )
    if name == "local":
        from wmrl.autoresearch.env.pool import SandboxPool

        return SandboxPool(workers, time_limit_cap_s=time_limit_cap_s, **pool_kwargs)
    require_ray()
    from wmrl.autoresearch.env.ray_executor import RayExecutor

    return RayExecutor(
        workers,
        address=address,
        allow_mixed_isolation=mixed,
        time_limit_cap_s=time_limit_cap_s,
        **pool_kwargs,
    )
