"""LLMSelector's names, defined once and importable without JAX (the command line lists them).

`systems.py` and `optimizers.py` import these; the parser of `jaxroute select` reads them without
importing the JAX world, so `jaxroute --help` and argument errors need no JAX.
"""

from __future__ import annotations

SYSTEMS: tuple[str, ...] = ("locate-solve", "self-refine", "debate")  # compound systems (`systems.SYSTEMS`)
OPTIMIZERS: tuple[str, ...] = ("llmselector", "greedy", "random_search", "exhaustive", "best_single")
EXTRA_OPTIMIZERS: tuple[str, ...] = ("llmselector_downgrade",)  # exercise 7; not run by default
