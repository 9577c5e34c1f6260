"""Test configuration: 8 fake CPU devices, set before jax is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache per test session: the end-to-end runs (every RL mode, the
# resumed runs, the notebooks) compile the same steps again and again from fresh closures.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="wmrl-jax-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pytest


@pytest.fixture(scope="session")
def rl_shared(tmp_path_factory):
    """Shared data stage and warm-start/WM checkpoints of the tiny AutoResearch setting
    (tests/rl_fixtures.py): built by the first run that uses them, loaded by the others."""
    root = tmp_path_factory.mktemp("rl_shared")
    return root / "data", root / "init"


def pytest_sessionfinish(session, exitstatus):
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR", "")
    if os.path.basename(cache).startswith("wmrl-jax-cache-"):
        import shutil

        shutil.rmtree(cache, ignore_errors=True)
