"""The model configs, one file per model (`--config=configs/<name>.py[:variant]`, or
`--config=<name>[:variant]`); shipped in the wheel as `prvr_jax.configs`."""
