"""Shared by the bench_*.py wrappers: run the harness (`jaxroute.bench`) on a config, print, write JSON."""

from __future__ import annotations

import os
import sys


def run(config_kw: dict, out: str, devices: int | None = None, quick: bool = False) -> int:
    """`jaxroute bench` with these BenchConfig settings; returns 0, or 1 when a part failed.

    quick: the same parts at `BenchConfig.quick()`'s tiny sizes (a smoke run; the flags' sizes are ignored)."""
    if devices:
        os.environ["JAXROUTE_CPU_DEVICES"] = str(devices)
    from jaxroute.runtime import use_all_cpu_cores

    use_all_cpu_cores()  # one JAX CPU device per core (before JAX starts), as the CLI does
    from jaxroute import report
    from jaxroute.bench import BenchConfig, format_report, run_bench
    from jaxroute.errors import JaxrouteError

    try:
        cfg = BenchConfig.quick(parts=config_kw["parts"]) if quick else BenchConfig(**config_kw)
    except JaxrouteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    res = run_bench(cfg, lambda partial: report.write_json(out, partial))
    print()
    print(format_report(res))
    print(f"wrote {report.write_json(out, res)}")
    return 1 if res["errors"] else 0


QUICK_HELP = "every part at tiny sizes (a smoke run of the same code; the size flags are ignored)"


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t.strip())
