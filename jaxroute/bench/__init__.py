"""`jaxroute bench`: one benchmark harness for every model, written as one JSON object.

Modules, one per concern: `config` (what is measured, at which sizes: full, quick, gpu),
`measure` (first / steady runs, compile time, memory per row, scaling, out-of-memory guard),
`models` (dispatch, replica cluster, decode DP as scenarios of the experiments API),
`references` (the pure-Python references, found in the repository's tests/), `blis` (the BLIS
scenario and trace-length scaling), `decision` (BR decision latency), `harness` (run and print).

The re-exports are imported on first use, so `config` (which the command line reads) imports without JAX.
"""

from __future__ import annotations

import importlib

__all__ = ["PARTS", "BenchConfig", "format_report", "run_bench"]
_HOMES = {"PARTS": "config", "BenchConfig": "config", "format_report": "harness", "run_bench": "harness"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"jaxroute.bench.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'jaxroute.bench' has no attribute '{name}'")
