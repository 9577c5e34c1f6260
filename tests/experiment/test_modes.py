"""A mode means one thing in every experiment: each builds its step's settings from the one
table (`wmrl.core.correct.MODE_SPECS`), and the switches it turns on are the table's row."""

import pytest

from tests.support.rl_fixtures import tiny_config
from wmrl.core.correct import MODE_SPECS, MODES

SWITCHES = ("uses_wm", "debias", "denoise", "fuse", "constant", "permute")


def _row(spec) -> dict:
    return {k: getattr(spec, k) for k in SWITCHES}


def test_the_table_hand_written():
    """What each mode turns on (the docs' modes table)."""
    on = {m: {k for k, v in _row(MODE_SPECS[m]).items() if v} for m in MODES}
    assert on == {
        "real": set(),
        "wm_only": {"uses_wm"},
        "debias_only": {"uses_wm", "debias"},
        "denoise_only": {"uses_wm", "denoise", "fuse"},
        "wmrl": {"uses_wm", "debias", "denoise", "fuse"},
        "static_anchors": {"uses_wm", "constant"},
        "permuted_wm": {"uses_wm", "debias", "denoise", "fuse", "permute"},
    }


@pytest.mark.parametrize("mode", MODES)
def test_autoresearch_step_settings_are_the_tables(mode, tmp_path):
    from wmrl.autoresearch.config import validate_autoresearch_config

    tc = validate_autoresearch_config(tiny_config(tmp_path / "d", tmp_path / "i", mode=mode))
    spec = MODE_SPECS[mode]
    assert _row(tc.spec) == _row(spec)
    assert tc.fuse == spec.fuse  # correction.sample_fusion = auto: the mode's


@pytest.mark.parametrize("mode", MODES)
def test_embodied_step_settings_are_the_tables(mode):
    from configs import embodied_push
    from wmrl.embodied import rl
    from wmrl.embodied.config import validate_embodied_config

    config = embodied_push.get_config("tiny")
    config.mode = mode
    validate_embodied_config(config)
    st = rl.statics_from_config(config)
    spec = MODE_SPECS[mode]
    assert _row(st.spec) == _row(spec)
    assert st.fused == spec.fuse
    assert (st.debias.mode != "none") == spec.debias


@pytest.mark.parametrize("mode", [m for m in MODES if not MODE_SPECS[m].control])
def test_bandit_variants_are_the_tables(mode):
    """The bandits (no static check, so neither control, `static_anchors` nor `permuted_wm`;
    the bandits' own tests list their variants): every WM mode executes its
    anchor groups; keyed debiasing, fusion and the anchor weight are the row's switches."""
    from wmrl.bandits.train import VARIANT_SPECS

    v, spec = VARIANT_SPECS[mode], MODE_SPECS[mode]
    assert (v.reward == "wm") == spec.uses_wm
    assert v.anchors == spec.uses_wm
    assert (v.debias == "keyed") == spec.debias
    assert v.fuse == spec.fuse
    assert v.anchor_weight == spec.denoise
