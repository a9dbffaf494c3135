"""Reproduce the lecture's code-01 dispatch demos (§1; exercises 1-2): theory checks, balls into bins, five
policies on 16 servers, stale information. One implementation: `jaxroute.reproduce.lecture_dispatch`; this
script writes the same report as `jaxroute reproduce lecture --only theory,bins,servers16,stale`.

    python scripts/reproduce_lecture_dispatch.py [--quick] [--out results/lecture_dispatch]
"""

import sys

from jaxroute.reproduce import script_main

if __name__ == "__main__":
    sys.exit(script_main("lecture_dispatch", description=__doc__))
