"""The command-line tools: each a thin `main()` over a library function, installed as a
`prvr-<name>` console script and runnable as `python -m prvr_jax.tools.<name>`.

Nothing in the library imports this package. `tools.evaluate` also holds
`evaluate_checkpoint`, what `prvr-evaluate` runs (above `eval` and `plots`, both of which it
uses). Each tool defines its flags in `main()`, so importing a tool's module defines no flag.
"""
