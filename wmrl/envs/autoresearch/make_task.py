"""`python -m wmrl.envs.autoresearch.make_task`: an alias of
`python -m wmrl.autoresearch.env.make_task`."""

import runpy

if __name__ == "__main__":
    runpy.run_module("wmrl.autoresearch.env.make_task", run_name="__main__", alter_sys=True)
