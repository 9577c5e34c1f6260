"""`python -m wmrl.envs.autoresearch.corpus`: an alias of
`python -m wmrl.autoresearch.env.corpus`."""

import runpy

if __name__ == "__main__":
    runpy.run_module("wmrl.autoresearch.env.corpus", run_name="__main__", alter_sys=True)
