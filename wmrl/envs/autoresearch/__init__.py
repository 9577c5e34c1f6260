"""Aliases of the Mini AutoResearch command lines; the code is `wmrl.autoresearch.env`."""
