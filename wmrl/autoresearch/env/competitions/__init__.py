"""Benchmark competitions (MLE-bench, MLE-Dojo) as AutoResearch tasks.

A competition prepared by its benchmark's own tools is imported into the task directory
format (``task_dir.write_competition_task``; CLI: ``python -m
wmrl.autoresearch.env.competitions``): its public files for the sandbox, its answers and
leaderboards under ``private/``, its description inside the card, and a ``competition``
block in ``task.json`` naming the benchmark, the metric and the submission columns.
``task.load_task`` loads such a directory like any task; the grader scores its submissions
with the competition's metric (``grading``) on the unchanged reward ladder, and records the
benchmark's own verdict beside the reward (``leaderboard.benchmark_outcome``: MLE-bench's
medal, MLE-Dojo's position score).

Nothing from the competition's own directory is executed: metrics come from a registry of
known rules by name (``metrics``), mapped from the competition's config; an unknown name is
refused. Reading a benchmark: ``mlebench.read_mlebench``, ``mledojo.read_mledojo``, both
returning a ``source.CompetitionSource``. The manual is docs/competitions.md.
"""
