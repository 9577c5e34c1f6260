"""Cost-aware routing's config (`routing = cost`): its cap reaches the trainer, and bad
values are refused naming the field before anything is written."""

import re

import pytest

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch.config import parse_config, trainer_config
from wmrl.config_errors import ConfigError


def config(**changes):
    return tiny_config("/tmp/unused-data", "/tmp/unused-init", **changes)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(routing="cost", correction__cheap_limit_s=-1.0), "correction.cheap_limit_s"),
        (dict(routing="cost", correction__cheap_limit_s=25.0), "correction.cheap_limit_s"),
        (dict(routing="cost", correction__cheap_quantile=1.0), "correction.cheap_quantile"),
        (dict(routing="cost", correction__cheap_quantile=-0.2), "correction.cheap_quantile"),
        (dict(routing="cost", correction__cheap_quantile=1.5), "correction.cheap_quantile"),
        (dict(routing="cost"), "correction.cheap_limit_s"),  # no cap at all
        (
            dict(routing="cost", correction__cheap_limit_s=2.0, correction__cheap_quantile=0.8),
            "correction.cheap_quantile",  # both: ambiguous
        ),
        (dict(correction__cheap_limit_s=2.0), "correction.cheap_limit_s"),  # without cost
        (dict(correction__cheap_quantile=0.5), "correction.cheap_quantile"),
        (dict(routing="cost", correction__cheap_limit_s=2.0, suite__executor="ray"), "routing"),
        (
            dict(
                routing="cost",
                correction__cheap_limit_s=2.0,
                env__turns=2,
                rl__anchor_lag=0,
                data__max_prompt_len=400,
            ),
            "routing",  # multi-turn: not built yet
        ),
        (
            dict(mode="real", routing="cost", correction__cheap_quantile=0.5),
            "correction.cheap_quantile",
        ),
    ],
)
def test_bad_cost_routing_is_refused_naming_the_field(changes, field):
    with pytest.raises(ConfigError, match="^" + re.escape(f"config.{field}: ")):
        parse_config(config(**changes))


def test_the_cap_reaches_the_trainer_config():
    # suite.time_limit_s is the tiny config's 20 s: a cap there (not above) is accepted.
    fixed = trainer_config(config(routing="cost", correction__cheap_limit_s=20.0))
    assert fixed.cheap.limit_s == 20.0 and not fixed.cheap.adaptive
    adaptive = trainer_config(config(routing="cost", correction__cheap_quantile=0.8))
    assert adaptive.cheap.adaptive and adaptive.cheap.quantile == 0.8
    assert trainer_config(config()).cheap is None
    real = trainer_config(config(mode="real", routing="cost", correction__cheap_limit_s=2.0))
    assert real.cheap.limit_s == 2.0 and real.routing.rho == 1.0  # every group, capped
