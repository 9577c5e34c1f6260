"""Embodied transfer (docs/method.md 4): WMRL post-trains a language-conditioned pushing policy in a
MuJoCo tabletop scene built in code. The correction maths is imported from `wmrl.core`."""
