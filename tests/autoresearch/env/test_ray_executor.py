"""The Ray executor, for real: a simulated cluster (`ray.cluster_utils.Cluster`, one CPU per
node) on this machine, real scripts in each node's real sandbox pool.

Fast suite: field and address errors, the missing extra, grading identical to the local pool,
the cluster's free slots, the attack on Ray from a sandbox, a few adversarial scripts, a node
removed mid-batch, the refusal of the rlimits level beside a Ray node (a local pool or a
node's own). Slow: every adversarial script against the local pool's statuses.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import sys
import textwrap
import time

import pytest

from tests.support.autoresearch_fixtures import GOOD_SCRIPT, good_script_score, make_tiny_task
from wmrl.autoresearch.env.executor import make_executor, validate_suite_executor
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.pool import SandboxPool, SandboxStartupError
from wmrl.config_errors import ConfigError

pytestmark = [
    pytest.mark.real,
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox"),
]

ray = pytest.importorskip("ray", reason="the Ray extra (requirements-ray.txt) is not installed")
from ray.cluster_utils import Cluster  # noqa: E402

from wmrl.autoresearch.env.ray_executor import RayExecutor, pack_task  # noqa: E402

LIMITS = {"disk_mb": 64, "fsize_mb": 48, "submission_mb": 16}


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_tiny_task(tmp_path_factory.mktemp("tasks") / "tiny", time_limit_s=3.0)


@pytest.fixture(scope="module")
def roomy_task(tmp_path_factory):
    """For scripts that must end by themselves: the default tasks' 60 s (the memory bomb's
    reclaim near the cgroup cap outlasted the tiny task's 3 s in a CI run)."""
    return make_tiny_task(tmp_path_factory.mktemp("tasks") / "roomy", time_limit_s=60.0)


@pytest.fixture(scope="module")
def ray_pool(cluster):
    with RayExecutor(1, address=cluster.address, **LIMITS) as p:
        yield p


def dedent(body: str) -> str:
    return textwrap.dedent(body).lstrip()


def assert_nodes_clean(pool: RayExecutor) -> None:
    """No process under any node's sandbox uids, nothing left in any node's work root."""
    deadline = time.monotonic() + 5
    while True:
        left = {n: ray.get(pool.actor(n).sandbox_leftovers.remote()) for n in pool.alive_nodes()}
        dirty = {n: v for n, v in left.items() if v["pids"] or v["workroot"]}
        if not dirty or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert dirty == {}, dirty


# -- no cluster needed ---------------------------------------------------------------------------


def test_executor_fields_are_validated_by_name():
    with pytest.raises(ConfigError, match=r"config\.suite\.executor.*'slurm'"):
        validate_suite_executor({"executor": "slurm"})
    with pytest.raises(ConfigError, match=r"config\.suite\.ray_address"):
        validate_suite_executor({"executor": "ray", "ray_address": "http://head:8265"})
    with pytest.raises(ConfigError, match=r"config\.suite\.ray_address"):
        validate_suite_executor({"executor": "ray", "ray_address": "ray://head"})
    with pytest.raises(ConfigError, match=r"config\.suite\.allow_mixed_isolation"):
        validate_suite_executor({"executor": "ray", "allow_mixed_isolation": "yes"})
    for ok in ("auto", "local", "ray://head:10001", "10.0.0.2:6379"):
        validate_suite_executor({"executor": "ray", "ray_address": ok})
    validate_suite_executor({})  # missing fields are the defaults (local)
    with pytest.raises(ConfigError, match=r"config\.suite\.executor"):
        make_executor(executor="ray ")


def test_trainer_config_validation_names_the_executor_fields(tmp_path):
    import importlib.util

    from wmrl.autoresearch.config import validate_autoresearch_config

    spec = importlib.util.spec_from_file_location("tiny", "configs/autoresearch_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    config = mod.get_config()
    assert (config.suite.executor, config.suite.ray_address) == ("local", "auto")
    assert config.suite.allow_mixed_isolation is False
    validate_autoresearch_config(config)
    config.suite.executor = "kubernetes"
    with pytest.raises(ConfigError, match=r"config\.suite\.executor"):
        validate_autoresearch_config(config)
    config.suite.executor, config.suite.ray_address = "ray", "head"
    with pytest.raises(ConfigError, match=r"config\.suite\.ray_address"):
        validate_autoresearch_config(config)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    config.suite.ray_address = f"ray://127.0.0.1:{port}"  # a run: refused before any write
    from wmrl.autoresearch.experiment import run

    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"config\.suite\.ray_address.*nothing answers"):
        run(config, tmp_path / "wd", progress=False)
    assert time.monotonic() - t0 < 15.0
    assert not (tmp_path / "wd").exists()


def test_missing_ray_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets without the extra
    with pytest.raises(ImportError, match=r"requirements-ray\.txt"):
        make_executor(executor="ray", ray_address="auto")


def test_unreachable_ray_address_fails_within_bounded_time(monkeypatch):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    for address in (f"ray://127.0.0.1:{port}", f"127.0.0.1:{port}"):
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match=r"suite\.ray_address") as e:
            make_executor(executor="ray", ray_address=address, workers=1)
        assert time.monotonic() - t0 < 15.0
        assert address in str(e.value)
        assert not ray.is_initialized()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # "auto" finds a cluster gone
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=r"suite\.ray_address='auto'.*nothing answers"):
        make_executor(executor="ray", ray_address="auto", workers=1)
    assert time.monotonic() - t0 < 15.0 and not ray.is_initialized()


def test_task_data_key_is_content_addressed(task, tmp_path):
    """Same content, other directory and times: same key; one byte changed: another."""
    import shutil

    key, data = pack_task(task.root)
    copy = tmp_path / "copy"
    shutil.copytree(task.root, copy)
    os.utime(copy / "public" / "train.csv", (0, 12345))
    assert pack_task(copy)[0] == key
    with open(copy / "private" / "test_labels.csv", "a") as f:
        f.write("\n")
    assert pack_task(copy)[0] != key
    assert len(data) > os.path.getsize(task.public_dir / "train.csv")


# -- on the simulated cluster ----------------------------------------------------------------------

BATCH = [
    GOOD_SCRIPT,
    GOOD_SCRIPT.replace("LogisticRegression()", "LogisticRegression(C=0.01)"),
    "import os\nopen(os.environ['SUBMISSION_PATH'], 'w').write('id,label\\n0,yes\\n')\n",
    "import sys\nsys.exit(3)\n",
    "def f(:\n",
    "print('nothing written')\n",
    GOOD_SCRIPT.replace('"label": m.predict', '"wrong": m.predict'),
]


def test_batch_is_graded_identically_to_the_local_pool(ray_pool, task):
    assert ray_pool.num_workers == 2 and len(ray_pool.alive_nodes()) == 2
    futs = ray_pool.submit_batch([(task, s) for s in BATCH])
    got = [f.result() for f in ray_pool.as_completed(futs)]
    assert len(got) == len(BATCH)
    ray_results = [f.result() for f in futs]
    with SandboxPool(2, **LIMITS) as local:
        local_results = [f.result() for f in local.submit_batch([(task, s) for s in BATCH])]
    key = lambda r: (r.task_id, r.status, r.score, r.percentile, r.reward, r.isolation)
    assert [key(r) for r in ray_results] == [key(r) for r in local_results]
    assert ray_results[0].status == Status.VALID
    assert ray_results[0].score == pytest.approx(good_script_score(task))  # independent
    assert [r.status for r in ray_results[2:]] == [
        Status.INVALID_SUBMISSION,
        Status.RUNTIME_ERROR,
        Status.MALFORMED,
        Status.NO_SUBMISSION,
        Status.INVALID_SUBMISSION,
    ]
    used = {ray_pool.nodes_tried(f)[0] for f in futs[:6]}
    assert used == set(ray_pool.alive_nodes())  # both nodes took work
    assert all(r.attempts == 1 for r in ray_results)


def test_free_slots_count_the_cluster(ray_pool, task):
    assert ray_pool.free_slots() == 2
    futs = ray_pool.submit_batch([(task, "import time\ntime.sleep(0.5)\n")] * 3)
    assert ray_pool.free_slots() == 0
    assert [f.result().status for f in ray_pool.as_completed(futs)] == [Status.NO_SUBMISSION] * 3
    assert ray_pool.free_slots() == 2


def attack_script(surfaces: list[dict]) -> str:
    """Try the Ray cluster (every listening port of the node, the unix sockets, the session
    dir, the RAY_* variables) and the actors and pool templates (signal 0 = are you there)."""
    ports = sorted({p for s in surfaces for p in s["ports"]})
    hosts = sorted({"127.0.0.1", *(s["node_ip"] for s in surfaces)})
    pids = sorted({p for s in surfaces for p in (s["pid"], s["template_pid"])})
    paths = sorted(
        {p for s in surfaces for p in (s["plasma_socket"], s["raylet_socket"]) if p}
        | {s["session_dir"] for s in surfaces}
    )
    writable = sorted(
        {s["session_dir"] for s in surfaces}
        | {f"{s['session_dir']}/runtime_resources/py_modules_files" for s in surfaces}
    )
    return dedent(f"""
        import os, socket
        print("env", sorted(k for k in os.environ if "RAY" in k.upper()))
        print("env values", [k for k, v in os.environ.items() if "/tmp/ray" in v])
        for host in {hosts!r}:
            for port in {ports!r}:
                s = socket.socket()  # no name lookup (rlimits as root cannot import idna)
                s.settimeout(0.3)
                try:
                    s.connect((host, port))
                    print("connected", host, port)
                except OSError:
                    pass
                s.close()
        for path in {paths!r}:
            print("exists" if os.path.exists(path) else "absent", path)
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                print("unix-connected", path)
            except OSError:
                pass
        print("tmp/ray", os.path.exists("/tmp/ray"))
        for d in {writable!r}:  # Ray makes its session dirs world-writable
            try:
                with open(os.path.join(d, "wmrl-sandbox-probe"), "w") as f:
                    f.write("x")
                print("wrote", d)
            except OSError:
                pass
        for pid in {pids!r}:
            try:
                os.kill(pid, 0)
                print("reached", pid)
            except OSError as e:
                print("unreached", pid, type(e).__name__)
        print("done")
    """)


def surfaces_of(pool: RayExecutor) -> list[dict]:
    return ray.get([pool.actor(n).attack_surface.remote() for n in pool.alive_nodes()])


def test_sandboxed_script_reaches_neither_ray_nor_its_actor(ray_pool, task, cluster):
    surfaces = surfaces_of(ray_pool)
    # The control, from outside the sandbox on the same machine: each probe can succeed.
    gcs_host, gcs_port = surfaces[0]["gcs_address"].rsplit(":", 1)
    assert int(gcs_port) in surfaces[0]["ports"]
    socket.create_connection((gcs_host, int(gcs_port)), timeout=2).close()
    assert os.path.exists(surfaces[0]["plasma_socket"])
    assert os.path.isdir(surfaces[0]["session_dir"])
    assert any(k.startswith("RAY_") for k in surfaces[0]["ray_env"])  # the actor has them
    os.kill(surfaces[0]["pid"], 0)
    script = attack_script(surfaces)
    futs = ray_pool.submit_batch([(task, script)] * 2)  # one per node (1 slot each)
    cf.wait(futs)
    assert {ray_pool.nodes_tried(f)[0] for f in futs} == set(ray_pool.alive_nodes())
    for f in futs:
        r = f.result()
        assert r.status == Status.NO_SUBMISSION and r.isolation.startswith("namespaces"), r
        out = r.stdout_tail
        assert "done" in out, r
        assert "env []" in out and "env values []" in out
        assert "connected" not in out  # neither TCP nor unix sockets
        assert "exists" not in out and "tmp/ray False" in out and "wrote" not in out
        assert "reached" not in out.replace("unreached", "")
        assert out.count("unreached") == len(
            {p for s in surfaces for p in (s["pid"], s["template_pid"])}
        )
    assert all(ray.get(ray_pool.actor(n).info.remote()) for n in ray_pool.alive_nodes())
    assert_nodes_clean(ray_pool)
    assert ray_pool.run(task, GOOD_SCRIPT).score == pytest.approx(good_script_score(task))


# Adversarial scripts of test_autoresearch_sandbox.py with the statuses they get there.
ADVERSARIAL = {
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        Status.TIMEOUT,
    ),
    "memory_bomb": (
        "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))\n",
        Status.RUNTIME_ERROR,
    ),
    "read_labels": (
        "import os, shutil\nfor p in LABELS:\n    shutil.copy(p, os.environ['SUBMISSION_PATH'])\n",
        Status.RUNTIME_ERROR,
    ),
    "raise_limits": (
        dedent("""
            import os, resource
            for res in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_NPROC):
                try:
                    resource.setrlimit(res, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
                    print("raised", res)
                except (ValueError, OSError):
                    print("denied", res)
            try:
                os.setuid(0)
                print("raised uid")
            except OSError:
                print("denied uid")
        """),
        Status.NO_SUBMISSION,
    ),
    "sleep_forever": ("import time\ntime.sleep(10**6)\n", Status.TIMEOUT),
    "cpu_spin": ("while True:\n    pass\n", Status.TIMEOUT),
    "daemon": (
        dedent("""
            import os, time
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(1000)
                os._exit(0)
            print("parent exits")
        """),
        Status.NO_SUBMISSION,
    ),
    "stdout_flood": (
        "import sys\nchunk = b'x' * 2**20\nfor _ in range(1024):\n"
        "    sys.stdout.buffer.write(chunk)\n",
        (Status.NO_SUBMISSION, Status.TIMEOUT),
    ),
    "fill_disk": (
        "i = 0\nwhile True:\n    open(f'fill{i}.bin', 'wb').write(b'0' * 2**23)\n    i += 1\n",
        Status.RUNTIME_ERROR,
    ),
    "symlink_labels": (
        "import os\nos.symlink(LABELS[-1], os.environ['SUBMISSION_PATH'])\n",
        Status.NO_SUBMISSION,
    ),
    "garbage": (bytes(range(256)) * 8, Status.MALFORMED),
}
FAST_ADVERSARIAL = ("memory_bomb", "read_labels", "raise_limits", "daemon", "garbage")


def _expected(status) -> tuple:
    return status if isinstance(status, tuple) else (status,)


def labels_paths(ray_pool, task) -> list[str]:
    """The labels where the driver has them and where every node keeps its cached copy."""
    key = pack_task(task.root)[0]
    caches = [s["cache"] for s in surfaces_of(ray_pool)]
    return [str(task.labels_path), *(f"{c}/{key}/private/test_labels.csv" for c in caches)]


def cache_on_every_node(pool, task, labels) -> None:
    """Batches of the good script until every node has cached the task (which node runs a
    script is the scheduler's choice, so earlier tests may have used only one)."""
    deadline = time.monotonic() + 60
    while missing := [p for p in labels if not os.path.exists(p)]:
        assert time.monotonic() < deadline, f"labels never cached at {missing}"
        futs = [pool.submit(task, GOOD_SCRIPT) for _ in range(2 * len(pool.alive_nodes()))]
        assert all(f.result().status == Status.VALID for f in futs)


def run_adversarial(pool, task, names, labels) -> dict:
    def source(n):
        src = ADVERSARIAL[n][0]
        return src if isinstance(src, bytes) else f"LABELS = {labels!r}\n" + src

    futs = {n: pool.submit(task, source(n)) for n in names}
    return {n: f.result() for n, f in futs.items()}


def test_adversarial_scripts_are_contained_on_ray_nodes(ray_pool, roomy_task):
    task = roomy_task
    labels = labels_paths(ray_pool, task)
    cache_on_every_node(ray_pool, task, labels)  # on this machine, outside the sandbox
    got = run_adversarial(ray_pool, task, FAST_ADVERSARIAL, labels)
    for name, r in got.items():
        assert r.status in _expected(ADVERSARIAL[name][1]), (name, r)
        assert r.attempts == 1, (name, r)
    assert "raised" not in got["raise_limits"].stdout_tail
    assert "MemoryError" in got["memory_bomb"].stderr_tail
    assert_nodes_clean(ray_pool)
    assert ray_pool.run(task, GOOD_SCRIPT).score == pytest.approx(good_script_score(task))


@pytest.mark.slow
def test_every_adversarial_script_gets_the_local_pools_status_on_ray(ray_pool, task):
    names = list(ADVERSARIAL)
    labels = labels_paths(ray_pool, task)
    got = run_adversarial(ray_pool, task, names, labels)
    with SandboxPool(2, **LIMITS) as local:
        want = run_adversarial(local, task, names, labels)
    for name in names:
        assert got[name].status == want[name].status, (name, got[name], want[name])
        assert got[name].status in _expected(ADVERSARIAL[name][1]), (name, got[name])
    assert_nodes_clean(ray_pool)


def test_an_rlimits_sandbox_never_runs_beside_a_ray_node(cluster):
    """At the rlimits level a script shares the host's network: the GCS and raylet ports
    answer it, and Ray runs what it is sent as the user that runs Ray (root here). The
    combination is refused: a local rlimits pool on a host where a Ray node listens (naming
    the GCS port), and a Ray node whose own pool would run at rlimits, whether or not
    allow_mixed_isolation is set. (startup_check=False: the refusal comes before the canary.)"""
    gcs_port = int(cluster.address.rsplit(":", 1)[1])
    with pytest.raises(
        SandboxStartupError, match=rf"a Ray node listens on this host at TCP port .*{gcs_port}"
    ):
        SandboxPool(1, isolation="rlimits", startup_check=False)
    t0 = time.monotonic()
    for allow in (False, True):
        with pytest.raises(RuntimeError, match=r"(?s)could not start.*a Ray node listens on this"):
            RayExecutor(
                1, address=cluster.address, isolation=["auto", "rlimits"],
                allow_mixed_isolation=allow, startup_check=False,
            )  # fmt: skip
    assert time.monotonic() - t0 < 240


def test_node_removed_mid_batch_completes_elsewhere(cluster, ray_pool, task):
    """Last in this module: it takes the module cluster's second node away for good."""
    pool = ray_pool
    (extra,) = [n for n in cluster.list_all_nodes() if n is not cluster.head_node]
    lost = extra.node_id
    assert lost in pool.alive_nodes() and pool.num_workers == 2
    slow_good = "import time\ntime.sleep(2.0)\n" + GOOD_SCRIPT
    futs = pool.submit_batch([(task, slow_good)] * 4)
    deadline = time.monotonic() + 60
    while not any(pool.nodes_tried(f)[:1] == [lost] for f in futs):  # it has one running
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # inside the sandbox on that node now
    cluster.remove_node(extra)
    results = [f.result() for f in futs]
    expected = good_script_score(task)
    for f, r in zip(futs, results, strict=True):
        assert r.status == Status.VALID and r.score == pytest.approx(expected), r
        tried = pool.nodes_tried(f)
        if tried[0] == lost:
            assert len(tried) == 2 and tried[1] != lost and r.attempts == 2, (tried, r)
        else:
            assert lost not in tried and r.attempts == 1
    assert sum(pool.nodes_tried(f)[0] == lost for f in futs) >= 1
    assert lost not in pool.alive_nodes()
    assert pool.free_slots() == 1  # the lost node's slot is gone
    assert pool.run(task, GOOD_SCRIPT).status == Status.VALID


def test_episode_results_carry_validation_and_error_type_through_ray(
    ray_pool, task, tmp_path_factory
):
    """A multi-turn episode task travels to the nodes whole (its validation labels too) and
    its results come back with the validation metric and the error type the local pool
    gives."""
    from wmrl.autoresearch.env.episode import make_episode_task

    episode = make_episode_task(task, tmp_path_factory.mktemp("episodes"))
    scripts = [GOOD_SCRIPT, GOOD_SCRIPT.replace('tr["label"]', 'tr["Label"]')]
    ray_results = [f.result() for f in ray_pool.submit_batch([(episode, s) for s in scripts])]
    with SandboxPool(1, startup_check=False, **LIMITS) as local:
        local_results = [local.run(episode, s) for s in scripts]
    key = lambda r: (r.status, r.score, r.reward, r.validation, r.error_type)
    assert [key(r) for r in ray_results] == [key(r) for r in local_results]
    assert ray_results[0].status == Status.VALID and ray_results[0].validation is not None
    assert (ray_results[1].status, ray_results[1].error_type) == (Status.RUNTIME_ERROR, "KeyError")
