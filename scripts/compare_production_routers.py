"""Every production router (llm-d, Dynamo, SGLang gateway, vLLM production-stack, AIBrix) on 8 replicas of
Qwen3-32B (2 x H100 each) over a rate ladder per workload, against the routers' and the lecture's claims.
One implementation: `jaxroute.reproduce.production_routers`; this script writes the same report as
`jaxroute reproduce production-routers --only routers_shared_prefix,routers_toolbench,routers_mooncake`
(report.md with the claims and verdicts, the tables per workload and rate, results.json, a PNG per workload of
TTFT p90 and output tokens/s against load).

    python scripts/compare_production_routers.py [--quick] [--only routers_toolbench] [--out results/production_routers]
"""

import sys

from jaxroute.reproduce import script_main

if __name__ == "__main__":
    sys.exit(script_main("production_routers", description=__doc__))
