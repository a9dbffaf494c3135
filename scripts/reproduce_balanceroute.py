"""Reproduce BalanceRoute's (arXiv 2605.06113) decode-DP results in the jaxroute barrier simulator: the model
ladder to the paper's setting, the main table (G=8), scaling with G, and oracle BR-H's beta x gamma sensitivity.
One implementation: `jaxroute.reproduce.balanceroute`; this script writes the same report as
`jaxroute reproduce balanceroute --only ladder,main,scaling,sensitivity`.

    python scripts/reproduce_balanceroute.py [--quick] [--only ladder,main,scaling,sensitivity] [--seeds S]
        [--out results/balanceroute]

The report (DIR/report.md, DIR/results.json, PNGs) replaces the old --verdicts JSON re-print: the verdicts and
reasons are in the report, and a rerun into the same DIR resumes from DIR/parts/ without simulating again.
"""

import sys

from jaxroute.reproduce import script_main

if __name__ == "__main__":
    sys.exit(script_main("balanceroute", description=__doc__))
