"""Multi-turn configs (`env.turns`): the schema, bad input named, the history prompt."""

import pytest

from tests.support.rl_fixtures import ROOT, load_config
from wmrl.autoresearch import history
from wmrl.autoresearch.config import (
    config_differences,
    load_config_file,
    validate_autoresearch_config,
)
from wmrl.autoresearch.env.dataset import SEP
from wmrl.config_errors import ConfigError


def multiturn_config():
    return load_config_file(ROOT / "configs" / "autoresearch_multiturn.py")


def test_tiny_config_is_single_turn_and_multiturn_config_is_valid():
    assert load_config().env.turns == 1
    c = multiturn_config()
    tc = validate_autoresearch_config(c)
    assert (tc.turns, c.env.turns) == (3, 3)
    assert tc.anchor_lag == c.rl.anchor_lag == 0  # synchronous anchors for K > 1
    assert c.data.max_prompt_len >= history.min_prompt_len(c.data.max_new_tokens)
    assert validate_autoresearch_config(load_config()).anchor_lag == 1


@pytest.mark.parametrize("turns", [0, -1])
def test_bad_turns_is_named(turns):
    c = multiturn_config()
    c.env.turns = turns
    with pytest.raises(ConfigError, match=r"config\.env\.turns"):
        validate_autoresearch_config(c)


def test_prompt_budget_too_small_for_the_history_is_named():
    c = multiturn_config()
    c.data.max_prompt_len = 96  # the single-turn budget: no room for a script in the history
    with pytest.raises(ConfigError, match=r"config\.data\.max_prompt_len.*env\.turns=3"):
        validate_autoresearch_config(c)
    c.env.turns = 1  # single-turn needs no history
    validate_autoresearch_config(c)


def test_runs_saved_before_env_turns_existed_are_single_turn():
    saved = load_config().to_dict()
    del saved["env"]
    assert config_differences(saved, load_config()) == []
    assert config_differences(saved, multiturn_config().to_dict()) != []
    two = {**load_config().to_dict(), "env": {"turns": 2}}
    assert "env.turns" in config_differences(saved, two)


def fits_within(n_chars):
    return lambda text: len(text) <= n_chars


def test_turn_one_prompt_is_the_single_turn_prompt():
    card = "- Type: classification\n- Data: all numeric"
    assert history.turn_prompt(card, [], fits_within(10)) == card + SEP
    assert history.card_of(card + SEP) == card


def test_history_keeps_the_last_script_and_older_observations_only():
    card = "CARD"
    past = [("script one\nA", "obs one"), ("script two\nB", "obs two")]
    past.append(("script three\nC", "obs 3"))
    text = history.turn_prompt(card, past, fits_within(10_000))
    assert text.startswith(card) and text.endswith(SEP)
    assert "script one" not in text and "script two" not in text  # older scripts dropped
    assert "obs one" in text and "obs two" in text  # their observations kept, in order
    assert text.index("obs one") < text.index("obs two") < text.index("script three")
    assert "### TURN 3 SCRIPT\nscript three\nC\n### TURN 3 RESULT\nobs 3" in text


def test_history_truncates_oldest_observations_then_the_last_scripts_tail():
    card, past = "CARD", [("old", "o1" * 20), ("old", "o2" * 20), ("x = 1\n" * 30, "last obs")]
    full = history.turn_prompt(card, past, fits_within(10_000))
    budget = len(full) - 30  # room for one older observation fewer
    text = history.turn_prompt(card, past, fits_within(budget))
    assert "o1" not in text and "o2o2" in text and "last obs" in text and len(text) <= budget
    tight = len(history.turn_prompt(card, past[-1:], fits_within(10_000))) - 40
    text = history.turn_prompt(card, past, fits_within(tight))
    assert "o2" not in text and history.TRUNCATED in text and "last obs" in text
    assert text.startswith(card) and len(text) <= tight
    with pytest.raises(ValueError, match="do not fit"):
        history.turn_prompt(card, past, fits_within(20))
