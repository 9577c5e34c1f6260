"""World Model RL on benchmark competitions: MLE-bench and MLE-Dojo competitions as tasks.

Prepare the competitions with the benchmarks' own tools, import them into one suite
directory (training competitions as `train`, the evaluation set as `heldout`), then train on
it (docs/competitions.md):

    python -m wmrl.autoresearch.env.competitions --benchmark=mledojo --data_dir=DOJO_DATA \\
        --competitions_dir=MLE-Dojo/mledojo/competitions --metrics=dojo_metrics.json \\
        --out=competitions
    python -m wmrl.autoresearch.env.competitions --benchmark=mlebench --data_dir=MLEBENCH_DATA \\
        --competitions_dir=mle-bench/mlebench/competitions \\
        --ids_file=mle-bench/experiments/splits/low.txt --split=heldout --out=competitions
    python -m wmrl.main --config=configs/autoresearch_mle.py --workdir=runs/mle_s0 \\
        --config.suite.dir=competitions --config.seed=0      # and seeds 1, 2
    python -m wmrl.autoresearch.env.competitions.report \\
        --runs=runs/mle_s0,runs/mle_s1,runs/mle_s2

Everything is the tiny config's (configs/autoresearch_tiny.py, the schema) but the suite:
`suite.dir` (here the directory the import wrote; it must hold suite.json) replaces the
built-in tasks, each competition's time limit is capped at `suite.time_limit_s` (real
competitions' scripts fit models on thousands of rows), and the prompt budget holds a
competition card's facts (its submission columns among them). Every held-out evaluation
record carries `heldout_benchmark` (any-medal %, above-median %, position score) beside the
held-out reward; the report command above gives them over seeds, mean ± one standard error.
On a pod from Qwen3-4B: configs/autoresearch_mle_qwen3_4b.py.
"""

from pathlib import Path

from wmrl.experiment.config import load_config_file


def get_config():
    c = load_config_file(Path(__file__).with_name("autoresearch_tiny.py"))
    c.suite.dir = "competitions"  # the import's --out (task dirs + suite.json)
    c.suite.time_limit_s = 120.0  # caps each competition's own limit (the import's --time_limit)
    c.data.max_prompt_len = 160  # a competition card's facts, submission columns included
    return c
