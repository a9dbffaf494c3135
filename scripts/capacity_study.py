"""Capacity study (production routers): the largest request rate each router sustains under a TTFT-p90 and a
TPOT-p90 SLO at 4, 8 and 16 replicas, on shared-prefix and the Mooncake trace, then llm-d's scorer weights tuned
(CMA-ES) and the tuned capacity beside the default's, with the speed against the pure-Python reference.
One implementation: `jaxroute.reproduce.capacity_study`; this script writes the same report as
`jaxroute reproduce production-routers --only capacity_shared_prefix,capacity_mooncake,capacity_tuned`.

    python scripts/capacity_study.py [--quick] [--out results/capacity_study] [--only capacity_mooncake]
"""

import sys

from jaxroute.reproduce import script_main

if __name__ == "__main__":
    sys.exit(script_main("capacity_study", description=__doc__))
