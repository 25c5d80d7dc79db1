"""Command-line tools: each a thin `main` over a library function, installed as `prvr-<name>`
(setup.cfg console_scripts) and runnable as `python -m prvr_jax.tools.<name>`."""
