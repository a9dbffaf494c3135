"""Reproduce the lecture's LLMSelector items (§4.4-4.5, exercises 6(b) and 7) in jaxroute's toy world: the
constructed five-model case, random pools, a noisy diagnoser, monotonicity violations, cost and the Pareto
frontier. One implementation: `jaxroute.reproduce.llmselector`; this script writes the same report as
`jaxroute reproduce llmselector`.

    python scripts/reproduce_lecture_selector.py [--quick] [--out results/llmselector] [--only cost]
"""

import sys

from jaxroute.reproduce import script_main

if __name__ == "__main__":
    sys.exit(script_main("llmselector", description=__doc__))
