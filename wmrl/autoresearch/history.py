"""The prompt of turn t of a multi-turn episode: the task card plus the history, in budget.

docs/method.md 4: an episode has K turns (`env.turns`); the prompt of turn t is the task
card (`data.prompt_text` without its script separator) followed by the history of turns
1..t-1 and the script separator, so turn 1's prompt is exactly the single-turn prompt:

    <card facts>
    ### TURN 1 RESULT
    <observation of turn 1>          older turns: their observations only
    ### TURN 2 SCRIPT
    <script of turn 2>               the last turn: its script and its observation
    ### TURN 2 RESULT
    <observation of turn 2>
    ### SCRIPT

What is truncated to stay within `data.max_prompt_len` tokens: the scripts of every turn but
the last are always left out (their observations stay); if the prompt is still too long the
oldest observations are dropped first (the card, the last script and the last observation
always stay); if the last script alone (re-encoded, a few tokens longer than as sampled) does
not fit, its last lines are cut and a `# [truncated]` line marks the cut. The card itself is
the single-turn card: the column tables of wide tasks were never in it.

Pure text functions: the observation text comes rendered (one template for real and
world-model observations, `wmrl.autoresearch.env.observation.render_observation`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from wmrl.autoresearch.env.dataset import SEP

# The budget `data.max_prompt_len` must leave for one turn's history (validated before any
# tokenizer exists, so in tokens of the default tokenizers, with room to spare): the card
# (the single-turn prompt budget), the last script (`data.max_new_tokens`), its observation
# and the turn headers.
CARD_TOKENS = 96
OBSERVATION_TOKENS = 32
HEADER_TOKENS = 16
TRUNCATED = "# [truncated]"


def min_prompt_len(max_new_tokens: int) -> int:
    """Tokens a multi-turn prompt needs for the card and one turn's history."""
    return CARD_TOKENS + max_new_tokens + OBSERVATION_TOKENS + HEADER_TOKENS


def card_of(prompt_text: str) -> str:
    """The task card of a single-turn prompt (`data.prompt_text`): without its separator."""
    if not prompt_text.endswith(SEP):
        raise ValueError("a single-turn prompt ends with the script separator")
    return prompt_text[: -len(SEP)]


def _render(card: str, observations: Sequence[tuple[int, str]], last: tuple[int, str, str]):
    parts = [card]
    for turn, obs in observations:
        parts.append(f"\n### TURN {turn} RESULT\n{obs}")
    turn, script, obs = last
    parts.append(f"\n### TURN {turn} SCRIPT\n{script.rstrip()}\n### TURN {turn} RESULT\n{obs}")
    return "".join(parts) + SEP


def turn_prompt(card: str, history: Sequence[tuple[str, str]], fits: Callable[[str], bool]):
    """The prompt of turn `len(history) + 1`: `card` plus `history` [(script, rendered
    observation)] of the earlier turns, truncated (module docstring) until `fits(text)`.
    Turn 1 (no history) is the single-turn prompt. Raises ValueError when not even the card
    and the last observation fit."""
    if not history:
        return card + SEP
    *older, (script, obs) = history
    kept = [(t + 1, o) for t, (_, o) in enumerate(older)]
    last_turn = len(history)
    text = _render(card, kept, (last_turn, script, obs))
    while not fits(text) and kept:
        kept = kept[1:]  # the oldest observation first
        text = _render(card, kept, (last_turn, script, obs))
    lines = script.rstrip().splitlines()
    while not fits(text) and lines:
        lines = lines[:-1]
        text = _render(card, kept, (last_turn, "\n".join([*lines, TRUNCATED]), obs))
    if not fits(text):
        raise ValueError(f"the card and turn {last_turn}'s observation alone do not fit")
    return text
