"""The speedup benchmark's capped modes (`<mode>+cap`, cost-aware routing): each names its
base mode and cap, and its config is the base mode's with routing=cost and that cap."""

import pytest

from tests.support.rl_fixtures import load_config
from wmrl.autoresearch.config import trainer_config
from wmrl.benchmarks.speedup_runner import DEFAULT_CAP_S, known_mode, mode_config, split_mode


@pytest.mark.parametrize(
    "name, base, limit, quantile",
    [
        ("wmrl+cap", "wmrl", DEFAULT_CAP_S, 0.0),
        ("static_anchors+cap=1.5", "static_anchors", 1.5, 0.0),
        ("real+cap=1", "real", 1.0, 0.0),
        ("wmrl+capq=0.8", "wmrl", 0.0, 0.8),
    ],
)
def test_capped_modes_run_their_base_mode_under_the_cap(name, base, limit, quantile):
    assert split_mode(name)[0] == base and known_mode(name)
    tc = trainer_config(mode_config(load_config(), name))
    assert tc.mode == base
    assert (tc.cheap.limit_s, tc.cheap.quantile) == (limit, quantile)


def test_uncapped_modes_are_todays():
    c = mode_config(load_config(), "wmrl")
    assert c.routing == "uniform" and trainer_config(c).cheap is None
    assert not known_mode("wmrl+capx") and not known_mode("nope+cap")
