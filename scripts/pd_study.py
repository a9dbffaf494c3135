"""Prefill/decode disaggregation study (8 groups of Llama-3.1-70B on 4 H200 each): colocated against every P:D
ratio on Mooncake and shared-prefix at two SLO pairs, and the cache-aware BalanceRoute on DP ranks with prefix
caches, against DistServe's and Splitwise's claims. One implementation: `jaxroute.reproduce.pd_study`; this
script writes the same report as `jaxroute reproduce production-routers --only pd_mooncake,pd_shared_prefix,pd_cache_aware`
(report.md with the claims and verdicts, the tables, results.json, a PNG per workload and SLO pair).

    python scripts/pd_study.py [--quick] [--only pd_cache_aware] [--out results/pd_study]
"""

import sys

from jaxroute.reproduce import script_main

if __name__ == "__main__":
    sys.exit(script_main("pd_study", description=__doc__))
