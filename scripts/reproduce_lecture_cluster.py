"""Reproduce the lecture's code-02 findings (§2.2-2.5) on the replica cluster, with 95 % CIs over seeds:
cache vs load on 4 replicas, the cluster's total cache (2 -> 8 replicas), the threshold theta, a hot prefix.
One implementation: `jaxroute.reproduce.lecture_cluster`; this script writes the same report as
`jaxroute reproduce lecture --only cluster_finding1,cluster_finding2,cluster_finding3,cluster_finding4`.

    python scripts/reproduce_lecture_cluster.py [--quick] [--out results/lecture_cluster]
"""

import sys

from jaxroute.reproduce import script_main

if __name__ == "__main__":
    sys.exit(script_main("lecture_cluster", description=__doc__))
