"""Experiments: rows of (label, params) on common seeds in one compiled grid, with paired CIs.

The generic API lives in `jaxroute.experiments.comparison` and is re-exported here; each
problem (dispatch, bins, cluster, decode) has its own module that builds rows and models.
Commands and scripts call these modules; they do not run grids of their own.

The re-exports are imported on first use, so `jaxroute.experiments.names` and `.knobs` (the names,
defaults and grammars the command line reads) import without JAX.
"""

from __future__ import annotations

import importlib

__all__ = ["Comparison", "Results", "Row", "conservation_failures", "paired_difference", "run_with_retry"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("jaxroute.experiments.comparison"), name)
    raise AttributeError(f"module 'jaxroute.experiments' has no attribute '{name}'")
