"""`python -m wmrl.envs.autoresearch.run`: an alias of
`python -m wmrl.autoresearch.env.run`."""

import runpy

if __name__ == "__main__":
    runpy.run_module("wmrl.autoresearch.env.run", run_name="__main__", alter_sys=True)
