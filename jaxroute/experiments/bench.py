"""The benchmark harness as an experiment: `run_bench(BenchConfig(...))` (the logic is `jaxroute.bench`)."""

from jaxroute.bench import PARTS, BenchConfig, format_report, run_bench

__all__ = ["PARTS", "BenchConfig", "format_report", "run_bench"]
