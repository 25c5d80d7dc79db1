"""The packages of the wheel; everything else is in setup.cfg.

configs/ stays at the top of the checkout and ships in the wheel as `prvr_jax.configs`, where
`--config=NAME[:variant]` finds it (`config_lib.resolve_config_flag`); setup.cfg's
`packages = find:` cannot name a package outside prvr_jax/.
"""

import setuptools

setuptools.setup(
    packages=[*setuptools.find_packages(include=['prvr_jax', 'prvr_jax.*']), 'prvr_jax.configs'],
    package_dir={'prvr_jax.configs': 'configs'})
