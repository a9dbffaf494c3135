"""Experiments: rows of (label, params) on common seeds in one compiled grid, with paired CIs.

The generic API lives in `jaxroute.experiments.comparison` and is re-exported here; each
problem (dispatch, bins, cluster, decode) has its own module that builds rows and models.
Commands and scripts call these modules; they do not run grids of their own.
"""

from jaxroute.experiments.comparison import (
    Comparison,
    Results,
    Row,
    conservation_failures,
    paired_difference,
    run_with_retry,
)

__all__ = ["Comparison", "Results", "Row", "conservation_failures", "paired_difference", "run_with_retry"]
