"""Test configuration: 8 fake CPU devices, set before jax is imported anywhere."""

import os

# The suite compiles hundreds of tiny programs and runs each for milliseconds: XLA's CPU backend
# at optimisation level 0, and the classic (non-partitionable) threefry, whose programs compile
# ~2x faster, cut the fast suite's wall-clock by a sixth, the unit tests' by 30-50%
# (docs/results.md: 1355 -> 1131 s on the idle 2-core machine). Both are
# inherited by the subprocesses the tests start; what the tests check (values against
# references, equality between layouts and runs) does not depend on either. WMRL_TEST_XLA=default
# keeps JAX's defaults (what a production run uses).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
if os.environ.get("WMRL_TEST_XLA") != "default":
    os.environ["XLA_FLAGS"] += (
        " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    )
    os.environ.setdefault("JAX_THREEFRY_PARTITIONABLE", "0")
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
    (tests/support/rl_fixtures.py): built by the first run that uses them, loaded by the others."""
    root = tmp_path_factory.mktemp("rl_shared")
    return root / "data", root / "init"


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the cache is shared
        return  # by all workers, and the controller removes it when every worker is done
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR", "")
    if os.path.basename(cache).startswith("wmrl-jax-cache-"):
        import shutil

        shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="session")
def fake_gcs_server():
    """The fake GCS JSON API for TensorStore (tests/support/fake_gcs.py), one per session:
    TensorStore reads its endpoint from the environment."""
    from tests.support import fake_gcs

    server = fake_gcs.start_server()
    env = {
        "TENSORSTORE_GCS_HTTP_URL": f"http://127.0.0.1:{server.server_address[1]}",
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake-token",
    }
    os.environ.update(env)
    yield server
    server.shutdown()
    for k in env:
        os.environ.pop(k, None)


@pytest.fixture
def fake_gcs(fake_gcs_server, monkeypatch):
    """`gs://` served from a fresh in-memory object store for one test, for epath (fsspec)
    and Orbax (TensorStore) alike. Yields the store; `store.root` is a fresh bucket's URL
    (fresh so that no TensorStore cache entry of an earlier test can match)."""
    import uuid

    import fsspec
    from etils.epath import backend, gpath
    from fsspec.registry import _registry
    from orbax.checkpoint._src.path import gcs_utils

    from tests.support import fake_gcs

    store = fake_gcs.ObjectStore()
    store.root = f"gs://wmrl-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setitem(fake_gcs.CURRENT, "store", store)
    for protocol in ("gs", "gcs"):
        fsspec.register_implementation(protocol, fake_gcs.FakeGCSFileSystem, clobber=True)
    backend.fsspec_backend._get_filesystem.cache_clear()
    # epath would use TensorFlow's gfile for gs:// if TensorFlow were installed.
    monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
    # Orbax asks google-cloud-storage whether the bucket has a hierarchical namespace.
    monkeypatch.setattr(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False)
    yield store
    for protocol in ("gs", "gcs"):
        _registry.pop(protocol, None)
    backend.fsspec_backend._get_filesystem.cache_clear()
