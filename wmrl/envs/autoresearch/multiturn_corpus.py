"""`python -m wmrl.envs.autoresearch.multiturn_corpus`: an alias of
`python -m wmrl.autoresearch.env.multiturn_corpus`."""

import runpy

if __name__ == "__main__":
    runpy.run_module("wmrl.autoresearch.env.multiturn_corpus", run_name="__main__", alter_sys=True)
