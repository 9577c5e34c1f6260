"""configs/autoresearch_mle.py (the tiny pipeline on a directory of imported competitions) and
its pod variant for Qwen3-4B (configs/autoresearch_mle_qwen3_4b.py): what they set, that the
trainer's validation accepts an imported suite and names the field otherwise, and the pod
variant's policy train step compiled AOT on 32 fake devices."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from wmrl.autoresearch.config import validate_autoresearch_config
from wmrl.config_errors import ConfigError
from wmrl.experiment.config import load_config_file

ROOT = Path(__file__).resolve().parents[3]


def config(name: str):
    return load_config_file(ROOT / "configs" / f"{name}.py")


@pytest.mark.real
def test_the_mle_config_is_the_tiny_pipeline_on_a_competition_suite(tmp_path):
    from tests.support.competition_fixtures import import_both

    c, tiny = config("autoresearch_mle"), config("autoresearch_tiny")
    assert (c.suite.dir, c.suite.time_limit_s, c.data.max_prompt_len) == ("competitions", 120.0,
                                                                           160)  # fmt: skip
    # Nothing else differs from the tiny config: no new field.
    flat = lambda cfg: {k: v for k, v in cfg.items() if k not in ("suite", "data")}
    assert flat(c.to_dict()) == flat(tiny.to_dict())
    assert set(c.suite.keys()) == set(tiny.suite.keys())
    assert set(c.data.keys()) == set(tiny.data.keys())
    c.suite.dir = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"config\.suite\.dir"):
        validate_autoresearch_config(c)
    c.suite.dir = str(import_both(tmp_path / "comps"))  # the import writes suite.json
    validate_autoresearch_config(c)


def test_the_pod_variant_sizes_qwen3_4b_for_the_competition_suite():
    from wmrl.tools.aot_check import step_shape

    c, qwen = config("autoresearch_mle_qwen3_4b"), config("qwen3_4b")
    assert step_shape(c) == step_shape(qwen) == (64, 512 + 1536, 2)
    assert c.model == qwen.model and c.mesh_shape == qwen.mesh_shape
    assert c.suite.dir == "competitions" and c.suite.time_limit_s == 600.0
    assert c.pretrained.wm_trunk and c.pretrained.checkpoint == ""


@pytest.mark.real
def test_the_pod_variant_compiles_on_32_fake_devices():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, "-m", "wmrl.tools.aot_check",
         "--config=configs/autoresearch_mle_qwen3_4b.py", "--mesh=2,8,2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "(32 devices)" in out and "compiled temp_size" in out, out
    params = float(re.search(r"^parameters\s+([\d,]+)", out, re.MULTILINE)[1].replace(",", ""))
    assert 3.9e9 < params < 4.1e9, out  # Qwen3-4B, embeddings tied
