"""Reproduce the lecture's code-03 demos on Preble (§3.3-3.6): Preble against round robin (demo 1), E2's cost
terms and pairing (demo 2), a hot tool (demo 3), the local order (demo 5), cache_guard against Preble (finding 1)
and the paper's ablation. One implementation: `jaxroute.reproduce.lecture_preble`; this script writes the same
report as `jaxroute reproduce lecture --only preble_fig3,preble_cost_terms,preble_hot_tool,preble_local_order,
preble_cache_guard,preble_ablation`.

    python scripts/reproduce_lecture_preble.py [--quick] [--out results/lecture_preble] [--only NAMES]
"""

import sys

from jaxroute.reproduce import script_main

if __name__ == "__main__":
    sys.exit(script_main("lecture_preble", description=__doc__))
