"""Sphinx configuration of the prvr_jax API reference.

  python3 -m pip install -e '.[docs]'
  python3 -m sphinx -W --keep-going -b html docs/api /tmp/prvr_jax_docs

Sphinx (autodoc + napoleon for our Google-style docstrings, myst-parser for the Markdown
docs) is what JAX, Flax and Optax document themselves with, so their objects look the same
here. `_ext/prvr_docs.py` writes the generated pages (one per module group, one per
registered model with numbers computed from the configs, the Markdown docs) into
`_generated/` before the build reads them.
"""

import os
import pathlib
import sys

# The model pages' numbers come from abstract shapes: no accelerator is needed (the workers
# computing them inherit this).
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / '_ext'))

import prvr_jax  # pylint: disable=g-import-not-at-top,wrong-import-position

project = 'prvr_jax'
author = 'prvr_jax authors'
copyright = 'prvr_jax authors, Apache-2.0'  # pylint: disable=redefined-builtin
release = version = prvr_jax.__version__

extensions = ['sphinx.ext.autodoc', 'sphinx.ext.napoleon', 'myst_parser', 'prvr_docs']
source_suffix = {'.md': 'markdown'}
exclude_patterns = ['_build']

# `x` in docstrings is code (shapes such as `[B, L, D]`, config keys), not a cross-reference.
default_role = 'code'
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# Attributes sections as field lists: as `.. attribute::` entries they would describe the
# dataclass fields a second time, next to autodoc's own entries.
napoleon_use_ivar = True
autodoc_member_order = 'bysource'
autodoc_typehints = 'signature'
myst_heading_anchors = 2

html_theme = 'alabaster'
html_title = f'prvr_jax {release}'
