"""Mini AutoResearch: tabular tasks, a sandbox that executes agent scripts, a grader.

Public entry points: ``task.load_task``, ``grader.grade_submission``, ``pool.SandboxPool``,
``sandbox.detect_isolation``. Importing this package has no side effects.
"""
