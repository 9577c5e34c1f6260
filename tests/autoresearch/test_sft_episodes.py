"""The multi-turn warm start's SFT rows (`wmrl.autoresearch.stages.sft_rows`): the single-turn
documents for the first turn and only the later turns of the executed episodes, so the first
turn keeps the corpus's mistake rate however many episodes there are. Hand-built episodes
on a tiny task, no sandbox."""

import numpy as np

from tests.support.autoresearch_fixtures import GOOD_SCRIPT, make_tiny_task
from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch import data as rldata
from wmrl.autoresearch import stages
from wmrl.autoresearch.env.episode import make_episode_task
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.observation import make_observation
from wmrl.autoresearch.presets import TINY_MULTITURN_SETTING
from wmrl.tokenizer import Tokenizer

BROKEN = GOOD_SCRIPT.replace("LogisticRegression().fit(", "LogisticRegression().fit((")


def _episode(task_id: str, index: int, first: str, second: str) -> dict:
    obs = [
        make_observation(Status.MALFORMED, "none", 0.0, None),
        make_observation(Status.VALID, "none", 0.2, 0.9),
    ]
    return {
        "task_id": task_id, "index": index, "split": "train", "kind": "fix", "mistake": "x",
        "turns": [{"turn": t + 1, "script": s, "observation": o.to_json()}
                  for t, (s, o) in enumerate(zip((first, second), obs, strict=True))],
    }  # fmt: skip


def test_the_warm_start_trains_on_the_single_turn_documents_and_the_episodes_revisions(tmp_path):
    """Two hand-built two-turn episodes: the rows are the single-turn documents (their
    prompt the card) plus the two revisions (their prompt the card, turn 1's script and its
    observation); no episode's first turn (the planted mistake) is trained on."""
    task = make_tiny_task(tmp_path / "tiny-task")
    ep_task = make_episode_task(task, tmp_path / "episode_tasks")
    config = tiny_config(
        tmp_path / "d", tmp_path / "i", **{k.replace(".", "__"): v
                                            for k, v in TINY_MULTITURN_SETTING.items()},
        data__scripts_per_task=2, data__sft_scripts_per_task=1,
    )  # fmt: skip
    episodes = [
        _episode(task.id, 0, BROKEN, GOOD_SCRIPT),
        _episode(task.id, 1, BROKEN, GOOD_SCRIPT),
    ]
    card = rldata.prompt_text(ep_task)
    # as the data stage trains it: the card, the authored scripts and the episodes' prompts
    corpus = [card, *(s for _, s in rldata.sft_documents(config, [task], {task.id: ep_task}))]
    corpus += [p for p, _ in rldata.episode_documents(config, episodes, {task.id: ep_task})]
    tok = Tokenizer.train(corpus, tmp_path / "spm", vocab_size=1500, code_pieces=True)
    prepared = rldata.Prepared(
        tmp_path, [task], [], [], tok, episodes=episodes, episode_tasks={task.id: ep_task}
    )
    rows = stages.sft_rows(config, prepared)
    P = config.data.max_prompt_len
    prompts = [tok.decode(r[m]) for r, m in zip(rows["tokens"][:, :P], rows["input_mask"][:, :P],
                                                strict=True)]  # fmt: skip
    scripts = [tok.decode(r[m]) for r, m in zip(rows["tokens"][:, P:], rows["input_mask"][:, P:],
                                                strict=True)]  # fmt: skip
    single = 2 + 1  # data.scripts_per_task + data.sft_scripts_per_task authored scripts
    assert len(prompts) == single + 2
    assert prompts[:single] == [card] * single
    for prompt, script in zip(prompts[single:], scripts[single:], strict=True):
        assert prompt.startswith(card.removesuffix("\n### SCRIPT\n"))
        assert f"### TURN 1 SCRIPT\n{BROKEN.rstrip()}\n### TURN 1 RESULT\n" in prompt
        assert script == GOOD_SCRIPT
    assert BROKEN not in scripts  # the planted mistake is never a target
    np.testing.assert_array_equal(rows["loss_mask"][:, :P], 0.0)
