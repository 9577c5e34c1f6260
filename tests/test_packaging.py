"""pyproject.toml declares the runtime dependencies requirements.txt pins, with the same
ranges, and neither holds the test tools (requirements-test.txt does)."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_TOOLS = ("pytest", "ruff", "nbclient", "nbformat", "ipykernel", "pytest-xdist")


def _requirements(path: Path) -> dict[str, str]:
    """{canonical name: the requirement without spaces} of a requirements file."""
    out = {}
    for line in path.read_text().splitlines():
        req = line.split("#", 1)[0].replace(" ", "")
        if req:
            out[_name(req)] = req
    return out


def _name(req: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", req).group(0)).lower()


def test_pyproject_declares_what_requirements_txt_pins():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pyproject = {_name(r): r.replace(" ", "") for r in declared}
    assert pyproject == _requirements(ROOT / "requirements.txt")


def test_test_tools_are_apart():
    runtime = _requirements(ROOT / "requirements.txt")
    tests = _requirements(ROOT / "requirements-test.txt")
    assert not set(TEST_TOOLS) & set(runtime)
    assert set(TEST_TOOLS) <= set(tests)
