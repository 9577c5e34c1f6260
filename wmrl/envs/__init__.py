"""Command-line aliases only.

The environments live with their experiments: `wmrl.autoresearch.env` (Mini AutoResearch:
tasks, sandbox, grader), `wmrl.bandits`, `wmrl.embodied`. The modules under
`wmrl.envs.autoresearch` keep the documented command lines working
(`python -m wmrl.envs.autoresearch.suite ...` runs `wmrl.autoresearch.env.suite`).
"""
