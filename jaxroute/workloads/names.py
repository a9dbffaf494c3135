"""The workloads' names and defaults, defined once and importable without JAX (the command line shows them).

`service.py`, `prefix/` and `decode.py` import these; the parsers of `jaxroute` read them without
importing the workload generators, so `jaxroute --help` and argument errors need no JAX.
"""

from __future__ import annotations

MAX_COUNT = 2**31 - 1  # the most requests (or any count) a run holds: array sizes and int32 indices

# Service-time laws of the classic dispatch model (`service.py`), in traced-id order; mean 1 each
SERVICE_LAWS: tuple[str, ...] = ("exp", "pareto", "lognormal", "det")

# Prefix workloads of the replica cluster (`prefix/`): synthetic ones and recorded traces
PREFIX_WORKLOADS: tuple[str, ...] = ("longdoc", "toolbench", "agent", "programming", "videoqa", "shared-prefix")
TRACE_WORKLOADS: tuple[str, ...] = ("mooncake", "azure-conv", "burstgpt")
# inference-perf (kubernetes-sigs/inference-perf @7de5ef2): SharedPrefix defaults in
# inference_perf/config/datagen/config.py lines 49-71 (num_groups 10, num_prompts_per_group 10,
# system_prompt_len 100, question_len 50, output_len 50); the generator in
# inference_perf/datagen/synthetic/shared_prefix_datagen.py.
SP_DEFAULTS = {"groups": 10, "prompts_per_group": 10, "system_tokens": 100, "question_tokens": 50,
               "output_tokens": 50}

# Decode workloads (`decode.py`), and those a horizon predictor learns from (`predictors/data.py`)
DECODE_WORKLOADS: tuple[str, ...] = ("synthetic-azure24", "synthetic-prod", "azure-conv", "azure-code")
DECODE_TRACE_WORKLOADS: tuple[str, ...] = ("azure-conv", "azure-code")  # read --trace; the others draw lengths
PREDICTOR_WORKLOADS: tuple[str, ...] = DECODE_WORKLOADS + ("mooncake",)
PREDICTOR_TRACE_WORKLOADS: tuple[str, ...] = DECODE_TRACE_WORKLOADS + ("mooncake",)
