"""Experiments built from training runs: `seeds` (a config over several seeds, mean ± std of
every metric per split)."""
