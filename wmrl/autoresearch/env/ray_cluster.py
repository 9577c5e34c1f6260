"""Reaching a Ray cluster: the address forms, a TCP probe, and importing the optional extra.

Shared by `executor` (config validation, before anything starts) and `ray_executor` (the
actors), which therefore do not import each other.
"""

from __future__ import annotations

import os
import socket
import tempfile

from wmrl.config_errors import ConfigError

RAY_EXTRA = "pip install -r requirements-ray.txt"
CONNECT_TIMEOUT_S = 10.0  # a Ray address must answer within this


def validate_ray_address(address, field: str = "config.suite.ray_address") -> str:
    """``auto`` | ``local`` | ``ray://host:port`` (Ray Client) | ``host:port`` (a GCS)."""
    if not isinstance(address, str) or not address:
        raise ConfigError(field, f"must be 'auto', 'local' or 'ray://host:port', got {address!r}")
    if address in ("auto", "local"):
        return address
    hostport = address[len("ray://") :] if address.startswith("ray://") else address
    host, sep, port = hostport.rpartition(":")
    if "://" in hostport or not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(
            field,
            f"must be 'auto', 'local', 'ray://host:port' or 'host:port', got {address!r}",
        )
    return address


def auto_address() -> str:
    """What ``ray.init("auto")`` would connect to: ``RAY_ADDRESS``, else the latest cluster
    ``ray start`` recorded on this machine ('' if none)."""
    env = os.environ.get("RAY_ADDRESS", "")
    if env and env not in ("auto", "local"):
        return env
    try:
        with open(os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")) as f:
            return f.read().strip()
    except OSError:
        return ""


def probe(address: str, timeout_s: float = CONNECT_TIMEOUT_S, shown: str | None = None) -> None:
    """Raise ConnectionError naming ``suite.ray_address`` unless a TCP connection opens."""
    shown = address if shown is None else shown
    hostport = address[len("ray://") :] if address.startswith("ray://") else address
    host, _, port = hostport.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(
            f"suite.ray_address={shown!r}: nothing answers at {host}:{port} within "
            f"{timeout_s:.0f} s ({e}); start a cluster there (`ray start --head`, docs/ray.md) "
            "or use 'auto' on a cluster node / 'local' for a cluster in this process"
        ) from e


def require_ray():
    """Import ray or say which optional extra is missing."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            f"suite.executor='ray' needs the optional Ray extra, which is not installed: "
            f"{RAY_EXTRA} (or pick suite.executor='local')"
        ) from e
    return ray
