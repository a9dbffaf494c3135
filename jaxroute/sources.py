"""The sources `jaxroute reproduce` checks, and where their experiments live; plain Python, no JAX.

`jaxroute.reproduce` (which imports JAX) runs them; the parser of `jaxroute reproduce` lists them
from here without importing it.
"""

from __future__ import annotations

# source -> modules (under jaxroute.reproduce) holding its experiments, in report order
SOURCES: dict[str, tuple[str, ...]] = {
    "lecture": ("lecture_dispatch", "lecture_cluster", "lecture_preble"),
    "balanceroute": ("balanceroute", "balanceroute_4p1d"),
    "llmselector": ("llmselector",),
    "production-routers": ("production_routers", "pd_study", "capacity_study", "control_study", "data_plane_study"),
}
