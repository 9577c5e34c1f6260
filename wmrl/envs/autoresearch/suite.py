"""`python -m wmrl.envs.autoresearch.suite`: an alias of
`python -m wmrl.autoresearch.env.suite`."""

import runpy

if __name__ == "__main__":
    runpy.run_module("wmrl.autoresearch.env.suite", run_name="__main__", alter_sys=True)
