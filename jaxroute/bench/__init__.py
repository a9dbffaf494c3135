"""`jaxroute bench`: one benchmark harness for every model, written as one JSON object.

Modules, one per concern: `config` (what is measured, at which sizes: full, quick, gpu),
`measure` (first / steady runs, compile time, memory per row, scaling, out-of-memory guard),
`models` (dispatch, replica cluster, decode DP as scenarios of the experiments API),
`references` (the pure-Python references, found in the repository's tests/), `blis` (the BLIS
scenario and trace-length scaling), `decision` (BR decision latency), `harness` (run and print).
"""

from jaxroute.bench.config import PARTS, BenchConfig
from jaxroute.bench.harness import format_report, run_bench

__all__ = ["PARTS", "BenchConfig", "format_report", "run_bench"]
