"""Prefix-sharing workloads for the replica cluster: prompts as sequences of segments.

Layout: `types` (the realised `RequestTable`, the prefix-match rule, `check_fits`), `synthetic`
(unit-based generators, Poisson arrivals per seed), `adapters` (Mooncake and Azure traces).

Parameters (lecture §2.1-2.5, Preble Table 1 averages; docs/architecture.md, reference facts):

| name | shared prefix | private suffix | output | popularity |
|---|---|---|---|---|
| longdoc | 13-token system prompt + 1 of 300 documents (mean 21,000 tokens, LogNormal sigma 0.4, clipped 4k-60k) | question = f_d of the prompt, f_d ~ U(4 %, 14 %) per document (mean 9 %) | 45 | Zipf(1.1) over documents |
| toolbench | 300-token system prompt + 1 of 500 tool descriptions (mean 1,500, sigma 0.3, clipped 600-2,500) | question 130 | 43 | Zipf(1.1); `hot_tool_share` (e.g. 0.4) puts that share on tool 0 |
| videoqa | 13-token system prompt + 1 of 200 videos (mean 8,700, sigma 0.3) | question 1,150 | 4 | Zipf(1.1) |
| programming | 13-token system prompt + 1 of 1,000 problems (mean 3,700, sigma 0.3) | 100-token sample tag | 190 | uniform; 8 parallel samples arrive together |
| agent | 1,200-token system prompt + 1 of 50 environments (mean 600) | per turn: 150-token observation; 16-token output kept in the cache | 16 | Zipf(1.1) over environments; 6 turns, 5 s apart, turn t reads all earlier turns |
| shared-prefix | 100-token system prompt of 1 of 10 groups | 50-token question, 1 of 10 per group (each of the 100 prompts recurs once per cycle) | 50 | inference-perf: a per-seed shuffle of the 100 prompts, cycled (restarted at each load stage) |

shared-prefix follows kubernetes-sigs/inference-perf's `shared_prefix` data generator (defaults:
inference_perf/config/datagen/config.py lines 49-71 @7de5ef2; `--sp-*` flags change them). Every
synthetic workload takes staged Poisson load (`with_rate_stages`, `--rate-stages RATE:SECONDS,...`).
"""

from jaxroute.workloads.prefix.adapters import (
    DEFAULT_TRACE_PATHS,
    TRACE_WORKLOADS,
    TracePrefixWorkload,
    from_azure,
    from_mooncake,
)
from jaxroute.workloads.prefix.synthetic import (
    PREFIX_WORKLOADS,
    SP_DEFAULTS,
    SYNTHETIC,
    SyntheticPrefixWorkload,
    agent,
    longdoc,
    private_prompts,
    programming,
    shared_prefix,
    synthetic,
    toolbench,
    videoqa,
    with_rate_stages,
    zipf_top_shares,
)
from jaxroute.workloads.prefix.types import (
    RequestTable,
    check_fits,
    request_steps,
    trace_adapters,
)

__all__ = [
    "DEFAULT_TRACE_PATHS", "PREFIX_WORKLOADS", "SP_DEFAULTS", "SYNTHETIC", "TRACE_WORKLOADS", "RequestTable",
    "SyntheticPrefixWorkload", "TracePrefixWorkload", "agent", "check_fits", "from_azure", "from_mooncake",
    "longdoc", "private_prompts", "programming", "request_steps", "shared_prefix", "synthetic", "toolbench", "trace_adapters",
    "videoqa",
    "with_rate_stages", "zipf_top_shares",
]
