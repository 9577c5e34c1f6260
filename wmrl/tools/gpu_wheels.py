"""Download the wheels `wmrl.benchmarks.gpu_suite` needs on the GPU machine (no network there).

  python -m wmrl.tools.gpu_wheels --out=/tmp/wmrl-gpu/wheels --also=/tmp/wmrl-gpu/artefacts

The device machine's image ('cuda') has Python 3.12 with jax 0.11.2 and its CUDA 13 plugin and
a large scientific stack (`ON_DEVICE`, as the workplace's notes list it). This resolves the
suite's requirements (their ranges read from requirements.txt) for CPython 3.12 on manylinux
x86_64 together with `jax==0.11.2`, drops what the image has (except `CARRY_ANYWAY`: the
libraries whose version our code is pinned to, small, which the suite puts first on
PYTHONPATH) and what nothing the suite runs imports, and downloads the rest, one pinned wheel
each, without dependencies (the suite installs them with `--no-deps`). A requirement published
only as a source archive is built here into a pure-Python wheel. The run fails, naming the
largest wheels, when the wheels (plus `--also`, the artefacts that travel with them) exceed
`--limit_mib` (the device tool's carry limit: 64 MiB in all).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JAX_ON_DEVICE = "0.11.2"
# What the suite imports (wmrl.autoresearch.experiment and the trainer, the benchmarks, the
# sandboxed
# scripts' scientific stack); the version ranges come from requirements.txt.
NEEDED = (
    "flax", "optax", "orbax-checkpoint", "etils", "ml-collections", "absl-py", "tqdm",
    "tensorboardX", "matplotlib", "scikit-learn", "pandas", "tensorflow-datasets",
)  # fmt: skip
# In the device machine's image, as last listed (2026-11-17; versions unknown, the suite's `env`
# part records them), restricted to what the suite's resolution contains.
ON_DEVICE = (
    "absl-py", "aiofiles", "attrs", "certifi", "charset-normalizer", "chex", "cloudpickle",
    "contourpy", "cycler", "einops", "etils", "filelock", "flax", "fonttools", "fsspec",
    "humanize", "idna", "jax", "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "joblib",
    "kiwisolver", "markdown-it-py", "matplotlib", "mdurl", "ml-dtypes", "msgpack", "narwhals",
    "numpy", "opt-einsum", "optax", "orbax-checkpoint", "packaging", "pandas", "pillow",
    "prometheus-client", "protobuf", "psutil", "pyarrow", "pygments", "pyparsing",
    "python-dateutil", "pyyaml", "requests", "rich", "safetensors", "scikit-learn", "scipy",
    "sentencepiece", "simplejson", "six", "tensorstore", "threadpoolctl", "tokenizers", "toolz",
    "tqdm", "treescope", "typing-extensions", "urllib3", "uvloop", "wrapt", "zipp",
)  # fmt: skip
# Carried although the image has them: our code is pinned to their version range and the
# image's versions are not known beforehand; small, and first on PYTHONPATH there.
CARRY_ANYWAY = ("flax", "optax", "orbax-checkpoint", "etils")
# Declared dependencies that nothing the suite runs imports (checked by running the CPU dry
# run of the suite in a Python 3.12 environment holding only ON_DEVICE plus these wheels).
NOT_IMPORTED = ("array-record",)
# Published as source archives only: built here into pure-Python wheels.
SDIST_ONLY = ("promise",)
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(17, 29)] + ["manylinux2014_x86_64"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines(names=NEEDED, path: Path = ROOT / "requirements.txt") -> list[str]:
    """The lines of requirements.txt for `names` (extras kept), comments stripped."""
    wanted = {canonical(n) for n in names}
    out = []
    for line in path.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec and canonical(re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0]) in wanted:
            out.append(spec)
    missing = wanted - {canonical(re.split(r"[\[<>=!~; ]", s, maxsplit=1)[0]) for s in out}
    if missing:
        raise ValueError(f"requirements.txt has no line for {sorted(missing)}")
    return out


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]


def _target_flags(python_version: str) -> list[str]:
    abi = "cp" + python_version.replace(".", "")
    flags = ["--only-binary=:all:", "--python-version", python_version, "--implementation",
             "cp", "--abi", abi]  # fmt: skip
    for p in PLATFORMS:
        flags += ["--platform", p]
    return flags


def resolve(requirements: list[str], python_version: str, local: Path) -> list[tuple[str, str]]:
    """(name, version) of every distribution pip would install for the target interpreter."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report",
                   str(report), "--find-links", str(local), "--target", str(Path(tmp) / "t"),
                   *_target_flags(python_version), f"jax=={JAX_ON_DEVICE}",
                   *requirements)  # fmt: skip
        subprocess.run(cmd, check=True)
        items = json.loads(report.read_text())["install"]
    return [(i["metadata"]["name"], i["metadata"]["version"]) for i in items]


def download(out: Path, python_version: str = "3.12") -> dict:
    """Fill `out` with the wheels; returns {"wheels": {file: MiB}, "total_mib", "left_out"}."""
    out.mkdir(parents=True, exist_ok=True)
    for name in SDIST_ONLY:  # pure Python: a wheel built here installs anywhere
        subprocess.run(_pip("wheel", "--no-deps", "--quiet", "-w", str(out), name), check=True)
    resolved = resolve(requirement_lines(), python_version, out)
    skip = {canonical(n) for n in ON_DEVICE + NOT_IMPORTED} - {canonical(n) for n in CARRY_ANYWAY}
    pins = [f"{n}=={v}" for n, v in resolved if canonical(n) not in skip]
    built = {canonical(n) for n in SDIST_ONLY}
    pins = [p for p in pins if canonical(p.split("==")[0]) not in built]
    cmd = _pip("download", "--no-deps", "--quiet", "-d", str(out), *_target_flags(python_version),
               *pins)  # fmt: skip
    subprocess.run(cmd, check=True)
    wanted = {canonical(p.split("==")[0]) for p in pins} | built
    for f in out.glob("*.whl"):  # leftovers of an earlier download with other pins
        if canonical(f.name.split("-")[0]) not in wanted:
            f.unlink()
    sizes = {f.name: f.stat().st_size / 2**20 for f in sorted(out.glob("*.whl"))}
    left_out = sorted(f"{n}=={v}" for n, v in resolved if canonical(n) in skip)
    return {"wheels": sizes, "total_mib": sum(sizes.values()), "left_out": left_out}


def folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**20


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m wmrl.tools.gpu_wheels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", required=True, help="folder for the wheels (not in the repository)")
    p.add_argument("--python_version", default="3.12", help="the device machine's Python")
    p.add_argument("--also", action="append", default=[],
                   help="a folder that travels with the wheels (counted in the limit)")  # fmt: skip
    p.add_argument("--limit_mib", type=float, default=64.0, help="what may be carried in all")
    opts = p.parse_args(argv)
    report = download(Path(opts.out), opts.python_version)
    biggest = sorted(report["wheels"].items(), key=lambda kv: -kv[1])
    for name, mib in biggest:
        print(f"  {mib:7.2f} MiB  {name}")
    extra = {d: folder_mib(Path(d)) for d in opts.also}
    total = report["total_mib"] + sum(extra.values())
    print(f"{len(biggest)} wheels, {report['total_mib']:.2f} MiB; left out (on the machine or "
          f"never imported): {', '.join(report['left_out'])}")  # fmt: skip
    for d, mib in extra.items():
        print(f"  + {mib:.2f} MiB in {d}")
    print(f"carried in all: {total:.2f} MiB of {opts.limit_mib:g} MiB")
    if total > opts.limit_mib:
        top = ", ".join(f"{n} ({m:.1f} MiB)" for n, m in biggest[:5])
        sys.exit(f"error: {total:.2f} MiB exceeds --limit_mib={opts.limit_mib:g}; largest: {top}")


if __name__ == "__main__":
    main()
