"""`python -m wmrl.envs.autoresearch.dataset`: an alias of
`python -m wmrl.autoresearch.env.dataset`."""

import runpy

if __name__ == "__main__":
    runpy.run_module("wmrl.autoresearch.env.dataset", run_name="__main__", alter_sys=True)
